"""The engine under memory pressure: KV pools just big enough, retraction and re-admission,
requests that can never fit. Every call returns, with a sensible reason, and nothing leaks.
One regression test per bug found by fuzzing (tiny model, small pools)."""
from __future__ import annotations

import threading

import pytest

from radixflow.runtime.core.scheduler import NEW_TOKEN_RATIO_MIN
from radixflow.runtime.sampling_params import SamplingParams
from test_fault_isolation import BOUND_S, assert_idle_and_clean, paused, reason, tiny

# A regex whose forced prefix tokenizes to far more tokens than the pools below hold, then a
# free part: jump-forward appends the whole prefix at once and decoding goes on after it.
LONG_LITERAL = "Z" + "The quick brown fox jumps over the lazy dog, " * 5


@pytest.mark.parametrize("chunk", [0, 8])
def test_retracted_request_that_outgrew_the_pool_by_jump_forward_finishes_instead_of_hanging(chunk):
    """Two constrained requests admitted together (a decayed new-token ratio reserves little)
    each jump forward past the pool's size. The one with fewer output tokens is retracted, the
    other finishes alone (it can never fit). The retracted one, waiting with more tokens than
    the pool holds, was then never admitted and never finished: without chunked prefill its
    whole recompute was one allocation that could never succeed, so the engine idled and the
    caller waited forever. It must finish with the no-fit abort too (as it did when chunked)."""
    with tiny(kv_cache_tokens=64, chunked_prefill_size=chunk) as e:
        e.loop.call(lambda: setattr(e.scheduler, "new_token_ratio", NEW_TOKEN_RATIO_MIN))
        sps = [{"temperature": 0, "max_new_tokens": 200, "regex": LONG_LITERAL + "[a-z]+"},
               {"temperature": 0, "max_new_tokens": 200, "regex": LONG_LITERAL * 2 + "[a-z]+"}]
        for sp in sps:  # compiled (and cached) now: both requests reach the paused loop together
            e.grammar.compile(SamplingParams.from_dict(sp))
        box: dict = {}
        with paused(e):  # both admitted in one step
            t = threading.Thread(target=lambda: box.setdefault("r", e.generate(
                input_ids=[[1, 2, 3], [4, 5, 6]], sampling_params=sps)), daemon=True)
            t.start()
        t.join(BOUND_S)
        assert not t.is_alive(), "generate did not return: a retracted request was never finished"
        results = box["r"]
        assert e.stats().num_preemptions == 1
        for res in results:
            assert reason(res) == "abort" and "KV cache" in res["meta_info"]["finish_reason"]["message"]
        assert_idle_and_clean(e)
