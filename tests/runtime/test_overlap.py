"""Overlap scheduling (runtime/core/overlap.py) on CPU: the same greedy outputs as without it,
the overlapped path really taken, exact slot accounting, faults contained as without it."""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import torch

from radixflow.runtime import Engine
from radixflow.runtime.core.faults import Fault, FaultInjector
from radixflow.runtime.model.demo import demo_model
from test_fault_isolation import BOUND_S, assert_idle_and_clean, bounded, ids, paused, reason

GREEDY = {"temperature": 0}
DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
SMALL_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["n"], "additionalProperties": False}


def tiny(enable_overlap: bool, **config) -> Engine:
    config = {"kv_cache_tokens": 4096, "dtype": "float32", **config}
    return Engine(demo_model("tiny"), check_invariants=True, enable_overlap=enable_overlap, **config)


def _summary(res: dict) -> tuple:
    return res["output_ids"], res["text"], res["meta_info"]["finish_reason"]


def _varied_jobs(free_ids: list[int], free_text: str) -> list[tuple[str, list[int], dict, dict]]:
    """(rid, prompt, sampling params, generate options): plain rows of several lengths and
    budgets, EOS-enabled rows and rows that stop early on a token or a string, a regex and a
    json_schema row, a row with logprobs."""
    stop = free_text[len(free_text) // 2: len(free_text) // 2 + 3]
    jobs = [(f"plain{i}", ids(n, 100 + i), {**GREEDY, "max_new_tokens": m, "ignore_eos": True}, {})
            for i, (n, m) in enumerate([(5, 40), (17, 9), (33, 25), (9, 3), (60, 48), (12, 1)])]
    # EOS on: eos0 samples EOS at its 25th token (found by search), eos1 does not
    jobs += [("eos0", ids(13, 1070), {**GREEDY, "max_new_tokens": 40}, {}),
             ("eos1", ids(21, 201), {**GREEDY, "max_new_tokens": 30}, {})]
    jobs += [("stop_token", ids(11, 300), {**GREEDY, "max_new_tokens": 40,
                                                           "stop_token_ids": [free_ids[5]]}, {}),
             ("stop_token_free", [1, 2, 3], {**GREEDY, "max_new_tokens": 40, "ignore_eos": True,
                                             "stop_token_ids": [free_ids[5]]}, {}),
             ("stop_string", [1, 2, 3], {**GREEDY, "max_new_tokens": 40, "ignore_eos": True, "stop": [stop]}, {}),
             # not plain until 6 tokens are out: joins the overlap mid-run
             ("min_new", [1, 2, 3], {**GREEDY, "max_new_tokens": 20, "min_new_tokens": 6,
                                     "stop_token_ids": [free_ids[2]]}, {}),
             ("regex", ids(6, 302), {**GREEDY, "max_new_tokens": 16, "regex": DATE}, {}),
             ("json", ids(6, 303), {**GREEDY, "max_new_tokens": 24, "json_schema": SMALL_SCHEMA}, {}),
             ("logprobs", ids(10, 304), {**GREEDY, "max_new_tokens": 6, "ignore_eos": True},
              {"return_logprob": True, "top_logprobs_num": 2})]
    return jobs


def run_workload(enable_overlap: bool, **config) -> tuple[dict[str, tuple], dict[str, list], object]:
    """The mixed workload, admitted in one step, then a second wave arriving mid-decode.
    Returns per rid (output ids, text, finish reason), the logprobs row's logprobs, and the
    engine's step runner (its step counters)."""
    with tiny(enable_overlap, **config) as e:
        free = e.generate(input_ids=[1, 2, 3], sampling_params={**GREEDY, "max_new_tokens": 40, "ignore_eos": True})
        e.flush_cache()
        jobs = _varied_jobs(free["output_ids"], free["text"])
        results: dict[str, dict] = {}

        def submit(rid, prompt, sp, opts):
            results[rid] = e.generate(input_ids=prompt, sampling_params=sp, rid=rid, **opts)

        threads = [threading.Thread(target=submit, args=job) for job in jobs]
        with paused(e):
            for t in threads:
                t.start()
        time.sleep(0.05)  # a second wave while the first decodes (admission between overlapped steps)
        late = [("late0", ids(14, 400), {**GREEDY, "max_new_tokens": 12, "ignore_eos": True}, {}),
                ("late1", ids(3, 401), {**GREEDY, "max_new_tokens": 30}, {})]
        late_threads = [threading.Thread(target=submit, args=job) for job in late]
        for t in late_threads:
            t.start()
        for t in threads + late_threads:
            t.join(BOUND_S)
            assert not t.is_alive()
        assert_idle_and_clean(e)
        logprobs = results["logprobs"]["meta_info"]["output_token_logprobs"]
        return {rid: _summary(r) for rid, r in results.items()}, logprobs, e.loop.step


def test_greedy_outputs_are_identical_with_and_without_overlap():
    off, off_logprobs, plain = run_workload(False)
    on, on_logprobs, overlapped = run_workload(True)
    assert plain.num_overlapped_steps == 0 and overlapped.num_overlapped_steps > 0
    assert sorted(on) == sorted(off)
    for rid in off:
        assert on[rid] == off[rid], rid
    # the logprob row now samples in overlapped steps, whose batches (rows of requests that just
    # finished, a different batch size) may round its logits differently in the last bits
    assert [(t, text) for _, t, text in on_logprobs] == [(t, text) for _, t, text in off_logprobs]
    assert [lp for lp, _, _ in on_logprobs] == pytest.approx([lp for lp, _, _ in off_logprobs], abs=1e-4)
    reasons = {rid: r[2]["type"] for rid, r in off.items()}
    assert reasons["stop_string"] == reasons["stop_token_free"] == reasons["eos0"] == "stop"
    assert len(off["eos0"][0]) == 25 and len(off["stop_token_free"][0]) < 40
    assert reasons["regex"] == reasons["json"] == "stop"
    assert reasons["plain5"] == "length" and len(off["plain4"][0]) == 48


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                          "age": {"type": "integer", "minimum": 0, "maximum": 99},
                                          "ok": {"type": "boolean"}},
          "required": ["name", "age", "ok"], "additionalProperties": False}


def _host_row_jobs() -> list[tuple[list[int], dict, dict]]:
    """(prompt, sampling params, generate options) of requests sampled on the host: grammars
    (forced keys: jump-forward runs), penalties, seeds at temperature 1, logprobs, min_new_tokens,
    next to plain rows."""
    jobs = [(ids(7, 800), {**GREEDY, "max_new_tokens": 80, "json_schema": PERSON}, {}),
            (ids(5, 801), {**GREEDY, "max_new_tokens": 16, "regex": DATE}, {}),
            (ids(9, 802), {**GREEDY, "max_new_tokens": 20, "ignore_eos": True, "repetition_penalty": 1.3,
                           "frequency_penalty": 0.5}, {}),
            (ids(6, 803), {"temperature": 1.0, "top_p": 0.9, "seed": 7, "max_new_tokens": 20, "ignore_eos": True}, {}),
            (ids(6, 804), {"temperature": 1.0, "seed": 11, "max_new_tokens": 80, "ignore_eos": True,
                           "json_schema": PERSON}, {}),
            (ids(8, 805), {**GREEDY, "max_new_tokens": 12, "ignore_eos": True}, {"return_logprob": True,
                                                                               "top_logprobs_num": 3}),
            (ids(4, 806), {**GREEDY, "max_new_tokens": 14, "min_new_tokens": 9}, {})]
    jobs += [(ids(5 + i, 810 + i), {**GREEDY, "max_new_tokens": 6 + 5 * i, "ignore_eos": True}, {})
             for i in range(4)]
    return jobs


def _run_host_rows(enable_overlap: bool, jump_forward: bool, **config) -> tuple[list[tuple], list, object]:
    with tiny(enable_overlap, jump_forward=jump_forward, **config) as e:
        results: list = [None] * len(_host_row_jobs())

        def submit(k, prompt, sp, opts):
            results[k] = e.generate(input_ids=prompt, sampling_params=sp, **opts)

        threads = [threading.Thread(target=submit, args=(k, *job)) for k, job in enumerate(_host_row_jobs())]
        with paused(e):
            for t in threads:
                t.start()
        for t in threads:
            t.join(BOUND_S)
            assert not t.is_alive()
        assert_idle_and_clean(e)
        tops = results[5]["meta_info"]["output_top_logprobs"]
        return [_summary(r) for r in results], tops, e.loop.step


@pytest.mark.parametrize("jump_forward", [True, False])
def test_host_rows_overlap_and_give_what_they_give_without_it(jump_forward):
    """Grammar, penalty, seeded, logprob and min_new_tokens rows take overlapped steps (sampled
    by the engine thread from the step's logits) and give the outputs of overlap off; with
    jump-forward the row launched on a token that forced more is dropped and redone."""
    off, off_tops, _ = _run_host_rows(False, jump_forward)
    on, on_tops, step = _run_host_rows(True, jump_forward)
    assert on == off
    assert [[e[1] for e in top] for top in on_tops] == [[e[1] for e in top] for top in off_tops]
    assert step.num_overlapped_steps > 10 and step.num_host_rows > 50
    assert (step.num_stale_rows > 0) == jump_forward
    json.loads(off[0][1]) and json.loads(off[4][1])  # the grammars completed
    assert [r[2]["type"] for r in off[:2]] == ["stop", "stop"]
    assert len(off[6][0]) >= 9


def test_host_rows_are_prepared_while_their_forward_runs(monkeypatch):
    """Grammar plans and masks of an overlapped step's host rows are made while its forward
    runs (a forward slowed to 20 ms on the worker thread), not after it."""
    from radixflow.runtime.core.step import StepRunner

    seen: list[bool] = []  # per preparation: whether the step's forward was still running
    prepare = StepRunner._prepare_host_rows

    def spy(self, step):
        if step.prepared is None:
            seen.append(not step.result.done())
        prepare(self, step)
    monkeypatch.setattr(StepRunner, "_prepare_host_rows", spy)
    with tiny(True) as e:
        decode = e.runner.prepare_decode

        def slow(batch):
            run = decode(batch)
            return lambda ids: (time.sleep(0.02), run(ids))[1]
        e.runner.prepare_decode = slow
        sps = [{**GREEDY, "max_new_tokens": 16, "regex": "[a-z]{16}"}] * 3
        out = bounded(e.generate, input_ids=[ids(5, 900), ids(6, 901), ids(7, 902)], sampling_params=sps)
        assert all(len(r["text"]) == 16 for r in out)
        assert_idle_and_clean(e)
    assert len(seen) >= 5 and sum(seen) >= len(seen) - 1, seen


def test_requests_finishing_at_every_step_keep_accounting_exact():
    """Budgets 1..24 in one batch: each overlapped step finishes one request, whose row of
    the step in flight computed past its end; slots and tree stay exact after every step."""
    prompts = [ids(4 + i % 7, 500 + i) for i in range(24)]
    sps = [{**GREEDY, "max_new_tokens": i + 1, "ignore_eos": True} for i in range(24)]
    with tiny(False) as e:
        want = e.generate(input_ids=prompts, sampling_params=sps)
    with tiny(True) as e:
        got = bounded(e.generate, input_ids=prompts, sampling_params=sps)
        assert e.loop.step.num_overlapped_steps > 0
        assert [r["output_ids"] for r in got] == [r["output_ids"] for r in want]
        # the tree holds exactly what the requests computed: cached reruns give the same output
        again = e.generate(input_ids=prompts, sampling_params=sps)
        assert [r["output_ids"] for r in again] == [r["output_ids"] for r in want]
        assert_idle_and_clean(e)


def test_overlap_goes_on_while_the_queue_cannot_be_admitted():
    """A full batch (max_num_seqs 2) with requests waiting, and a queue blocked on memory:
    decode steps still overlap while nothing can be admitted, the waiting requests are admitted
    as room frees, and every output equals the one without overlap."""
    prompts = [ids(6 + i, 700 + i) for i in range(6)]
    sps = [{**GREEDY, "max_new_tokens": 8 + 3 * i, "ignore_eos": True} for i in range(6)]
    for config in ({"max_num_seqs": 2}, {"kv_cache_tokens": 96}):
        with tiny(False, **config) as e:
            want = [r["output_ids"] for r in e.generate(input_ids=prompts, sampling_params=sps)]
        with tiny(True, **config) as e:
            waiting_when_overlapped = []
            sched = e.scheduler
            ahead = sched.schedule_decode_ahead

            def record():
                batch = ahead()
                if batch is not None:
                    waiting_when_overlapped.append(len(sched.waiting))
                return batch
            sched.schedule_decode_ahead = record
            got = bounded(e.generate, input_ids=prompts, sampling_params=sps)
            assert [r["output_ids"] for r in got] == want, config
            assert max(waiting_when_overlapped, default=0) > 0, config
            assert_idle_and_clean(e)


def test_failed_overlapped_forward_undoes_both_steps_and_caches_nothing_uncomputed():
    prompt = ids(30, 600)
    sp = {**GREEDY, "max_new_tokens": 10, "ignore_eos": True}
    with tiny(False) as clean:
        want = clean.generate(input_ids=prompt, sampling_params=sp)["output_ids"]
    with tiny(True) as e:
        e.set_fault_injector(FaultInjector([Fault("forward", after_step=4, times=1, exc=RuntimeError)]))
        failed = bounded(e.generate, input_ids=prompt, sampling_params=sp)
        assert reason(failed) == "error" and "RuntimeError" in failed["meta_info"]["finish_reason"]["message"]
        assert e.loop.step.num_overlapped_steps > 0
        assert_idle_and_clean(e)
        again = bounded(e.generate, input_ids=prompt, sampling_params=sp)
        assert again["output_ids"] == want
        assert_idle_and_clean(e)


def test_forward_failing_on_the_worker_undoes_the_step_launched_on_top_of_it():
    """A forward error seen only when the step's tokens are read: the step launched from its
    tokens meanwhile fails with it and is undone; the requests fail once, nothing leaks."""
    prompts = [ids(20, 650), ids(7, 651)]
    sp = {**GREEDY, "max_new_tokens": 12, "ignore_eos": True}
    with tiny(True) as e:
        real, launched = e.runner.prepare_decode, []

        def prepare_decode(batch):
            run = real(batch)
            launched.append(batch)
            if len(launched) != 4:
                return run

            def broken(input_ids):
                time.sleep(0.05)  # still running when the next step is launched on top
                raise RuntimeError("device fault")
            return broken

        e.runner.prepare_decode = prepare_decode
        results = bounded(e.generate, input_ids=prompts, sampling_params=sp)
        assert [reason(r) for r in results] == ["error", "error"]
        assert len(launched) == 5 and e.stats().failed_steps == 1
        assert_idle_and_clean(e)
        e.runner.prepare_decode = real
        again = bounded(e.generate, input_ids=prompts, sampling_params=sp)
    with tiny(False) as clean:
        assert [r["output_ids"] for r in again] == [r["output_ids"] for r in clean.generate(
            input_ids=prompts, sampling_params=sp)]


def test_out_of_memory_in_an_overlapped_decode_is_retried():
    prompts = [ids(12, 700 + i) for i in range(4)]
    sp = {**GREEDY, "max_new_tokens": 12, "ignore_eos": True}
    with tiny(False) as clean:
        want = [r["output_ids"] for r in clean.generate(input_ids=prompts, sampling_params=sp)]
    with tiny(True) as e:
        e.set_fault_injector(FaultInjector([Fault("forward", after_step=5, times=2, exc=torch.cuda.OutOfMemoryError)]))
        got = bounded(e.generate, input_ids=prompts, sampling_params=sp)
        assert [r["output_ids"] for r in got] == want
        assert e.stats().failed_steps == 2
        assert_idle_and_clean(e)


def test_abort_while_a_step_is_in_flight_leaks_nothing():
    with tiny(True) as e:
        sp = {**GREEDY, "max_new_tokens": 200, "ignore_eos": True}
        box: dict = {}
        t = threading.Thread(target=lambda: box.setdefault("r", e.generate(
            input_ids=[ids(9, 800), ids(9, 801)], sampling_params=sp, rid=["a", "b"])))
        t.start()
        deadline = time.monotonic() + BOUND_S
        while e.loop.step.num_overlapped_steps < 5 and time.monotonic() < deadline:
            time.sleep(0.005)
        e.abort("a")
        t.join(BOUND_S)
        a, b = box["r"]
        assert reason(a) == "abort" and reason(b) == "length"
        assert len(b["output_ids"]) == 200
        assert_idle_and_clean(e)


@pytest.mark.parametrize("point,victim", [
    ("detokenizer", {}), ("grammar", {"regex": "[a-z ]{0,60}"}), ("sampler", {"repetition_penalty": 1.2}),
    ("detokenizer", {"regex": "[a-z ]{0,60}"})])
def test_per_request_fault_in_an_overlapped_step_fails_that_request_alone(point, victim):
    """A fault at one request's point, on a plain row or a host row, fails it alone."""
    with tiny(True) as e:
        e.set_fault_injector(FaultInjector([Fault(point, rids={"victim"}, after_step=4)]))
        sp = {**GREEDY, "max_new_tokens": 10, "ignore_eos": True}
        with paused(e):
            box: dict = {}
            t = threading.Thread(target=lambda: box.setdefault("r", e.generate(
                input_ids=[ids(9, 8), ids(9, 9), ids(9, 10)], sampling_params=[sp, {**sp, **victim}, sp],
                rid=["r0", "victim", "r2"])))
            t.start()
        t.join(BOUND_S)
        assert [reason(r) for r in box["r"]] == ["length", "error", "length"]
        assert e.loop.step.num_overlapped_steps > 0 and (e.loop.step.num_host_rows > 0) == bool(victim)
        assert_idle_and_clean(e)


def test_sample_on_device_picks_what_sample_picks_for_plain_rows():
    from radixflow.runtime.core.sampler import SampleRow, sample, sample_on_device
    from radixflow.runtime.sampling_params import SamplingParams

    params = [{"temperature": 0}, {"temperature": 0.8}, {"temperature": 1.0, "top_k": 5},
              {"temperature": 0.7, "top_p": 0.9}, {"temperature": 1.0, "min_p": 0.05}, {"temperature": 0}]
    rows = [SampleRow(SamplingParams.from_dict(p), [], [], None, []) for p in params]
    logits = torch.randn(len(rows), 997, generator=torch.Generator().manual_seed(0)) * 3
    logits[5, 17] = float("nan")
    want = sample(logits.clone(), rows, torch.Generator().manual_seed(1)).tokens
    got = sample_on_device(logits.clone(), rows, torch.Generator().manual_seed(1))
    assert got.dtype == torch.int64 and got.tolist() == want
    assert want[5] == -1


@pytest.mark.gpu
def test_gpu_overlap_gives_the_outputs_of_overlap_off():
    """On CUDA (launches asynchronous, tokens read back through pinned buffers, CUDA graphs on):
    the varied workload and the host-row workload give what they give with overlap off. fp32, so
    batch composition cannot flip a greedy choice through rounding."""
    cuda = {"device": "cuda", "max_num_seqs": 32, "cuda_graph_max_bs": 32}
    off, off_logprobs, _ = run_workload(False, **cuda)
    on, on_logprobs, overlapped = run_workload(True, **cuda)
    assert overlapped.num_overlapped_steps > 0 and on == off
    assert [lp for lp, _, _ in on_logprobs] == pytest.approx([lp for lp, _, _ in off_logprobs], abs=1e-4)
    for jump_forward in (True, False):
        off_rows, _, _ = _run_host_rows(False, jump_forward, **cuda)
        on_rows, _, step = _run_host_rows(True, jump_forward, **cuda)
        assert on_rows == off_rows and step.num_host_rows > 0


def test_slot_table_device_writes_equal_the_host_ones():
    """The slot table's device path (asynchronous uploads, runtime/core/upload.py), forced on CPU,
    writes what the host path writes: one slot per row, one run, and several runs."""
    from radixflow.runtime.core.kv_pool import ReqToTokenPool

    pools = [ReqToTokenPool(4, 32, torch.device("cpu")) for _ in range(2)]
    pools[1]._host = None  # the CUDA code path
    for pool in pools:
        pool.write_one_each([0, 2, 3], [5, 0, 31], np.array([7, 8, 9], dtype=np.int32))
        pool.write([1], [3], [np.arange(10, 20, dtype=np.int32)])
        pool.write([0, 3], [6, 1], [[1, 2], np.array([3, 4, 5], dtype=np.int32)])
    assert pools[0].table.dtype == pools[1].table.dtype == torch.int32
    assert torch.equal(pools[0].table, pools[1].table)
    assert pools[0].table[3, :4].tolist() == [0, 3, 4, 5] and pools[0].table[0, 5:8].tolist() == [7, 1, 2]


@pytest.mark.gpu
def test_gpu_step_inputs_reach_the_device_without_waiting_for_it():
    """Overlap needs the host to prepare step N+1 while step N runs: the slot-table writes and a
    CUDA graph's inputs are copied asynchronously (pinned), so none of them waits for the kernels
    already queued (a pageable copy would synchronize the stream)."""
    from radixflow.runtime.core.kv_pool import ReqToTokenPool

    cuda = torch.device("cuda")
    pool = ReqToTokenPool(4, 64, cuda)
    with Engine(demo_model("tiny"), device="cuda", dtype="float32", kv_cache_tokens=4096, max_num_seqs=8,
                cuda_graph_max_bs=8) as engine:
        engine.generate("warm the graphs up", {"temperature": 0, "max_new_tokens": 4})
        graphs = engine.runner.graph_runner
        assert graphs is not None

        def prepare_a_step() -> None:
            pool.write_one_each([0, 1], [3, 4], np.array([7, 8], dtype=np.int32))
            pool.write([2], [0], [np.arange(5, dtype=np.int32)])
            pool.write([0, 3], [0, 1], [[1, 2], [3, 4, 5]])
            graphs.run([1, 2], [0, 0], [1, 2], [0, 1])
        prepare_a_step()  # pinned blocks enter the host allocator's cache, as in serving
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # ~0.1 s of device time queued ahead of the copies
        prepare_a_step()
        waited = torch.cuda.current_stream().query()
        torch.cuda.synchronize()
    assert not waited, "a host-to-device copy waited for the device"
    assert pool.table[0, :5].tolist() == [1, 2, 0, 7, 0] and pool.table[3, 1:4].tolist() == [3, 4, 5]
