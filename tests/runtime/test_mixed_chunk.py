"""Mixed steps (`enable_mixed_chunk`): a prefill step also decodes every running request, so a
running request gets a token in every step, however many prompts arrive or chunk. Same greedy
outputs as without mixing, exact slot accounting, faults contained as in any step."""
from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import HealthCheck, settings

from radixflow.radix import RadixCache
from radixflow.runtime import Engine
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.core.kv_pool import KVPool, ReqToTokenPool
from radixflow.runtime.core.request import Req
from radixflow.runtime.core.scheduler import Scheduler, SchedulerLimits
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.sampling_params import SamplingParams
from test_engine_stateful import EngineLifecycle
from test_fault_isolation import BOUND_S, _drive, assert_idle_and_clean, bounded, ids, paused, reason
from test_overlap import GREEDY, run_workload


def _scheduler(mixed: bool, kv_tokens: int = 200, chunk: int = 4, max_prefill_tokens: int = 64) -> Scheduler:
    limits = SchedulerLimits(max_num_seqs=8, max_prefill_tokens=max_prefill_tokens, chunked_prefill_size=chunk,
                             max_context_len=128, policy="fcfs", lpm_fcfs_threshold=128, mixed=mixed)
    return Scheduler(limits, KVPool(kv_tokens + 1, 1, 1, 2, torch.float32, torch.device("cpu")),
                     ReqToTokenPool(8, 128, torch.device("cpu")), RadixCache())


def _step(s: Scheduler) -> object:
    """One scheduled step with the fake model of `_drive`; the batch."""
    batch = _drive(s, 1)
    assert batch is not None
    return batch


def test_running_request_decodes_in_every_step_of_a_chunked_prefill():
    """A 20-token prompt in chunks of 4 arrives while `a` decodes: with mixing each of its five
    chunk steps also gives `a` a token; without, `a` waits through all five."""
    for mixed in (False, True):
        s = _scheduler(mixed)
        a = Req("a", ids(3, 1), SamplingParams.from_dict({"max_new_tokens": 50}))
        s.add(a)
        _step(s)  # a's prefill
        _step(s)  # a decodes
        c = Req("c", ids(20, 2), SamplingParams.from_dict({"max_new_tokens": 3}))
        s.add(c)
        before, at = len(a.output_ids), a.kv_len
        batches = [_step(s) for _ in range(5)]
        assert c.kv_len == 20 and c in s.running
        if mixed:
            assert len(a.output_ids) == before + 5
            assert [b.prefix_lens for b in batches] == [[4 * k, at + k] for k in range(5)]
            for b in batches:
                assert [r.rid for r in b.reqs] == ["c", "a"] and b.num_decode_rows == 1
                assert b.extend_lens == [4, 1] and not b.is_decode
        else:
            assert len(a.output_ids) == before
            assert all(b.num_decode_rows == 0 for b in batches)


def test_decode_rows_take_at_most_half_of_a_mixed_step_s_token_budget():
    """The running requests' tokens count against the step's prefill budget, but leave at least
    half of it to the prefill: 7 running requests and a budget of 8 do not cut a prompt into
    1-token chunks."""
    s = _scheduler(True, chunk=64, max_prefill_tokens=8)
    for i in range(7):
        s.add(Req(f"r{i}", ids(2, 10 + i), SamplingParams.from_dict({"max_new_tokens": 20})))
    while len(s.running) < 7:
        _step(s)
    c = Req("c", ids(20, 3), SamplingParams.from_dict({"max_new_tokens": 2}))
    s.add(c)
    chunks = []
    while c not in s.running:
        batch = _step(s)
        assert batch.num_decode_rows == 7 and batch.reqs[0] is c
        chunks.append(batch.extend_lens[0])
    assert chunks == [4] * 5  # 8 // 2 a step, not 8 - 7


def _pressure(mixed: bool) -> tuple[list[tuple[str, dict]], int, list[int]]:
    """Two requests that outgrow a 40-slot pool together (admission over-commits: reservation
    ratio 0), run to the end with the fake model: finishing order and reasons, preemptions,
    and the count of decode rows per step."""
    s = _scheduler(mixed, kv_tokens=40, chunk=8)
    s.add(Req("a", ids(4, 1), SamplingParams.from_dict({"max_new_tokens": 20})))
    for _ in range(8):
        _step(s)
    s.new_token_ratio = 0.0
    s.add(Req("b", ids(17, 2), SamplingParams.from_dict({"max_new_tokens": 12})))
    decode_rows = []
    for _ in range(200):
        if not s.has_work():
            break
        s.new_token_ratio = 0.0
        decode_rows.append(_step(s).num_decode_rows)
    assert not s.has_work()
    assert s.kv.num_free + s.cache.evictable_size() == 40 and s.cache.protected_size() == 0
    return [(r.rid, r.finish_reason) for r in s.take_finished()], s.num_preemptions, decode_rows


def test_mixed_steps_under_memory_pressure_finish_what_unmixed_ones_finish():
    """Mixing takes the running requests' slots before admission: a pool that over-commits
    retracts and recovers as without mixing, with the same outcomes and nothing leaked."""
    plain, plain_preempted, plain_rows = _pressure(False)
    mixed, mixed_preempted, mixed_rows = _pressure(True)
    assert plain_preempted > 0 and mixed_preempted > 0
    assert sorted(mixed) == sorted(plain)
    assert {reason["type"] for _, reason in mixed} == {"length"}
    assert max(plain_rows) == 0 and max(mixed_rows) == 1


def test_mixed_steps_give_the_outputs_of_unmixed_ones():
    """The overlap suite's workload (plain rows, EOS, stop tokens and strings, min_new_tokens, a
    regex, a JSON schema, logprobs; a second wave arriving mid-decode) with and without mixing."""
    off, off_logprobs, plain = run_workload(False)
    on, on_logprobs, steps = run_workload(False, enable_mixed_chunk=True, chunked_prefill_size=8)
    assert plain.num_mixed_steps == 0 and steps.num_mixed_steps > 0
    assert on == off
    assert [(t, text) for _, t, text in on_logprobs] == [(t, text) for _, t, text in off_logprobs]
    assert [lp for lp, _, _ in on_logprobs] == pytest.approx([lp for lp, _, _ in off_logprobs], abs=1e-4)


def test_mixed_steps_with_overlap_give_the_same_outputs():
    off, _, _ = run_workload(False)
    on, _, steps = run_workload(True, enable_mixed_chunk=True, chunked_prefill_size=8)
    assert steps.num_overlapped_steps > 0 and steps.num_mixed_steps > 0
    assert on == off


def tiny(**config) -> Engine:
    return Engine(demo_model("tiny"), dtype="float32", check_invariants=True, kv_cache_tokens=4096, **config)


def _arrivals(e: Engine, late_prompts: list[list[int]], sp_late: dict) -> tuple[dict, list[dict]]:
    """One long decode, then late prompts submitted while it runs; both results."""
    box: dict = {}
    long = threading.Thread(target=lambda: box.setdefault("long", e.generate(
        input_ids=ids(9, 90), sampling_params={**GREEDY, "max_new_tokens": 60, "ignore_eos": True})))
    long.start()
    while e.stats().generated_tokens < 3:
        threading.Event().wait(0.002)
    late = bounded(e.generate, input_ids=late_prompts, sampling_params=sp_late)
    long.join(BOUND_S)
    assert not long.is_alive()
    return box["long"], late


def test_engine_counts_mixed_steps_and_the_same_prefill_tokens():
    late_prompts = [ids(30, 91), ids(45, 92)]
    sp = {**GREEDY, "max_new_tokens": 5, "ignore_eos": True}
    results = {}
    for mixed in (False, True):
        with tiny(enable_mixed_chunk=mixed, chunked_prefill_size=16) as e:
            made, parts = e.runner.make_forward_batch, []

            def make_forward_batch(batch, *args, **kwargs):
                fb = made(batch, *args, **kwargs)
                if batch.num_decode_rows:  # on CPU the decode rows are attended to apart
                    parts.append((fb.parts[1].batch_size, batch.num_decode_rows))
                return fb
            e.runner.make_forward_batch = make_forward_batch
            long, late = _arrivals(e, late_prompts, sp)
            stats = e.stats()
            results[mixed] = ([long["output_ids"]] + [r["output_ids"] for r in late],
                              stats.prefill_tokens_computed, e.loop.step.num_mixed_steps)
            assert len(parts) == e.loop.step.num_mixed_steps and all(a == b for a, b in parts)
            assert_idle_and_clean(e)
    assert results[True][0] == results[False][0]
    assert results[True][1] == results[False][1] == 9 + 30 + 45
    # chunks of 16: [16 of 30], [14 of 30 + 16 of 45], [16 of 45], [13 of 45], each beside the decode
    assert results[False][2] == 0 and results[True][2] == 4


def test_failed_mixed_forward_fails_its_rows_and_leaks_nothing():
    """A forward that fails in a mixed step: the prefilling and the decoding requests both
    fail with reason error, their new slots are freed uncached, the engine serves on."""
    with tiny(enable_mixed_chunk=True, chunked_prefill_size=16) as e:
        real, seen = e.runner.forward, []

        def forward(batch, offsets):
            if batch.num_decode_rows and not seen:
                seen.append(batch)
                raise RuntimeError("device fault in a mixed step")
            return real(batch, offsets)
        e.runner.forward = forward
        long, late = _arrivals(e, [ids(40, 93)], {**GREEDY, "max_new_tokens": 4, "ignore_eos": True})
        assert seen, "no mixed step ran"
        assert reason(long) == "error" and reason(late[0]) == "error"
        assert "device fault" in long["meta_info"]["finish_reason"]["message"]
        assert_idle_and_clean(e)
        e.runner.forward = real
        again = bounded(e.generate, input_ids=ids(40, 93), sampling_params={**GREEDY, "max_new_tokens": 4})
        assert reason(again) in ("length", "stop")
        assert_idle_and_clean(e)


def test_out_of_memory_in_a_mixed_step_is_retried():
    sp = {**GREEDY, "max_new_tokens": 6, "ignore_eos": True}
    with tiny() as clean:
        want_long, want_late = _arrivals(clean, [ids(40, 94)], sp)
    with tiny(enable_mixed_chunk=True, chunked_prefill_size=16) as e:
        real, failed = e.runner.forward, []

        def forward(batch, offsets):
            if batch.num_decode_rows and len(failed) < 2:
                failed.append(batch)
                raise torch.cuda.OutOfMemoryError("out of memory (injected)")
            return real(batch, offsets)
        e.runner.forward = forward
        long, late = _arrivals(e, [ids(40, 94)], sp)
        assert len(failed) == 2
        assert long["output_ids"] == want_long["output_ids"]
        assert late[0]["output_ids"] == want_late[0]["output_ids"]
        assert_idle_and_clean(e)


def test_abort_of_a_decoding_request_during_mixed_steps_leaks_nothing():
    with tiny(enable_mixed_chunk=True, chunked_prefill_size=8) as e:
        box: dict = {}
        t = threading.Thread(target=lambda: box.setdefault("r", e.generate(
            input_ids=ids(5, 95), sampling_params={**GREEDY, "max_new_tokens": 400, "ignore_eos": True}, rid="victim")))
        t.start()
        while e.stats().generated_tokens < 2:
            threading.Event().wait(0.002)
        with paused(e):
            late = threading.Thread(target=lambda: box.setdefault("late", e.generate(
                input_ids=[ids(64, 96 + i) for i in range(3)],
                sampling_params={**GREEDY, "max_new_tokens": 3, "ignore_eos": True})))
            late.start()
            abort = threading.Thread(target=e.abort, args=("victim",))
            abort.start()
        for th in (t, late, abort):
            th.join(BOUND_S)
            assert not th.is_alive()
        assert reason(box["r"]) == "abort"
        assert [reason(r) for r in box["late"]] == ["length"] * 3
        assert_idle_and_clean(e)


def test_enable_mixed_chunk_is_a_config_and_cli_option():
    assert EngineConfig().enable_mixed_chunk is False
    assert EngineConfig(enable_mixed_chunk=True).enable_mixed_chunk is True
    from radixflow.frontend.cli import build_parser
    args = build_parser().parse_args(["serve", "--enable-mixed-chunk"])
    assert args.enable_mixed_chunk is True


class MixedEngineLifecycle(EngineLifecycle):
    """The request-lifecycle state machine (submit / abort / step / faults / flush / shutdown)
    with mixed steps on."""

    def make_engine(self) -> Engine:
        return Engine(demo_model("tiny"), kv_cache_tokens=96, max_num_seqs=4, chunked_prefill_size=8,
                      check_invariants=True, enable_mixed_chunk=True)


MixedEngineLifecycle.TestCase.settings = settings(max_examples=8, stateful_step_count=25, deadline=None,
                                                  suppress_health_check=[HealthCheck.too_slow])
test_mixed_engine_lifecycle = MixedEngineLifecycle.TestCase


@pytest.mark.gpu
def test_gpu_mixed_steps_give_the_outputs_of_unmixed_ones():
    """On CUDA a mixed step is one Triton extend over its prefill and decode rows (CUDA graphs
    replay the plain decode steps between them): the varied workload gives what it gives
    unmixed, with overlap off and on. fp32, so batch composition cannot flip a greedy choice."""
    cuda = {"device": "cuda", "max_num_seqs": 32, "cuda_graph_max_bs": 32, "chunked_prefill_size": 8}
    off, _, _ = run_workload(False, **cuda)
    for overlap in (False, True):
        on, _, steps = run_workload(overlap, enable_mixed_chunk=True, **cuda)
        assert steps.num_mixed_steps > 0 and on == off, overlap
