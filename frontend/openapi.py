"""GET /openapi.json: the routes and their request/response schemas, derived from the msgspec structs."""
from __future__ import annotations

import functools
import importlib.metadata
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.embeddings import EmbeddingRequest, EmbeddingResponse, EncodeRequest
from radixflow.frontend.native import AbortRequest, GenerateRequest
from radixflow.frontend.openai_schemas import (
    ChatCompletion, ChatRequest, Completion, CompletionRequest, ModelCard, ModelList,
)
from radixflow.frontend.programs import ProgramRequest
from radixflow.frontend.reasoning import SeparateRequest, SeparateResponse
from radixflow.frontend.responses_schemas import ResponseObject, ResponsesRequest
from radixflow.frontend.score import ScoreRequest, ScoreResponse
from radixflow.frontend.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from radixflow.frontend.weight_routes import (
    ContinueRequest, Done, PauseRequest, UpdateWeightsReply, UpdateWeightsRequest, WeightVersion, WeightVersionUpdate,
)

REF = "#/components/schemas/{name}"


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(msgspec.Struct):
    """Every 4xx/5xx answer (OpenAI's shape)."""

    error: ErrorDetail


# path → (method, summary, request struct or None, 200 response struct or None)
OPERATIONS: dict[str, tuple[str, str, type | None, type | None]] = {
    "/v1/completions": ("post", "OpenAI completions (stream: SSE of Completion chunks)", CompletionRequest, Completion),
    "/v1/chat/completions": ("post", "OpenAI chat completions (stream: SSE chunks)", ChatRequest, ChatCompletion),
    "/v1/responses": ("post", "OpenAI Responses API, a subset: text and function tools (stream: SSE of response "
                      "events)", ResponsesRequest, ResponseObject),
    "/v1/responses/{response_id}": ("get", "a stored response (DELETE forgets it)", None, ResponseObject),
    "/v1/responses/{response_id}/input_items": ("get", "a stored response's input items (order, limit, after)",
                                                None, None),
    "/v1/embeddings": ("post", "OpenAI embeddings: each input's last-token final hidden state, L2-normalized",
                       EmbeddingRequest, EmbeddingResponse),
    "/v1/score": ("post", "generative scoring (SGLang's): each label token's probability after query + item",
                  ScoreRequest, ScoreResponse),
    "/v1/models": ("get", "served models", None, ModelList),
    "/v1/models/{model}": ("get", "one served model", None, ModelCard),
    "/v1/programs": ("post", "run a program IR", ProgramRequest, None),
    "/generate": ("post", "SGLang-native generate", GenerateRequest, None),
    "/encode": ("post", "SGLang-native embeddings ({embedding, meta_info}, or a list)", EncodeRequest, None),
    "/abort_request": ("post", "abort one request (rid) or all (abort_all)", AbortRequest, None),
    "/separate_reasoning": ("post", "a thinking model's text split into answer and reasoning", SeparateRequest,
                            SeparateResponse),
    "/tokenize": ("post", "token ids of a prompt or of chat messages (also /v1/tokenize)", TokenizeRequest,
                  TokenizeResponse),
    "/detokenize": ("post", "text of token ids (also /v1/detokenize)", DetokenizeRequest, DetokenizeResponse),
    "/get_model_info": ("get", "model path and limits", None, None),
    "/model_info": ("get", "same as /get_model_info", None, None),
    "/get_server_info": ("get", "server config and stats", None, None),
    "/server_info": ("get", "same as /get_server_info", None, None),
    "/get_load": ("get", "requests running and waiting", None, None),
    "/flush_cache": ("post", "drop the unlocked prefix cache", None, None),
    "/update_weights_from_disk": ("post", "serve another checkpoint of the same model (--enable-weight-updates)",
                                  UpdateWeightsRequest, UpdateWeightsReply),
    "/get_weight_version": ("get", "the name of the weights served", None, WeightVersion),
    "/update_weight_version": ("post", "name the weights served (they stay)", WeightVersionUpdate, Done),
    "/pause_generation": ("post", "stop generating (mode abort, retract or in_place) until /continue_generation",
                          PauseRequest, Done),
    "/continue_generation": ("post", "generate again after /pause_generation", ContinueRequest, Done),
    "/version": ("get", "the radixflow version", None, None),
    "/health": ("get", "liveness", None, None),
    "/health_generate": ("get", "generates one token", None, None),
    "/metrics": ("get", "Prometheus metrics", None, None),
}


def _operation(summary: str, request: type | None, response: type | None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {
        "200": {"description": "OK"},
        "default": {"description": "error", "content": {"application/json": {"schema": _ref(ErrorBody)}}}}}
    if response is not None:
        op["responses"]["200"]["content"] = {"application/json": {"schema": _ref(response)}}
    if request is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(request)}}}
    return op


def _ref(struct: type) -> dict[str, str]:
    return {"$ref": REF.format(name=struct.__name__)}


def openapi_document() -> dict[str, Any]:
    structs = [s for _, _, req, resp in OPERATIONS.values() for s in (req, resp) if s is not None] + [ErrorBody]
    _, components = msgspec.json.schema_components(structs, ref_template=REF)
    paths = {path: {method: _operation(summary, req, resp)} for path, (method, summary, req, resp) in OPERATIONS.items()}
    return {"openapi": "3.1.0",
            "info": {"title": "radixflow", "version": importlib.metadata.version("radixflow")},
            "paths": paths, "components": {"schemas": components}}


@functools.lru_cache(maxsize=1)
def _encoded() -> bytes:
    return msgspec.json.encode(openapi_document())


async def openapi_json(request: Request) -> Response:
    return Response(_encoded(), media_type="application/json")
