"""/metrics after a few requests, and /v1/programs round trips."""
from __future__ import annotations

import json

import re

import pytest

API_KEY = "test-key"  # the conftest server's

NAMES = [
    "radixflow_queue_time_seconds", "radixflow_prefill_time_seconds", "radixflow_time_to_first_token_seconds",
    "radixflow_inter_token_latency_seconds", "radixflow_e2e_request_latency_seconds",
    "radixflow_kv_cache_usage_ratio", "radixflow_num_requests_waiting", "radixflow_num_requests_running",
    "radixflow_preemptions_total", "radixflow_prefix_cache_hit_tokens_total",
    "radixflow_prefix_cache_query_tokens_total", "radixflow_prompt_tokens_total",
    "radixflow_generation_tokens_total", "radixflow_requests_finished_total",
    "radixflow_prefill_tokens_computed_total",
]


def _value(text: str, sample: str) -> float:
    """The value of `sample` (a name, optionally with labels) whatever model_name it carries."""
    name, _, labels = sample.partition("{")
    extra = "," + labels.rstrip("}") if labels else ""
    m = re.search(rf'^{re.escape(name)}\{{model_name="[^"]*"{re.escape(extra)}\}} (\S+)$', text, re.M)
    assert m, f"{sample} missing"
    return float(m.group(1))


def test_metrics(client, engine, wait_idle):
    wait_idle(engine)  # an earlier test's aborted stream may still be finishing: counters would move
    prompt = "Metrics prompt shared by two requests"
    for _ in range(2):
        r = client.post("/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
        assert r.status_code == 200
    before = engine.stats()
    text = client.get("/metrics").text
    for name in NAMES:
        kind = r"(_total)? (counter|gauge|histogram)$"
        assert re.search(rf"^# TYPE {name.removesuffix('_total')}{kind}", text, re.M), name
    s = engine.stats()
    # the scrape reads the stats of its moment: a straggler of an earlier test may step meanwhile
    assert before.generated_tokens <= _value(text, "radixflow_generation_tokens_total") <= s.generated_tokens
    assert s.generated_tokens >= 6
    assert 0 < _value(text, "radixflow_prefix_cache_hit_tokens_total") <= \
        _value(text, "radixflow_prefix_cache_query_tokens_total")
    assert _value(text, 'radixflow_requests_finished_total{reason="length"}') >= 2
    # The second request hit the cache: fewer tokens computed than prompt tokens served.
    assert before.prompt_tokens <= _value(text, "radixflow_prompt_tokens_total") <= s.prompt_tokens
    assert _value(text, "radixflow_prefill_tokens_computed_total") < s.prompt_tokens
    assert _value(text, "radixflow_time_to_first_token_seconds_count") >= 2
    assert _value(text, "radixflow_e2e_request_latency_seconds_count") >= 2
    assert 0 < _value(text, "radixflow_e2e_request_latency_seconds_sum") < 60
    assert _value(text, "radixflow_inter_token_latency_seconds_count") >= 4
    assert _value(text, "radixflow_num_requests_running") == 0
    assert 0 <= _value(text, "radixflow_kv_cache_usage_ratio") <= 1


@pytest.fixture()
def program():
    import radixflow.lang as rf

    @rf.function
    def qa(s, question):
        s += rf.user(question)
        s += rf.assistant(rf.gen("answer", max_tokens=4, temperature=0))

    return qa


def test_program_round_trip(server, program, engine):
    import radixflow.lang as rf

    with rf.Endpoint(server.url, api_key=API_KEY) as target:
        result = program.submit(target, question="What is 2+2?")
    assert set(result) == {"variables", "text", "meta"}
    answer = result["variables"]["answer"]
    assert isinstance(answer, str) and "What is 2+2?" in result["text"]
    assert result["text"].endswith(answer + "<|im_end|>\n")
    local = program.run(question="What is 2+2?", backend=rf.Engine(engine=engine))
    assert local["answer"] == answer  # greedy: the same as running it in-process


def test_program_stream_and_errors(client, program):
    import msgspec

    from radixflow.lang import trace

    ir = msgspec.to_builtins(trace(program))
    body = {"program": ir, "arguments": {"question": "Hi"}, "stream": True}
    with client.stream("POST", "/v1/programs", json=body) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    final = events[-1]
    assert set(final) == {"variables", "text", "meta"}
    streamed = {e["variable"]: e["value"] for e in events[:-1]}
    assert streamed == final["variables"] and "answer" in streamed
    bad = client.post("/v1/programs", json={"program": ir, "arguments": {"nope": "x"}})
    assert bad.status_code == 400 and "nope" in bad.json()["error"]["message"]
    bad = client.post("/v1/programs", json={"program": ir, "arguments": {"nope": "x"}, "stream": True})
    assert bad.status_code == 400 and "nope" in bad.json()["error"]["message"]
    bad = client.post("/v1/programs", json={"program": {"ops": [{"op": "teleport"}]}})
    assert bad.status_code == 400
    huge = dict(ir, ops=[{"op": "text", "text": "x"}] * 5000)
    bad = client.post("/v1/programs", json={"program": huge, "arguments": {"question": "Hi"}})
    assert bad.status_code == 400 and "ops" in bad.json()["error"]["message"]
