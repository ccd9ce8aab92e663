"""OpenAI and SGLang conformance at the edge: status codes, error types, stream shapes, tool messages, SGLang fields and routes."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest

from radixflow.frontend.server import create_app
from radixflow.runtime.errors import QueueFullError

from .conftest import API_KEY, MODEL_NAME, LiveServer

COMP = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, "ignore_eos": True}
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "ignore_eos": True}


def _sse(response: httpx.Response) -> list:
    events = [line[len("data: "):] for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


# -- a wrapped engine that can fail on demand and records chat template calls ---------------------


class RecordingTokenizer:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.chats: list[list[dict]] = []

    def apply_chat_template(self, messages: list[dict], **kwargs: Any) -> Any:
        self.chats.append(messages)
        return self._inner.apply_chat_template(messages, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FaultyEngine:
    """The real engine, except: `mode = "error"` ends every request with an engine failure
    after its first chunk; `mode = "full"` refuses every request as the queue limit does."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.tokenizer = RecordingTokenizer(inner.tokenizer)
        self.mode: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def generate_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[dict]:
        if self.mode == "full":
            raise QueueFullError("20 requests are in flight (max_num_seqs + max_queued_requests = 20); retry later")
        stream = self._inner.generate_stream(*args, **kwargs)
        try:
            async for chunk in stream:
                if self.mode == "error" and kwargs["sampling_params"].max_new_tokens > 0:
                    meta = {**chunk["meta_info"], "finish_reason": {"type": "error", "message": "boom: CUDA fell over"}}
                    yield {**chunk, "meta_info": meta}
                    return
                yield chunk
        finally:
            await stream.aclose()


@pytest.fixture(scope="module")
def faulty(engine) -> Iterator[tuple[FaultyEngine, httpx.Client]]:
    wrapped = FaultyEngine(engine)
    live = LiveServer(create_app(wrapped, MODEL_NAME, API_KEY)).start()
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as c:
        yield wrapped, c
    live.stop()


@pytest.fixture()
def fault(faulty):
    wrapped, client = faulty
    yield wrapped, client
    wrapped.mode = None


def test_engine_failure_is_500_with_message_and_in_band_in_streams(fault):
    wrapped, client = fault
    wrapped.mode = "error"
    for path, body in [("/v1/completions", COMP), ("/v1/chat/completions", CHAT),
                       ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})]:
        err = _error(client.post(path, json=body), 500)
        assert "boom: CUDA fell over" in err["message"] and err["type"] == "server_error"
        with client.stream("POST", path, json={**body, "stream": True}) as r:
            assert r.status_code == 200
            chunks = _sse(r)  # ends with [DONE]
        assert "boom: CUDA fell over" in chunks[-1]["error"]["message"]


def test_full_engine_is_429_with_retry_after_and_health_generate_503(fault):
    wrapped, client = fault
    wrapped.mode = "full"
    for path, body in [("/v1/completions", COMP), ("/generate", {"text": "hi"})]:
        r = client.post(path, json=body)
        _error(r, 429)
        assert r.headers["retry-after"] == "1"
    r = httpx.get(str(client.base_url) + "/health_generate")  # no API key: exempt, as SGLang
    assert r.status_code == 503 and "retry-after" in r.headers
    wrapped.mode = None
    assert httpx.get(str(client.base_url) + "/health_generate").status_code == 200


def test_tool_messages_reach_the_chat_template(fault):
    wrapped, client = fault
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    messages = [{"role": "user", "content": "1+2?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": "3", "tool_call_id": "call_1"}]
    r = client.post("/v1/chat/completions", json={**CHAT, "messages": messages})
    assert r.status_code == 200, r.text
    seen = wrapped.tokenizer.chats[-1]
    assert seen[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 1, "b": 2}}
    assert seen[2]["tool_call_id"] == "call_1"
    assert seen[1]["tool_calls"][0]["id"] == "call_1" and seen[1]["tool_calls"][0]["type"] == "function"


def test_tool_call_arguments_as_an_object_and_without_an_id(fault):
    wrapped, client = fault
    calls = [{"function": {"name": "add", "arguments": {"a": 1}}},
             {"id": "call_2", "type": "function", "function": {"name": "neg", "arguments": "not json"}}]
    messages = [{"role": "user", "content": "1+2?"}, {"role": "assistant", "tool_calls": calls}]
    r = client.post("/v1/chat/completions", json={**CHAT, "messages": messages})
    assert r.status_code == 200, r.text
    seen = wrapped.tokenizer.chats[-1][1]["tool_calls"]
    assert seen[0] == {"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
    assert seen[1]["function"] == {"name": "neg", "arguments": "not json"}


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "function", "function": {"name": "f f"}}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}}},
     "response_format"),
])
def test_tool_fields_without_tools_are_refused_never_ignored(client, extra, param):
    _error(client.post("/v1/chat/completions", json={**CHAT, **extra}), 400, param)


def test_tool_choice_none_and_strict_schema_are_served(client):
    r = client.post("/v1/chat/completions", json={**CHAT, "tool_choice": "none"})
    assert r.status_code == 200
    fmt = {"type": "json_schema", "json_schema": {"name": "yes_no", "strict": True, "schema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        "additionalProperties": False}}}
    r = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 20, "response_format": fmt})
    assert r.status_code == 200, r.text
    if r.json()["choices"][0]["finish_reason"] == "stop":
        assert set(json.loads(r.json()["choices"][0]["message"]["content"])) == {"ok"}


def test_openai_error_types(server, client):
    with httpx.Client(base_url=server.url) as c:
        err = _error(c.post("/v1/completions", json=COMP), 401)
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_api_key"
    err = _error(client.post("/v1/completions", json={**COMP, "model": "gpt-9"}), 404, "model")
    assert err["type"] == "invalid_request_error" and err["code"] == "model_not_found"


def test_max_tokens_defaults_to_the_rest_of_the_context(client, engine):
    ids = [7] * (engine.max_context_len - 3)
    out = client.post("/v1/completions", json={"model": MODEL_NAME, "prompt": ids, "ignore_eos": True}).json()
    assert out["usage"]["completion_tokens"] == 3 and out["choices"][0]["finish_reason"] == "length"


def test_echo_text_offsets_with_bos(client, engine):
    prompt = "The cat sat"
    ids = engine.tokenizer.encode(prompt)
    assert ids[0] in engine.tokenizer.special_token_ids  # the demo tokenizer adds BOS
    out = client.post("/v1/completions", json={**COMP, "prompt": prompt, "echo": True, "logprobs": 0}).json()
    lp = out["choices"][0]["logprobs"]
    text = out["choices"][0]["text"]
    expected = [len(engine.tokenizer.decode(ids[:i])) for i in range(len(ids))]
    assert lp["text_offset"][:len(ids)] == expected
    assert lp["text_offset"][len(ids)] == len(prompt) and text.startswith(prompt)


def test_stream_usage_only_with_include_usage(client):
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        chunks = _sse(r)
    assert all("usage" not in c for c in chunks)
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = _sse(r)
    assert all(c["usage"] is None for c in chunks[:-1]) and chunks[-1]["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("route, body", [("/v1/chat/completions", CHAT), ("/v1/completions", COMP)])
def test_continuous_usage_stats_put_each_choices_count_on_its_chunks(client, route, body):
    """vLLM's stream_options.continuous_usage_stats: every chunk after the opening carries the
    usage of its choice so far; the last (choices empty) the request's, as without it."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {**body, "stream": True, "stream_options": options, "max_tokens": 4, "n": 2, "temperature": 1.0,
            "ignore_eos": True}
    with client.stream("POST", route, json=body) as r:
        chunks = _sse(r)
    counts: dict[int, list[int]] = {0: [], 1: []}
    for chunk in chunks[:-1]:
        if chunk["usage"] is None:
            assert chunk["choices"][0].get("delta", {}).get("role") == "assistant"  # the opening
            continue
        [choice] = chunk["choices"]
        usage = chunk["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        counts[choice["index"]].append(usage["completion_tokens"])
    assert all(c == sorted(c) and c[-1] == 4 and c[0] >= 1 for c in counts.values()), counts
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    with client.stream("POST", route, json={**body, "stream_options": {"continuous_usage_stats": True}}) as r:
        assert all("usage" not in c for c in _sse(r))  # without include_usage: no usage at all, as vLLM


# -- SGLang native ---------------------------------------------------------------------------------


def test_sglang_harmless_fields_are_accepted(client):
    body = {"text": "Seeded", "sampling_params": {"max_new_tokens": 4, "sampling_seed": 7, "custom_params": None,
                                                  "stream_interval": 1},
            "image_data": None, "return_hidden_states": False, "priority": 3, "log_metrics": True}
    first = client.post("/generate", json=body)
    assert first.status_code == 200, first.text
    seeded = client.post("/generate", json={"text": "Seeded", "sampling_params": {"max_new_tokens": 4, "seed": 7}})
    assert first.json()["output_ids"] == seeded.json()["output_ids"]  # sampling_seed is seed


@pytest.mark.parametrize("body, param", [
    ({"text": "x", "image_data": "data:image/png;base64,AAAA"}, "image_data"),
    ({"text": "x", "custom_logit_processor": "{}"}, "custom_logit_processor"),
    ({"text": "x", "return_hidden_states": True}, "return_hidden_states"),
    ({"text": "x", "return_logprob": True, "logprob_start_len": -3}, "logprob_start_len"),
])
def test_sglang_fields_that_matter_are_refused_by_name(client, body, param):
    _error(client.post("/generate", json=body), 400, param)


def test_sglang_routes(server, client, engine):
    info = client.get("/model_info").json()
    assert info["model_path"] == engine.model_path
    (load,) = client.get("/get_load").json()
    assert load["num_reqs"] == 0 and load["num_waiting_reqs"] == 0
    with httpx.Client(base_url=server.url) as anonymous:
        assert anonymous.get("/health_generate").status_code == 200
    assert client.post("/abort_request", json={"abort_all": True}).status_code == 200
    _error(client.post("/abort_request", json={}), 400, "rid")


def test_abort_all_stops_running_requests(client, server):
    # long enough that the abort lands first however fast the model decodes (the tiny model: 2,048
    # positions)
    body = {"text": "long", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}, "stream": True}

    async def run() -> dict:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"},
                                     timeout=60) as c:
            async with c.stream("POST", "/generate", json=body) as r:
                last, aborted = None, False
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        last = json.loads(line[6:])
                        # >= 2: a consumer that fell behind gets one chunk for several tokens
                        if not aborted and last["meta_info"]["completion_tokens"] >= 2:
                            aborted = True
                            await c.post("/abort_request", json={"abort_all": True})
                return last

    last = asyncio.run(run())
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < 2000


# -- the real openai client over the streaming edges -----------------------------------------------


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


def test_openai_stream_logprobs_stop_at_first_token_and_length(oai):
    first = oai.completions.create(model=MODEL_NAME, prompt="Tell", max_tokens=1, temperature=0)
    stop = first.choices[0].text
    chunks = list(oai.completions.create(model=MODEL_NAME, prompt="Tell", max_tokens=8, temperature=0,
                                         stop=[stop], stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "" and chunks[-1].choices[0].finish_reason == "stop"
    chunks = list(oai.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}],
                                              max_tokens=4, logprobs=True, top_logprobs=2, stream=True,
                                              extra_body={"ignore_eos": True}))
    content = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert len(content) == 4 and all(len(t.top_logprobs) == 2 for t in content)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_async_openai_n_stream_with_usage(server):
    async def main() -> list:
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0) as c:
            stream = await c.completions.create(model=MODEL_NAME, prompt="abc", max_tokens=3, n=2, stream=True,
                                                stream_options={"include_usage": True}, logprobs=1,
                                                extra_body={"ignore_eos": True})
            return [chunk async for chunk in stream]

    chunks = asyncio.run(main())
    reasons = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices and
               c.choices[0].finish_reason}
    assert reasons == {0: "length", 1: "length"}
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].choices == []
    tokens = sum(len(c.choices[0].logprobs.tokens) for c in chunks if c.choices and c.choices[0].logprobs)
    assert tokens == 6
