"""Unexpected errors on any route are an OpenAI-shaped 500, logged once, and the connection
stays open; a client gone mid-body is a quiet 499."""
from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.server import create_app


class StatusSpy:
    """The app, recording the status of every response it starts."""

    def __init__(self, app: Any) -> None:
        self.app, self.state, self.statuses = app, app.state, []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        async def spy(message: dict) -> None:
            if message["type"] == "http.response.start":
                self.statuses.append(message["status"])
            await send(message)

        await self.app(scope, receive, spy)


async def _boom(request: Request) -> Response:
    raise RuntimeError("boom")


@pytest.fixture()
def spied(engine, live_server) -> Iterator[tuple[StatusSpy, str]]:
    app = create_app(engine, "tiny")
    app.router.add_route("/test-boom", _boom, methods=["GET", "POST"])  # a routed (not direct-lane) path
    spy = StatusSpy(app)
    server = live_server(spy).start()
    try:
        yield spy, server.url
    finally:
        server.stop()


def _local_port(response: httpx.Response) -> int:
    return response.extensions["network_stream"].get_extra_info("socket").getsockname()[1]


def test_an_unexpected_error_is_a_json_500_and_the_connection_stays_open(spied, caplog):
    spy, url = spied
    with httpx.Client(base_url=url, timeout=30) as client:
        with caplog.at_level(logging.ERROR):
            r = client.get("/test-boom")
        assert r.status_code == 500, r.text
        assert r.json()["error"] == {"message": "internal error: RuntimeError: boom", "type": "server_error",
                                     "param": None, "code": "500"}
        assert "connection" not in r.headers or r.headers["connection"] != "close"
        port = _local_port(r)
        time.sleep(0.2)  # a server that drops the connection after the 500 has done so by now
        again = client.get("/health")
        assert again.status_code == 200 and _local_port(again) == port  # the same keep-alive connection
    logged = [rec for rec in caplog.records if rec.exc_info and str(rec.exc_info[1]) == "boom"]
    assert [rec.getMessage() for rec in logged] == ["GET /test-boom failed"]  # once, with its traceback


def _send_half_a_body(url: str, path: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: 100\r\n\r\n".encode() + b'{"text": "')
        time.sleep(0.05)


@pytest.mark.parametrize("path", ["/generate", "/v1/programs", "/abort_request"])
def test_a_client_gone_mid_body_is_a_quiet_499(spied, caplog, path):
    spy, url = spied
    with caplog.at_level(logging.WARNING):
        _send_half_a_body(url, path)
        deadline = time.monotonic() + 5
        while not spy.statuses:
            assert time.monotonic() < deadline, "the request was never answered"
            time.sleep(0.01)
    assert spy.statuses == [499]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
