"""A sweep of malformed and out-of-range requests over every generation route: each is answered
200 or 4xx with an OpenAI-shaped error body (never a 500, never a hang), and the server goes on
serving with no request, lock or KV slot left behind."""
from __future__ import annotations

import json

import pytest

from .conftest import MODEL_NAME

NAN = float("nan")


def _chat(**kw) -> tuple[str, dict]:
    return "/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}],
                                    "max_tokens": 3, **kw}


def _completion(**kw) -> tuple[str, dict]:
    return "/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 3, **kw}


def _native(sp: dict | None = None, **kw) -> tuple[str, dict]:
    return "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3, **(sp or {})}, **kw}


def _schema(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}


CASES = [
    _chat(messages="hi"), _chat(messages=[]), _chat(messages=[{"role": "wizard", "content": "x"}]),
    _chat(messages=[{"role": "user"}] * 10_000),
    _chat(messages=[{"content": "x"}]), _chat(messages=[{"role": "user", "content": [{"type": "bogus"}]}]),
    _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]),
    _chat(messages=[{"role": "user", "content": None}]), _chat(messages=[{"role": "user", "content": 5}]),
    _chat(n=0), _chat(n=1000), _chat(max_tokens=-1), _chat(max_tokens=0), _chat(max_tokens=10**9),
    _chat(max_completion_tokens=-1),
    _chat(max_completion_tokens=-3), _chat(temperature=-1), _chat(temperature="abc"), _chat(temperature=NAN),
    _chat(temperature=float("inf")), _chat(top_p=0), _chat(top_p=2), _chat(top_k=-5), _chat(top_k=10**9),
    _chat(min_p=2), _chat(logprobs=True, top_logprobs=30), _chat(logprobs=True, top_logprobs=-1),
    _chat(top_logprobs=3), _chat(stop=5), _chat(stop=["a"] * 50), _chat(stop=[""]), _chat(stop=""),
    _chat(response_format={"type": "json_schema"}), _chat(response_format=_schema({"type": "bogus"})),
    _chat(response_format=_schema("notadict")), _chat(response_format={"type": "weird"}),
    _chat(response_format={"type": "json_object"}, json_schema={}),
    _chat(response_format={"type": "json_object"}, regex="a"),
    _chat(response_format={"type": "json_object"}, max_tokens=5), _chat(tools=[{"type": "function"}]),
    _chat(tools="x"), _chat(tool_choice="required"), _chat(stream=True, stream_options="x"),
    _chat(stream=True, stream_options={"include_usage": "yes"}), _chat(logit_bias={"abc": 1}),
    _chat(logit_bias={"99999999": 1}), _chat(logit_bias={"5": 1e9}), _chat(logit_bias={"5": NAN}),
    _chat(seed=2**70), _chat(seed=-1), _chat(user=5), _chat(frequency_penalty=5), _chat(presence_penalty=-3),
    _chat(repetition_penalty=0), _chat(n=2, stream=True), _chat(regex="["), _chat(regex="a{2,1}"),
    _chat(json_schema="{"), _chat(ebnf="root ::= "), _chat(min_tokens=10, max_tokens=2), _chat(min_tokens=-1),
    _chat(stop_token_ids=[10**9]), _chat(stop_token_ids="x"), _chat(ignore_eos="yes"), _chat(model=None),
    _chat(model=5), _chat(lora_path="nope"), _chat(chat_template_kwargs=5), _chat(continue_final_message=True),
    _completion(prompt=[10**9]), _completion(prompt=[[1, 2], [3]]), _completion(prompt=[[1, 2], "a"]),
    _completion(prompt=""), _completion(prompt=[]), _completion(prompt=[[]]), _completion(prompt=[-1]),
    _completion(prompt=[1.5]), _completion(prompt=None), _completion(prompt=True), _completion(prompt={"a": 1}),
    _completion(echo=True, logprobs=2), _completion(echo=True, logprobs=2, max_tokens=0), _completion(logprobs=100),
    _completion(logprobs=-1), _completion(best_of=2, n=3), _completion(best_of=0), _completion(suffix="x"),
    _completion(n=3, stream=True), _completion(stream=True, stream_options={"include_usage": True}),
    _completion(max_tokens="5"), _completion(prompt="x" * 50000),
    _chat(user="u" * 100_000), _completion(user="u" * 100_000), _native(session_id="s" * 100_000),
    _native(), _native(text=None), _native(text=None, input_ids=[10**9]), _native(input_ids=[1]),
    _native(text=["a", "b"], sampling_params=[{}]), _native(text=["a", "b"], sampling_params=[{"max_new_tokens": 2}, 5]),
    _native({"regex": "["}), _native({"json_schema": "{"}), _native({"json_schema": "{}", "regex": "a"}),
    _native({"stop_token_ids": [10**9]}), _native({"n": 0}), _native({"n": 3}, stream=True),
    _native({"temperature": -2}), _native({"max_new_tokens": -1}), _native({"bogus": 1}),
    _native(return_logprob=True, logprob_start_len=10**6), _native(return_logprob=True, logprob_start_len=-5),
    _native(return_logprob=True, top_logprobs_num=-1), _native(return_logprob=True, top_logprobs_num=10**6),
    _native(return_logprob=True, token_ids_logprob=[10**9]), _native(lora_path="nope"), _native(image_data="x"),
    _native(rid=5), _native(rid=["a", "b"]), _native({"logit_bias": {"x": 1}}),
    _native({"min_new_tokens": 5, "max_new_tokens": 1}), _native(text=[], sampling_params={}),
    _native(text=None, input_ids=[]), _native(text=None, input_ids=[[]]), _native(text=None, input_ids=[[1], []]),
    _native({"stop": ["x"] * 100}), _native(stream="yes"), _native({"ebnf": "root ::= [a"}),
    *[_chat(messages=[{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": f}]}])
      for f in ([1], 5, True, "x", None, {"name": 5}, {"arguments": "{}"}, {"name": "f", "arguments": 5},
                {"name": "f", "arguments": "[" * 5000 + "]" * 5000}, {"name": "f", "arguments": "[" * 900 + "]" * 900})],
    _chat(messages=[{"role": "assistant", "tool_calls": [5]}]), _chat(messages=[{"role": "assistant", "tool_calls": {}}]),
]
RAW = [("/v1/chat/completions", b"{not json"), ("/v1/chat/completions", b""), ("/generate", b"[1,2]"),
       ("/v1/completions", b"null"), ("/generate", b'{"text": "\\ud800"}')]


def _is_answer(response) -> bool:
    if response.status_code == 200:
        return True
    if not 400 <= response.status_code < 500:
        return False
    error = response.json().get("error")
    return isinstance(error, dict) and isinstance(error.get("message"), str) and bool(error["message"])


@pytest.mark.parametrize("path,body", CASES + RAW, ids=lambda v: str(v)[:60] if isinstance(v, (dict, bytes)) else v)
def test_bad_input_gets_an_answer_never_a_500(client, path, body):
    content = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()
    with client.stream("POST", path, content=content, headers={"content-type": "application/json"}) as r:
        r.read()
    assert _is_answer(r), (r.status_code, r.text[:300])
    if r.status_code == 200 and "text/event-stream" in r.headers.get("content-type", ""):
        assert b'"internal_error"' not in r.content, r.text[:300]


def test_the_server_serves_on_after_the_sweep(client, engine, wait_idle):
    for path, body in CASES[:20]:
        client.post(path, content=json.dumps(body, allow_nan=True), headers={"content-type": "application/json"})
    assert client.get("/health_generate").status_code == 200
    ok = client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 2
    wait_idle(engine)
    stats = engine.stats()
    assert stats.num_running == 0 and stats.num_waiting == 0
