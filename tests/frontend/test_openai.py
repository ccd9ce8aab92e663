"""The real openai client (sync and async) against the live server; SSE grammar chunk by chunk."""
from __future__ import annotations

import asyncio
import json

import openai
import pytest

MODEL_NAME, API_KEY = "tiny", "test-key"  # the conftest server's

GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


def test_models(oai):
    assert [m.id for m in oai.models.list().data] == [MODEL_NAME]


def test_completion_usage_logprobs_echo(oai):
    out = oai.completions.create(model=MODEL_NAME, prompt="The cat sat", max_tokens=5, logprobs=2, **GREEDY)
    choice = out.choices[0]
    assert choice.finish_reason == "length" and choice.text
    assert len(choice.logprobs.tokens) == 5 == len(choice.logprobs.token_logprobs)
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    assert all(len(t) == 2 for t in choice.logprobs.top_logprobs)
    assert out.usage.completion_tokens == 5 and out.usage.total_tokens == out.usage.prompt_tokens + 5
    assert out.usage.prompt_tokens_details.cached_tokens >= 0
    echo = oai.completions.create(model=MODEL_NAME, prompt="The cat sat", max_tokens=5, echo=True, logprobs=0,
                                  **GREEDY)
    assert echo.choices[0].text == "The cat sat" + choice.text  # greedy: same continuation
    n_prompt = out.usage.prompt_tokens
    assert len(echo.choices[0].logprobs.tokens) == n_prompt + 5
    assert echo.choices[0].logprobs.token_logprobs[0] is None
    assert echo.choices[0].logprobs.text_offset[n_prompt] == len("The cat sat")  # output offsets index the text


def test_completion_prompt_list_and_token_ids(oai, engine):
    ids = engine.tokenizer.encode("Once upon")
    out = oai.completions.create(model=MODEL_NAME, prompt=["Once upon", "A time"], max_tokens=3, **GREEDY)
    assert [c.index for c in out.choices] == [0, 1]
    by_ids = oai.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=3, **GREEDY)
    assert by_ids.choices[0].text == out.choices[0].text


def test_n3_prefills_once(oai, engine):
    prompt = "A prompt long enough to tell one prefill from three: " + "lorem ipsum dolor " * 8
    n_prompt = len(engine.tokenizer.encode(prompt))
    before = engine.stats().prefill_tokens_computed
    out = oai.completions.create(model=MODEL_NAME, prompt=prompt, n=3, max_tokens=4, seed=7)
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert out.usage.prompt_tokens == n_prompt and out.usage.completion_tokens == 12
    assert engine.stats().prefill_tokens_computed - before < 2 * n_prompt


def test_stop_is_trimmed(oai):
    base = oai.completions.create(model=MODEL_NAME, prompt="Numbers:", max_tokens=12, **GREEDY).choices[0].text
    stop = base[len(base) // 2:len(base) // 2 + 2]
    assert stop.strip(), base
    out = oai.completions.create(model=MODEL_NAME, prompt="Numbers:", max_tokens=12, stop=[stop], **GREEDY)
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].text == base[:base.index(stop)]


def test_chat_logprobs_and_extras(oai):
    out = oai.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_completion_tokens=4, logprobs=True, top_logprobs=3, seed=1,
        extra_body={"top_k": 5, "min_p": 0.01, "repetition_penalty": 1.1, "ignore_eos": True})
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert len(choice.logprobs.content) == 4
    assert all(len(t.top_logprobs) == 3 for t in choice.logprobs.content)
    assert "".join(t.token for t in choice.logprobs.content) == choice.message.content
    assert out.usage.completion_tokens == 4


def test_chat_stream_n3(oai):
    chunks = list(oai.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hey"}],
                                              n=3, max_tokens=3, stream=True, extra_body={"ignore_eos": True},
                                              stream_options={"include_usage": True}))
    texts = {i: "" for i in range(3)}
    reasons = {}
    for chunk in chunks[:-1]:
        (c,) = chunk.choices
        texts[c.index] += c.delta.content or ""
        if c.finish_reason:
            reasons[c.index] = c.finish_reason
    assert reasons == {0: "length", 1: "length", 2: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9


def test_async_client_chat_and_completion(server):
    async def main():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0) as c:
            chat, comp = await asyncio.gather(
                c.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}],
                                          max_tokens=3, extra_body={"ignore_eos": True}),
                c.completions.create(model=MODEL_NAME, prompt="y", max_tokens=3, extra_body={"ignore_eos": True}))
            text = ""
            async for chunk in await c.completions.create(model=MODEL_NAME, prompt="z", max_tokens=4,
                                                          stream=True):
                text += chunk.choices[0].text
            return chat, comp, text

    chat, comp, text = asyncio.run(main())
    assert chat.usage.completion_tokens == 3 and comp.usage.completion_tokens == 3 and text


def _sse(response) -> list:
    events = [line[len("data: "):] for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_chat_sse_grammar(client):
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = _sse(r)
    first, *middle, last_choice, usage = chunks
    assert {c["id"] for c in chunks} == {first["id"]}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["choices"][0]["finish_reason"] is None
    for c in middle:
        assert c["choices"][0]["finish_reason"] is None and "role" not in c["choices"][0]["delta"]
    assert last_choice["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    whole = client.post("/v1/chat/completions", json={**body, "stream": False, "stream_options": None}).json()
    assert streamed == whole["choices"][0]["message"]["content"]


def test_completion_sse_grammar(client):
    body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4, "stream": True, "logprobs": 1}
    with client.stream("POST", "/v1/completions", json=body) as r:
        chunks = _sse(r)
    assert all(c["object"] == "text_completion" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks][:-1] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks) == 4
    assert all("usage" not in c or c["usage"] is None for c in chunks)  # not asked for


def _check_timings(usage: dict) -> None:
    t = usage["timings"]
    assert set(t) == {"queue_s", "prefill_s", "ttft_s", "e2e_s"}
    assert 0 <= t["queue_s"] <= t["ttft_s"] <= t["e2e_s"] and 0 <= t["prefill_s"] <= t["ttft_s"]
    assert t["queue_s"] + t["prefill_s"] == pytest.approx(t["ttft_s"], abs=1e-5)


def test_usage_extension_carries_the_timings(client):
    """`usage.timings` (seconds in the engine: queue, prefill, TTFT, e2e) beside `prefill_miss_tokens`,
    on completions and chat completions, whole and streamed with include_usage."""
    chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "timings"}], "max_tokens": 3}
    comp = {"model": MODEL_NAME, "prompt": "timings", "max_tokens": 3}
    for route, body in (("/v1/completions", comp), ("/v1/chat/completions", chat),
                        ("/v1/completions", {**comp, "prompt": ["timings one", "timings two"], "n": 2})):
        out = client.post(route, json=body).json()
        _check_timings(out["usage"])
        assert "prefill_miss_tokens" in out["usage"]
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with client.stream("POST", route, json=stream) as r:
            chunks = _sse(r)
        assert chunks[-1]["choices"] == []
        _check_timings(chunks[-1]["usage"])
