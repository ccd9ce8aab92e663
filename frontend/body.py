"""Request and response bodies: a size cap (413), strict msgspec decoding (400), JSON encoding."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.errors import APIError, bad_request

T = TypeVar("T")
# Bodies up to this size are tokenized on the event loop (well under a millisecond); larger
# ones on a worker thread, so a long prompt never stalls the other streams.
INLINE_PARSE_BYTES = 8192


async def read_body(request: Request) -> bytes:
    """The whole body, or APIError(413) as soon as it exceeds the app's cap (declared or streamed),
    or APIError(408) when no part of it has arrived for the body timeout (a client that sends
    the headers and stalls would otherwise hold its connection and coroutine for ever)."""
    limits = request.app.state.server.limits
    cap, pause = limits.max_body_bytes, limits.body_timeout_s
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise APIError(413, f"request body of {declared} bytes exceeds the limit of {cap} bytes")
    chunks, size = [], 0
    parts = aiter(request.stream())
    while True:
        try:
            async with asyncio.timeout(pause):
                chunk = await anext(parts)
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise APIError(408, f"no part of the request body arrived for {pause} s", code="request_timeout") from None
        size += len(chunk)
        if size > cap:
            raise APIError(413, f"request body exceeds the limit of {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, schema: Any = dict, rename: dict[str, str] | None = None,
                    empty_ok: bool = False) -> Any:
    """Decode the body as JSON into `schema` (a msgspec Struct, or dict). Invalid JSON, wrong
    types and unknown fields (Structs that forbid them) are 400s naming the field. `empty_ok`:
    an empty body is `{}` (a route whose fields all have defaults)."""
    raw = await read_body(request)
    if not raw.strip():
        if not empty_ok:
            raise APIError(400, "the request body is empty; send a JSON object")
        raw = b"{}"
    try:
        return msgspec.json.decode(raw, type=schema)
    except msgspec.ValidationError as exc:
        raise bad_request(exc, rename) from exc
    except msgspec.DecodeError as exc:
        raise APIError(400, f"invalid JSON: {exc}") from exc
    except RecursionError as exc:
        raise APIError(400, "the JSON body is nested too deeply") from exc


def json_response(obj: Any, status: int = 200) -> Response:
    """A JSON response from a Struct or plain data, encoded by msgspec."""
    return Response(msgspec.json.encode(obj), status_code=status, media_type="application/json")


async def off_loop_if_large(request: Request, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` (the body's parsing and tokenization): inline for a small body, else on a
    worker thread. A body of unknown length (chunked) counts as large."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) <= INLINE_PARSE_BYTES:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)
