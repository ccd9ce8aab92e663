"""The HTTP server: app factory (engine started and stopped in the lifespan) and `radixflow serve`."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from radixflow.frontend import embeddings, native, weight_routes
from radixflow.frontend.body import json_response
from radixflow.frontend.chat import create_chat_completion
from radixflow.frontend.completions import create_completion
from radixflow.frontend.errors import (
    AnswerUnexpected, APIError, api_error_handler, http_error_handler, internal_error_handler,
)
from radixflow.frontend.lora_routes import adapter_cards, load_lora_adapter, unload_lora_adapter
from radixflow.frontend.limits import ProgramLimits, RequestLimits, limits_from_flags
from radixflow.frontend.openai_common import check_model, now
from radixflow.frontend.openai_schemas import ModelCard, ModelList
from radixflow.frontend.openapi import openapi_json
from radixflow.frontend.programs import run_program
from radixflow.frontend.response_store import DEFAULT_MAX_RESPONSES, ResponseStore
from radixflow.frontend.responses import create_response, input_items, response_by_id
from radixflow.frontend.score import create_score
from radixflow.frontend.state import Gate, ServerState, refusal
from radixflow.frontend.tokenize import detokenize, tokenize
from radixflow.frontend.tool_call_formats import check_parser_name
from radixflow.frontend.streams import ClientGone
from radixflow.runtime.text.reasoning import check_reasoning_parser

log = logging.getLogger(__name__)

EngineOrFactory = Any  # an Engine (the caller owns it) or a zero-argument callable returning one (we own it)


def _model_card(request: Request, model: str | None = None) -> ModelCard:
    server = request.app.state.server
    if model is not None:  # a LoRA adapter
        return next(c for c in adapter_cards(server, server.engine.max_context_len) if c.id == model)
    return ModelCard(id=server.served_model_name, created=now(), root=server.engine.model_path,
                     max_model_len=server.engine.max_context_len)


async def list_models(request: Request) -> Response:
    server = request.app.state.server
    return json_response(ModelList(data=[_model_card(request), *adapter_cards(server, server.engine.max_context_len)]))


async def get_model(request: Request) -> Response:
    lora = check_model(request, request.path_params["model"])
    return json_response(_model_card(request, lora))


async def metrics(request: Request) -> Response:
    m = request.app.state.server.metrics
    return Response(m.render(), media_type=m.content_type)


ROUTES = [
    Route("/v1/completions", create_completion, methods=["POST"]),
    Route("/v1/chat/completions", create_chat_completion, methods=["POST"]),
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/{response_id}", response_by_id, methods=["GET", "DELETE"]),
    Route("/v1/responses/{response_id}/input_items", input_items, methods=["GET"]),
    Route("/v1/embeddings", embeddings.create_embedding, methods=["POST"]),
    Route("/v1/score", create_score, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model:path}", get_model, methods=["GET"]),
    Route("/v1/programs", run_program, methods=["POST"]),
    Route("/v1/load_lora_adapter", load_lora_adapter, methods=["POST"]),
    Route("/v1/unload_lora_adapter", unload_lora_adapter, methods=["POST"]),
    Route("/generate", native.generate, methods=["POST"]),
    Route("/encode", embeddings.encode, methods=["POST"]),
    Route("/get_model_info", native.get_model_info, methods=["GET"]),
    Route("/model_info", native.get_model_info, methods=["GET"]),
    Route("/get_load", native.get_load, methods=["GET"]),
    Route("/get_server_info", native.get_server_info, methods=["GET"]),
    Route("/server_info", native.get_server_info, methods=["GET"]),
    Route("/flush_cache", native.flush_cache, methods=["GET", "POST"]),
    Route("/update_weights_from_disk", weight_routes.update_weights_from_disk, methods=["POST"]),
    Route("/get_weight_version", weight_routes.get_weight_version, methods=["GET"]),
    Route("/update_weight_version", weight_routes.update_weight_version, methods=["POST"]),
    Route("/pause_generation", weight_routes.pause_generation, methods=["POST"]),
    Route("/continue_generation", weight_routes.continue_generation, methods=["POST"]),
    Route("/version", native.version, methods=["GET"]),
    Route("/health", native.health, methods=["GET"]),
    Route("/health_generate", native.health_generate, methods=["GET"]),
    Route("/abort_request", native.abort_request, methods=["POST"]),
    Route("/separate_reasoning", native.separate_reasoning, methods=["POST"]),
    Route("/concate_and_append_request", native.concate_and_append_request, methods=["POST"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/v1/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/v1/detokenize", detokenize, methods=["POST"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
]


async def _client_gone(request: Request, exc: Exception) -> Response:
    """ClientGone (the engine requests were aborted) or ClientDisconnect (gone mid-body): nobody
    is listening, nothing to log."""
    return Response(status_code=499)


# POST to these skips starlette's middleware stack and router: the per-request layers and, on a
# stream, the wrappers every chunk's `send` went through (~7% of the API server's CPU over a burst
# of 256 streams). Other methods on these paths still reach the router (405).
DIRECT_ROUTES = {"/generate": native.generate, "/v1/completions": create_completion,
                 "/v1/chat/completions": create_chat_completion, "/v1/responses": create_response}


class App(Starlette):
    """The Starlette app with a direct lane for the generation routes: the Gate's check, the
    endpoint, its response sent on the server's own `send`; an exception before the response
    answered by the app's exception handlers (an unexpected one logged, as AnswerUnexpected
    logs it on the other routes)."""

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        endpoint = DIRECT_ROUTES.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if endpoint is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        error = refusal(self.state.server, scope)
        if error is not None:
            response = error.response()
        else:
            request = Request(scope, receive, send)
            try:
                response = await endpoint(request)
            except Exception as exc:
                response = await self._answer(request, exc)
        await response(scope, receive, send)

    async def _answer(self, request: Request, exc: Exception) -> Response:
        handler = next(self.exception_handlers[kind] for kind in type(exc).__mro__ if kind in self.exception_handlers)
        if handler is internal_error_handler:
            log.exception("%s %s failed", request.method, request.url.path)
        return await handler(request, exc)


def _is_factory(engine_or_factory: EngineOrFactory) -> bool:
    return callable(engine_or_factory) and not hasattr(engine_or_factory, "generate_stream")


async def _start(server: ServerState, engine_or_factory: EngineOrFactory) -> None:
    try:
        engine = (await asyncio.to_thread(engine_or_factory) if _is_factory(engine_or_factory)
                  else engine_or_factory)
        server.attach(engine)
    except ValueError as exc:  # a model or setting that cannot be served: the reason, in one line
        log.error("the engine failed to start: %s", exc)
        server.phase = "failed"
        if server.on_failure is not None:
            server.on_failure()
    except Exception:  # an unexpected failure: say why, with the traceback, stop serving
        log.exception("the engine failed to start")
        server.phase = "failed"
        if server.on_failure is not None:
            server.on_failure()


def create_app(engine_or_factory: EngineOrFactory, served_model_name: str | None = None,
               api_key: str | None = None, *, limits: RequestLimits | None = None,
               max_body_bytes: int | None = None, program_limits: ProgramLimits | None = None,
               health_timeout_s: float = 20.0, on_failure: Callable[[], None] | None = None,
               incremental_streaming_output: bool = False, tool_call_parser: str = "hermes",
               max_stored_responses: int = DEFAULT_MAX_RESPONSES, reasoning_parser: str | None = None,
               weight_updates: bool = False) -> Starlette:
    """The ASGI app. Given a factory, the engine is built in the background at start-up (requests
    get 503 until it is ready) and shut down when the app stops; given an Engine, the caller keeps
    ownership. `served_model_name` defaults to the engine's model path. `max_body_bytes`
    overrides that one field of `limits`. `incremental_streaming_output`: native streams send
    each chunk's new text and output_ids only. `tool_call_parser`: the format tool_choice "auto"
    output is parsed for (a tool_call_formats.PARSERS name; ValueError otherwise).
    `reasoning_parser`: how a chat output's reasoning is split from its answer (a reasoning.FORMATS
    name, or SGLang's spelling of one; None: it is not).
    `max_stored_responses`: /v1/responses kept in this process's memory for previous_response_id
    and GET (least recently used dropped first; 0: none). `weight_updates`: /update_weights_from_disk
    answers (it loads a path on this machine)."""
    tool_call_parser = check_parser_name(tool_call_parser)
    reasoning_parser = check_reasoning_parser(reasoning_parser)
    limits = limits or RequestLimits()
    if max_body_bytes is not None:
        limits = dataclasses.replace(limits, max_body_bytes=max_body_bytes)
    server = ServerState(served_model_name, api_key, limits, program_limits or ProgramLimits(), health_timeout_s,
                         on_failure=on_failure, incremental_streaming_output=incremental_streaming_output,
                         tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser,
                         responses=ResponseStore(max_stored_responses), weight_updates=weight_updates)
    owned = _is_factory(engine_or_factory)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        starting = asyncio.create_task(_start(server, engine_or_factory))
        try:
            yield
        finally:
            server.stop()
            server.program_pool.shutdown(wait=False, cancel_futures=True)
            await starting
            if owned and server.engine is not None:
                await asyncio.to_thread(server.engine.shutdown)

    middleware = [Middleware(AnswerUnexpected), Middleware(Gate, server=server)]
    app = App(routes=ROUTES, lifespan=lifespan, middleware=middleware,
              exception_handlers={APIError: api_error_handler, HTTPException: http_error_handler,
                                  ClientGone: _client_gone, ClientDisconnect: _client_gone,
                                  Exception: internal_error_handler})
    app.state.server = server
    return app


class _Server(uvicorn.Server):
    """Stops the app on SIGINT/SIGTERM: requests that still arrive get 503, those in flight are aborted."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self._state = state

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:  # the app started (the engine is up): its heap is long-lived
            from radixflow.runtime.core_process import freeze_heap

            freeze_heap()

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._state.stop()
        super().handle_exit(sig, frame)


def serve(ns: argparse.Namespace, engine_kwargs: dict[str, Any]) -> int:
    """`radixflow serve`: build the engine (`--model`, the demo model of `--demo-size`, or the
    default SmolLM2), serve the app with uvicorn on --host/--port until interrupted. Returns the
    exit status. The engine core runs in its own process (`--engine-core process`, the default),
    shared by `--api-server-count` HTTP server processes."""
    from radixflow.runtime import EngineConfig, demo_model
    from radixflow.runtime.model.default_model import DEFAULT_MODEL_NAME
    from radixflow.runtime.model.model_path import resolve_model_path

    kwargs = dict(engine_kwargs)
    model = kwargs.pop("model", None)
    demo_size = getattr(ns, "demo_size", None)
    count = getattr(ns, "api_server_count", 1)
    core = getattr(ns, "engine_core", "process")
    try:
        if not 0 <= ns.port <= 65535:
            raise ValueError(f"--port must be 0 to 65535, got {ns.port}")
        check_parser_name(getattr(ns, "tool_call_parser", "hermes"))
        check_reasoning_parser(getattr(ns, "reasoning_parser", None))
        path = model or (demo_model(demo_size) if demo_size else resolve_model_path(None))
        resolve_model_path(path)  # a path that cannot be a model fails here, before listening
        EngineConfig.from_kwargs(model=path, **kwargs)  # bad flags fail here, before listening
        if count < 1 or (count > 1 and core != "process"):
            raise ValueError("--api-server-count must be >= 1, and above 1 needs --engine-core process")
        stored = getattr(ns, "max_stored_responses", None)
        if stored is not None and (stored < 0 or (stored > 0 and count > 1)):
            raise ValueError("--max-stored-responses must be >= 0, and 0 with --api-server-count above 1: "
                             "each API server process keeps its own responses, and a request with "
                             "previous_response_id may reach another one")
    except ValueError as exc:
        log.error("radixflow serve: %s", exc)
        return 2
    name = ns.served_model_name or model or (f"radixflow-demo-{demo_size}" if demo_size else DEFAULT_MODEL_NAME)
    log.info("radixflow serving %r from %s at http://%s:%d (OpenAI: /v1, native: /generate, metrics: /metrics; "
             "engine core: %s, %d API server process%s)", name, path, ns.host, ns.port, core, count,
             "" if count == 1 else "es")
    if count > 1:
        return _serve_many(ns, path, kwargs, name, count)
    return _serve_one(ns, _engine_factory(core, path, kwargs), name)


def _engine_factory(core: str, path: str, kwargs: dict[str, Any], address: str | None = None) -> Callable[[], Any]:
    if core == "thread":
        from radixflow.runtime import Engine

        return lambda: Engine(path, **kwargs)
    from radixflow.runtime import EngineClient  # the engine's modules stay in its process: no torch here

    return lambda: EngineClient(path, address=address, **kwargs)


def _serve_one(ns: argparse.Namespace, factory: Callable[[], Any], name: str, sock: Any = None) -> int:
    """One HTTP server process (on `sock` when given, else --host/--port) until interrupted."""
    holder: dict[str, _Server] = {}
    failed: list[bool] = []

    def stop() -> None:  # the engine failed to start
        failed.append(True)
        holder["server"].should_exit = True

    limits, program_limits = limits_from_flags(ns)
    stored = getattr(ns, "max_stored_responses", None)
    if stored is None:  # one of several API servers (`sock` given) keeps none: see serve()
        stored = DEFAULT_MAX_RESPONSES if sock is None else 0
    app = create_app(factory, name, ns.api_key, on_failure=stop, limits=limits, program_limits=program_limits,
                     incremental_streaming_output=getattr(ns, "incremental_streaming_output", False),
                     tool_call_parser=getattr(ns, "tool_call_parser", "hermes"), max_stored_responses=stored,
                     reasoning_parser=getattr(ns, "reasoning_parser", None),
                     weight_updates=getattr(ns, "enable_weight_updates", False))
    config = uvicorn.Config(app, host=ns.host, port=ns.port, log_level=ns.log_level.lower(), lifespan="on",
                            timeout_graceful_shutdown=10)  # then open streams are cancelled (= aborted)
    server = holder["server"] = _Server(config, app.state.server)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises Ctrl-C after its graceful shutdown
        server.run(sockets=None if sock is None else [sock])
    # NOTE: the lifespan marks the app "stopping" as it exits, over "failed": `failed` remembers.
    return 1 if failed or app.state.server.phase == "failed" else 0


def _api_server(ns: argparse.Namespace, path: str, kwargs: dict[str, Any], name: str, address: str,
                sock: Any) -> None:
    """One of several API server processes (multiprocessing target): its own EngineClient on the
    shared core, uvicorn on the shared listening socket."""
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s [api %(process)d]: "
                        "%(message)s")
    raise SystemExit(_serve_one(ns, _engine_factory("process", path, kwargs, address), name, sock))


def _serve_many(ns: argparse.Namespace, path: str, kwargs: dict[str, Any], name: str, count: int) -> int:
    """Start the core, bind the port once, run `count` API server processes on it; on SIGINT or
    SIGTERM (or when one server exits) stop the servers, then the core."""
    import shutil
    import socket
    import tempfile

    sock = socket.socket(socket.AF_INET6 if ":" in ns.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:  # before the core starts: a busy port fails fast, with nothing to stop
        sock.bind((ns.host, ns.port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        log.error("radixflow serve: cannot listen on %s:%d: %s", ns.host, ns.port, exc)
        return 1
    folder = tempfile.mkdtemp(prefix="radixflow-core-")
    try:
        return _run_many(ns, path, kwargs, name, count, sock, f"ipc://{folder}/core.sock")
    finally:
        sock.close()
        shutil.rmtree(folder, ignore_errors=True)


def _run_many(ns: argparse.Namespace, path: str, kwargs: dict[str, Any], name: str, count: int, sock: Any,
              address: str) -> int:
    """_serve_many once the port is bound: the core at `address`, then the servers, until one ends."""
    import multiprocessing
    import signal
    import threading

    from radixflow.runtime.core_process import start_core

    try:
        core = start_core(address, path, kwargs)
    except (ValueError, RuntimeError) as exc:
        log.error("the engine core failed to start: %s", exc)
        return 1
    ctx = multiprocessing.get_context("spawn")
    servers = [ctx.Process(target=_api_server, args=(ns, path, kwargs, name, address, sock), name=f"radixflow-api-{i}")
               for i in range(count)]
    for proc in servers:
        proc.start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.2):
        if any(not proc.is_alive() for proc in servers) or core.poll() is not None:
            break
    for proc in servers:
        if proc.is_alive():
            proc.terminate()  # SIGTERM: a graceful uvicorn shutdown
    for proc in servers:
        proc.join(timeout=30)
    core.terminate()
    core.wait(timeout=30)
    failed = [proc for proc in servers if proc.exitcode not in (0, -signal.SIGTERM)]
    return 1 if failed else 0
