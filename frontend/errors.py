"""OpenAI-shaped error bodies: one exception type for every 4xx/5xx the server answers."""
from __future__ import annotations

import logging
import re
from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

log = logging.getLogger(__name__)

# OpenAI's error types: client errors (401 and 404 included) are invalid_request_error, with the
# detail in `code` (invalid_api_key, model_not_found, ...).
_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 408: "timeout", 413: "invalid_request_error", 429: "rate_limit_error",
          503: "service_unavailable", 504: "timeout"}
RETRY_AFTER_S = 1  # what a 429 tells the client to wait


class APIError(Exception):
    """Raised anywhere in a route; becomes {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = dict(headers or {})
        if status == 429:
            self.headers.setdefault("Retry-After", str(RETRY_AFTER_S))

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code or str(self.status)}}

    def response(self) -> Response:
        return Response(msgspec.json.encode(self.body()), status_code=self.status,
                        media_type="application/json", headers=self.headers)


_AT = re.compile(r"at `\$\.([A-Za-z_]\w*)")
_FIELD = re.compile(r"(?:unknown|required) field `([A-Za-z_]\w*)`")
_SAMPLING_FIELD = re.compile(r"sampling_params\.(\w+)")
# the engine's prompt checks (runtime/request_inputs.py) → "prompt"; its grammar errors start
# with the constraint's kind (runtime/grammar/), or "grammar" where the backend does not say
_PROMPT = re.compile(r"^(?:token id -?\d+ is outside the vocabulary|the prompt is empty|the prompt has \d+ tokens but)")
_GRAMMAR = re.compile(r"^(regex|json_schema|choices|ebnf|structural_tag|grammar)[ :]")
# request options the engine checks itself (runtime/request_inputs.py check_priority_use, ...)
_OPTION = re.compile(r"^(priority|return_hidden_states) ")


def _param(message: str) -> str | None:
    """The request field a message is about: a sampling field, else the top-level field of the
    path, else the named field; "prompt" and "grammar" for the engine's prompt and grammar
    errors, which callers rename to their own field."""
    if _PROMPT.search(message):
        return "prompt"
    for pattern in (_SAMPLING_FIELD, _AT, _FIELD, _GRAMMAR, _OPTION):
        match = pattern.search(message)
        if match:
            return match.group(1)
    return None


def bad_request(exc: Exception, rename: dict[str, str] | None = None) -> APIError:
    """A 400 from a msgspec validation error or an engine ValueError, naming the field when known.

    `rename` maps engine sampling names back to the names the client used (max_new_tokens →
    max_tokens for OpenAI routes), and "prompt" / "grammar" to the route's prompt field and the
    request's constraint field; a "grammar" left unnamed is no field."""
    from radixflow.runtime.errors import QueueFullError

    message = str(exc)
    if isinstance(exc, QueueFullError):
        return APIError(429, message, code="queue_full")
    param = _param(message)
    if rename and param in rename:
        message = message.replace(f"sampling_params.{param}", rename[param])
        param = rename[param]
    return APIError(400, message, param=None if param == "grammar" else param)


async def api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response()


async def http_error_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (unknown route, wrong method) in the OpenAI shape."""
    assert isinstance(exc, HTTPException)
    message = {404: f"no route {request.url.path}",
               405: f"method {request.method} not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
    return APIError(exc.status_code, message).response()


async def internal_error_handler(request: Request, exc: Exception) -> Response:
    """An exception no other handler takes: a 500 saying what it was (logged by the caller)."""
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()


class AnswerUnexpected:
    """Pure ASGI middleware, the outermost of the app's own: an exception no handler took,
    raised before the response started, is logged once and answered with the OpenAI-shaped 500
    here, and the connection stays open for the client's next request (starlette's
    ServerErrorMiddleware would answer, then re-raise, and uvicorn would drop the keep-alive
    connection). Raised after the response started (a stream), it propagates: closing the
    connection is then the only way to tell the client."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:
                raise
            log.exception("%s %s failed", scope["method"], scope["path"])
            await (await internal_error_handler(Request(scope), exc))(scope, receive, send)
