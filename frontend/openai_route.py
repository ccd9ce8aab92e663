"""The OpenAI route, written once: validate → tokenize off the loop → launch → answer or stream.

/v1/completions and /v1/chat/completions differ only in a `Shape` (completions.py, chat.py):
how the request becomes prompts and options, and how results and stream deltas become
OpenAI objects. Everything else (limits, max_tokens against the context, engine failures as
500s or in-band error chunks, usage, [DONE]) lives here.
"""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.body import json_response, off_loop_if_large, read_json
from radixflow.frontend.errors import APIError
from radixflow.frontend.openai_common import check_model, new_id, now, start, usage
from radixflow.frontend.openai_sampling import RENAMED, Constraint, client_names, request_constraint, sampling_params
from radixflow.frontend.openai_schemas import PromptTokensDetails, Usage
from radixflow.frontend.streams import EventStream, Fanout, guarded, sse
from radixflow.runtime.sampling_params import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class Prompts:
    """What a Shape's `prompts` returns: token ids per prompt, and each prompt's text (for echo)."""

    ids: list[list[int]]
    texts: list[str]


@dataclass
class Job:
    """One validated OpenAI request on its way through the route."""

    req: Any
    prompts: Prompts
    sampling: SamplingParams
    head: dict[str, Any]
    shared: dict[int, int] = field(default_factory=dict)  # prompt → cached_tokens before its n samples
    streams: dict[int, Any] = field(default_factory=dict)  # per choice: its stream's state
    state: Any = None  # what the shape's check() returned (chat: the request's ChatPlan)


class Shape(Protocol):
    """The per-endpoint part of the route."""

    schema: type
    id_prefix: str
    prompt_param: str

    def check(self, req: Any, request: Request) -> Any: ...
    def constraint(self, state: Any, own: Constraint | None) -> Constraint | None: ...
    def max_tokens(self, req: Any) -> int | None: ...
    def max_tokens_param(self, req: Any) -> str: ...
    def prompts(self, req: Any, tokenizer: Any) -> Prompts: ...
    def options(self, req: Any) -> dict[str, Any]: ...
    def response(self, job: Job, results: list[dict], tokenizer: Any) -> msgspec.Struct: ...
    def opening(self, job: Job) -> list[msgspec.Struct]: ...
    def delta(self, job: Job, index: int, chunk: dict, reason: str | None, tokenizer: Any) -> msgspec.Struct | None: ...
    def chunk(self, job: Job, choices: list, usage: Any) -> msgspec.Struct: ...


def finish_reason(meta: dict) -> str | None:
    """OpenAI's finish_reason; an engine failure is an APIError(500) carrying its message."""
    reason = meta.get("finish_reason")
    if reason is None:
        return None
    kind = reason.get("type", "stop")
    if kind == "error":
        raise APIError(500, f"generation failed: {reason.get('message') or 'internal error'}",
                       code="internal_error")
    return kind


def fit_context(job_prompts: list[list[int]], sp: SamplingParams, requested: int | None, engine: Any,
                param: str) -> list[SamplingParams]:
    """Per prompt: max_tokens defaults to the rest of the context; prompt + max_tokens beyond
    the context is a 400 worded as vLLM words it, on `param` (the prompt's field, or the
    max_tokens field when one was given)."""
    out = []
    for ids in job_prompts:
        context = engine.max_context_len
        rest = context - len(ids)
        wanted = rest if requested is None else requested
        if rest <= 0 or wanted > rest:
            raise APIError(400, f"This model's maximum context length is {context} tokens. However, you "
                           f"requested {len(ids) + max(wanted, 0)} tokens ({len(ids)} in the messages, "
                           f"{max(wanted, 0)} in the completion). Please reduce the length of the messages "
                           "or completion.", param=param,
                           code="context_length_exceeded")
        out.append(sp if requested is not None else msgspec.structs.replace(sp, max_new_tokens=wanted))
    return out


async def handle(request: Request, shape: Shape) -> Response:
    req = await read_json(request, shape.schema, RENAMED)
    job, fanout = await prepare(request, shape, req)
    tokenizer = request.app.state.server.engine.tokenizer
    if req.stream:
        options = req.stream_options
        include_usage = options is not None and options.include_usage
        continuous = include_usage and options.continuous_usage_stats
        return EventStream(guarded(_events(fanout, shape, job, tokenizer, include_usage, continuous), fanout,
                                   shape.id_prefix))
    results = await fanout.finish(request.receive)
    return json_response(shape.response(job, results, tokenizer))


async def prepare(request: Request, shape: Shape, req: Any) -> tuple[Job, Fanout]:
    """Check `req` (the shape's request), tokenize its prompts and start its engine streams: the
    running job and its fan-out, which the caller answers from and closes."""
    server = request.app.state.server
    engine = server.engine
    server.limits.check_session(req.user, "user")
    lora = check_model(request, req.model)
    state = shape.check(req, request)
    own = request_constraint(req, engine)  # None when the route constrains (it refused the request's own)
    constraint = shape.constraint(state, own)
    requested, requested_param = shape.max_tokens(req), shape.max_tokens_param(req)
    names = client_names(requested_param, shape.prompt_param, constraint)
    sp = sampling_params(req, requested, server.limits, names, constraint)
    prompts = await off_loop_if_large(request, shape.prompts, req, engine.tokenizer)
    per_prompt = fit_context(prompts.ids, sp, requested, engine,
                             shape.prompt_param if requested is None else requested_param)
    job = Job(req, prompts, sp, {"id": new_id(shape.id_prefix), "created": now(), "model": req.model},
              state=state)
    # the fan-out's chunks are incremental (O(new tokens) each): a stream sends them as deltas
    fanout, job.shared = await start(request, prompts.ids, per_prompt, {**shape.options(req), "lora_path": lora},
                                     names)
    return job, fanout


def encode_chunk(chunk: msgspec.Struct, include_usage: bool) -> bytes:
    """A stream chunk: `usage` is present (null until the last chunk) only with include_usage."""
    data = msgspec.to_builtins(chunk)
    if not include_usage:
        data.pop("usage", None)
    return sse(data)


async def _events(fanout: Fanout, shape: Shape, job: Job, tokenizer: Any, include_usage: bool,
                  continuous: bool = False) -> AsyncIterator[bytes]:
    """Opening chunks, one chunk per engine chunk with something new, then the usage chunk.
    `continuous` (vLLM's continuous_usage_stats): each chunk after the opening carries its
    choice's usage so far."""
    metas: dict[int, dict] = {}
    for chunk in shape.opening(job):
        yield encode_chunk(chunk, include_usage)
    async for index, engine_chunk in fanout:
        meta = metas[index] = engine_chunk["meta_info"]
        out = shape.delta(job, index, engine_chunk, finish_reason(meta), tokenizer)
        if out is not None:
            if continuous:
                out.usage = choice_usage(meta)
            yield encode_chunk(out, include_usage)
    if include_usage:
        yield sse(shape.chunk(job, [], usage(metas, job.sampling.n, job.shared)))


def choice_usage(meta: dict) -> Usage:
    """One choice's usage so far, from its latest meta_info."""
    prompt, completion = meta["prompt_tokens"], meta["completion_tokens"]
    return Usage(prompt, completion, prompt + completion, PromptTokensDetails(meta["cached_tokens"]))


def response_usage(job: Job, results: list[dict]) -> Any:
    return usage({i: r["meta_info"] for i, r in enumerate(results)}, job.sampling.n, job.shared)
