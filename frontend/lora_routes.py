"""LoRA adapter routes: load and unload at run time (only with --lora-dir), adapters as models."""
from __future__ import annotations

import asyncio

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.body import json_response, read_json
from radixflow.frontend.errors import APIError
from radixflow.frontend.openai_common import now
from radixflow.frontend.openai_schemas import ModelCard


class LoadAdapterRequest(msgspec.Struct, forbid_unknown_fields=True):
    lora_name: str
    lora_path: str


class UnloadAdapterRequest(msgspec.Struct, forbid_unknown_fields=True):
    lora_name: str


def adapter_cards(server, max_model_len: int) -> list[ModelCard]:
    """One model card per loaded adapter, `parent` = the served base model."""
    return [ModelCard(id=name, created=now(), root=path, max_model_len=max_model_len,
                      parent=server.served_model_name)
            for name, path in sorted(server.engine.lora_adapters().items())]


def _engine_for_changes(request: Request):
    engine = request.app.state.server.engine
    if getattr(engine, "config", None) is None or engine.config.lora_dir is None:
        raise APIError(400, "loading adapters at run time is off: start the server with --lora-dir",
                       code="lora_loading_disabled")
    return engine


async def load_lora_adapter(request: Request) -> Response:
    engine = _engine_for_changes(request)
    req = await read_json(request, LoadAdapterRequest)
    server = request.app.state.server
    if req.lora_name in (server.served_model_name, engine.model_path):
        raise APIError(400, f"adapter name {req.lora_name!r} is the base model's name", param="lora_name")
    try:
        await asyncio.to_thread(engine.load_lora_adapter, req.lora_name, req.lora_path)
    except ValueError as exc:
        raise APIError(400, str(exc), param="lora_path") from exc
    return json_response({"success": True, "message": f"adapter {req.lora_name!r} loaded"})


async def unload_lora_adapter(request: Request) -> Response:
    engine = _engine_for_changes(request)
    req = await read_json(request, UnloadAdapterRequest)
    try:
        await asyncio.to_thread(engine.unload_lora_adapter, req.lora_name)
    except ValueError as exc:
        raise APIError(404, str(exc), param="lora_name", code="lora_not_found") from exc
    return json_response({"success": True, "message": f"adapter {req.lora_name!r} unloaded"})
