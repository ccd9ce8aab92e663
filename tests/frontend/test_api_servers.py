"""Two API servers on one engine core (`radixflow serve --api-server-count 2`), each with its own
EngineClient: what one server does to requests the other runs. The servers listen on ports of
their own here, so a test picks which server gets each HTTP request."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import LiveServer
from radixflow.frontend.server import create_app
from radixflow.runtime import EngineClient
from radixflow.runtime.model.demo import demo_model

LONG = {"max_new_tokens": 1900, "ignore_eos": True}  # the tiny model: a 2,048-token context


def _two_servers(**config: object) -> Iterator[tuple[EngineClient, LiveServer, LiveServer]]:
    """One core (owned by the first client), two API servers, each on a client of its own."""
    model = demo_model("tiny")
    first = EngineClient(model, kv_cache_tokens=8192, check_invariants=True, **config)
    second = EngineClient(model, address=first.address, kv_cache_tokens=8192, **config)
    a = LiveServer(create_app(first, "tiny")).start()
    b = LiveServer(create_app(second, "tiny")).start()
    yield first, a, b
    a.stop()
    b.stop()
    second.shutdown()
    first.shutdown()


@pytest.fixture(scope="module")
def two() -> Iterator[tuple[EngineClient, LiveServer, LiveServer]]:
    yield from _two_servers()


def _stream_finish_reasons(url: str, body: dict, started: threading.Event, out: dict) -> None:
    """Stream /generate; set `started` at the first chunk of every index; `out[index]` = finish reason."""
    seen: set[int] = set()
    want = body["sampling_params"].get("n", 1)
    with httpx.Client(base_url=url, timeout=60) as c, c.stream("POST", "/generate", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            index = chunk.get("index", 0)
            seen.add(index)
            if len(seen) == want:
                started.set()
            if chunk["meta_info"]["finish_reason"] is not None:
                out[index] = chunk["meta_info"]["finish_reason"]


def _wait_idle(engine: EngineClient) -> None:
    deadline = time.monotonic() + 5
    while (s := engine.stats()).num_running or s.num_waiting:
        assert time.monotonic() < deadline, s
        time.sleep(0.01)


@pytest.mark.parametrize("n", [1, 3])
def test_abort_request_on_the_other_server_ends_every_sample(two, n):
    """/abort_request by a client rid reaches the request on whichever server runs it: the server
    that does not know the rid still asks the core, which ends every sample (`rid-0`, ...)."""
    engine, a, b = two
    started, reasons = threading.Event(), {}
    body = {"text": "a long one", "sampling_params": {**LONG, "n": n}, "rid": f"cross-{n}"}
    runner = threading.Thread(target=_stream_finish_reasons, args=(a.url, body, started, reasons))
    runner.start()
    assert started.wait(30)
    with httpx.Client(base_url=b.url, timeout=10) as c:
        assert c.post("/abort_request", json={"rid": f"cross-{n}"}).status_code == 200
    runner.join(timeout=10)
    assert not runner.is_alive(), "the samples ran on"
    assert sorted(reasons) == list(range(n)) and {r["type"] for r in reasons.values()} == {"abort"}, reasons
    _wait_idle(engine)
    engine.check_accounting()
    assert engine.invariant_violations == []


def test_a_client_rid_in_use_on_one_server_is_refused_on_the_other(two):
    """The rid of an n > 1 request running on one server is in use on the other too (as on one
    server): accepted there, a stop string or disconnect of that request would end the samples
    of the first (an abort of a rid ends its group's samples)."""
    engine, a, b = two
    started, reasons = threading.Event(), {}
    body = {"text": "a long one", "sampling_params": {**LONG, "n": 2}, "rid": "shared"}
    runner = threading.Thread(target=_stream_finish_reasons, args=(a.url, body, started, reasons))
    runner.start()
    assert started.wait(30)
    try:
        with httpx.Client(base_url=b.url, timeout=30) as c:
            again = c.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}, "rid": "shared"})
            assert again.status_code == 400 and "already in use" in again.text, again.text
            sample = c.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2},
                                               "rid": "shared-1"})
            assert sample.status_code == 400 and "already in use" in sample.text, sample.text
    finally:
        with httpx.Client(base_url=a.url, timeout=10) as c:
            c.post("/abort_request", json={"rid": "shared"})
        runner.join(timeout=10)
    assert {r["type"] for r in reasons.values()} == {"abort"}, reasons
    _wait_idle(engine)
    engine.check_accounting()


@pytest.fixture(scope="module")
def narrow() -> Iterator[tuple[EngineClient, LiveServer, LiveServer]]:
    """Two servers on a core that runs one request at a time: a second request waits in its queue."""
    yield from _two_servers(max_num_seqs=1)


@pytest.mark.parametrize("where", ["same", "other"])
def test_an_abort_while_the_shared_prefill_waits_ends_the_request(narrow, where):
    """An n > 1 request first runs a prefill its samples share; an /abort_request by its rid
    while that prefill waits (or runs) ends the request: no sample starts afterwards."""
    engine, a, b = narrow
    blocker_started, blocker = threading.Event(), {}
    hold = threading.Thread(target=_stream_finish_reasons, args=(a.url, {"text": "hold", "sampling_params": LONG,
                                                                         "rid": f"hold-{where}"},
                                                                 blocker_started, blocker))
    hold.start()
    assert blocker_started.wait(30)
    result: dict = {}

    def post() -> None:
        with httpx.Client(base_url=a.url, timeout=60) as c:
            result["r"] = c.post("/generate", json={"text": "wait for it", "rid": f"late-{where}",
                                                     "sampling_params": {**LONG, "n": 2}})
    runner = threading.Thread(target=post)
    runner.start()
    deadline = time.monotonic() + 10
    while engine.stats().num_waiting == 0:  # its prefill queues behind the blocker
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with httpx.Client(base_url=(a if where == "same" else b).url, timeout=10) as c:
        assert c.post("/abort_request", json={"rid": f"late-{where}"}).status_code == 200
        time.sleep(0.2)
        assert c.post("/abort_request", json={"rid": f"hold-{where}"}).status_code == 200
    runner.join(timeout=30)
    hold.join(timeout=10)
    assert not runner.is_alive(), "the samples ran on"
    r = result["r"]
    _assert_ended_unstarted(r, engine)


def test_an_abort_between_the_shared_prefill_and_the_samples_ends_the_request(two, monkeypatch):
    """The window after an n > 1 request's shared prefill finished and before its samples are
    submitted: the engine holds nothing of the request, so an /abort_request on the server that
    runs it must be remembered there, or the samples start afterwards and run to their limit."""
    from radixflow.frontend import streams

    engine, a, _ = two
    prefill = streams.prefill

    async def abort_after_the_prefill(eng, prompts):
        lasts = await prefill(eng, prompts)
        a.app.state.server.in_flight.abort(eng, "window")  # as /abort_request would, on this server
        return lasts
    monkeypatch.setattr(streams, "prefill", abort_after_the_prefill)
    with httpx.Client(base_url=a.url, timeout=60) as c:
        r = c.post("/generate", json={"text": "in the window", "rid": "window", "sampling_params": {**LONG, "n": 2}})
    _assert_ended_unstarted(r, engine)


@pytest.mark.parametrize("settle", [True, False])
def test_an_abort_on_the_other_server_between_the_shared_prefill_and_the_samples_ends_the_request(
        two, monkeypatch, settle):
    """The same window, with the /abort_request on the server that does not run the request: the
    core holds nothing of it then, so the abort must reach the server that runs it. With
    `settle`, the samples start after that server heard of the abort (none starts); without,
    they may start before (they end aborted soon after, far from their limit)."""
    from radixflow.frontend import streams

    engine, a, b = two
    prefill = streams.prefill
    rid = f"window-other-{settle}"

    async def abort_after_the_prefill(eng, prompts):
        lasts = await prefill(eng, prompts)
        b.app.state.server.in_flight.abort(b.app.state.server.engine, rid)  # as /abort_request on b would
        deadline = time.monotonic() + 5
        while settle and not a.app.state.server.in_flight.aborted(rid):
            assert time.monotonic() < deadline, "the server running the request never heard of the abort"
            await asyncio.sleep(0.01)
        return lasts
    monkeypatch.setattr(streams, "prefill", abort_after_the_prefill)
    with httpx.Client(base_url=a.url, timeout=60) as c:
        r = c.post("/generate", json={"text": "in the window", "rid": rid, "sampling_params": {**LONG, "n": 2}})
    if settle:
        _assert_ended_unstarted(r, engine)
    else:
        assert r.status_code == 200, r.text[:300]
        assert [s["meta_info"]["finish_reason"]["type"] for s in r.json()] == ["abort", "abort"]
        assert all(s["meta_info"]["completion_tokens"] < LONG["max_new_tokens"] for s in r.json())
        _wait_idle(engine)
        engine.check_accounting()


def test_an_abort_on_the_other_server_before_the_submit_ends_the_request(two, monkeypatch):
    """An /abort_request on the other server that reaches the core before the request it names
    (accepted by this server, not yet submitted): the core finds nothing, so this server must
    end the request once it submitted it."""
    from radixflow.frontend import streams

    engine, a, b = two
    register = streams.Fanout.register

    def abort_before_the_submit(fanout) -> None:
        register(fanout)
        b.app.state.server.in_flight.abort(b.app.state.server.engine, "early")  # as /abort_request on b would
        deadline = time.monotonic() + 5
        while not a.app.state.server.in_flight.aborted("early"):
            assert time.monotonic() < deadline, "the server running the request never heard of the abort"
            time.sleep(0.01)
    monkeypatch.setattr(streams.Fanout, "register", abort_before_the_submit)
    with httpx.Client(base_url=a.url, timeout=60) as c:
        r = c.post("/generate", json={"text": "early", "rid": "early", "sampling_params": LONG})
    assert r.status_code == 200, r.text[:300]
    meta = r.json()["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < LONG["max_new_tokens"], meta
    _wait_idle(engine)
    engine.check_accounting()


def test_a_shutdown_between_the_shared_prefill_and_the_samples_starts_no_sample(two, monkeypatch):
    """A server shutting down aborts what it runs; an n > 1 request past its shared prefill but
    not yet started (no client rid: nothing to abort by name) must not start its samples then."""
    from radixflow.frontend import streams

    engine = two[0]
    client = EngineClient(demo_model("tiny"), address=engine.address, kv_cache_tokens=8192)
    live = LiveServer(create_app(client, "tiny")).start()
    prefill = streams.prefill

    async def shut_down_after_the_prefill(eng, prompts):
        lasts = await prefill(eng, prompts)
        live.app.state.server.in_flight.abort_all(eng)  # as the server's shutdown does
        return lasts
    monkeypatch.setattr(streams, "prefill", shut_down_after_the_prefill)
    try:
        with httpx.Client(base_url=live.url, timeout=60) as c:
            r = c.post("/generate", json={"text": "closing", "sampling_params": {**LONG, "n": 2}})
        assert r.status_code == 200, r.text[:300]
        assert [s["meta_info"]["finish_reason"]["type"] for s in r.json()] == ["abort", "abort"]
    finally:
        live.stop()
        client.shutdown()
    _wait_idle(engine)
    engine.check_accounting()


def _assert_ended_unstarted(r: httpx.Response, engine: Any) -> None:
    """An n = 2 request that ended before its samples started: both abort with no tokens, and
    nothing is left in the engine."""
    assert r.status_code == 200, r.text[:300]
    assert [s["meta_info"]["finish_reason"]["type"] for s in r.json()] == ["abort", "abort"]
    assert all(s["meta_info"]["completion_tokens"] == 0 for s in r.json())
    _wait_idle(engine)
    engine.check_accounting()
