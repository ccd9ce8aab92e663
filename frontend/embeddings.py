"""POST /v1/embeddings (OpenAI's shape) and /encode (SGLang's native one): each input is
prefilled like any prompt (its prefix from the cache) and its embedding is the last token's final
hidden state after the model's last norm, L2-normalized (Engine.encode). The KV an input computes
stays in the prefix cache for later requests."""
from __future__ import annotations

import base64
from typing import Any, Literal

import msgspec
import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.body import json_response, off_loop_if_large, read_json
from radixflow.frontend.completions import check_prompt_size, parse_prompts
from radixflow.frontend.errors import APIError, bad_request
from radixflow.frontend.native import prompt_inputs
from radixflow.frontend.openai_common import check_model, new_id, now
from radixflow.frontend.streams import launch
from radixflow.runtime.sampling_params import SamplingParams

PREFILL_ONLY = SamplingParams.from_dict({"max_new_tokens": 0})


class EmbeddingRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    input: str | list[str | int | list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    priority: int | None = None  # vLLM's: the request's rank under priority scheduling


class EncodeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """SGLang's /encode: `text` or `input_ids`, one or a list; `lora_path` an adapter's name."""

    text: str | list[str] | None = None
    input_ids: list[int | list[int]] | None = None  # one prompt's ids, or a list of them (not mixed)
    rid: str | list[str] | None = None
    lora_path: str | None = None
    priority: int | None = None  # the request's rank under priority scheduling


class Embedding(msgspec.Struct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage
    object: str = "list"


async def _embed(request: Request, prompts: list[list[int]], options: list[dict[str, Any]],
                 names: dict[str, str]) -> list[dict]:
    """Each prompt's encode result ({"embedding", "meta_info"}), run to completion (aborted if the
    client goes): a prompt past the context or otherwise bad is a 400 naming `names["prompt"]`,
    a failed one a 500. An aborted one (/abort_request, shutdown) comes back with its embedding
    None and finish_reason abort, for the route to answer."""
    server = request.app.state.server
    context = server.engine.max_context_len
    longest = max(map(len, prompts), default=0)
    if longest > context:
        raise APIError(400, f"This model's maximum context length is {context} tokens. However, you requested "
                       f"{longest} tokens in the input.", param=names["prompt"], code="context_length_exceeded")
    try:
        fanout, _ = await launch(request.receive, server.engine, prompts, [PREFILL_ONLY] * len(prompts),
                                 [{**opts, "embed": True} for opts in options], server.in_flight)
    except ValueError as exc:
        raise bad_request(exc, names) from exc
    results = await fanout.finish(request.receive)
    for result in results:
        reason = result["meta_info"].get("finish_reason") or {}
        if result.get("embedding") is None and reason.get("type") != "abort":
            raise APIError(500, f"embedding failed: {reason.get('message') or reason.get('type') or 'no result'}",
                           code="internal_error")
    return results


def _as_base64(vector: list[float]) -> str:
    """OpenAI's base64 encoding_format: the float32 values' little-endian bytes."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


async def create_embedding(request: Request) -> Response:
    server = request.app.state.server
    engine = server.engine
    req = await read_json(request, EmbeddingRequest)
    server.limits.check_session(req.user, "user")
    lora = check_model(request, req.model)
    hidden = engine.hidden_size
    if req.dimensions is not None and req.dimensions != hidden:
        raise APIError(400, f"dimensions {req.dimensions} is not supported: this model's embeddings have "
                       f"{hidden} dimensions (they are not truncatable)", param="dimensions")
    if req.input == "" or (isinstance(req.input, list) and "" in req.input):  # as OpenAI: nothing to embed
        raise APIError(400, "input must not be an empty string", param="input")
    check_prompt_size(req.input, server.limits, "input")
    prompts = await off_loop_if_large(request, parse_prompts, req.input, engine.tokenizer, "input")
    results = await _embed(request, prompts.ids, [{"lora_path": lora, "priority": req.priority}] * len(prompts.ids), {"prompt": "input"})
    if any(r.get("embedding") is None for r in results):  # an abort asked for, or the server shutting down
        raise APIError(400, "the request was aborted before its embeddings were computed", code="request_aborted")
    encode = _as_base64 if req.encoding_format == "base64" else (lambda vector: vector)
    data = [Embedding(i, encode(r["embedding"])) for i, r in enumerate(results)]
    tokens = sum(r["meta_info"]["prompt_tokens"] for r in results)
    return json_response(EmbeddingResponse(new_id("embd"), now(), req.model, data, EmbeddingUsage(tokens, tokens)))


async def encode(request: Request) -> Response:
    server = request.app.state.server
    req = await read_json(request, EncodeRequest)
    if req.text is not None:
        check_prompt_size(req.text, server.limits, "text")
    if req.input_ids is not None:
        check_prompt_size(req.input_ids, server.limits, "input_ids")
    prompts, is_batch = await off_loop_if_large(request, prompt_inputs, req, server.engine.tokenizer)
    if isinstance(req.rid, str) and is_batch:
        raise APIError(400, "a batch of inputs needs a list of rids, one per input", param="rid")
    rids = req.rid if isinstance(req.rid, list) else [req.rid] * len(prompts)
    if len(rids) != len(prompts):
        raise APIError(400, f"got {len(rids)} rid for {len(prompts)} inputs", param="rid")
    options = [{"lora_path": req.lora_path, "rid": rid, "priority": req.priority} for rid in rids]
    results = await _embed(request, prompts, options, {"prompt": "text" if req.input_ids is None else "input_ids"})
    return json_response(results if is_batch else results[0])
