"""POST /v1/score (SGLang's generative scoring): per item, the probability of each label token
right after query + item (runtime/scoring.py). Every (item, label) pair is a prefill-only stream
of the server's, so a client that goes aborts them and the items share the query's cached KV."""
from __future__ import annotations

import re

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.body import json_response, off_loop_if_large, read_json
from radixflow.frontend.errors import APIError, bad_request
from radixflow.frontend.openai_common import check_model
from radixflow.frontend.streams import launch
from radixflow.runtime.scoring import PREFILL_ONLY, ScoreBatch, score_requests

_FIELD = re.compile(r"^(query|items|label_token_ids|item_first)\b")


class ScoreRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    query: str | list[int]
    items: str | list[str | list[int]]  # strings, or token id lists (runtime/scoring.py refuses a mix)
    label_token_ids: list[int]
    apply_softmax: bool = False
    item_first: bool = False
    model: str | None = None  # the served model or a LoRA adapter's name; absent: the base model
    priority: int | None = None  # vLLM's: every pair's rank under priority scheduling


class ScoreUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(msgspec.Struct):
    scores: list[list[float]]
    model: str
    usage: ScoreUsage
    object: str = "scoring"


def _check_size(req: ScoreRequest, items: list, limits) -> None:
    """The limits on what the joined prompts hold: the query counts once per item."""
    limits.check_prompts(len(items), "items")
    limits.check_prompts(len(req.label_token_ids), "label_token_ids")
    pairs = len(items) * len(req.label_token_ids)
    if pairs > limits.max_score_pairs:
        raise APIError(400, f"{pairs} item-label pairs (items x label_token_ids); the limit max_score_pairs is "
                       f"{limits.max_score_pairs}", param="items", code="limit_exceeded")
    joined = len(req.query) * len(items) + sum(len(item) for item in items)
    if isinstance(req.query, str):
        limits.check_text(joined, "items")
    else:
        limits.check_ids(joined, "items")


def _batch(req: ScoreRequest, items: list, engine) -> ScoreBatch:
    try:
        return score_requests(engine.tokenizer, req.query, items, req.label_token_ids, req.item_first,
                              engine.vocab_size)
    except ValueError as exc:
        field = _FIELD.match(str(exc))
        raise APIError(400, str(exc), param=field.group(1) if field else None) from exc


async def create_score(request: Request) -> Response:
    server = request.app.state.server
    engine = server.engine
    req = await read_json(request, ScoreRequest)
    lora = None if req.model is None else check_model(request, req.model)
    items = [req.items] if isinstance(req.items, str) else req.items
    _check_size(req, items, server.limits)
    batch = await off_loop_if_large(request, _batch, req, items, engine)
    longest = max(map(len, batch.prompts)) + 1
    if longest > engine.max_context_len:
        raise APIError(400, f"This model's maximum context length is {engine.max_context_len} tokens. However, "
                       f"query + item + label is {longest} tokens.", param="items", code="context_length_exceeded")
    pairs = batch.requests()
    options = [{"return_logprob": True, "logprob_start_len": start, "lora_path": lora,
                "priority": req.priority} for _, start in pairs]
    try:
        fanout, _ = await launch(request.receive, engine, [ids for ids, _ in pairs], [PREFILL_ONLY] * len(pairs),
                                 options, server.in_flight)
    except ValueError as exc:
        raise bad_request(exc, {"prompt": "items"}) from exc
    results = await fanout.finish(request.receive)
    reasons = [r["meta_info"].get("finish_reason") or {} for r in results]
    if any(reason.get("type") == "error" for reason in reasons):
        message = next(reason.get("message") for reason in reasons if reason.get("type") == "error")
        raise APIError(500, f"scoring failed: {message}", code="internal_error")
    try:
        scores = batch.scores(results, req.apply_softmax)
    except ValueError as exc:  # aborted (/abort_request, shutdown) before its score
        raise APIError(400, "the request was aborted before its scores were computed", code="request_aborted") from exc
    tokens = sum(map(len, batch.prompts))
    return json_response(ScoreResponse(scores, req.model or server.served_model_name or engine.model_path,
                                       ScoreUsage(tokens, tokens)))
