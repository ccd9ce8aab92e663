"""POST /v1/programs: run a traced program IR next to the engine (the IR is data; no user code runs).

Bounded: a program is validated against the program limits before its first op; at most
`max_concurrent` run at once (more get 429, nothing queues); each has a deadline
(`deadline_s`, then 504 with every generation it started aborted and its state discarded).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.body import json_response, read_json
from radixflow.frontend.errors import APIError
from radixflow.frontend.program_backend import ServerBackend
from radixflow.frontend.streams import SSE_DONE, ClientGone, EventStream, sse, until_disconnect

log = logging.getLogger(__name__)


class ProgramRequest(msgspec.Struct, forbid_unknown_fields=True):
    program: dict[str, Any]
    arguments: dict[str, Any] | None = None
    stream: bool = False


def _execute(req: ProgramRequest, backend: ServerBackend, limits: Any,
             on_variable: Callable[[str, Any], None] | None = None) -> dict[str, Any]:
    """Blocking (worker thread). Bad programs, arguments or gen parameters → 400; a full engine
    → 429 (raised by the backend); past the deadline → 504; other failures → 500."""
    from radixflow.lang import BackendError, ProgramError, ProgramTimeout, execute

    try:
        return execute(req.program, req.arguments, backend, limits, on_variable)
    except ProgramTimeout as exc:
        raise APIError(504, str(exc), code="program_timeout") from exc
    except ValueError as exc:
        raise APIError(400, str(exc), param="program") from exc
    except (ProgramError, BackendError) as exc:
        if isinstance(exc.__cause__, ValueError):
            raise APIError(400, str(exc.__cause__), param="program") from exc
        raise APIError(500, f"the program failed: {exc}") from exc


class _Slot:
    """One of the server's program slots, held for a program's whole run (429 when none is free)."""

    def __init__(self, server: Any) -> None:
        if not server.program_slots.acquire(blocking=False):
            limit = server.program_limits.max_concurrent
            raise APIError(429, f"{limit} programs are running (limit max_concurrent); retry later")
        self._server = server

    def release(self) -> None:
        self._server.program_slots.release()


def _start(server: Any, req: ProgramRequest, backend: ServerBackend,
           on_variable: Callable[[str, Any], None] | None = None) -> asyncio.Future:
    """Run the program on the program pool, holding a slot until it ends."""
    slot = _Slot(server)
    loop = asyncio.get_running_loop()
    try:
        work = loop.run_in_executor(server.program_pool, _execute, req, backend, server.program_limits,
                                    on_variable)
    except BaseException:
        slot.release()
        raise
    def done(future: asyncio.Future) -> None:
        slot.release()
        if not future.cancelled():
            future.exception()  # retrieved: a run whose client left fails unread, which is expected

    work.add_done_callback(done)
    return work


async def _bounded(work: asyncio.Future, server: Any, backend: ServerBackend, receive: Any) -> Any:
    """Await the program; on the deadline or a disconnect, abort all it started."""
    deadline = server.program_limits.deadline_s
    try:
        return await asyncio.wait_for(until_disconnect(receive, asyncio.shield(work)), timeout=deadline + 1.0)
    except TimeoutError as exc:
        backend.close()
        raise APIError(504, f"the program ran longer than {deadline} s (limit deadline_s)",
                       code="program_timeout") from exc
    except ClientGone:
        backend.close()
        raise


async def run_program(request: Request) -> Response:
    """Returns {"variables", "text", "meta"}. With `stream: true`, SSE events
    `{"variable": name, "value": v}` as each variable is set, then the whole result object, then
    [DONE]. A client that disconnects stops the program: its generations in flight are aborted."""
    server = request.app.state.server
    req = await read_json(request, ProgramRequest)
    loop = asyncio.get_running_loop()
    backend = ServerBackend(server.engine, loop, server.role_markers, server.limits, server.in_flight)
    if req.stream:
        from radixflow.lang.interpreter import prepare

        try:  # reject a bad program with a 400 before the event stream begins
            prepare(req.program, req.arguments, server.program_limits)
        except ValueError as exc:
            raise APIError(400, str(exc), param="program") from exc
        return _stream_program(req, backend, server, loop)
    work = _start(server, req, backend)
    return json_response(await _bounded(work, server, backend, request.receive))


def _stream_program(req: ProgramRequest, backend: ServerBackend, server: Any,
                    loop: asyncio.AbstractEventLoop) -> Response:
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def on_variable(name: str, value: Any) -> None:  # worker thread
        loop.call_soon_threadsafe(events.put_nowait, {"variable": name, "value": value})

    work = _start(server, req, backend, on_variable)
    deadline_s = server.program_limits.deadline_s
    deadline = loop.time() + deadline_s + 1.0  # as _bounded: a gen in flight is not waited for

    async def stream() -> AsyncIterator[bytes]:
        try:
            while not (work.done() and events.empty()):
                getter = asyncio.ensure_future(events.get())
                done, _ = await asyncio.wait({getter, work}, timeout=max(0.0, deadline - loop.time()),
                                             return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield sse(getter.result())
                    continue
                getter.cancel()
                if not done:  # past the deadline: abort what it started, report in-band
                    backend.close()
                    yield sse(APIError(504, f"the program ran longer than {deadline_s} s (limit deadline_s)",
                                       code="program_timeout").body())
                    yield SSE_DONE
                    return
            try:
                yield sse(work.result())
            except APIError as exc:  # the response has begun: report in-band
                yield sse(exc.body())
            except Exception as exc:  # a bug, not the client's: logged, and in-band as the 500 it would be
                log.exception("streamed program failed")
                yield sse(APIError(500, f"internal error: {type(exc).__name__}: {exc}").body())
            yield SSE_DONE
        finally:
            if not work.done():
                backend.close()  # the client went away: abort the program's generations

    return EventStream(stream())
