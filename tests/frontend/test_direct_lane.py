"""POST to the generation routes skips starlette's router and middleware stack (what a burst of
streams pays per request and per chunk); every other route and method keeps them, and the
answers and errors are the same either way."""
from __future__ import annotations

import logging

import httpx
import pytest
from starlette.routing import Router

from radixflow.frontend import native
from radixflow.frontend.server import create_app

KEY = "lane-key"
GENERATION = [
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3}}),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3}, "stream": True}),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 3}),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                              "stream": True}),
]


@pytest.fixture()
def lane(engine, live_server, monkeypatch):
    """(client with the API key, client without it, the (method, path) pairs starlette's router saw)."""
    routed: list[tuple[str, str]] = []
    through_router = Router.__call__

    async def spy(self, scope, receive, send):
        if scope["type"] == "http":
            routed.append((scope["method"], scope["path"]))
        await through_router(self, scope, receive, send)

    monkeypatch.setattr(Router, "__call__", spy)
    server = live_server(create_app(engine, "tiny", KEY)).start()
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as client, \
                httpx.Client(base_url=server.url, timeout=60) as anonymous:
            yield client, anonymous, routed
    finally:
        server.stop()


def test_generation_routes_skip_the_router_and_answer_as_before(lane):
    client, _, routed = lane
    for path, body in GENERATION:
        r = client.post(path, json=body)
        assert r.status_code == 200, r.text
        if body.get("stream"):
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.text.rstrip().endswith("data: [DONE]")
        else:
            assert r.json()
    assert routed == []
    assert client.get("/v1/models").status_code == 200
    assert client.get("/generate").status_code == 405  # another method: the router answers
    assert routed == [("GET", "/v1/models"), ("GET", "/generate")]


def test_errors_on_the_lane_are_the_apps_errors(lane, monkeypatch, caplog):
    client, anonymous, routed = lane
    r = anonymous.post("/generate", json=GENERATION[0][1])
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = client.post("/generate", content=b"{not json")
    assert r.status_code == 400 and "invalid JSON" in r.json()["error"]["message"]

    def boom(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(native, "parse_generate", boom)
    with caplog.at_level(logging.ERROR):
        r = client.post("/generate", json=GENERATION[0][1])
    assert r.status_code == 500 and r.json()["error"]["message"] == "internal error: RuntimeError: boom"
    assert "boom" in caplog.text  # logged with its traceback, as the app's error middleware logs
    assert routed == []
    monkeypatch.undo()
    assert client.post("/generate", json=GENERATION[0][1]).status_code == 200  # still serving
