"""POST /v1/chat/completions: the model's chat template, n, stop, logprobs + top_logprobs, streaming."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.body import json_response, read_json
from radixflow.frontend.errors import APIError
from radixflow.frontend.openai_common import check_model, new_id, now, start, usage
from radixflow.frontend.openai_sampling import RENAMED, finish_reason, sampling_params
from radixflow.frontend.openai_schemas import (
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatMessage,
    ChatRequest, ChoiceLogprobs, Delta, TokenLogprob, TopLogprob,
)
from radixflow.frontend.streams import EventStream, Fanout, guarded, sse

log = logging.getLogger(__name__)

MAX_TOP_LOGPROBS = 20


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: text content, `developer` read as `system`."""
    out = []
    for m in messages:
        content = m.content if m.content is None or isinstance(m.content, str) else "".join(p.text for p in m.content)
        msg = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.name is not None:
            msg["name"] = m.name
        out.append(msg)
    return out


def prompt_ids(req: ChatRequest, tokenizer: Any) -> list[int]:
    try:
        return tokenizer.apply_chat_template(template_messages(req.messages), add_generation_prompt=True,
                                             tokenize=True)
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages") from exc


def _check(req: ChatRequest) -> None:
    if req.tools:
        raise APIError(400, "tools are not supported", param="tools")
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        if not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
            raise APIError(400, f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs")


def to_logprobs(meta: dict, tokenizer: Any) -> ChoiceLogprobs | None:
    """Native output logprob entries ([logprob, token_id, text]) → OpenAI chat logprobs."""
    if "output_token_logprobs" not in meta:
        return None
    tops = meta.get("output_top_logprobs") or [None] * len(meta["output_token_logprobs"])

    def top(entry: list) -> TopLogprob:
        return TopLogprob(entry[2] or "", entry[0], list(tokenizer.token_bytes(entry[1])))

    content = [TokenLogprob(e[2] or "", e[0], list(tokenizer.token_bytes(e[1])), [top(t) for t in (ts or [])])
               for e, ts in zip(meta["output_token_logprobs"], tops)]
    return ChoiceLogprobs(content)


async def create_chat_completion(request: Request) -> Response:
    engine = request.app.state.server.engine
    req = await read_json(request, ChatRequest, RENAMED)
    check_model(request, req.model)
    _check(req)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    sp = sampling_params(req, engine, max_tokens)
    ids = await asyncio.to_thread(prompt_ids, req, engine.tokenizer)
    options = {"return_logprob": req.logprobs, "top_logprobs_num": req.top_logprobs or 0,
               "return_text_in_logprobs": True, "logprob_start_len": -1}
    fanout, shared = await start(request, [ids], sp, options)
    head = {"id": new_id("chatcmpl"), "created": now(), "model": req.model}
    if req.stream:
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        events = _events(fanout, engine.tokenizer, sp.n, shared, head, include_usage)
        return EventStream(guarded(events, fanout, "chat"))
    results = await fanout.finish(request.receive)
    choices = [ChatChoice(i, AssistantMessage(content=r["text"]), to_logprobs(r["meta_info"], engine.tokenizer),
                          finish_reason(r["meta_info"])) for i, r in enumerate(results)]
    metas = {i: r["meta_info"] for i, r in enumerate(results)}
    return json_response(ChatCompletion(**head, choices=choices, usage=usage(metas, sp.n, shared)))


async def _events(fanout: Fanout, tokenizer: Any, n: int, shared: dict[int, int], head: dict,
                  include_usage: bool) -> AsyncIterator[bytes]:
    """Role chunk per choice first; then content deltas with finish_reason null; each choice's
    last chunk carries its finish_reason; then the usage chunk (if asked) and [DONE]."""
    sent: dict[int, str] = {}
    metas: dict[int, dict] = {}
    for index in range(n):
        yield sse(ChatCompletionChunk(**head, choices=[
            ChatChunkChoice(index, Delta(role="assistant", content=""), None, None)]))
    async for index, chunk in fanout:
        meta = metas[index] = chunk["meta_info"]
        delta = chunk["text"][len(sent.get(index, "")):]
        sent[index] = chunk["text"]
        lp = to_logprobs(meta, tokenizer)
        reason = finish_reason(meta)
        if delta or reason is not None or (lp is not None and lp.content):
            yield sse(ChatCompletionChunk(**head, choices=[
                ChatChunkChoice(index, Delta(content=delta) if delta else Delta(), lp, reason)]))
    if include_usage:
        yield sse(ChatCompletionChunk(**head, choices=[], usage=usage(metas, n, shared)))

