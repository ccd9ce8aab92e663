"""POST /v1/programs: run a traced program IR next to the engine (the IR is data; no user code runs)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
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


def _execute(req: ProgramRequest, backend: ServerBackend, limits: Any) -> dict[str, Any]:
    """Blocking (worker thread). Bad programs, arguments or gen parameters → 400; other failures → 500."""
    from radixflow.lang import BackendError, ProgramError, execute

    try:
        return execute(req.program, req.arguments, backend, limits)
    except ValueError as exc:
        raise APIError(400, str(exc), param="program") from exc
    except (ProgramError, BackendError) as exc:
        if isinstance(exc.__cause__, ValueError):
            raise APIError(400, str(exc.__cause__), param="program") from exc
        raise APIError(500, f"the program failed: {exc}") from exc


async def run_program(request: Request) -> Response:
    """Returns {"variables", "text", "meta"}. With `stream: true` the same object arrives as one
    SSE event followed by [DONE] (the interpreter has no per-variable hook yet). A client that
    disconnects stops the program: its generations in flight are aborted."""
    server = request.app.state.server
    req = await read_json(request, ProgramRequest)
    loop = asyncio.get_running_loop()
    backend = ServerBackend(server.engine, loop, server.role_markers)
    work = loop.run_in_executor(server.program_pool, _execute, req, backend, server.program_limits)
    try:
        result = await until_disconnect(request.receive, work)
    except ClientGone:
        backend.close()
        raise
    if not req.stream:
        return json_response(result)

    async def events() -> AsyncIterator[bytes]:
        yield sse(result)
        yield SSE_DONE

    return EventStream(events())
