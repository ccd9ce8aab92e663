"""Big inputs under the default limits: refused before any work, and the event loop never blocks on tokenization."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from radixflow.frontend.limits import RequestLimits
from radixflow.frontend.server import create_app

from .conftest import LiveServer


@pytest.fixture(scope="module")
def default_server(engine) -> Iterator[LiveServer]:
    live = LiveServer(create_app(engine, "tiny")).start()  # the default limits
    yield live
    live.stop()


def test_30_mb_prompt_is_refused_at_once(default_server):
    body = b'{"model": "tiny", "prompt": "' + b"x" * (30 * 1024 * 1024) + b'"}'
    start = time.monotonic()
    r = httpx.post(default_server.url + "/v1/completions", content=body,
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413 and str(RequestLimits().max_body_bytes) in r.json()["error"]["message"]
    assert time.monotonic() - start < 5


def test_prompt_over_max_prompt_chars_is_refused_before_tokenizing(default_server):
    chars = RequestLimits().max_prompt_chars + 1
    start = time.monotonic()
    r = httpx.post(default_server.url + "/generate", json={"text": "y" * chars}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "limit_exceeded"
    assert f"the limit max_prompt_chars is {chars - 1}" in r.json()["error"]["message"]
    assert time.monotonic() - start < 3


def test_health_answers_while_a_big_prompt_is_tokenized(default_server):
    text = "word " * (RequestLimits().max_prompt_chars // 5 - 1)  # just inside the limit
    done = threading.Event()
    took: list[float] = []
    statuses: list[int] = []

    def big() -> None:
        start = time.monotonic()
        try:
            r = httpx.post(default_server.url + "/generate",
                           json={"text": text, "sampling_params": {"max_new_tokens": 0}}, timeout=120)
            statuses.append(r.status_code)
        finally:  # the loop below must end even if the request fails
            took.append(time.monotonic() - start)
            done.set()

    worker = threading.Thread(target=big)
    worker.start()
    worst = 0.0
    while not done.is_set():
        start = time.monotonic()
        assert httpx.get(default_server.url + "/health", timeout=30).status_code == 200
        worst = max(worst, time.monotonic() - start)
        time.sleep(0.02)
    worker.join()
    assert statuses and statuses[0] in (200, 400)  # 400: more tokens than the context holds
    # Tokenizing on the event loop would hold /health for the whole request.
    assert worst < max(1.0, 0.5 * took[0]), (worst, took)
