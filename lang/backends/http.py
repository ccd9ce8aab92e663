"""Endpoint backend: a radixflow (or SGLang) server's native API over HTTP, with httpx.

POST {url}/generate (streaming: SSE `data: {...}` lines ending `data: [DONE]`),
GET {url}/get_model_info (its `role_markers`), POST {url}/v1/programs (traced programs),
POST {url}/abort_request (a gen of a program whose body failed).
"""
from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec

from radixflow.lang import ir
from radixflow.lang.backend import BackendError

log = logging.getLogger(__name__)


def _error_message(response: httpx.Response) -> str:
    """The server's own words: OpenAI-shaped {"error": {"message"}}, {"detail"}, or the raw body."""
    try:
        data = response.json()
    except ValueError:
        return response.text or response.reason_phrase
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        for key in ("error", "detail", "message"):
            if key in data:
                return str(data[key])
    return json.dumps(data)


def _check(response: httpx.Response) -> None:
    if response.status_code != 200:
        raise BackendError(f"{response.request.method} {response.request.url.path} → "
                           f"HTTP {response.status_code}: {_error_message(response)}")


class Endpoint:
    """`rf.Endpoint("http://127.0.0.1:30000", api_key=None)`. Thread-safe (one pooled httpx client).

    `client` lets a caller supply its own httpx.Client (tests pass one with a MockTransport).
    """

    def __init__(self, url: str, api_key: str | None = None, *, timeout_s: float | None = 600.0,
                 client: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = client or httpx.Client(timeout=timeout_s)
        self.client.headers.update(headers)
        self._model_info: dict | None = None
        self._lock = threading.Lock()

    def generate(self, body: dict) -> dict | list[dict]:
        response = self.client.post(f"{self.url}/generate", json=body)
        _check(response)
        return response.json()

    def generate_stream(self, body: dict) -> Iterator[dict]:
        with self.client.stream("POST", f"{self.url}/generate", json={**body, "stream": True}) as response:
            if response.status_code != 200:
                response.read()
                _check(response)
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if isinstance(chunk, dict) and "error" in chunk and "text" not in chunk:
                    raise BackendError(f"stream error: {chunk['error']}")
                yield chunk

    def abort(self, rid: str) -> None:
        """End the request `rid` on the server (a program's gen whose body failed). Best effort:
        a server that cannot be reached is logged, the program's own error stands."""
        try:
            self.client.post(f"{self.url}/abort_request", json={"rid": rid}, timeout=10.0)
        except httpx.HTTPError as exc:
            log.warning("could not abort request %s: %s", rid, exc)

    def model_info(self) -> dict:
        with self._lock:
            if self._model_info is None:
                response = self.client.get(f"{self.url}/get_model_info")
                _check(response)
                self._model_info = response.json()
            return self._model_info

    def role_markers(self) -> dict:
        info = self.model_info()
        if "role_markers" not in info:
            raise BackendError(f"{self.url}/get_model_info has no role_markers: the server cannot render chat roles")
        return info["role_markers"]

    def run_program(self, program: ir.Program, arguments: dict[str, Any]) -> dict[str, Any]:
        """POST a traced program to /v1/programs; returns the server's {"variables", "text", "meta"}."""
        body = {"program": msgspec.to_builtins(program), "arguments": arguments, "stream": False}
        response = self.client.post(f"{self.url}/v1/programs", json=body)
        _check(response)
        return response.json()

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
