"""SGLang-compatible native routes: /generate, model/server info, cache, health, abort."""
from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.body import json_response, read_json
from radixflow.frontend.errors import APIError, bad_request
from radixflow.frontend.streams import SSE_DONE, EventStream, Fanout, launch, sse
from radixflow.runtime.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class GenerateRequest(msgspec.Struct, forbid_unknown_fields=True):
    """SGLang's GenerateReqInput, the fields radixflow serves. `sampling_params` keys are
    SamplingParams' own (validated there)."""

    text: str | list[str] | None = None
    input_ids: list[int | list[int]] | None = None  # one prompt's ids, or a list of them
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[str] | None = None
    lora_path: str | None = None


def _inputs(req: GenerateRequest, tokenizer: Any) -> tuple[list[list[int]], bool]:
    """(token ids per input, whether the request is a batch)."""
    if (req.text is None) == (req.input_ids is None):
        raise APIError(400, "give exactly one of text and input_ids", param="text")
    if isinstance(req.text, str):
        return [tokenizer.encode(req.text)], False
    if req.text is not None:
        if not req.text:
            raise APIError(400, "text must not be an empty list", param="text")
        return [tokenizer.encode(t) for t in req.text], True
    if not req.input_ids:
        raise APIError(400, "input_ids must not be empty", param="input_ids")
    if all(isinstance(t, int) for t in req.input_ids):
        return [list(req.input_ids)], False
    if all(isinstance(ids, list) for ids in req.input_ids):
        return [list(ids) for ids in req.input_ids], True
    raise APIError(400, "input_ids must be a list of ints or a list of such lists", param="input_ids")


def _per_input(value: Any, n: int, name: str) -> list:
    if isinstance(value, list):
        if len(value) != n:
            raise APIError(400, f"got {len(value)} {name} for {n} inputs", param=name)
        return value
    return [value] * n


def _sampling(raw: list[dict | None]) -> list[SamplingParams]:
    try:
        return [SamplingParams.from_dict(p) for p in raw]
    except ValueError as exc:
        raise bad_request(exc) from exc


@dataclass
class GenerateJob:
    """A validated /generate request: what to launch and how to shape the answer."""

    prompts: list[list[int]]
    sampling: list[SamplingParams]
    options: list[dict[str, Any]]
    # SGLang's shapes: one input with n == 1 → an object; one input with n > 1 → a list of n;
    # a batch → a flat list, input-major (input i, sample j at i * n + j).
    single: bool


def parse_generate(req: GenerateRequest, tokenizer: Any) -> GenerateJob:
    """Tokenize and validate (APIError 400). Blocking: call off the event loop for big inputs."""
    prompts, is_batch = _inputs(req, tokenizer)
    sampling = _sampling(_per_input(req.sampling_params, len(prompts), "sampling_params"))
    rids = _per_input(req.rid, len(prompts), "rid")
    if req.lora_path is not None:
        raise APIError(400, "LoRA adapters are not supported yet", param="lora_path")
    if req.top_logprobs_num < 0:
        raise APIError(400, "top_logprobs_num must be >= 0", param="top_logprobs_num")
    base = {"return_logprob": req.return_logprob, "logprob_start_len": req.logprob_start_len,
            "top_logprobs_num": req.top_logprobs_num, "return_text_in_logprobs": req.return_text_in_logprobs}
    return GenerateJob(prompts, sampling, [{**base, "rid": rid} for rid in rids],
                       single=not is_batch and sampling[0].n == 1)


async def start_generate(receive: Any, engine: Any, job: GenerateJob) -> Fanout:
    try:
        fanout, _ = await launch(receive, engine, job.prompts, job.sampling, job.options)
    except ValueError as exc:
        raise bad_request(exc) from exc
    return fanout


async def generate_result(receive: Any, engine: Any, job: GenerateJob) -> dict | list[dict]:
    """Run to completion (aborted if `receive` reports a disconnect; None: never)."""
    results = await (await start_generate(receive, engine, job)).finish(receive)
    return results[0] if job.single else results


async def generate(request: Request) -> Response:
    engine = request.app.state.server.engine
    req = await read_json(request, GenerateRequest)
    job = await asyncio.to_thread(parse_generate, req, engine.tokenizer)
    if not req.stream:
        return json_response(await generate_result(request.receive, engine, job))
    fanout = await start_generate(request.receive, engine, job)
    return EventStream(_events(fanout, job.single))


async def _events(fanout: Fanout, single: bool) -> AsyncIterator[bytes]:
    """SSE chunks: cumulative text; output logprobs only new ones; `index` when several."""
    try:
        async for index, chunk in fanout:
            yield sse(chunk if single else {**chunk, "index": index})
    except Exception as exc:  # the response has begun: report in-band
        log.exception("generate stream failed")
        yield sse(APIError(500, f"generation failed: {exc}").body())
    finally:
        await fanout.close()
    yield SSE_DONE


async def get_model_info(request: Request) -> Response:
    server = request.app.state.server
    engine = server.engine
    return json_response({"model_path": engine.model_path, "tokenizer_path": engine.model_path,
                          "is_generation": True, "served_model_name": server.served_model_name,
                          "max_context_len": engine.max_context_len, "role_markers": server.role_markers})


async def get_server_info(request: Request) -> Response:
    server = request.app.state.server
    engine = server.engine
    return json_response({
        "version": importlib.metadata.version("radixflow"), "model_path": engine.model_path,
        "served_model_name": server.served_model_name,
        "max_context_len": engine.max_context_len, "kv_cache_tokens": engine.stats().kv_slots_total,
        "supports_grammar": bool(getattr(engine, "supports_grammar", False)),
        "config": dataclasses.asdict(engine.config), "stats": dataclasses.asdict(engine.stats()),
    })


async def flush_cache(request: Request) -> Response:
    await asyncio.to_thread(request.app.state.server.engine.flush_cache)
    return Response("Cache flushed.\n", media_type="text/plain")


async def health(request: Request) -> Response:
    return Response(status_code=200)


async def health_generate(request: Request) -> Response:
    """Generates one token end to end; 503 if the engine cannot."""
    engine = request.app.state.server.engine
    ids = engine.tokenizer.encode("ping")
    try:
        fanout, _ = await launch(request.receive, engine, [ids], [SamplingParams.from_dict({"max_new_tokens": 1})],
                                 [{}])
        try:
            await asyncio.wait_for(fanout.collect(), timeout=request.app.state.server.health_timeout_s)
        finally:
            await fanout.close()
    except (TimeoutError, RuntimeError) as exc:
        raise APIError(503, f"the engine did not generate: {exc!r}") from exc
    return Response(status_code=200)


class AbortRequest(msgspec.Struct, forbid_unknown_fields=True):
    rid: str


async def abort_request(request: Request) -> Response:
    req = await read_json(request, AbortRequest)
    request.app.state.server.engine.abort(req.rid)
    return Response(status_code=200)


async def concate_and_append_request(request: Request) -> Response:
    """SGLang's join(mode="concate_and_append"): the client already holds the joined text; no-op."""
    await read_json(request)
    return Response(status_code=200)
