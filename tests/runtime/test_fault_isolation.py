"""Fault isolation: every request leaves the engine exactly once, with its reason; no fault
leaks KV, poisons the cache or hangs a caller. One regression test per reproduced bug, then
per-point injected faults (runtime/core/faults.py)."""
from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.core.faults import Fault, FaultInjector, InjectedFault

GREEDY = {"temperature": 0, "ignore_eos": True}
BOUND_S = 20.0  # no caller may wait longer than this in these tests


def bounded(fn, *args, **kwargs):
    """Run fn in a thread; fail the test (instead of hanging it) if it takes past BOUND_S."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the test thread below
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(BOUND_S)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} did not return within {BOUND_S}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def tiny(**config) -> Engine:
    """The tiny demo model in fp32 (exact comparisons across engines), invariants checked."""
    return Engine(demo_model("tiny"), dtype="float32", check_invariants=True, **config)


def clean_output(prompt: list[int], sp: dict) -> list[int]:
    """Greedy output of `prompt` on a fresh engine that saw nothing else."""
    with tiny() as clean:
        return clean.generate(input_ids=prompt, sampling_params=sp)["output_ids"]


def ids(n: int, seed: int, vocab: int = 3000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def assert_idle_and_clean(e: Engine) -> None:
    """Nothing in flight, no lock left in the tree, slot accounting exact, tree consistent."""
    e.check_accounting()
    assert e.stats().num_running == 0 and e.stats().num_waiting == 0
    assert e.scheduler.cache.protected_size() == 0
    assert not e.loop.active
    assert e.invariant_violations == []


class paused:
    """Hold the engine loop (inside a call on it) so that what is submitted meanwhile is
    admitted together in the next step."""

    def __init__(self, e: Engine) -> None:
        self.e, self.gate = e, threading.Event()

    def __enter__(self) -> None:
        entered = threading.Event()
        self.thread = threading.Thread(target=self.e.loop.call,
                                       args=(lambda: (entered.set(), self.gate.wait(BOUND_S)),))
        self.thread.start()
        entered.wait(BOUND_S)

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.2)  # let submitting threads reach the inbox
        self.gate.set()
        self.thread.join(BOUND_S)


def submit_all(e: Engine, prompts: list[list[int]], sp: dict, rids: list[str] | None = None) -> list[dict]:
    """Generate for all prompts, admitted in one step."""
    box: dict = {}
    with paused(e):
        t = threading.Thread(target=lambda: box.setdefault("r", e.generate(
            input_ids=prompts, sampling_params=sp, rid=rids)))
        t.start()
    t.join(BOUND_S)
    assert not t.is_alive(), "generate did not return"
    return box["r"]


def reason(result: dict) -> str:
    return result["meta_info"]["finish_reason"]["type"]


# -- 1. a request that can no longer fit is reported ---------------------------------------------


def test_last_request_that_outgrows_the_pool_finishes_with_a_reason():
    with tiny(kv_cache_tokens=64) as e:
        res = bounded(e.generate, input_ids=ids(40, 1), sampling_params={**GREEDY, "max_new_tokens": 100})
        assert reason(res) == "abort"
        assert "KV cache" in res["meta_info"]["finish_reason"]["message"]
        assert res["meta_info"]["completion_tokens"] == 64 - 40 + 1  # the last one needs no slot
        assert_idle_and_clean(e)


def test_last_survivor_after_retractions_finishes_with_a_reason():
    """Over-committed decode retracts requests; the one that cannot fit even alone ends with
    a reason once it is the last, and everyone else completes."""
    with tiny(kv_cache_tokens=64) as e:
        prompts = [ids(20, 0)] + [ids(6, s) for s in range(1, 6)]
        sps = [{**GREEDY, "max_new_tokens": 60}] + [{**GREEDY, "max_new_tokens": 20}] * 5
        results = bounded(e.generate, input_ids=prompts, sampling_params=sps)
        assert e.stats().num_preemptions > 0
        assert reason(results[0]) == "abort" and "KV cache" in results[0]["meta_info"]["finish_reason"]["message"]
        assert [r["meta_info"]["finish_reason"] for r in results[1:]] == [{"type": "length", "length": 20}] * 5
        assert_idle_and_clean(e)


def _drive(s, max_steps: int):
    """Run scheduler `s` with a fake model: every sampled row gets token 7. Returns the last
    step's batch (None if none was scheduled)."""
    batch = None
    for _ in range(max_steps):
        batch = s.schedule()
        if batch is None:
            return None
        for req, sample in zip(batch.reqs, batch.sample):
            if sample:
                req.output_ids.append(7)
                if len(req.output_ids) >= req.sampling.max_new_tokens:
                    req.finish({"type": "length", "length": len(req.output_ids)})
            elif not req.wants_sample and batch.completes[batch.reqs.index(req)]:
                req.finish({"type": "length", "length": 0})
        s.finish_step(batch)
        s.check_accounting()
    return batch


def test_running_request_is_not_starved_by_a_chunked_prefill():
    """A prompt whose cached prefix made it look admissible must not end up holding the pool
    half-prefilled while a running request cannot decode: the running request finishes."""
    from radixflow.radix import RadixCache
    from radixflow.runtime.core.kv_pool import KVPool, ReqToTokenPool
    from radixflow.runtime.core.request import Req
    from radixflow.runtime.sampling_params import SamplingParams
    from radixflow.runtime.core.scheduler import Scheduler, SchedulerLimits

    kv = KVPool(41, 1, 1, 2, torch.float32, torch.device("cpu"))
    limits = SchedulerLimits(max_num_seqs=4, max_prefill_tokens=64, chunked_prefill_size=4,
                             max_context_len=64, policy="fcfs", lpm_fcfs_threshold=128)
    s = Scheduler(limits, kv, ReqToTokenPool(4, 64, torch.device("cpu")), RadixCache())
    shared = ids(20, 2)
    s.add(Req("warm", shared, SamplingParams.from_dict({"max_new_tokens": 0})))
    _drive(s, 10)  # 20 evictable tokens of `shared` in the tree
    a = Req("a", ids(4, 1), SamplingParams.from_dict({"max_new_tokens": 30}))
    s.add(a)
    _drive(s, 1)
    s.new_token_ratio = 0.0  # a decayed reservation: admission may over-commit
    c = Req("c", shared + ids(20, 3), SamplingParams.from_dict({"max_new_tokens": 1}))
    s.add(c)
    _drive(s, 200)
    assert a.finish_reason == {"type": "length", "length": 30}
    assert c.finish_reason == {"type": "length", "length": 1}
    assert [r.rid for r in s.take_finished()] == ["warm", "a", "c"]


# -- 2. a failed forward does not poison the radix cache ---------------------------------------------


def test_failed_forward_inserts_nothing_into_the_tree():
    prompt = ids(50, 3)
    sp = {**GREEDY, "max_new_tokens": 8}
    expected = clean_output(prompt, sp)
    with tiny() as e:
        e.set_fault_injector(FaultInjector([Fault("forward", times=1, exc=RuntimeError)]))
        failed = bounded(e.generate, input_ids=prompt, sampling_params=sp)
        assert reason(failed) == "error" and "RuntimeError" in failed["meta_info"]["finish_reason"]["message"]
        again = bounded(e.generate, input_ids=prompt, sampling_params=sp)
        assert again["meta_info"]["cached_tokens"] == 0
        assert again["output_ids"] == expected
        assert_idle_and_clean(e)


def test_out_of_memory_in_prefill_is_retried_with_a_smaller_budget():
    prompt = ids(50, 4)
    sp = {**GREEDY, "max_new_tokens": 6}
    expected = clean_output(prompt, sp)
    with tiny(max_prefill_tokens=64) as e:
        real_forward, prefills = e.runner.forward, []

        def forward(batch, offsets):
            if not batch.is_decode:
                prefills.append(sum(batch.extend_lens))
            return real_forward(batch, offsets)

        e.runner.forward = forward
        e.set_fault_injector(FaultInjector([Fault("forward", times=2, exc=torch.cuda.OutOfMemoryError)]))
        res = bounded(e.generate, input_ids=prompt, sampling_params=sp)
        assert reason(res) == "length" and res["output_ids"] == expected
        assert prefills == [16, 16, 16, 2]  # two halvings: 64 -> 16 tokens per prefill step
        assert_idle_and_clean(e)


def test_out_of_memory_that_persists_fails_the_request_after_a_few_retries():
    with tiny() as e:
        e.set_fault_injector(FaultInjector([Fault("forward", exc=torch.cuda.OutOfMemoryError)]))
        res = bounded(e.generate, input_ids=ids(30, 5), sampling_params={**GREEDY, "max_new_tokens": 4})
        assert reason(res) == "error" and "OutOfMemory" in res["meta_info"]["finish_reason"]["message"]
        e.set_fault_injector(None)
        assert reason(e.generate(input_ids=ids(30, 5), sampling_params={**GREEDY, "max_new_tokens": 4})) == "length"
        assert_idle_and_clean(e)


# -- 3 and 4. errors outside the forward fail only the requests they belong to ------------------------


def test_nan_logits_fail_only_the_affected_request():
    """torch.multinomial on NaN raises for one row: that request fails, its batch-mate lives."""
    with tiny() as e:
        real_forward = e.runner.forward

        def forward(batch, offsets):
            logits = real_forward(batch, offsets).clone()
            rows = 0
            for req, off in zip(batch.reqs, offsets):
                if req.rid == "poisoned":
                    logits[rows: rows + len(off)] = float("nan")
                rows += len(off)
            return logits

        e.runner.forward = forward
        sampled = {"max_new_tokens": 20, "temperature": 1.0, "ignore_eos": True}
        good, bad = submit_all(e, [ids(12, 6), ids(12, 7)], sampled, ["healthy", "poisoned"])
        assert reason(bad) == "error"
        assert reason(good) == "length" and good["meta_info"]["completion_tokens"] == 20
        assert_idle_and_clean(e)


@pytest.mark.parametrize("point", ["sampler", "grammar", "detokenizer"])
def test_per_request_fault_fails_that_request_alone(point):
    with tiny() as e:
        e.set_fault_injector(FaultInjector([Fault(point, rids={"victim"}, after_step=2)]))
        sp = {**GREEDY, "max_new_tokens": 10}
        victim_sp = {**sp, "regex": "[a-z ]{1,40}"} if point == "grammar" else sp
        results = submit_all(e, [ids(9, 8), ids(9, 9), ids(9, 10)], [sp, victim_sp, sp], ["r0", "victim", "r2"])
        assert [reason(r) for r in results] == ["length", "error", "length"]
        assert InjectedFault.__name__ in results[1]["meta_info"]["finish_reason"]["message"]
        assert results[0]["meta_info"]["completion_tokens"] == 10
        assert_idle_and_clean(e)


def test_step_fault_after_admission_leaks_nothing():
    """A fault in the step that admitted requests: they are accounted for and fail once."""
    with tiny(kv_cache_tokens=4096) as e:
        e.set_fault_injector(FaultInjector([Fault("sampler", times=1, step_level=True)]))
        results = submit_all(e, [ids(20, s) for s in range(4)], {**GREEDY, "max_new_tokens": 3})
        assert all(reason(r) == "error" for r in results)
        assert_idle_and_clean(e)
        assert e.runner.kv_pool.num_free + e.scheduler.cache.evictable_size() == 4096


def test_step_fault_as_a_chunked_prefill_hands_over_leaks_nothing():
    """The step in which one chunked prefill completes and the next request starts chunking
    fails: exactly those two fail, once; the later ones complete; nothing leaks."""
    with tiny(chunked_prefill_size=8, schedule_policy="fcfs") as e:
        # 20-token prompts, 8-token chunks: step 2 is c0[16:20] + c1[0:8]
        e.set_fault_injector(FaultInjector([Fault("sampler", times=1, step_level=True, after_step=2)]))
        results = submit_all(e, [ids(20, 30 + s) for s in range(4)], {**GREEDY, "max_new_tokens": 3},
                             [f"c{s}" for s in range(4)])
        assert [reason(r) for r in results] == ["error", "error", "length", "length"]
        assert_idle_and_clean(e)


def test_scheduling_error_after_admission_fails_every_request_once():
    """An error outside the step's own isolation (here: releasing the step) reaches the loop's
    fallback, which must see the requests admitted in that step: each fails once, none leaks."""
    with tiny(chunked_prefill_size=8, schedule_policy="fcfs") as e:
        real, calls = e.scheduler.finish_step, []

        def finish_step(batch):
            calls.append(batch)
            if len(calls) == 1:
                raise RuntimeError("a scheduling bug")
            return real(batch)

        e.scheduler.finish_step = finish_step
        # the first step admits r0..r2 whole and starts chunking r3 (4 + 4 + 4 + 8 of 20)
        results = submit_all(e, [ids(4, 50), ids(4, 51), ids(4, 52), ids(20, 53)], {**GREEDY, "max_new_tokens": 3})
        assert len(calls[0].reqs) == 4 and not calls[0].completes[-1]
        assert all(reason(r) == "error" and "scheduling bug" in r["meta_info"]["finish_reason"]["message"]
                   for r in results)
        assert_idle_and_clean(e)


def test_bad_top_logprobs_num_is_rejected_at_submission_and_others_keep_running():
    with tiny() as e:
        vocab = e.runner.args.vocab_size
        for bad in (21, vocab + 1, -1):
            with pytest.raises(ValueError, match="top_logprobs_num"):
                e.generate(input_ids=ids(5, 11), sampling_params={"max_new_tokens": 2}, return_logprob=True,
                           top_logprobs_num=bad)
        with pytest.raises(ValueError, match="logprob_start_len"):
            e.generate(input_ids=ids(5, 11), sampling_params={"max_new_tokens": 2}, return_logprob=True,
                       logprob_start_len=5)
        with pytest.raises(ValueError, match="logprob_start_len"):
            e.generate(input_ids=ids(5, 11), sampling_params={"max_new_tokens": 2}, return_logprob=True,
                       logprob_start_len=-3)
        res = e.generate(input_ids=ids(5, 11), sampling_params={**GREEDY, "max_new_tokens": 2},
                         return_logprob=True, top_logprobs_num=20, logprob_start_len=4)
        assert len(res["meta_info"]["output_top_logprobs"][0]) == 20
        assert_idle_and_clean(e)


@pytest.mark.parametrize("logprob_start_len", [0, -1], ids=["prompt-logprobs", "output-logprobs"])
def test_logprob_error_in_the_step_fails_that_request_alone(logprob_start_len, monkeypatch):
    """What validation now refuses, forced through: topk over more alternatives than the
    vocabulary raises in the step; the asking request fails, its batch-mate completes."""
    from radixflow.runtime.core.request import OutputOptions

    monkeypatch.setattr(OutputOptions, "validate", lambda self, prompt_len, vocab_size: None)
    with tiny() as e:
        sp, box = {**GREEDY, "max_new_tokens": 12}, {}
        greedy_for_logprobs = {"return_logprob": True, "logprob_start_len": logprob_start_len,
                               "top_logprobs_num": e.runner.args.vocab_size + 1}

        def run(rid: str, **opts) -> None:
            box[rid] = e.generate(input_ids=ids(9, len(rid)), sampling_params=sp, rid=rid, **opts)

        threads = [threading.Thread(target=run, args=("healthy",)),
                   threading.Thread(target=run, args=("asks-too-much",), kwargs=greedy_for_logprobs)]
        with paused(e):
            for t in threads:
                t.start()
        for t in threads:
            t.join(BOUND_S)
        assert reason(box["asks-too-much"]) == "error"
        assert reason(box["healthy"]) == "length" and box["healthy"]["meta_info"]["completion_tokens"] == 12
        assert_idle_and_clean(e)


# -- 5. the loop never dies silently; shutdown wakes everyone ----------------------------------------


def test_failing_finish_listener_does_not_stop_the_engine():
    with tiny() as e:
        def listener(_timing):
            raise RuntimeError("listener bug")

        e.add_finish_listener(listener)
        for _ in range(3):
            assert reason(bounded(e.generate, input_ids=ids(5, 12), sampling_params={**GREEDY, "max_new_tokens": 2})) == "length"
        assert e.is_healthy
        assert_idle_and_clean(e)


def test_failing_output_callback_does_not_stop_the_engine():
    """A consumer whose callback raises (on progress and on finish) is logged; the loop, the
    accounting and everyone else go on."""
    from radixflow.runtime.core.request import OutputOptions
    from radixflow.runtime.sampling_params import SamplingParams

    with tiny() as e:
        def on_output(_req, _finished):
            raise RuntimeError("consumer bug")

        sp = SamplingParams.from_dict({**GREEDY, "max_new_tokens": 4})
        req = e._make_req(ids(6, 17), sp, OutputOptions(), "broken-consumer", None, on_output)
        req.stream = True
        e.loop.submit(req)
        other = bounded(e.generate, input_ids=ids(6, 18), sampling_params={**GREEDY, "max_new_tokens": 4})
        assert reason(other) == "length"
        e.loop.call(lambda: None)
        assert req.finish_reason == {"type": "length", "length": 4}
        assert e.is_healthy
        assert_idle_and_clean(e)


def test_dead_loop_fails_waiters_and_refuses_new_requests():
    e = tiny()
    try:
        started = threading.Event()
        real = e.loop.step.run_one

        def run_one():
            if started.is_set():
                raise SystemExit("the loop thread dies")
            return real()

        e.loop.step.run_one = run_one
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("r", e.generate(
            input_ids=ids(8, 13), sampling_params={**GREEDY, "max_new_tokens": 50})))
        started.set()
        t.start()
        t.join(BOUND_S)
        assert not t.is_alive()
        assert reason(box["r"]) == "error"
        assert not e.is_healthy
        from radixflow.runtime.errors import EngineDeadError
        with pytest.raises(EngineDeadError):
            e.generate(input_ids=ids(4, 1), sampling_params={"max_new_tokens": 1})
        with pytest.raises(EngineDeadError):
            e.flush_cache()
    finally:
        e.shutdown()


def test_shutdown_wakes_every_waiter_and_later_calls_raise():
    from radixflow.runtime.errors import EngineClosedError

    e = tiny()
    results: list = []
    threads = [threading.Thread(target=lambda s=s: results.append(e.generate(
        input_ids=ids(10, s), sampling_params={**GREEDY, "max_new_tokens": 2000}))) for s in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    bounded(e.shutdown)
    for t in threads:
        t.join(BOUND_S)
        assert not t.is_alive()
    assert len(results) == 4 and all(reason(r) == "abort" for r in results)
    with pytest.raises(EngineClosedError):
        e.generate(input_ids=ids(4, 1), sampling_params={"max_new_tokens": 1})
    with pytest.raises(EngineClosedError):
        bounded(e.flush_cache)
    with pytest.raises(EngineClosedError):
        bounded(e.check_accounting)


# -- 6. honest counters ------------------------------------------------------------------------------------


def test_prefix_queries_count_once_per_admitted_request_not_per_attempt():
    with tiny(kv_cache_tokens=200, max_num_seqs=2) as e:
        shared = ids(40, 14)
        e.generate(input_ids=shared, sampling_params={"max_new_tokens": 0})
        before = e.stats()
        prompts = [shared + ids(10, 20 + i) for i in range(6)]
        bounded(e.generate, input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 30})
        after = e.stats()
        queried = after.prefix_query_tokens - before.prefix_query_tokens
        hit = after.prefix_hit_tokens - before.prefix_hit_tokens
        assert queried == sum(len(p) - 1 for p in prompts)
        assert 6 * 40 <= hit <= queried
        assert_idle_and_clean(e)


# -- invariant mode --------------------------------------------------------------------------------


def test_invariant_mode_logs_and_counts_a_violation(caplog):
    """check_invariants catches a slot that no one owns after the next step: logged, counted."""
    import logging

    with tiny() as e:
        sp = {**GREEDY, "max_new_tokens": 2}
        e.generate(input_ids=ids(8, 15), sampling_params=sp)
        leaked = e.loop.call(lambda: e.runner.kv_pool.alloc(1))  # allocated, owned by no one
        with caplog.at_level(logging.ERROR, logger="radixflow.runtime.engine"):
            e.generate(input_ids=ids(8, 16), sampling_params=sp)
            e.loop.call(lambda: None)  # the step's check and stats refresh have run
        assert e.invariant_violations and "KV accounting broken" in e.invariant_violations[0]
        assert e.stats().invariant_violations == len(e.invariant_violations)
        assert "engine invariant violated" in caplog.text
        e.loop.call(lambda: e.runner.kv_pool.free(leaked))
        e.check_accounting()


# -- the soak: randomized workload with injected faults everywhere ------------------------------------


def _soak_workload(rng: random.Random, n: int, vocab: int) -> list[tuple[str, list[int], dict, bool]]:
    roots = [[rng.randrange(vocab) for _ in range(50)] for _ in range(4)]
    jobs = []
    for i in range(n):
        prompt = roots[i % 4][: rng.randrange(0, 50)] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        sp = {"max_new_tokens": rng.randrange(0, 32), "temperature": rng.choice([0, 0, 1.0]), "ignore_eos": True}
        if rng.random() < 0.1:
            sp = {**sp, "regex": "[a-z]{1,12}", "max_new_tokens": 16}
        jobs.append((f"r{i}", prompt, sp, rng.random() < 0.15))
    return jobs


def _soak_faults(rng: random.Random, jobs: list[tuple[str, list[int], dict, bool]]) -> list[Fault]:
    victims = rng.sample([rid for rid, *_ in jobs], 24)
    constrained = [rid for rid, _, sp, _ in jobs if "regex" in sp]  # only these reach the grammar point
    victims[6:12] = rng.sample(constrained, min(6, len(constrained)))
    return [
        Fault("forward", probability=0.01, exc=RuntimeError),                      # a kernel failure
        Fault("forward", rids=victims[18:24], exc=RuntimeError),                   # a request that breaks its step
        Fault("forward", probability=0.05, times=3, exc=torch.cuda.OutOfMemoryError),  # retried
        Fault("sampler", rids=victims[:6], after_step=rng.randrange(5, 40)),
        Fault("grammar", rids=victims[6:12]),
        Fault("detokenizer", rids=victims[12:18], after_step=rng.randrange(5, 40)),
        Fault("sampler", probability=0.01, step_level=True),
        Fault("grammar", probability=0.01, step_level=True),
        Fault("detokenizer", probability=0.01, step_level=True),
    ]


def run_soak(num_requests: int, seed: int, monkeypatch, overlap: bool = False) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from radixflow.runtime.core import scheduler

    # Admission reserves no room for future tokens, so decode over-commits and retracts however
    # fast this machine drains the queue (the soak must exercise preemption under faults).
    monkeypatch.setattr(scheduler, "NEW_TOKEN_RATIO_INIT", 0.0)
    monkeypatch.setattr(scheduler, "NEW_TOKEN_RATIO_MIN", 0.0)
    rng = random.Random(seed)
    with tiny(kv_cache_tokens=256, max_num_seqs=24, chunked_prefill_size=24, enable_overlap=overlap) as e:
        jobs = _soak_workload(rng, num_requests, e.runner.args.vocab_size)
        faults = _soak_faults(rng, jobs)
        e.set_fault_injector(FaultInjector(faults, seed=seed))
        finishes: dict[str, int] = {}
        e.add_finish_listener(lambda t: finishes.__setitem__(t.rid, finishes.get(t.rid, 0) + 1))

        def run(job):
            rid, prompt, sp, abort = job
            if abort:
                threading.Timer(rng.random() * 0.05, e.abort, args=(rid,)).start()
            start = time.monotonic()
            res = e.generate(input_ids=prompt, sampling_params=sp, rid=rid)
            return res, time.monotonic() - start

        with ThreadPoolExecutor(16) as pool:
            outcomes = list(pool.map(run, jobs))
        time.sleep(0.2)  # late abort timers find nothing to abort
        e.set_fault_injector(None)
        failed = set().union(*(f.fired_for for f in faults if f.exc is not torch.cuda.OutOfMemoryError))
        assert {f.point for f in faults if f.fired} == {"forward", "sampler", "grammar", "detokenizer"}
        assert all(f.fired for f in faults if f.rids is not None), "a targeted fault never fired"
        assert finishes == {rid: 1 for rid, *_ in jobs}
        for (rid, _, sp, aborted), (res, waited) in zip(jobs, outcomes):
            assert waited < BOUND_S
            got = res["meta_info"]["finish_reason"]
            if rid in failed:
                assert got["type"] == "error", (rid, got)
            elif aborted:
                assert got["type"] in ("abort", "length", "stop"), (rid, got)
            else:
                want = ("length", "stop") if "regex" in sp else ("length",)
                assert got["type"] in want, (rid, got)
                if "regex" not in sp:
                    assert res["meta_info"]["completion_tokens"] == sp["max_new_tokens"]
        assert_idle_and_clean(e)
        assert e.stats().failed_steps > 0 and e.stats().num_preemptions > 0
        if overlap:  # overlapped steps ran, regex rows among them (sampled on the engine thread)
            assert e.loop.step.num_overlapped_steps > 0 and e.loop.step.num_host_rows > 0, vars(e.loop.step)
        # The tree holds only computed KV: cached prompts give a clean engine's greedy output.
        probes = [prompt for _, prompt, _, _ in jobs[:24]]
        cached = e.generate(input_ids=probes, sampling_params={**GREEDY, "max_new_tokens": 6})
        assert sum(r["meta_info"]["cached_tokens"] for r in cached) > 0
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=256) as clean:
        want = clean.generate(input_ids=probes, sampling_params={**GREEDY, "max_new_tokens": 6})
    assert [r["output_ids"] for r in cached] == [r["output_ids"] for r in want]


def test_soak_with_injected_faults(monkeypatch):
    run_soak(300, seed=0, monkeypatch=monkeypatch)


def test_soak_with_injected_faults_and_overlap(monkeypatch):
    run_soak(300, seed=7, monkeypatch=monkeypatch, overlap=True)


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", range(1, 6))
def test_soak_with_injected_faults_long(seed, overlap, monkeypatch):
    run_soak(1500, seed=seed, monkeypatch=monkeypatch, overlap=overlap)
