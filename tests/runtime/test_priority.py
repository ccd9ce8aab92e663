"""Priority scheduling (runtime/core/priority.py): the queue's order by priority, preemption of
running requests of lower priority for a seat or for KV, and its limits. The scheduler runs on
plain CPU pools with no model (test_admission_cost.py's steps); then the engine, whose
preempted request still gives its greedy output."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from radixflow.radix import RadixCache
from radixflow.runtime import Engine
from radixflow.runtime.core.kv_pool import KVPool, ReqToTokenPool
from radixflow.runtime.core.priority import DISPLACED, PriorityRules, queue_victim
from radixflow.runtime.core.request import Req, Status
from radixflow.runtime.core.scheduler import Scheduler, SchedulerLimits
from radixflow.runtime.errors import QueueFullError
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.sampling_params import SamplingParams

from .test_admission_cost import TOKEN, step

ON = PriorityRules(enabled=True)


def make_scheduler(priority: PriorityRules = ON, max_num_seqs: int = 2, num_slots: int = 4096,
                   policy: str = "fcfs", chunk: int = 0) -> Scheduler:
    cpu = torch.device("cpu")
    limits = SchedulerLimits(max_num_seqs=max_num_seqs, max_prefill_tokens=1 << 20, chunked_prefill_size=chunk,
                             max_context_len=8192, policy=policy, lpm_fcfs_threshold=128)
    return Scheduler(limits, KVPool(num_slots + 1, 1, 1, 1, torch.float32, cpu),
                     ReqToTokenPool(max_num_seqs, 8192, cpu), RadixCache(), priority=priority)


def make_req(rid: str, priority: int | None, prompt_len: int = 8, max_new_tokens: int = 4, first: int = 0) -> Req:
    req = Req(rid=rid, prompt_ids=[first + (i * 31) % 997 for i in range(prompt_len)],
              sampling=SamplingParams.from_dict({"max_new_tokens": max_new_tokens, "ignore_eos": True}))
    req.priority = priority
    return req


def admission_order(s: Scheduler, reqs: list[Req]) -> list[str]:
    """The rids in the order they were first admitted, running everything to its end."""
    order: list[str] = []
    while s.has_work():
        assert step(s)
        for req in reqs:
            if req.times.scheduled is not None and req.rid not in order:
                order.append(req.rid)
    return order


def queue_behind_one(s: Scheduler, reqs: list[Req]) -> list[str]:
    """Admit a first request alone (max_num_seqs 1), queue `reqs` behind it: their order."""
    blocker = make_req("blocker", None, max_new_tokens=3)
    s.add(blocker)
    assert step(s) and blocker.status is Status.RUNNING
    for req in reqs:
        s.add(req)
    return [rid for rid in admission_order(s, [blocker, *reqs]) if rid != "blocker"]


@pytest.mark.parametrize("rules, want", [
    (ON, ["high", "high-later", "mid", "none", "low"]),
    (PriorityRules(enabled=True, low_values_first=True), ["low", "none", "mid", "high", "high-later"]),
    (PriorityRules(enabled=True, default=7), ["none", "high", "high-later", "mid", "low"]),
    (PriorityRules(), ["low", "high", "none", "mid", "high-later"]),  # off: arrival order
])
def test_queue_order(rules, want):
    s = make_scheduler(rules, max_num_seqs=1)
    reqs = [make_req("low", -3), make_req("high", 5), make_req("none", None), make_req("mid", 2),
            make_req("high-later", 5)]
    assert queue_behind_one(s, reqs) == want
    assert s.num_preemptions == 0  # a difference of 10 or less never preempts


def test_priority_before_prefix_match():
    """lpm orders requests of one priority by their cached prefix; priority comes first."""
    s = make_scheduler(max_num_seqs=1, policy="lpm")
    warm = make_req("warm", 0, prompt_len=64, max_new_tokens=1)
    s.add(warm)
    admission_order(s, [warm])
    cached = make_req("cached", 0, prompt_len=64)  # warm's prompt: a 63-token hit
    cold, urgent = make_req("cold", 0, prompt_len=64, first=5000), make_req("urgent", 1, prompt_len=64, first=7000)
    assert queue_behind_one(s, [cold, cached, urgent]) == ["urgent", "cached", "cold"]


def run_two_low_then_high(s: Scheduler, high_priority: int) -> tuple[Req, list[Req]]:
    """Two long low-priority requests fill the batch (2 seats); a high one arrives after two steps."""
    lows = [make_req("low-a", 0, max_new_tokens=12), make_req("low-b", 0, max_new_tokens=12, first=400)]
    for req in lows:
        s.add(req)
    assert step(s) and step(s)  # prefill both, decode once
    high = make_req("high", high_priority, max_new_tokens=3, first=800)
    s.add(high)
    return high, lows


def test_preempts_for_a_seat_and_everyone_finishes_whole():
    s = make_scheduler()
    high, lows = run_two_low_then_high(s, 11)
    ratio = s.new_token_ratio
    assert step(s)
    assert high.status is Status.RUNNING and s.num_preemptions == 1
    assert s.new_token_ratio == ratio  # not a misjudged memory: admission's estimate stands
    assert sum(r.status is Status.WAITING for r in lows) == 1 and len(s.running) + len(s.prefilling) == 2
    victim = next(r for r in lows if r.status is Status.WAITING)
    assert victim.num_retractions == 1 and victim.output_ids == [TOKEN] * 2  # its progress kept
    while s.has_work():
        assert step(s)
        s.check_accounting()
    for req in [high, *lows]:
        assert req.finish_reason == {"type": "length"} and len(req.output_ids) == req.sampling.max_new_tokens
    assert high.times.finished < min(r.times.finished for r in lows)
    assert s.kv.num_free + s.cache.evictable_size() == s.kv.capacity


@pytest.mark.parametrize("rules, high_priority", [
    (ON, 10),                                                   # a difference of exactly the threshold
    (PriorityRules(enabled=True, preemption=False), 100),       # --disable-priority-preemption
    (PriorityRules(enabled=True, threshold=50), 40),
    (PriorityRules(enabled=True, low_values_first=True), 100),  # 100 ranks below 0 there
    (PriorityRules(), 100),                                     # priorities off
])
def test_no_preemption(rules, high_priority):
    s = make_scheduler(rules)
    high, lows = run_two_low_then_high(s, high_priority)
    while lows[0].status is Status.RUNNING or lows[1].status is Status.RUNNING:
        assert step(s)
        assert high.times.scheduled is None or any(r.is_finished for r in lows)
    while s.has_work():
        assert step(s)
    assert s.num_preemptions == 0 and high.finish_reason == {"type": "length"}


def test_preemption_order_lowest_priority_then_least_advanced():
    s = make_scheduler(max_num_seqs=3)
    reqs = [make_req("p5", 5, max_new_tokens=20), make_req("p0-ahead", 0, max_new_tokens=20, first=300),
            make_req("p0-behind", 0, max_new_tokens=20, first=600)]
    s.add(reqs[0])
    s.add(reqs[1])
    assert step(s) and step(s) and step(s)
    s.add(reqs[2])
    assert step(s)  # p0-behind prefilled: it has one token, p0-ahead three
    urgent = make_req("urgent", 20, first=900)
    s.add(urgent)
    assert step(s)
    assert [r.rid for r in s.waiting] == ["p0-behind"] and urgent.status is Status.RUNNING
    second = make_req("urgent-2", 20, first=1200)
    s.add(second)
    assert step(s)  # then the other priority-0 request; p5 (outranked by 15) stays unless needed
    assert {r.rid for r in s.waiting} == {"p0-behind", "p0-ahead"} and reqs[0].status is Status.RUNNING
    assert s.num_preemptions == 2


def test_preempts_for_kv_only_when_enough_would_be_freed():
    """64 slots. A priority-0 request (20 tokens, 8 to generate) and a priority-15 one (20, 8)
    run, 24 slots free; a priority-20 request outranks only the first, whose retraction frees its
    20. A 30-token request then fits, so it is retracted; a 45-token one would need both gone, so
    nothing is retracted (it waits for them to end)."""
    for prompt_len, preempted in ((30, True), (45, False)):
        s = make_scheduler(max_num_seqs=4, num_slots=64)
        low, mid = make_req("low", 0, 20, 8), make_req("mid", 15, 20, 8, first=300)
        s.add(low)
        s.add(mid)
        assert step(s)
        s.new_token_ratio = 0.0  # reserve no future decode: the fit is the prompts' alone
        high = make_req("high", 20, prompt_len, 1, first=600)
        s.add(high)
        assert step(s)
        assert (low.status is Status.WAITING) is preempted and mid.status is Status.RUNNING
        assert (high.status is not Status.WAITING) is preempted and s.num_preemptions == int(preempted)
        while s.has_work():
            assert step(s)
            s.check_accounting()
        assert all(r.finish_reason == {"type": "length"} for r in (low, mid, high))


def test_a_cached_prefix_it_would_lock_does_not_count_as_room():
    """64 slots: a finished 20-token prompt cached (evictable), a priority-0 request (20 tokens)
    and a priority-15 one (15) running, 9 free. A priority-20 turn on the cached prompt needs 14
    new slots: 29 are free or evictable, but admission locks its 20 cached ones first, leaving
    9: the priority-0 request is retracted for it."""
    s = make_scheduler(max_num_seqs=4, num_slots=64)
    warm = make_req("warm", 0, 20, 1)
    s.add(warm)
    admission_order(s, [warm])
    low, mid = make_req("low", 0, 20, 8, first=300), make_req("mid", 15, 15, 8, first=600)
    s.add(low)
    s.add(mid)
    assert step(s)
    s.new_token_ratio = 0.0
    assert (s.kv.num_free, s.cache.evictable_size()) == (9, 20)
    high = make_req("high", 20, 20, 1)
    high.prompt_ids += list(range(900, 914))
    s.add(high)
    assert step(s)
    assert low.status is Status.WAITING and high.status is not Status.WAITING and s.num_preemptions == 1
    while s.has_work():
        assert step(s)
        s.check_accounting()


@pytest.mark.parametrize("urgent_priority, steps_aside", [(11, True), (10, False)])
def test_a_chunked_prefill_of_lower_priority_steps_aside(urgent_priority, steps_aside):
    """Nothing joins a step while a prompt prefills in chunks: an outranking request retracts it
    and goes first, and it comes back in the same step from its chunks so far (in the tree); a
    request within the threshold waits for the chunks to end."""
    s = make_scheduler(max_num_seqs=4, chunk=16)
    long = make_req("long", 0, prompt_len=100, max_new_tokens=2)
    s.add(long)
    assert step(s) and long in s.prefilling and long.kv_len == 16
    urgent = make_req("urgent", urgent_priority, max_new_tokens=2, first=500)
    s.add(urgent)
    batch = s.schedule()
    if steps_aside:
        assert batch.reqs == [urgent, long] and batch.prefix_lens == [0, 16] and batch.extend_lens == [8, 16]
    else:
        assert batch.reqs == [long] and batch.prefix_lens == [16]
    assert s.num_preemptions == long.num_retractions == int(steps_aside)
    for req, sample in zip(batch.reqs, batch.sample):
        if sample:
            req.output_ids.append(TOKEN)
    s.finish_step(batch)
    assert urgent.output_ids == ([TOKEN] if steps_aside else [])  # its first token before the long prompt's
    while s.has_work():
        assert step(s)
        s.check_accounting()
    assert long.finish_reason == urgent.finish_reason == {"type": "length"}


def test_a_plan_that_finds_nothing_is_not_made_again_until_something_changes(monkeypatch):
    s = make_scheduler(max_num_seqs=4, num_slots=64)
    low, mid = make_req("low", 0, 20, 8), make_req("mid", 15, 20, 8, first=300)
    s.add(low)
    s.add(mid)
    assert step(s)
    s.new_token_ratio = 0.0
    s.add(make_req("high", 20, 45, 1, first=600))
    plans = []
    real = Scheduler._preemption_victims
    monkeypatch.setattr(Scheduler, "_preemption_victims", lambda self, head: plans.append(head) or real(self, head))
    for _ in range(5):
        assert step(s)
    assert len(plans) == 1 and not s._preemption_possible()
    ahead = s.schedule_decode_ahead()
    assert ahead is not None  # overlap goes on: nothing to preempt
    s.undo_step(ahead)  # (not run: its slots go back)
    s.check_accounting()
    s.add(make_req("another", 0, first=900))  # the queue changed: planned again at the next step
    assert s._preemption_possible()


def test_no_pair_to_preempt_is_not_looked_for_again_until_the_sets_change(monkeypatch):
    """Decode steps with a full batch and a queue that outranks nothing by enough: the check
    that a preemption is possible runs once, not every step (and again after an arrival)."""
    s = make_scheduler()
    _, lows = run_two_low_then_high(s, 10)  # within the threshold: no pair
    looks = []
    real = PriorityRules.rank
    monkeypatch.setattr(PriorityRules, "rank", lambda self, req: looks.append(req.rid) or real(self, req))
    for _ in range(4):
        assert step(s)
    assert looks and not s._preemption_possible()
    seen = len(looks)
    for _ in range(3):
        assert step(s)
    assert len(looks) == seen and all(r.status is Status.RUNNING for r in lows)
    s.add(make_req("urgent", 11, first=900))
    assert s._preemption_possible()


def test_overlap_stops_for_a_possible_preemption():
    s = make_scheduler()
    high, _ = run_two_low_then_high(s, 11)
    assert s.schedule_decode_ahead() is None  # the loop schedules instead, and preempts
    assert step(s) and high.status is Status.RUNNING


def test_decode_room_retracts_the_lowest_priority_first():
    """Out of KV while decoding: the request of lowest priority goes back (all alike, the first
    admitted would)."""
    s = make_scheduler(max_num_seqs=3, num_slots=40)
    s.new_token_ratio = 0.0
    reqs = [make_req("p9", 9, 10, 30), make_req("p1", 1, 10, 30, first=300), make_req("p5", 5, 10, 30, first=600)]
    for req in reqs:
        s.add(req)
    assert step(s)
    while not s.waiting:
        assert step(s)
    assert [r.rid for r in s.waiting] == ["p1"]


# -- the engine ---------------------------------------------------------------------------------

GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


def test_engine_preempted_request_keeps_its_greedy_output():
    with Engine(demo_model("tiny"), enable_priority_scheduling=True, max_num_seqs=1) as engine:
        alone = engine.generate("the slow river", GREEDY)["output_ids"]

        async def run() -> tuple[list[int], list[str]]:
            done: list[str] = []

            async def consume(prompt, params, priority, name):
                last = None
                async for chunk in engine.generate_stream(prompt, params, priority=priority):
                    last = chunk
                done.append(name)
                return last["output_ids"]

            low = asyncio.create_task(consume("the slow river", GREEDY, 0, "low"))
            while engine.stats().num_running == 0:
                await asyncio.sleep(0.005)
            high = asyncio.create_task(consume("an urgent note", {**GREEDY, "max_new_tokens": 4}, 50, "high"))
            return (await low), (await high), done

        low_ids, high_ids, done = asyncio.run(run())
        assert low_ids == alone and len(high_ids) == 4
        assert done == ["high", "low"]
        assert engine.stats().num_preemptions == 1
        engine.check_accounting()


def test_encode_and_score_preempt_a_running_request_of_lower_priority():
    with Engine(demo_model("tiny"), enable_priority_scheduling=True, max_num_seqs=1) as engine:
        alone = engine.generate("the slow river", GREEDY)["output_ids"]
        for urgent in (lambda: engine.encode("an urgent note", priority=50)["embedding"],
                       lambda: engine.score("an urgent", [" note", " call"], [5, 6], priority=50)):
            low: dict = {}
            thread = threading.Thread(target=lambda: low.update(engine.generate("the slow river", GREEDY, priority=0)))
            thread.start()
            while engine.stats().num_running == 0:
                time.sleep(0.005)
            assert urgent()
            assert not low, "the urgent request waited for the running one"
            thread.join()
            assert low["output_ids"] == alone
        assert engine.stats().num_preemptions == 2
        engine.check_accounting()


# every call that submits requests checks `priority` the same way
CALLS = {
    "generate": lambda engine, **kw: engine.generate("hi", {"max_new_tokens": 1}, **kw)["meta_info"]["completion_tokens"],
    "encode": lambda engine, **kw: len(engine.encode("hi", **kw)["embedding"]),
    "score": lambda engine, **kw: len(engine.score("hi", ["a"], [5], **kw)),
}


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("priority", [1.5, "1", True, 1 << 63, -(1 << 63)])
def test_engine_refuses_a_priority_that_is_not_an_integer_in_range(call, priority):
    with Engine(demo_model("tiny"), max_num_seqs=2) as engine:
        with pytest.raises(ValueError, match="priority"):
            CALLS[call](engine, priority=priority)
        assert CALLS[call](engine, priority=3) >= 1
        engine.check_accounting()


@pytest.mark.parametrize("call", CALLS)
def test_abort_on_priority_when_disabled(call):
    with Engine(demo_model("tiny"), abort_on_priority_when_disabled=True) as engine:
        with pytest.raises(ValueError, match="enable-priority-scheduling"):
            CALLS[call](engine, priority=3)
        assert CALLS[call](engine) >= 1


@pytest.mark.parametrize("kwargs", [{"priority_scheduling_preemption_threshold": -1},
                                    {"default_priority_value": 1 << 63},
                                    {"default_priority_value": True}])
def test_config_refusals(kwargs):
    with pytest.raises(ValueError):
        Engine(demo_model("tiny"), **kwargs)


def test_queue_victim_is_the_last_of_the_lowest_priority():
    waiting = [make_req("a", 0), make_req("b", 3), make_req("c", 0), make_req("d", None)]
    for i, req in enumerate(waiting):
        req.times.arrival = float(i)
    new = make_req("new", 1)
    assert queue_victim(ON, waiting, new, set()).rid == "d"  # None counts as 0, and came last
    assert queue_victim(ON, waiting, new, {"d"}).rid == "c"
    assert queue_victim(ON, waiting, new, {"a", "c", "d"}) is None  # "b" outranks it
    assert queue_victim(ON, waiting, make_req("same", 0), set()) is None
    assert queue_victim(PriorityRules(), waiting, make_req("any", 99), set()) is None
    assert queue_victim(PriorityRules(enabled=True, low_values_first=True), waiting, new, set()).rid == "b"


def test_a_full_queue_takes_a_request_of_higher_priority_in_place_of_its_last():
    """One running, two waiting (max_queued_requests 2): another request of the same priority is
    refused (QueueFullError, a 429 over HTTP); one of higher priority takes the place of the
    waiting request that came last, which ends with reason abort."""
    short = {"max_new_tokens": 2, "temperature": 0}
    with Engine(demo_model("tiny"), enable_priority_scheduling=True, max_num_seqs=1, max_queued_requests=2) as engine:

        async def run() -> dict:
            reasons: dict = {}

            async def consume(name, priority, params):
                async for chunk in engine.generate_stream("a story of " + name, params, rid=name, priority=priority):
                    reasons[name] = chunk["meta_info"]["finish_reason"]

            async def until(check):
                while not check(engine.stats()):
                    await asyncio.sleep(0.002)

            tasks = [asyncio.create_task(consume("running", 0, {"max_new_tokens": 4000, "ignore_eos": True}))]
            await until(lambda s: s.num_running == 1)
            tasks += [asyncio.create_task(consume(name, 0, short)) for name in ("first", "second")]
            await until(lambda s: s.num_waiting == 2)
            with pytest.raises(QueueFullError):
                await consume("same-priority", 0, short)
            tasks.append(asyncio.create_task(consume("urgent", 5, short)))
            await until(lambda s: "second" in reasons)
            engine.abort("running")
            await asyncio.gather(*tasks)
            return reasons

        reasons = asyncio.run(run())
        assert reasons["second"] == DISPLACED
        assert reasons["first"]["type"] == reasons["urgent"]["type"] == "length"
        assert reasons["running"]["type"] == "abort" and "same-priority" not in reasons
        engine.check_accounting()
