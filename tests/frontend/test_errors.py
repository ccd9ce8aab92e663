"""The error matrix: OpenAI-shaped bodies, the right status, and the engine keeps serving."""
from __future__ import annotations

import httpx
import pytest
from radixflow.runtime.model.demo import demo_model

MODEL_NAME = "tiny"  # the conftest server's

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMP = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, "ignore_eos": True}


def _error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {**COMP, "max_tokens": "5"}, "max_tokens"),
    ("/v1/completions", {**COMP, "temperature": -1}, "temperature"),
    ("/v1/completions", {**COMP, "temperature": 3}, "temperature"),
    ("/v1/completions", {**COMP, "top_p": 0}, "top_p"),
    ("/v1/completions", {**COMP, "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {**COMP, "n": 0}, "n"),
    ("/v1/completions", {**COMP, "logprobs": 50}, "logprobs"),
    ("/v1/completions", {**COMP, "prompt": []}, "prompt"),
    ("/v1/completions", {**COMP, "prompt": ["a", 1]}, "prompt"),
    ("/v1/completions", {**COMP, "frobnicate": 1}, "frobnicate"),
    ("/v1/completions", {"prompt": "x"}, "model"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema"}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "yaml"}}, "response_format"),
    ("/v1/chat/completions", {**CHAT, "presence_penalty": 5}, "presence_penalty"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, "tools"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ("/generate", {"text": "x", "sampling_params": {"bogus": 1}}, None),
    ("/generate", {"sampling_params": {}}, "text"),
    ("/generate", {"input_ids": [10 ** 9]}, "input_ids"),
    ("/generate", {"text": "x", "stream": True, "top_logprobs_num": -1}, "top_logprobs_num"),
    ("/v1/programs", {"program": {"ops": "nope"}}, "program"),
])
def test_bad_requests_are_400(client, path, body, param):
    _error(client.post(path, json=body), 400, param)


@pytest.mark.parametrize("function", [[1], 5, True, "x", {"name": "f", "arguments": 5}])
def test_tool_calls_of_the_wrong_shape_are_400(client, function):
    call = {"id": "c", "type": "function", "function": function}
    _error(client.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "assistant", "tool_calls": [call]}]}),
           400, "messages")


def test_invalid_json_and_empty_body(client):
    _error(client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"}), 400)
    _error(client.post("/generate", content=b""), 400)
    _error(client.post("/v1/chat/completions", content=b"[1, 2]"), 400)


@pytest.mark.parametrize("path, body, param", [
    ("/generate", {"input_ids": [[1], []]}, "input_ids"),
    ("/v1/completions", {**COMP, "prompt": [10 ** 9]}, "prompt"),
    ("/v1/completions", {**COMP, "prompt": [[1], []]}, "prompt"),
    ("/v1/completions", {**COMP, "regex": "["}, "regex"),
    ("/v1/completions", {**COMP, "json_schema": "{"}, "json_schema"),
    ("/v1/chat/completions", {**CHAT, "json_schema": {"type": "bogus"}}, "json_schema"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "bogus"}}}}, "response_format"),
    ("/generate", {"text": "x", "sampling_params": {"regex": "["}}, "regex"),
    ("/generate", {"text": "x", "sampling_params": {"json_schema": {"type": "bogus"}}}, "json_schema"),
])
def test_prompt_and_grammar_errors_name_the_field(client, path, body, param):
    _error(client.post(path, json=body), 400, param)


def test_prompt_longer_than_max_model_len(client, engine):
    long_ids = [5] * (engine.max_context_len + 1)
    err = _error(client.post("/v1/completions", json={**COMP, "prompt": long_ids}), 400)
    assert err["message"].startswith(f"This model's maximum context length is {engine.max_context_len} tokens")
    assert err["code"] == "context_length_exceeded"
    fits = [5] * (engine.max_context_len - 10)
    err = _error(client.post("/v1/completions", json={**COMP, "prompt": fits, "max_tokens": 11}), 400, "max_tokens")
    assert f"requested {engine.max_context_len + 1} tokens" in err["message"]
    _error(client.post("/generate", json={"input_ids": long_ids, "stream": True}), 400)


@pytest.mark.parametrize("constraint", [{"json_schema": {}}, {"regex": "a"}])
def test_response_format_with_another_constraint_is_400(client, constraint):
    body = {**CHAT, "response_format": {"type": "json_object"}, **constraint}
    err = _error(client.post("/v1/chat/completions", json=body), 400, "response_format")
    assert next(iter(constraint)) in err["message"]


def test_auth(server):
    with httpx.Client(base_url=server.url) as c:
        _error(c.post("/v1/completions", json=COMP), 401)
        _error(c.get("/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
        _error(c.post("/generate", json={"text": "x"}, headers={"Authorization": "Basic test-key"}), 401)
        assert c.get("/health").status_code == 200  # probes need no key
        assert c.get("/metrics").status_code == 200


def test_the_max_tokens_field_is_named_as_the_client_sent_it(client):
    err = _error(client.post("/v1/chat/completions", json={**CHAT, "max_completion_tokens": -1}), 400)
    assert err["message"] == "max_completion_tokens must be >= 0"
    err = _error(client.post("/v1/chat/completions", json={**CHAT, "max_tokens": -1}), 400, "max_tokens")
    assert err["message"] == "max_tokens must be >= 0"
    _error(client.post("/v1/chat/completions", json={**CHAT, "max_completion_tokens": 10 ** 6}), 400,
           "max_completion_tokens")


def test_unknown_model_and_route(client):
    err = _error(client.post("/v1/completions", json={**COMP, "model": "gpt-9"}), 404, "model")
    assert err["code"] == "model_not_found"
    _error(client.get("/v1/models/gpt-9"), 404)
    _error(client.get("/v1/nothing-here"), 404)
    _error(client.get("/v1/completions"), 405)


def test_limits_on_user_and_session_id(client):
    from radixflow.frontend.limits import RequestLimits

    limit = RequestLimits().max_user_chars
    for path, body, param in [("/v1/chat/completions", CHAT, "user"), ("/v1/completions", COMP, "user"),
                              ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1}}, "session_id")]:
        ok = client.post(path, json={**body, param: "u" * limit})
        assert ok.status_code == 200, ok.text
        err = _error(client.post(path, json={**body, param: "u" * (limit + 1)}), 400, param)
        assert err["code"] == "limit_exceeded" and "max_user_chars" in err["message"]


def test_body_too_large(client):
    big = {**COMP, "prompt": "x" * (300 * 1024)}  # the test server caps bodies at 256 KiB
    _error(client.post("/v1/completions", json=big), 413)

    def chunks():  # no content-length: the cap applies while streaming the body in
        for _ in range(40):
            yield b" " * 8192

    _error(client.post("/generate", content=chunks()), 413)


def test_engine_keeps_serving_after_errors(client, engine):
    for body in ({**COMP, "n": -3}, {**COMP, "model": "nope"}, {**COMP, "stop": [""]}):
        assert client.post("/v1/completions", json=body).status_code in (400, 404)
    ok = client.post("/v1/completions", json=COMP)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
    engine.check_accounting()
    assert engine.invariant_violations == []


def test_queue_full_is_429_and_others_are_served(live_server):
    """Past max_num_seqs + max_queued_requests in flight, a request gets 429 (rate_limit_error)."""
    import threading

    import httpx

    from radixflow.frontend.server import create_app
    from radixflow.runtime import Engine

    with Engine(demo_model("tiny"), kv_cache_tokens=4096, max_num_seqs=1, max_queued_requests=1) as eng:
        live = live_server(create_app(eng, "tiny")).start()
        statuses: list[int] = []
        gate = threading.Event()

        def post(i: int) -> None:
            gate.wait()
            body = {"text": f"busy {i}", "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}}
            r = httpx.post(live.url + "/generate", json=body, timeout=60)
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert r.json()["error"]["type"] == "rate_limit_error"

        try:
            threads = [threading.Thread(target=post, args=(i,)) for i in range(6)]
            for t in threads:
                t.start()
            gate.set()
            for t in threads:
                t.join()
            assert 429 in statuses and statuses.count(200) >= 2, statuses
            ok = httpx.post(live.url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}})
            assert ok.status_code == 200
        finally:
            live.stop()
