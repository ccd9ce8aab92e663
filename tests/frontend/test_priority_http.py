"""`priority` over HTTP (both cores): /generate, /v1/completions, /v1/chat/completions, /v1/responses,
/v1/embeddings, /encode and /v1/score carry it to the engine core, where a high-priority request
preempts a running low-priority one; a bad value, or any value where the server refuses
priorities, is a 400 naming it."""
from __future__ import annotations

import threading

import httpx
import pytest

from .conftest import LiveServer
from radixflow.frontend.server import create_app
from radixflow.runtime import Engine, EngineClient
from radixflow.runtime.model.demo import demo_model

LONG = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}


def serve(kind, **config):
    eng = kind(demo_model("tiny"), check_invariants=True, **config)
    return eng, LiveServer(create_app(eng, "tiny")).start()


@pytest.fixture(scope="module", params=[Engine, EngineClient], ids=["core-thread", "core-process"])
def prioritized(request):
    eng, live = serve(request.param, enable_priority_scheduling=True, max_num_seqs=1)
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client, eng
    live.stop()
    eng.shutdown()


def preemptions(client) -> float:
    text = client.get("/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("radixflow_num_preemptions_total") or line.startswith("radixflow_preemptions_total"))


def test_high_priority_preempts_through_every_route(prioritized):
    client, eng = prioritized
    alone = client.post("/generate", json={"text": "a long story", "sampling_params": LONG}).json()["output_ids"]
    before = preemptions(client)
    for route, body in [
        ("/generate", {"text": "urgent", "sampling_params": {"max_new_tokens": 3}, "priority": 50}),
        ("/v1/completions", {"model": "tiny", "prompt": "urgent", "max_tokens": 3, "priority": 50}),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "urgent"}],
                                  "max_tokens": 3, "priority": 50}),
        ("/v1/responses", {"model": "tiny", "input": "urgent", "max_output_tokens": 3, "priority": 50}),
        ("/v1/embeddings", {"model": "tiny", "input": "urgent", "priority": 50}),
        ("/encode", {"text": "urgent", "priority": 50}),
        # four item-label pairs: the first preempts, the other three queue before the low one
        ("/v1/score", {"query": "urgent", "items": [" a", " b"], "label_token_ids": [5, 6], "priority": 50}),
    ]:
        low_done = threading.Event()
        low: dict = {}

        def run_low():
            low["ids"] = client.post("/generate", json={"text": "a long story", "sampling_params": LONG,
                                                        "priority": 0}).json()["output_ids"]
            low_done.set()

        thread = threading.Thread(target=run_low)
        thread.start()
        while eng.stats().num_running == 0:
            threading.Event().wait(0.005)
        r = client.post(route, json=body)
        assert r.status_code == 200, r.text
        assert not low_done.is_set(), f"{route}: the high-priority request waited for the low one"
        thread.join()
        assert low["ids"] == alone  # preempted and resumed: the same greedy output
    assert preemptions(client) - before == 7


@pytest.mark.parametrize("route, body", [
    ("/generate", {"text": "hi", "priority": "high"}),
    ("/generate", {"text": "hi", "priority": 1.5}),
    ("/generate", {"text": "hi", "priority": 1 << 63}),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "priority": "1"}),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "priority": True}),
    ("/v1/responses", {"model": "tiny", "input": "hi", "priority": 2.5}),
    ("/v1/embeddings", {"model": "tiny", "input": "hi", "priority": "x"}),
    ("/v1/embeddings", {"model": "tiny", "input": "hi", "priority": -(1 << 63)}),
    ("/encode", {"text": "hi", "priority": 1.5}),
    ("/encode", {"text": "hi", "priority": 1 << 63}),
    ("/v1/score", {"query": "hi", "items": [" a"], "label_token_ids": [5], "priority": False}),
    ("/v1/score", {"query": "hi", "items": [" a"], "label_token_ids": [5], "priority": 1 << 63}),
])
def test_bad_priority_is_a_400(prioritized, route, body):
    client, eng = prioritized
    r = client.post(route, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "priority", r.json()
    eng.check_accounting()


def test_refused_where_priorities_are_off_and_refused():
    """(The core thread only: the client of a core process runs the same check, and so does the
    core behind it.)"""
    eng, live = serve(Engine, abort_on_priority_when_disabled=True)
    try:
        with httpx.Client(base_url=live.url, timeout=60) as client:
            for route, body in [("/generate", {"text": "hi", "priority": 1}),
                                ("/v1/completions", {"model": "tiny", "prompt": "hi", "priority": 1}),
                                ("/v1/embeddings", {"model": "tiny", "input": "hi", "priority": 1}),
                                ("/v1/score", {"query": "hi", "items": [" a"], "label_token_ids": [5], "priority": 1})]:
                r = client.post(route, json=body)
                assert r.status_code == 400, r.text
                assert r.json()["error"]["param"] == "priority" and "--enable-priority-scheduling" in r.json()["error"]["message"]
            ok = client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}})
            assert ok.status_code == 200
    finally:
        live.stop()
        eng.shutdown()
