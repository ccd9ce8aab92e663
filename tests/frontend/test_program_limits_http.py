"""/v1/programs under its limits: 429 past max_concurrent, 504 past the deadline (its requests aborted; in-band when streamed), 429 when the engine is full."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from radixflow.frontend.server import create_app
from radixflow.lang import Limits

from .conftest import LiveServer

SLOW = {"program": {"ops": [{"op": "gen", "name": f"g{i}", "params": {"max_new_tokens": 40, "ignore_eos": True}}
                            for i in range(40)]}}


@pytest.fixture(scope="module")
def limited(engine) -> Iterator[tuple[LiveServer, httpx.Client]]:
    app = create_app(engine, "tiny", program_limits=Limits(max_concurrent=1, deadline_s=0.5))
    live = LiveServer(app).start()
    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield live, c
    live.stop()


def test_deadline_is_504_and_aborts_what_it_started(limited, engine, wait_idle):
    _, client = limited
    start = time.monotonic()
    r = client.post("/v1/programs", json=SLOW)
    assert r.status_code == 504, r.text
    assert "deadline_s" in r.json()["error"]["message"]
    assert time.monotonic() - start < 3
    wait_idle(engine, kv=True)
    assert client.post("/v1/programs", json={"program": {"ops": [{"op": "text", "text": "ok"}]}}).json()["text"] == "ok"


def test_concurrent_programs_past_the_limit_get_429(limited, engine, wait_idle):
    _, client = limited
    statuses: list[int] = []
    first = threading.Thread(target=lambda: statuses.append(client.post("/v1/programs", json=SLOW).status_code))
    first.start()
    time.sleep(0.15)
    r = client.post("/v1/programs", json=SLOW)
    first.join()
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert "max_concurrent" in r.json()["error"]["message"]
    assert statuses == [504]
    wait_idle(engine, kv=True)


def test_full_engine_inside_a_program_is_429(engine):
    from .test_conformance import FaultyEngine

    wrapped = FaultyEngine(engine)
    wrapped.mode = "full"
    live = LiveServer(create_app(wrapped, "tiny")).start()
    try:
        r = httpx.post(live.url + "/v1/programs", json={"program": {"ops": [{"op": "gen", "name": "a"}]}})
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
    finally:
        live.stop()


def test_streamed_program_past_the_deadline_ends_in_band_and_aborts(limited, engine, wait_idle):
    _, client = limited
    long_gen = {"program": {"ops": [{"op": "gen", "name": "g", "params": {"max_new_tokens": 1500,
                                                                          "ignore_eos": True}}]},
                "stream": True}
    start = time.monotonic()
    with client.stream("POST", "/v1/programs", json=long_gen) as r:
        assert r.status_code == 200
        events = [line[len("data: "):] for line in r.iter_lines() if line]
    assert time.monotonic() - start < 3  # one long gen does not outlive the deadline
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "program_timeout"
    wait_idle(engine, kv=True)
