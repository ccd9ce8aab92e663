"""Routes an RL loop drives (SGLang's): serve another checkpoint of the same model, name its
version, pause and continue generation around the update.

`POST /update_weights_from_disk` replaces every weight in place (Engine.update_weights_from_disk:
running requests finish on the old weights, the prefix cache is dropped); it reads a path on the
server's disk, so it answers only on a server started with --enable-weight-updates.
`/update_weight_version` (a name only), `/pause_generation` and `/continue_generation` answer on
every server, as /abort_request does.
"""
from __future__ import annotations

import asyncio

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.body import json_response, read_json
from radixflow.frontend.errors import APIError

LOAD_FORMATS = (None, "auto")  # the format is read from the checkpoint, as at start-up


class UpdateWeightsRequest(msgspec.Struct, forbid_unknown_fields=True):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class UpdateWeightsReply(msgspec.Struct):
    success: bool
    message: str
    num_paused_requests: int = 0


class WeightVersion(msgspec.Struct):
    weight_version: str


class WeightVersionUpdate(msgspec.Struct, forbid_unknown_fields=True):
    new_version: str
    abort_all_requests: bool = True  # SGLang's default: no request runs under the old name


class PauseRequest(msgspec.Struct, forbid_unknown_fields=True):
    mode: str = "abort"  # abort, retract or in_place (EngineLoop.pause)


class ContinueRequest(msgspec.Struct, forbid_unknown_fields=True):
    """No fields: an empty body or {}."""


class Done(msgspec.Struct):
    success: bool
    message: str


async def update_weights_from_disk(request: Request) -> Response:
    server = request.app.state.server
    if not server.weight_updates:
        raise APIError(400, "weight updates are off: start the server with --enable-weight-updates",
                       code="weight_updates_disabled")
    req = await read_json(request, UpdateWeightsRequest)
    if req.load_format not in LOAD_FORMATS:
        raise APIError(400, f"load_format {req.load_format!r} is not supported: leave it out (or \"auto\"), the "
                       "checkpoint's format (safetensors directory or GGUF file) is read from it", param="load_format")
    if not req.flush_cache:
        raise APIError(400, "flush_cache must be true: the prefix cache holds KV computed with the old weights",
                       param="flush_cache")
    try:
        reply = await asyncio.to_thread(server.engine.update_weights_from_disk, req.model_path,
                                        abort_all_requests=req.abort_all_requests, weight_version=req.weight_version)
    except ValueError as exc:
        return _failed(str(exc))
    return json_response(UpdateWeightsReply(**reply))


def _failed(message: str) -> Response:
    """SGLang's failure reply (success false, message) with the OpenAI-shaped error beside it."""
    error = APIError(400, message, param="model_path")
    body = {"success": False, "message": message, "num_paused_requests": 0, **error.body()}
    return Response(msgspec.json.encode(body), status_code=400, media_type="application/json")


async def get_weight_version(request: Request) -> Response:
    engine = request.app.state.server.engine
    return json_response(WeightVersion(await asyncio.to_thread(engine.get_weight_version)))


async def pause_generation(request: Request) -> Response:
    req = await read_json(request, PauseRequest, empty_ok=True)
    try:
        await asyncio.to_thread(request.app.state.server.engine.pause_generation, req.mode)
    except ValueError as exc:
        raise APIError(400, str(exc), param="mode") from exc
    return json_response(Done(True, f"generation paused (mode {req.mode})"))


async def continue_generation(request: Request) -> Response:
    await read_json(request, ContinueRequest, empty_ok=True)
    await asyncio.to_thread(request.app.state.server.engine.continue_generation)
    return json_response(Done(True, "generation continued"))


async def update_weight_version(request: Request) -> Response:
    req = await read_json(request, WeightVersionUpdate)
    await asyncio.to_thread(request.app.state.server.engine.update_weight_version, req.new_version,
                            req.abort_all_requests)
    return json_response(Done(True, f"weight version set to {req.new_version!r}"))
