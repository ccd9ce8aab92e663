"""The server's lifecycle state and the gate every HTTP request passes: 503 unless ready, 401 without the key."""
from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from radixflow.frontend.errors import APIError
from radixflow.frontend.in_flight import InFlight
from radixflow.frontend.limits import ProgramLimits, RequestLimits
from radixflow.frontend.metrics import Metrics
from radixflow.frontend.response_store import DEFAULT_MAX_RESPONSES, ResponseStore

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/metrics", "/openapi.json"})  # no API key needed (scrapers), nor for /health*
ALWAYS_PATHS = frozenset({"/metrics", "/openapi.json"})  # answered while starting or stopping too
_UNAVAILABLE = {"starting": "the engine is starting; retry shortly", "stopping": "the server is shutting down",
                "failed": "the engine failed to start; see the server log"}


@dataclass
class ServerState:
    """What the routes read (`request.app.state.server`). `engine` is set once `phase` is "ready";
    phases: starting → ready → stopping (or starting → failed)."""

    served_model_name: str | None
    api_key: str | None
    limits: RequestLimits
    program_limits: ProgramLimits
    health_timeout_s: float
    metrics: Metrics = field(default_factory=Metrics)
    engine: Any = None
    phase: str = "starting"
    role_markers: dict[str, Any] | None = None
    on_failure: Callable[[], None] | None = None
    incremental_streaming_output: bool = False  # native streams: each chunk's new text and ids only
    tool_call_parser: str = "hermes"  # the format of tool_choice "auto" calls (tool_call_formats.PARSERS)
    reasoning_parser: str | None = None  # how chat output's reasoning is split off (reasoning.FORMATS)
    weight_updates: bool = False  # /update_weights_from_disk answers (--enable-weight-updates)
    in_flight: InFlight = field(default_factory=InFlight)  # this server's engine requests
    responses: ResponseStore = field(default_factory=lambda: ResponseStore(DEFAULT_MAX_RESPONSES))  # /v1/responses
    # programs block a thread for their whole run: their own pool (one thread per admitted
    # program, so nothing queues), never the default executor that tokenization uses
    program_pool: ThreadPoolExecutor = field(init=False)
    program_slots: threading.BoundedSemaphore = field(init=False)

    def __post_init__(self) -> None:
        workers = self.program_limits.max_concurrent
        self.program_pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rf-program")
        self.program_slots = threading.BoundedSemaphore(workers)

    @property
    def max_body_bytes(self) -> int:
        return self.limits.max_body_bytes

    def stop(self) -> None:
        """Stop taking requests (503) and abort this server's requests in flight, so their streams
        end with reason abort: uvicorn tells the app nothing on SIGTERM until every connection
        has closed, and a stream never closes while its engine request runs. Any thread."""
        self.phase = "stopping"
        if self.engine is not None:
            self._loop.call_soon_threadsafe(self.in_flight.abort_all, self.engine)

    def attach(self, engine: Any) -> None:
        """Bind the started engine and open for traffic (on the server's event loop)."""
        self._loop = asyncio.get_running_loop()
        self.engine = engine
        if self.served_model_name is None:
            self.served_model_name = engine.model_path
        self.role_markers = engine.tokenizer.role_markers()
        self.metrics.bind(engine, self.served_model_name)
        engine.add_abort_listener(functools.partial(self.in_flight.notice, engine))
        self.phase = "ready"
        log.info("engine ready: %s (%s), KV pool %d tokens, max context %d tokens", self.served_model_name,
                 engine.model_path, engine.stats().kv_slots_total, engine.max_context_len)


class Gate:
    """Pure ASGI middleware (streams pass through untouched): availability, then API key."""

    def __init__(self, app: Any, server: ServerState) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            error = refusal(self.server, scope)
            if error is not None:
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def refusal(server: ServerState, scope: dict) -> APIError | None:
    """Why `server` refuses the HTTP request `scope` (503: not serving; 401: no valid API key),
    or None. The Gate's check, and the direct lane's (frontend/server.py)."""
    path = scope["path"]
    if server.phase != "ready" and path not in ALWAYS_PATHS:
        return APIError(503, _UNAVAILABLE[server.phase])
    if not server.engine.is_healthy and path not in ALWAYS_PATHS:
        return APIError(503, "the engine stopped serving (its loop died or it shut down); see the server log")
    key = server.api_key
    if key is None or path in OPEN_PATHS or path.startswith("/health"):  # probes, as SGLang
        return None
    auth = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        return APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                        code="invalid_api_key")
    return None
