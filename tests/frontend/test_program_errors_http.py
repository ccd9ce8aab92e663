"""/v1/programs error statuses: a malformed program is a 400; a generation the engine fails or aborts, or an
unexpected failure, a 500; a streamed program that fails ends with an in-band error event, then [DONE]."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from radixflow.frontend.program_backend import ServerBackend
from radixflow.frontend.server import create_app

from .conftest import LiveServer


def fork_then(var: dict) -> dict:
    return {"program": {"ops": [{"op": "text", "text": "hi"},
                                {"op": "fork", "id": "f", "n": 2,
                                 "body": [{"op": "gen", "name": "y", "params": {"max_new_tokens": 2}}]},
                                var]}}


def events(response: httpx.Response) -> list:
    lines = [line[len("data: "):] for line in response.iter_lines() if line]
    assert lines[-1] == "[DONE]", lines
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("index", [None, 5, -1, -3])
def test_fork_variable_without_a_valid_index_is_400(client, index):
    var = {"op": "var", "name": "y", "fork": "f", **({} if index is None else {"index": index})}
    for stream in (False, True):
        r = client.post("/v1/programs", json={**fork_then(var), "stream": stream})
        assert r.status_code == 400, r.text
        assert "needs an index in [0, 2)" in r.json()["error"]["message"]
    ok = client.post("/v1/programs", json=fork_then({"op": "var", "name": "y", "fork": "f", "index": 1}))
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("tokens", ["2047", 2047.0])
def test_token_budget_counts_the_value_that_will_run(client, tokens):
    program = {"ops": [{"op": "gen", "params": {"max_new_tokens": tokens}}] * 200}
    r = client.post("/v1/programs", json={"program": program})
    assert r.status_code == 400, r.text
    assert "max_total_new_tokens" in r.json()["error"]["message"]


def test_unexpected_failure_in_a_streamed_program_ends_in_band(client, monkeypatch):
    def broken(self):
        raise KeyError("no markers today")

    monkeypatch.setattr(ServerBackend, "role_markers", broken)
    program = {"ops": [{"op": "gen", "name": "a", "params": {"max_new_tokens": 2}},
                       {"op": "role_begin", "role": "user"}]}
    with client.stream("POST", "/v1/programs", json={"program": program, "stream": True}) as r:
        assert r.status_code == 200
        got = events(r)
    assert got[0]["variable"] == "a"
    error = got[-1]["error"]
    assert error["type"] == "server_error" and "no markers today" in error["message"]
    r = client.post("/v1/programs", json={"program": program})
    assert r.status_code == 500 and "no markers today" in r.json()["error"]["message"]


def test_engine_failure_inside_a_program_is_500(engine):
    from .test_conformance import FaultyEngine

    wrapped = FaultyEngine(engine)
    wrapped.mode = "error"
    live = LiveServer(create_app(wrapped, "tiny")).start()
    program = {"ops": [{"op": "text", "text": "hi"}, {"op": "gen", "name": "a", "params": {"max_new_tokens": 4}}]}
    try:
        r = httpx.post(live.url + "/v1/programs", json={"program": program}, timeout=60)
        assert r.status_code == 500, r.text
        assert "boom: CUDA fell over" in r.json()["error"]["message"]
        with httpx.stream("POST", live.url + "/v1/programs", json={"program": program, "stream": True}) as r:
            error = events(r)[-1]["error"]
        assert error["type"] == "server_error" and "boom: CUDA fell over" in error["message"]
        select = {"ops": [{"op": "text", "text": "hi"}, {"op": "select", "name": "s", "choices": ["a", "b"]}]}
        r = httpx.post(live.url + "/v1/programs", json={"program": select}, timeout=60)
        assert r.status_code == 200, r.text  # select sends prefill-only requests, which this fault spares
    finally:
        live.stop()


def test_gen_aborted_inside_a_program_is_500(client, engine, wait_idle):
    program = {"ops": [{"op": "text", "text": "hi"},
                       {"op": "gen", "name": "a", "params": {"max_new_tokens": 1500, "ignore_eos": True}},
                       {"op": "text", "text": "never"}]}
    answers: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: answers.append(client.post("/v1/programs", json={"program": program})))
    worker.start()
    deadline = time.monotonic() + 10
    while engine.stats().num_running == 0:
        assert time.monotonic() < deadline, "the program's gen never started"
        time.sleep(0.005)
    assert client.post("/abort_request", json={"abort_all": True}).status_code == 200
    worker.join(timeout=30)
    r = answers[0]
    assert r.status_code == 500, r.text
    assert "abort" in r.json()["error"]["message"]
    wait_idle(engine, kv=True)


STAG = {"structures": [{"begin": "<f>", "schema": {"type": "nope"}, "end": "</f>"}], "triggers": ["<f>"]}


@pytest.mark.parametrize("params, reasoning, words", [
    ({"logit_bias": {"5": 1000}}, None, "logit_bias values must be in [-100, 100]"),
    ({"structural_tag": "{bad"}, None, "structural_tag is not valid JSON"),
    ({"json_schema": json.dumps({"not": {"const": 3}})}, None, "'not' at #"),
    ({}, "nope", "model_type must be one of"),
    ({"logit_bias": {"999999": 1}}, None, "outside the vocabulary"),  # checked by the engine, as the gen runs
    ({"structural_tag": json.dumps(STAG)}, None, "structures[0].schema does not compile"),
])
def test_bad_gen_values_are_400s_naming_the_gen(client, params, reasoning, words):
    gen = {"op": "gen", "name": "a", "params": {"max_new_tokens": 2, **params},
           **({} if reasoning is None else {"reasoning": reasoning})}
    r = client.post("/v1/programs", json={"program": {"ops": [{"op": "text", "text": "hi"}, gen]}})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("gen 'a': ") and words in message, message
