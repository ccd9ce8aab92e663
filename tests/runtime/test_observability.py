"""The numbers operators read: miss reasons, eviction figures, goodput, hit counters, timers."""
from __future__ import annotations

import random
import threading

import pytest

from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.core.request import OutputOptions
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.slo import Goodput, SLOs
from radixflow.runtime.stats import RequestTiming

GREEDY = {"temperature": 0, "ignore_eos": True}


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 3000) for _ in range(n)]


def misses(res: dict) -> dict[str, int]:
    return res["meta_info"]["prefill_miss_tokens"]


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after) if after.get(k, 0) != before.get(k, 0)}


def test_cold_then_divergent_second_turn():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=1024) as e:
        first = ids(40, 1)
        a = e.generate(input_ids=first, sampling_params={**GREEDY, "max_new_tokens": 4})
        assert misses(a) == {"cold": 39, "logits": 1} and a["meta_info"]["divergent_at"] is None
        # the "re-rendered" second turn changes token 25 of the first
        second = first[:25] + ids(20, 2)
        b = e.generate(input_ids=second, sampling_params={**GREEDY, "max_new_tokens": 4})
        assert misses(b) == {"divergent": 19, "logits": 1} and b["meta_info"]["divergent_at"] == 25
        # an honest next turn extends prompt + output: only the new tokens miss, and cold
        third = first + a["output_ids"] + ids(10, 3)
        c = e.generate(input_ids=third, sampling_params={**GREEDY, "max_new_tokens": 2})
        # the last output token has no KV yet: it is computed with the new ones
        assert misses(c) == {"cold": 10, "logits": 1} and c["meta_info"]["cached_tokens"] == 40 + 3


def test_evicted_after_a_small_pool_fills():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=128) as e:
        victim = ids(60, 4)
        e.generate(input_ids=victim, sampling_params={"max_new_tokens": 0})
        for s in range(5, 9):  # push the victim out of the tree
            e.generate(input_ids=ids(60, s), sampling_params={"max_new_tokens": 0})
        assert e.stats().evicted_tokens >= 60
        again = e.generate(input_ids=victim, sampling_params={**GREEDY, "max_new_tokens": 1})
        assert misses(again) == {"evicted": 59, "logits": 1}
        assert e.stats().kv_lifetime.count >= 60  # token-weighted


def test_namespace_miss():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=1024) as e:
        prompt = ids(30, 9)
        e.generate(input_ids=prompt, sampling_params={"max_new_tokens": 0})
        done = threading.Event()
        req = e._make_req(prompt, SamplingParams.from_dict({**GREEDY, "max_new_tokens": 1}), OutputOptions(),
                          "other-ns", None, lambda r, finished: done.set() if finished else None)
        req.namespace = "adapter-x"
        e.loop.submit(req)
        assert done.wait(20)
        assert req.miss_tokens == {"namespace": 29, "logits": 1}


def test_chunked_tail_and_reasons_sum_to_prefill_tokens():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=1024, chunked_prefill_size=8) as e:
        before = e.stats()
        res = e.generate(input_ids=ids(30, 10), sampling_params={**GREEDY, "max_new_tokens": 1})
        assert misses(res) == {"cold": 8, "chunk": 22}
        res2 = e.generate(input_ids=ids(5, 11), sampling_params={**GREEDY, "max_new_tokens": 3})
        assert misses(res2) == {"cold": 4, "logits": 1}
        after = e.stats()
        computed = after.prefill_tokens_computed - before.prefill_tokens_computed
        assert computed == 35 == sum(delta(before.miss_tokens, after.miss_tokens).values())


def test_shared_prefix_moves_hits_and_queries_by_exact_counts():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=2048) as e:
        shared = ids(50, 12)
        e.generate(input_ids=shared, sampling_params={"max_new_tokens": 0})
        before = e.stats()
        prompts = [shared + ids(10, 20 + i) for i in range(4)]
        for p in prompts:
            e.generate(input_ids=p, sampling_params={**GREEDY, "max_new_tokens": 2})
        after = e.stats()
        assert after.prefix_query_tokens - before.prefix_query_tokens == 4 * 59
        assert after.prefix_hit_tokens - before.prefix_hit_tokens == 4 * 50
        assert after.reuse_gap.count - before.reuse_gap.count == 4


def test_forced_retraction_counts_a_preemption():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=64) as e:
        prompts = [ids(6, s) for s in range(5)]
        e.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 20})
        assert e.stats().num_preemptions > 0


def test_goodput_equals_a_hand_computed_slo_check():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=2048, slo_ttft_ms=30, slo_itl_ms=8, slo_e2e_ms=200) as e:
        rng = random.Random(0)
        for i in range(24):
            e.generate(input_ids=ids(rng.randrange(5, 200), 100 + i),
                       sampling_params={**GREEDY, "max_new_tokens": rng.randrange(1, 30)},
                       session_id=f"s{i % 5}")
        timings = list(e.recent_timings)[-24:]
        s = e.stats()
    slos = SLOs(0.030, 0.008, 0.200)
    good = [t for t in timings if t.finish_type in ("stop", "length") and
            (t.ttft_s is not None and t.ttft_s <= 0.030) and (t.e2e_s <= 0.200) and
            (t.completion_tokens < 2 or (t.token_times[-1] - t.token_times[0]) / (len(t.token_times) - 1) <= 0.008)]
    assert s.good_requests == len(good)
    assert s.slo_violations["ttft"] == sum(1 for t in timings if t.ttft_s is None or t.ttft_s > 0.030)
    assert s.slo_violations["e2e"] == sum(1 for t in timings if t.e2e_s > 0.200)
    assert [t for t in timings if not slos.violations(t)] == good
    bad_sessions = {t.session_id for t in timings if t not in good}
    assert s.num_sessions == 5 and s.num_bad_sessions == len(bad_sessions)


def test_timers_are_consistent_per_request():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=2048) as e:
        e.generate(input_ids=[ids(12, s) for s in range(6)], sampling_params={**GREEDY, "max_new_tokens": 5})
        timings = list(e.recent_timings)
    assert len(timings) == 6
    for t in timings:
        assert t.queue_s is not None and 0 <= t.queue_s <= t.ttft_s <= t.e2e_s
        assert len(t.inter_token_s()) == t.completion_tokens - 1


def _timing(rid: str, ttft: float | None, tokens: tuple[float, ...], e2e: float, finish: str = "length",
            session: str | None = None) -> RequestTiming:
    return RequestTiming(rid, 0.0, 0.0 if ttft is not None else None, ttft, e2e, tokens, 5, len(tokens), 0, finish,
                         session_id=session)


def test_goodput_and_session_goodput_on_fixed_timings():
    g = Goodput(SLOs.from_ms(ttft_ms=100, itl_ms=10, e2e_ms=500))
    cases = [  # (timing, good?) each hand-checked against ttft <= 0.1, mean itl <= 0.01, e2e <= 0.5
        (_timing("at-the-limits", 0.1, (0.1, 0.11, 0.12), 0.5, session="a"), True),
        (_timing("one-token", 0.05, (0.05,), 0.06, session="a"), True),       # itl not checked
        (_timing("slow-first", 0.2, (0.2, 0.205), 0.3, session="b"), False),  # ttft
        (_timing("slow-decode", 0.05, (0.05, 0.1), 0.2, session="c"), False),  # itl 50 ms
        (_timing("no-token", None, (), 0.01, finish="abort", session="c"), False),  # ttft (none)
        (_timing("aborted-fast", 0.01, (0.01,), 0.02, finish="abort"), False),  # within SLOs, not normal
        (_timing("long", 0.05, (0.05, 0.06), 0.9, session="d"), False),  # e2e
    ]
    for t, _ in cases:
        g.observe(t)
    assert g.good_requests == sum(good for _, good in cases) == 2
    assert g.violations == {"ttft": 2, "itl": 1, "e2e": 1}
    assert (g.num_sessions, g.num_bad_sessions) == (4, 3)  # a stays good; b, c (twice bad), d do not
    g.observe(_timing("later-good", 0.01, (0.01,), 0.02, session="b"))
    assert (g.num_sessions, g.num_bad_sessions, g.good_requests) == (4, 3, 3)  # a bad session stays bad


def test_meta_info_timings_agree_with_the_recorded_timeline():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=2048) as e:
        res = e.generate(input_ids=[ids(20, s) for s in range(3)], sampling_params={**GREEDY, "max_new_tokens": 4})
        recorded = {t.rid: t for t in e.recent_timings}
    for r in res:
        m = r["meta_info"]
        t, tm = recorded[m["id"]], m["timings"]
        assert tm["queue_s"] + tm["prefill_s"] == pytest.approx(tm["ttft_s"], abs=2e-6)
        assert 0 <= tm["queue_s"] <= tm["ttft_s"] <= tm["e2e_s"]
        assert tm["ttft_s"] == pytest.approx(t.ttft_s, abs=1e-6) and tm["e2e_s"] == pytest.approx(t.e2e_s, abs=1e-6)
        assert m["cached_tokens"] == t.cached_tokens and sum(m["prefill_miss_tokens"].values()) == 20 - t.cached_tokens
