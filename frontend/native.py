"""SGLang-compatible native routes: /generate, model/server info, cache, health, abort."""
from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.body import json_response, off_loop_if_large, read_json
from radixflow.frontend.errors import RETRY_AFTER_S, APIError, bad_request
from radixflow.frontend.in_flight import InFlight
from radixflow.frontend.limits import RequestLimits
from radixflow.frontend.reasoning import SeparateRequest, separate
from radixflow.frontend.streams import SSE_DONE, EventStream, Fanout, launch, sse
from radixflow.runtime.sampling_params import RequestOptions, SamplingParams, request_option_names
from radixflow.runtime.text.reasoning import check_reasoning_parser

log = logging.getLogger(__name__)


class GenerateRequest(RequestOptions, kw_only=True, forbid_unknown_fields=True):
    """SGLang's GenerateReqInput, the fields radixflow serves: RequestOptions' own (declared
    there) and these. `sampling_params` keys are SamplingParams' own (validated there).
    Harmless SGLang fields radixflow does not implement are accepted and ignored (logged once
    per request); those whose meaning matters are a 400."""

    text: str | list[str] | None = None
    input_ids: list[int | list[int]] | None = None  # one prompt's ids, or a list of them
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    rid: str | list[str] | None = None
    # accepted and ignored when harmless
    image_data: Any = None
    log_metrics: bool = True
    custom_logit_processor: Any = None


def _check_unsupported(req: GenerateRequest) -> None:
    """400 naming a field whose effect radixflow cannot give."""
    if req.image_data not in (None, [], ""):
        raise APIError(400, "image_data is not supported: this server has no vision model", param="image_data")
    if req.custom_logit_processor is not None:
        raise APIError(400, "custom_logit_processor is not supported", param="custom_logit_processor")


def _check_sizes(req: GenerateRequest, limits: RequestLimits) -> None:
    """Limits on the raw request, before any tokenization."""
    limits.check_session(req.session_id, "session_id")
    if isinstance(req.text, str):
        limits.check_text(len(req.text), "text")
    elif req.text is not None:
        limits.check_prompts(len(req.text), "text")
        limits.check_text(sum(len(t) for t in req.text if isinstance(t, str)), "text")
    if req.input_ids is not None:
        lists = [x for x in req.input_ids if isinstance(x, list)]
        limits.check_prompts(max(1, len(lists)), "input_ids")
        limits.check_ids(sum(len(x) for x in lists) + len(req.input_ids) - len(lists), "input_ids")
    raw = req.sampling_params if isinstance(req.sampling_params, list) else [req.sampling_params]
    for params in raw:
        if isinstance(params, dict):
            limits.check_sampling(params)
    try:
        options(req).validate()
    except ValueError as exc:
        raise APIError(400, str(exc), param=str(exc).split()[0]) from exc
    limits.check_top_logprobs(req.top_logprobs_num, "top_logprobs_num")


def options(req: GenerateRequest) -> RequestOptions:
    return RequestOptions(**{name: getattr(req, name) for name in request_option_names()})


def prompt_inputs(req: Any, tokenizer: Any) -> tuple[list[list[int]], bool]:
    """(token ids per input, whether the request is a batch) of a native request's `text` or
    `input_ids` (/generate's, /encode's)."""
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
    names: dict[str, str]  # bad_request's: the prompt field given and the constraint's field


def _client_names(req: GenerateRequest, sampling: list[SamplingParams]) -> dict[str, str]:
    """The engine's "prompt" and "grammar" errors → the fields this request used."""
    grammar = next((name for sp in sampling for name in ("regex", "json_schema", "choices", "ebnf", "structural_tag")
                    if getattr(sp, name) is not None), "grammar")
    return {"prompt": "text" if req.input_ids is None else "input_ids", "grammar": grammar}


def check_generate(req: GenerateRequest, limits: RequestLimits) -> None:
    """Every check that needs no tokenizer (cheap: run on the event loop, before tokenizing)."""
    _check_unsupported(req)
    _check_sizes(req, limits)


def parse_generate(req: GenerateRequest, tokenizer: Any) -> GenerateJob:
    """Tokenize and validate (APIError 400). Blocking: call off the event loop, after check_generate."""
    prompts, is_batch = prompt_inputs(req, tokenizer)
    sampling = _sampling(_per_input(req.sampling_params, len(prompts), "sampling_params"))
    rids = _per_input(req.rid, len(prompts), "rid")
    base = options(req).engine_kwargs()
    return GenerateJob(prompts, sampling, [{**base, "rid": rid} for rid in rids],
                       single=not is_batch and sampling[0].n == 1, names=_client_names(req, sampling))


async def start_generate(receive: Any, engine: Any, job: GenerateJob, in_flight: InFlight | None = None) -> Fanout:
    try:
        fanout, _ = await launch(receive, engine, job.prompts, job.sampling, job.options, in_flight)
    except ValueError as exc:
        raise bad_request(exc, job.names) from exc
    return fanout


def check_failed(result: dict) -> None:
    """An engine failure (finish reason type "error") is an APIError(500) with its message."""
    reason = result["meta_info"].get("finish_reason") or {}
    if reason.get("type") == "error":
        raise APIError(500, f"generation failed: {reason.get('message') or 'internal error'}",
                       code="internal_error")


async def generate_result(receive: Any, engine: Any, job: GenerateJob,
                          in_flight: InFlight | None = None) -> dict | list[dict]:
    """Run to completion (aborted if `receive` reports a disconnect; None: never)."""
    results = await (await start_generate(receive, engine, job, in_flight)).finish(receive)
    for result in results:
        check_failed(result)
    return results[0] if job.single else results


async def generate(request: Request) -> Response:
    server = request.app.state.server
    engine = server.engine
    req = await read_json(request, GenerateRequest)
    check_generate(req, server.limits)
    job = await off_loop_if_large(request, parse_generate, req, engine.tokenizer)
    if not req.stream:
        return json_response(await generate_result(request.receive, engine, job, server.in_flight))
    for opts in job.options:  # SGLang's stream shape: cumulative chunks, unless the server says otherwise
        opts["incremental"] = server.incremental_streaming_output
    fanout = await start_generate(request.receive, engine, job, server.in_flight)
    return EventStream(_events(fanout, job.single))


async def _events(fanout: Fanout, single: bool) -> AsyncIterator[bytes]:
    """SSE chunks: cumulative text and output_ids (only new ones with --incremental-streaming-output);
    output logprobs only new ones; `index` when several."""
    try:
        async for index, chunk in fanout:
            check_failed(chunk)
            if single and chunk["meta_info"]["finish_reason"] is not None:
                yield sse(chunk) + SSE_DONE  # the last event and the end in one write
                return
            yield sse(chunk if single else {**chunk, "index": index})
    except APIError as exc:  # the response has begun: report in-band
        yield sse(exc.body())
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
                          "max_context_len": engine.max_context_len, "role_markers": server.role_markers,
                          "weight_version": await asyncio.to_thread(engine.get_weight_version)})


async def get_server_info(request: Request) -> Response:
    server = request.app.state.server
    engine = server.engine
    return json_response({
        "version": importlib.metadata.version("radixflow"), "model_path": engine.model_path,
        "served_model_name": server.served_model_name,
        "max_context_len": engine.max_context_len, "kv_cache_tokens": engine.stats().kv_slots_total,
        "supports_grammar": bool(getattr(engine, "supports_grammar", False)),
        "tool_call_parser": server.tool_call_parser, "reasoning_parser": server.reasoning_parser,
        "weight_updates": server.weight_updates,
        "api_server_pid": os.getpid(), "engine_core_pid": getattr(engine, "core_pid", os.getpid()),
        "config": dataclasses.asdict(engine.config), "stats": dataclasses.asdict(engine.stats()),
    })


async def version(request: Request) -> Response:
    return json_response({"version": importlib.metadata.version("radixflow")})


async def flush_cache(request: Request) -> Response:
    await asyncio.to_thread(request.app.state.server.engine.flush_cache)
    return Response("Cache flushed.\n", media_type="text/plain")


async def health(request: Request) -> Response:
    return Response(status_code=200)


async def health_generate(request: Request) -> Response:
    """Generates one token end to end; 503 if the engine cannot (at once while admission is
    paused: /pause_generation, or a weight update waiting for the running requests)."""
    engine = request.app.state.server.engine
    if engine.stats().admission_paused:
        raise APIError(503, "generation is paused (/pause_generation, or a weight update in progress)",
                       headers={"Retry-After": str(RETRY_AFTER_S)})
    ids = engine.tokenizer.encode("ping")

    async def probe() -> None:  # its start too waits for the engine (the first chunk): timed as a whole
        fanout, _ = await launch(request.receive, engine, [ids], [SamplingParams.from_dict({"max_new_tokens": 1})],
                                 [{}])
        try:
            await fanout.collect()
        finally:
            await fanout.close()

    try:
        await asyncio.wait_for(probe(), timeout=request.app.state.server.health_timeout_s)
    except (TimeoutError, RuntimeError, ValueError) as exc:  # ValueError: QueueFullError under load
        why = f"nothing within {request.app.state.server.health_timeout_s} s" if isinstance(exc, TimeoutError) else exc
        raise APIError(503, f"the engine did not generate: {why}", headers={"Retry-After": str(RETRY_AFTER_S)}) from exc
    return Response(status_code=200)


async def get_load(request: Request) -> Response:
    """SGLang's /get_load: one entry per data-parallel rank (radixflow has one)."""
    s = request.app.state.server.engine.stats()
    return json_response([{"dp_rank": 0, "num_reqs": s.num_running + s.num_waiting,
                           "num_waiting_reqs": s.num_waiting, "num_tokens": s.kv_slots_used}])


class AbortRequest(msgspec.Struct, forbid_unknown_fields=True):
    rid: str = ""
    abort_all: bool = False


async def abort_request(request: Request) -> Response:
    """Abort one request by rid (each sample of an n > 1 request), or every request in flight
    with `abort_all`."""
    req = await read_json(request, AbortRequest)
    server = request.app.state.server
    if req.abort_all:
        await asyncio.to_thread(server.engine.abort_all)
    elif req.rid:
        server.in_flight.abort(server.engine, req.rid)
    else:
        raise APIError(400, "give rid, or abort_all: true", param="rid")
    return Response(status_code=200)


async def concate_and_append_request(request: Request) -> Response:
    """SGLang's join(mode="concate_and_append"): the client already holds the joined text; no-op."""
    await read_json(request)
    return Response(status_code=200)


async def separate_reasoning(request: Request) -> Response:
    """A thinking model's text split into its answer and its reasoning (frontend/reasoning.py)."""
    req = await read_json(request, SeparateRequest)
    server = request.app.state.server
    server.limits.check_text(len(req.text), "text")
    try:
        name = (check_reasoning_parser(server.reasoning_parser) if req.reasoning_parser is None
                else check_reasoning_parser(req.reasoning_parser, "reasoning_parser"))
    except ValueError as exc:
        raise APIError(400, str(exc), param="reasoning_parser") from None
    if name is None:
        raise APIError(400, "give reasoning_parser: this server has no --reasoning-parser", param="reasoning_parser")
    return json_response(separate(req.text, name))
