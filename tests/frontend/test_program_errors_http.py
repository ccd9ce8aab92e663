"""/v1/programs error statuses: a malformed program is a 400, an unexpected failure a 500, and a streamed
program that fails ends its stream with an in-band error event, then [DONE]."""
from __future__ import annotations

import json

import httpx
import pytest

from radixflow.frontend.program_backend import ServerBackend


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
