"""POST /v1/completions: prompt strings or token ids; n, stop, echo, logprobs, streaming."""
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
from radixflow.frontend.openai_schemas import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest
from radixflow.frontend.streams import EventStream, Fanout, guarded, sse

log = logging.getLogger(__name__)

MAX_LOGPROBS = 20


def parse_prompts(prompt: Any, tokenizer: Any) -> tuple[list[list[int]], list[str]]:
    """(token ids, text) per prompt from a string, a list of strings, token ids, or a list of those."""
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt)], [prompt]
    if prompt and all(isinstance(p, str) for p in prompt):
        return [tokenizer.encode(p) for p in prompt], list(prompt)
    if prompt and all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]
    elif prompt and all(isinstance(p, list) for p in prompt):
        prompts = [list(p) for p in prompt]
    else:
        raise APIError(400, "prompt must be a string, a list of strings, a list of token ids, or a list "
                       "of token id lists (non-empty, not mixed)", param="prompt")
    return prompts, [tokenizer.decode(ids) for ids in prompts]


def to_logprobs(entries: list, tops: list | None, offset: int) -> CompletionLogprobs:
    """Native [logprob, token_id, text] entries → OpenAI's legacy logprobs object."""
    tokens = [e[2] or "" for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    top = [None if t is None else {x[2] or "": x[0] for x in t} for t in tops] if tops else [None] * len(entries)
    return CompletionLogprobs(tokens, [e[0] for e in entries], top, offsets)


def chunk_logprobs(meta: dict, offset: int, echo_text: str | None = None) -> CompletionLogprobs | None:
    """This chunk's output tokens from character `offset` on; with `echo_text` (first chunk of an
    echo request) the prompt's tokens first, and the output's offsets start after that text."""
    if "output_token_logprobs" not in meta:
        return None
    start = offset if echo_text is None else len(echo_text)
    out = to_logprobs(meta["output_token_logprobs"], meta.get("output_top_logprobs"), start)
    if echo_text is None:
        return out
    prompt = to_logprobs(meta.get("input_token_logprobs", []), meta.get("input_top_logprobs"), 0)
    return CompletionLogprobs(prompt.tokens + out.tokens, prompt.token_logprobs + out.token_logprobs,
                              prompt.top_logprobs + out.top_logprobs, prompt.text_offset + out.text_offset)


async def create_completion(request: Request) -> Response:
    server = request.app.state.server
    req = await read_json(request, CompletionRequest, RENAMED)
    check_model(request, req.model)
    if req.suffix:
        raise APIError(400, "suffix is not supported", param="suffix")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
        raise APIError(400, f"logprobs must be in [0, {MAX_LOGPROBS}]", param="logprobs")
    sp = sampling_params(req, server.engine, req.max_tokens)
    if req.best_of is not None and req.best_of != sp.n:
        raise APIError(400, "best_of other than n is not supported", param="best_of")
    prompts, texts = await asyncio.to_thread(parse_prompts, req.prompt, server.engine.tokenizer)
    options = {"return_logprob": req.logprobs is not None, "top_logprobs_num": req.logprobs or 0,
               "return_text_in_logprobs": True, "logprob_start_len": 0 if req.echo else -1}
    fanout, shared = await start(request, prompts, sp, options)
    head = {"id": new_id("cmpl"), "created": now(), "model": req.model}
    if req.stream:
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        events = _events(fanout, req, texts, sp.n, shared, head, include_usage)
        return EventStream(guarded(events, fanout, "completion"))
    results = await fanout.finish(request.receive)
    choices = []
    for index, res in enumerate(results):
        meta, prompt_text = res["meta_info"], texts[index // sp.n]
        text = (prompt_text if req.echo else "") + res["text"]
        lp = chunk_logprobs(meta, 0, prompt_text if req.echo else None)
        choices.append(CompletionChoice(index, text, lp, finish_reason(meta)))
    metas = {i: r["meta_info"] for i, r in enumerate(results)}
    return json_response(Completion(**head, choices=choices, usage=usage(metas, sp.n, shared)))


async def _events(fanout: Fanout, req: CompletionRequest, texts: list[str], n: int, shared: dict[int, int],
                  head: dict, include_usage: bool) -> AsyncIterator[bytes]:
    """One chunk per engine chunk with new text or tokens; finish_reason only on each choice's last."""
    sent: dict[int, str] = {}
    offsets: dict[int, int] = {}
    metas: dict[int, dict] = {}
    async for index, chunk in fanout:
        meta, first = chunk["meta_info"], index not in metas
        metas[index] = meta
        delta = chunk["text"][len(sent.get(index, "")):]
        sent[index] = chunk["text"]
        echo_text = texts[index // n] if first and req.echo else None
        if echo_text is not None:
            delta = echo_text + delta
        lp = chunk_logprobs(meta, offsets.get(index, 0), echo_text)
        if lp is not None and lp.text_offset:
            offsets[index] = lp.text_offset[-1] + len(lp.tokens[-1])
        reason = finish_reason(meta)
        if delta or reason is not None or (lp is not None and lp.tokens):
            yield sse(Completion(**head, choices=[CompletionChoice(index, delta, lp, reason)]))
    if include_usage:
        yield sse(Completion(**head, choices=[], usage=usage(metas, n, shared)))

