"""`return_hidden_states` on /generate (both cores): with --enable-return-hidden-states the
response's meta_info holds the states the engine computes in-process (one response, a batch, the
last event of a stream); without it, or not a boolean, a 400 naming the field."""
from __future__ import annotations

import json

import httpx
import pytest
import torch

from .conftest import LiveServer
from radixflow.frontend.server import create_app
from radixflow.runtime import Engine, EngineClient
from radixflow.runtime.model.demo import demo_model

GREEDY = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def reference():
    with Engine(demo_model("tiny"), enable_return_hidden_states=True) as engine:
        return {text: engine.generate(text, GREEDY, return_hidden_states=True) for text in ("the river", "a note")}


@pytest.fixture(scope="module", params=[Engine, EngineClient], ids=["core-thread", "core-process"])
def served(request):
    eng = request.param(demo_model("tiny"), check_invariants=True, enable_return_hidden_states=True)
    live = LiveServer(create_app(eng, "tiny")).start()
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client, eng
    live.stop()
    eng.shutdown()


def _same(got: dict, want: dict) -> None:
    assert got["output_ids"] == want["output_ids"]
    hidden, ref = got["meta_info"]["hidden_states"], want["meta_info"]["hidden_states"]
    assert len(hidden) == len(ref) == len(want["output_ids"])
    torch.testing.assert_close(torch.tensor(hidden[0]), torch.tensor(ref[0]))
    torch.testing.assert_close(torch.tensor(hidden[1:]), torch.tensor(ref[1:]))


def test_one_a_batch_and_a_stream(served, reference):
    client, eng = served
    one = client.post("/generate", json={"text": "the river", "sampling_params": GREEDY, "return_hidden_states": True})
    assert one.status_code == 200, one.text
    _same(one.json(), reference["the river"])
    batch = client.post("/generate", json={"text": ["the river", "a note"], "sampling_params": GREEDY,
                                           "return_hidden_states": True})
    assert batch.status_code == 200, batch.text
    for got, text in zip(batch.json(), ["the river", "a note"]):
        _same(got, reference[text])
    with client.stream("POST", "/generate", json={"text": "a note", "sampling_params": GREEDY, "stream": True,
                                                  "return_hidden_states": True}) as r:
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert all("hidden_states" not in e["meta_info"] for e in events[:-1])
    _same(events[-1], reference["a note"])
    plain = client.post("/generate", json={"text": "a note", "sampling_params": GREEDY}).json()
    assert "hidden_states" not in plain["meta_info"]
    eng.check_accounting()


def test_not_a_boolean_is_a_400(served):
    client, _ = served
    r = client.post("/generate", json={"text": "hi", "return_hidden_states": "yes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "return_hidden_states", r.text


def test_refused_without_the_flag():
    eng = Engine(demo_model("tiny"))
    live = LiveServer(create_app(eng, "tiny")).start()
    try:
        with httpx.Client(base_url=live.url, timeout=60) as client:
            r = client.post("/generate", json={"text": "hi", "return_hidden_states": True})
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == "return_hidden_states" and "--enable-return-hidden-states" in error["message"]
            assert client.post("/generate", json={"text": "hi", "return_hidden_states": False}).status_code == 200
    finally:
        live.stop()
        eng.shutdown()
