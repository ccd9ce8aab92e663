"""The hostile-client matrix: every route, bad input of every kind → the right 4xx, OpenAI-shaped, fast; the server serves on with KV at baseline."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from .conftest import API_KEY, MODEL_NAME

C = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}
CH = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
G = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}


def with_nested(body: dict, key: str, depth: int) -> bytes:
    """`body` as JSON with `key` set to a list nested `depth` deep (json.dumps would recurse)."""
    head = json.dumps({**body, key: None})[:-len("null}")]
    return (head + "[" * depth + "1" + "]" * depth + "}").encode()


def deep_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def doubling(rounds: int) -> dict:
    ops = [{"op": "scope_begin", "name": "u0"}, {"op": "text", "text": "x"}, {"op": "scope_end", "name": "u0"}]
    for i in range(1, rounds + 1):
        ops += [{"op": "scope_begin", "name": f"u{i}"}, {"op": "var", "name": f"u{i - 1}"},
                {"op": "var", "name": f"u{i - 1}"}, {"op": "scope_end", "name": f"u{i}"}]
    return {"program": {"ops": ops}}


def nested_program(depth: int) -> bytes:
    opening = '{"op": "if", "ref": {"name": "a"}, "equals": "b", "then": ['
    return ('{"program": {"ops": [' + opening * depth + '{"op": "text", "text": "x"}' + "]}" * depth
            + "]}}").encode()


# (id, path, body (dict → JSON, bytes → raw), status, param or None)
CASES = [
    # -- /v1/completions
    ("c-malformed-json", "/v1/completions", b"{not json", 400, None),
    ("c-array-body", "/v1/completions", b"[1, 2]", 400, None),
    ("c-empty-body", "/v1/completions", b"", 400, None),
    ("c-invalid-utf8", "/v1/completions", b'{"model": "tiny", "prompt": "\xff\xfe"}', 400, None),
    ("c-lone-surrogate", "/v1/completions", b'{"model": "tiny", "prompt": "a\\ud800b", "max_tokens": 1}', 400, None),
    ("c-nan", "/v1/completions", b'{"model": "tiny", "prompt": "x", "temperature": NaN}', 400, None),
    ("c-inf-temperature", "/v1/completions", b'{"model": "tiny", "prompt": "x", "temperature": 1e999}', 400, None),
    ("c-missing-model", "/v1/completions", {"prompt": "x"}, 400, "model"),
    ("c-missing-prompt", "/v1/completions", {"model": MODEL_NAME}, 400, "prompt"),
    ("c-prompt-int", "/v1/completions", {**C, "prompt": 5}, 400, "prompt"),
    ("c-prompt-empty-list", "/v1/completions", {**C, "prompt": []}, 400, "prompt"),
    ("c-prompt-empty-ids", "/v1/completions", {**C, "prompt": [[]]}, 400, "prompt"),
    ("c-prompt-mixed", "/v1/completions", {**C, "prompt": ["a", 1]}, 400, "prompt"),
    ("c-oov-token", "/v1/completions", {**C, "prompt": [10 ** 9]}, 400, "prompt"),
    ("c-negative-token", "/v1/completions", {**C, "prompt": [-1, 5]}, 400, "prompt"),
    ("c-max-tokens-string", "/v1/completions", {**C, "max_tokens": "5"}, 400, "max_tokens"),
    ("c-max-tokens-negative", "/v1/completions", {**C, "max_tokens": -1}, 400, "max_tokens"),
    ("c-max-tokens-huge", "/v1/completions", {**C, "max_tokens": 10 ** 12}, 400, "max_tokens"),
    ("c-n-zero", "/v1/completions", {**C, "n": 0}, 400, "n"),
    ("c-n-huge", "/v1/completions", {**C, "n": 10 ** 6}, 400, "n"),
    ("c-logprobs-high", "/v1/completions", {**C, "logprobs": 21}, 400, "logprobs"),
    ("c-logprobs-negative", "/v1/completions", {**C, "logprobs": -1}, 400, "logprobs"),
    ("c-thousands-of-stops", "/v1/completions", {**C, "stop": [f"s{i}" for i in range(5000)]}, 400, "stop"),
    ("c-long-stop", "/v1/completions", {**C, "stop": ["x" * 5000]}, 400, "stop"),
    ("c-empty-stop", "/v1/completions", {**C, "stop": [""]}, 400, "stop"),
    ("c-unknown-model", "/v1/completions", {**C, "model": "gpt-9"}, 404, "model"),
    ("c-unknown-field", "/v1/completions", {**C, "frobnicate": 1}, 400, "frobnicate"),
    ("c-invalid-regex", "/v1/completions", {**C, "regex": "("}, 400, "regex"),
    ("c-huge-regex", "/v1/completions", {**C, "regex": "a" * 70_000}, 400, "regex"),
    ("c-schema-not-json", "/v1/completions", {**C, "json_schema": "{"}, 400, "json_schema"),
    ("c-schema-deep", "/v1/completions", {**C, "json_schema": deep_schema(100)}, 400, "json_schema"),
    ("c-structural-tag-deep", "/v1/completions", {**C, "structured_outputs": {"structural_tag": json.dumps({
        "structures": [{"begin": "<a>", "schema": deep_schema(100), "end": ""}], "triggers": ["<a"]})}}, 400,
     "structured_outputs.structural_tag"),
    ("c-structural-tag-triggers", "/v1/completions", {**C, "response_format": {
        "type": "structural_tag", "structures": [{"begin": "<a>", "schema": {}, "end": ""}],
        "triggers": [f"<{i}" for i in range(1000)] + ["<a"]}}, 400, "response_format"),
    ("c-stream-options-no-stream", "/v1/completions", {**C, "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("c-logit-bias-oov", "/v1/completions", {**C, "logit_bias": {str(10 ** 9): 1.0}}, 400, "logit_bias"),
    ("c-logit-bias-range", "/v1/completions", {**C, "logit_bias": {"5": 1e9}}, 400, "logit_bias"),
    ("c-suffix", "/v1/completions", {**C, "suffix": "end"}, 400, "suffix"),
    ("c-best-of", "/v1/completions", {**C, "best_of": 3}, 400, "best_of"),
    ("c-seed-string", "/v1/completions", {**C, "seed": "x"}, 400, "seed"),
    ("c-top-p-zero", "/v1/completions", {**C, "top_p": 0}, 400, "top_p"),
    ("c-huge-body", "/v1/completions", {**C, "prompt": "x" * 300_000}, 413, None),
    ("c-deep-nesting", "/v1/completions", with_nested(C, "prompt", 20_000), 400, None),
    # -- /v1/chat/completions
    ("ch-no-messages", "/v1/chat/completions", {**CH, "messages": []}, 400, "messages"),
    ("ch-unknown-role", "/v1/chat/completions", {**CH, "messages": [{"role": "wizard", "content": "x"}]}, 400,
     "messages"),
    ("ch-content-int", "/v1/chat/completions", {**CH, "messages": [{"role": "user", "content": 5}]}, 400,
     "messages"),
    ("ch-missing-role", "/v1/chat/completions", {**CH, "messages": [{"content": "x"}]}, 400, "messages"),
    ("ch-message-not-object", "/v1/chat/completions", {**CH, "messages": ["hi"]}, 400, "messages"),
    ("ch-tools", "/v1/chat/completions", {**CH, "tools": [{"type": "function"}]}, 400, "tools"),
    ("ch-tool-choice", "/v1/chat/completions", {**CH, "tool_choice": "required"}, 400, "tool_choice"),
    ("ch-top-logprobs-alone", "/v1/chat/completions", {**CH, "top_logprobs": 2}, 400, "top_logprobs"),
    ("ch-top-logprobs-high", "/v1/chat/completions", {**CH, "logprobs": True, "top_logprobs": 50}, 400,
     "top_logprobs"),
    ("ch-max-completion-negative", "/v1/chat/completions", {**CH, "max_completion_tokens": -5}, 400,
     "max_completion_tokens"),
    ("ch-presence-penalty", "/v1/chat/completions", {**CH, "presence_penalty": 5}, 400, "presence_penalty"),
    ("ch-response-format-yaml", "/v1/chat/completions", {**CH, "response_format": {"type": "yaml"}}, 400,
     "response_format"),
    ("ch-json-schema-missing", "/v1/chat/completions", {**CH, "response_format": {"type": "json_schema"}}, 400,
     "response_format"),
    ("ch-deep-metadata", "/v1/chat/completions", with_nested(CH, "metadata", 20_000), 400, None),
    ("ch-n-huge", "/v1/chat/completions", {**CH, "n": 10 ** 9}, 400, "n"),
    ("ch-context-overflow", "/v1/chat/completions", {**CH, "max_tokens": 10 ** 6}, 400, "max_tokens"),
    # -- /generate
    ("g-both-inputs", "/generate", {"text": "x", "input_ids": [1]}, 400, "text"),
    ("g-no-input", "/generate", {"sampling_params": {}}, 400, "text"),
    ("g-empty-ids", "/generate", {"input_ids": []}, 400, "input_ids"),
    ("g-mixed-ids", "/generate", {"input_ids": [[1, 2], 3]}, 400, "input_ids"),
    ("g-oov-ids", "/generate", {"input_ids": [10 ** 9]}, 400, "input_ids"),
    ("g-sampling-mismatch", "/generate", {"text": ["a", "b"], "sampling_params": [{}]}, 400, "sampling_params"),
    ("g-negative-max-new", "/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}, 400,
     "max_new_tokens"),
    ("g-unknown-sampling-key", "/generate", {"text": "x", "sampling_params": {"bogus": 1}}, 400, None),
    ("g-stop-regex-backref", "/generate", {"text": "x", "sampling_params": {"stop_regex": "(a)\\1"}}, 400, None),
    ("g-stop-regex-huge-automaton", "/generate", {"text": "x", "sampling_params": {"stop_regex": "a{3000}"}}, 400,
     None),
    ("g-stop-regex-invalid", "/generate", {"text": "x", "sampling_params": {"stop_regex": "(("}}, 400, None),
    ("g-top-logprobs-negative", "/generate", {**G, "top_logprobs_num": -1}, 400, "top_logprobs_num"),
    ("g-top-logprobs-huge", "/generate", {**G, "top_logprobs_num": 1000}, 400, "top_logprobs_num"),
    ("g-logprob-start-bad", "/generate", {**G, "return_logprob": True, "logprob_start_len": -3}, 400,
     "logprob_start_len"),
    # GBNF quotes literals with ", so this grammar does not parse
    ("g-ebnf", "/generate", {"text": "x", "sampling_params": {"ebnf": "root ::= 'a'"}}, 400, "ebnf"),
    ("g-structural-tag-empty", "/generate", {"text": "x", "sampling_params": {"structural_tag": "{}"}}, 400,
     "structural_tag"),
    ("g-structural-tag-not-json", "/generate", {"text": "x", "sampling_params": {"structural_tag": "{"}}, 400,
     "structural_tag"),
    ("g-structural-tag-begin", "/generate", {"text": "x", "sampling_params": {"structural_tag": {
        "structures": [{"begin": "<b>", "schema": {}, "end": ""}], "triggers": ["<a"]}}}, 400, "structural_tag"),
    ("g-structural-tag-schema", "/generate", {"text": "x", "sampling_params": {"structural_tag": {
        "structures": [{"begin": "<a>", "schema": "{}", "end": ""}], "triggers": ["<a"]}}}, 400, "structural_tag"),
    ("g-too-many-prompts", "/generate", {"text": ["a"] * 1000}, 400, "text"),
    ("g-n-huge", "/generate", {"text": "x", "sampling_params": {"n": 1000}}, 400, "n"),
    ("g-stream-bad-logprobs", "/generate", {**G, "stream": True, "top_logprobs_num": -1}, 400, "top_logprobs_num"),
    ("g-wrong-type-text", "/generate", {"text": 5}, 400, "text"),
    # -- /v1/programs: each bomb
    ("p-ops-not-list", "/v1/programs", {"program": {"ops": "nope"}}, 400, "program"),
    ("p-unknown-op", "/v1/programs", {"program": {"ops": [{"op": "launch"}]}}, 400, "program"),
    ("p-doubling", "/v1/programs", doubling(40), 400, "program"),
    ("p-fork-bomb", "/v1/programs", {"program": {"ops": [{"op": "fork", "id": "f", "n": 10 ** 6}]}}, 400,
     "program"),
    ("p-select-choices", "/v1/programs",
     {"program": {"ops": [{"op": "select", "name": "x", "choices": [str(i) for i in range(5000)]}]}}, 400,
     "program"),
    ("p-token-budget-n", "/v1/programs",
     {"program": {"ops": [{"op": "gen", "name": f"g{i}", "params": {"max_new_tokens": 2048, "n": 128}}
                          for i in range(128)]}}, 400, "program"),
    ("p-token-budget", "/v1/programs",
     {"program": {"ops": [{"op": "gen", "params": {"max_new_tokens": 2048}}] * 200}}, 400, "program"),
    ("p-gen-n", "/v1/programs", {"program": {"ops": [{"op": "gen", "name": "a", "params": {"n": 3}}]}}, 400,
     "program"),
    ("p-deep-nesting", "/v1/programs", nested_program(2000), 400, None),
    ("p-missing-argument", "/v1/programs",
     {"program": {"ops": [{"op": "var", "name": "q", "source": "arg"}], "arguments": ["q"]}}, 400, "program"),
    ("p-unknown-param", "/v1/programs", {"program": {"ops": [{"op": "gen", "params": {"temprature": 0}}]}}, 400,
     "program"),
    ("p-stream-bad", "/v1/programs", {"program": {"ops": "nope"}, "stream": True}, 400, "program"),
    # -- other routes
    ("a-empty", "/abort_request", {}, 400, "rid"),
    ("a-rid-int", "/abort_request", {"rid": 5}, 400, "rid"),
]


def _send(client: httpx.Client, path: str, body: object) -> httpx.Response:
    if isinstance(body, bytes):
        return client.post(path, content=body, headers={"content-type": "application/json"})
    return client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


def _kv_at_baseline(engine) -> None:
    deadline = time.monotonic() + 2
    while engine.stats().kv_slots_used != 0 or engine.stats().num_running != 0:
        assert time.monotonic() < deadline, engine.stats()
        time.sleep(0.01)
    engine.check_accounting()


def test_matrix_is_big_enough():
    assert len(CASES) >= 60
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name, path, body, status, param", CASES, ids=[c[0] for c in CASES])
def test_hostile_request(client, engine, name, path, body, status, param):
    start = time.monotonic()
    r = _send(client, path, body)
    elapsed = time.monotonic() - start
    assert r.status_code == status, (name, r.status_code, r.text[:500])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param, err
    assert elapsed < 5, f"{name} took {elapsed:.1f} s"
    ok = client.post("/generate", json={"text": "after " + name, "sampling_params": {"max_new_tokens": 1,
                                                                               "ignore_eos": True}})
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 1
    _kv_at_baseline(engine)
    assert not engine.invariant_violations


def test_other_status_codes(server, client):
    assert client.get("/v1/completions").status_code == 405
    assert client.get("/v1/models/gpt-9").status_code == 404
    assert client.get("/no/such/route").status_code == 404
    with httpx.Client(base_url=server.url) as anonymous:
        assert anonymous.post("/v1/completions", json=C).status_code == 401


def _one_token_latency(client: httpx.Client) -> float:
    start = time.perf_counter()
    assert client.post("/generate", json={"text": "ping", "sampling_params": {"max_new_tokens": 1}}).status_code == 200
    return time.perf_counter() - start


@pytest.mark.parametrize("bomb", [
    ("/generate", {"text": "x" * 40, "sampling_params": {"max_new_tokens": 150, "ignore_eos": True,
                                                         "stop_regex": "(.+.+)+\\x00"}}),
    ("/v1/programs", doubling(40)),
])
def test_bombs_do_not_slow_a_concurrent_request(server, client, bomb):
    baseline = min(_one_token_latency(client) for _ in range(3))
    path, body = bomb
    done = threading.Event()

    def fire() -> None:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as c:
            while not done.is_set():
                c.post(path, json=body)

    worker = threading.Thread(target=fire)
    worker.start()
    try:
        time.sleep(0.1)
        during = min(_one_token_latency(client) for _ in range(3))
    finally:
        done.set()
        worker.join()
    assert during < max(10 * baseline, 0.5), (baseline, during)
