"""Named endpoints, cache flushing, the comparison table and the program-level figure (no vLLM)."""
from __future__ import annotations

import asyncio
import math

import httpx
import pytest

from radixflow.frontend.bench.programs import agent_args, agent_session, measure, tree_args, tree_of_thought
from radixflow.frontend.bench.report import markdown
from radixflow.frontend.bench.systems import _flush, parse_endpoint
from radixflow.frontend.bench.workloads import make_workload
from radixflow.lang import ir


def test_parse_endpoint_names_backend_and_url():
    name, ep = parse_endpoint("vllm-cpu=openai@http://127.0.0.1:8001", served_model_name="m")
    assert (name, ep.backend, ep.base_url, ep.served_model_name) == ("vllm-cpu", "openai", "http://127.0.0.1:8001", "m")
    for bad in ("vllm", "vllm=openai", "=openai@http://x", "vllm=grpc@http://x", "radix-off=openai@http://x"):
        with pytest.raises(ValueError):
            parse_endpoint(bad)


def test_flush_tries_radixflow_then_vllm_route():
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200 if request.url.path == "/reset_prefix_cache" else 404)

    async def go(transport: httpx.MockTransport) -> bool:
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
            return await _flush(http)

    assert asyncio.run(go(httpx.MockTransport(handler))) is True
    assert seen == ["/flush_cache", "/reset_prefix_cache"]
    assert asyncio.run(go(httpx.MockTransport(lambda r: httpx.Response(404)))) is False


def test_issue16_presets_have_their_shapes():
    noshare = make_workload("noshare256", num_prompts=16, vocab_size=4096)
    assert len(noshare.requests) == 16 and all(len(r.new_ids) == 256 and r.max_new_tokens == 8 for r in noshare.requests)
    assert len({r.new_ids[:8] for r in noshare.requests}) == 16
    shared = make_workload("shared512", num_prompts=16, vocab_size=4096)
    assert {r.new_ids[:512] for r in shared.requests} == {shared.requests[0].new_ids[:512]}
    assert all(len(r.new_ids) == 562 and r.max_new_tokens == 8 for r in shared.requests)
    sessions = make_workload("sessions384", num_prompts=32, vocab_size=4096)
    assert sessions.num_roots == 8 and len(sessions.requests) == 32
    assert [len(r.new_ids) for r in sessions.requests[:4]] == [384, 64, 64, 64]


def _run(workload: str, system: str, seconds: float) -> dict:
    nan = {"mean": math.nan, "p50": math.nan, "p99": math.nan}
    return {"workload": workload, "system": system, "request_rate": math.inf,
            "summary": {"duration_s": seconds, "total_token_throughput": 100 / seconds, "output_throughput": 1.0,
                        "ttft_ms": nan, "prefix_hit_rate": 0.5, "ideal_hit_rate": 0.9}}


def test_markdown_divides_the_baseline_seconds():
    text = markdown([_run("fewshot", "radixflow", 2.0), _run("fewshot", "vllm-cpu", 3.0), _run("random", "radixflow", 1.0)],
                    baseline="vllm-cpu")
    lines = text.splitlines()
    assert lines[0].endswith("vllm-cpu s ÷ s |") and len(lines) == 5
    assert "| **1.50** |" in lines[2] and lines[3].endswith("| 1 |") and lines[4].endswith("| - |")


def test_agent_program_turns_grow_by_about_two_percent_and_trace():
    batch = agent_args(seed=0, sessions=3, turns=5, system_words=500)
    assert len(batch) == 3 and len({b["system_prompt"] for b in batch}) == 1
    assert all(len(b["tool_results"]) == 4 for b in batch)
    assert batch[0]["tool_results"] != batch[1]["tool_results"]
    program = agent_session.trace(tool_results=batch[0]["tool_results"])
    gens = [op for op, _ in ir.walk(program.ops) if isinstance(op, ir.Gen)]
    assert len(gens) == 5


def test_tree_program_forks_twice():
    program = tree_of_thought.trace()
    forks = [op for op, _ in ir.walk(program.ops) if isinstance(op, ir.Fork)]
    assert len(forks) == 4 and sorted(f.n for f in forks) == [3, 3, 3, 3]  # 1 outer + one inner per thought
    assert tree_args(0, 2, 40) == tree_args(0, 2, 40) and len(tree_args(0, 2, 40)) == 2


def test_program_prefill_per_unique_on_the_demo_model():
    import radixflow.lang as rf
    from radixflow.frontend.bench.programs import _Counters
    from radixflow.runtime.model.demo import demo_model

    backend = rf.Engine(demo_model("tiny"), kv_cache_tokens=8192)
    try:
        row = measure("agent", agent_session, agent_args(0, 2, 3, 60), _Counters(engine=backend.engine), backend=backend)
    finally:
        backend.shutdown()
    # every distinct prompt token prefilled once: the unique tokens are the prefill plus the
    # generated tokens, less each request's last one (never run through the model, never cached)
    assert row["evicted_during_run"] == 0
    assert row["unique_tokens"] == row["prefill_tokens_computed"] + row["generated_tokens"] - 6
    assert row["prefill_per_unique"] < 1.0 and row["prompt_tokens"] > 2 * row["prefill_tokens_computed"]
