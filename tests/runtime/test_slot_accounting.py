"""The engine's strong slot check (`check_invariants`, run after every step in many tests) finds
a slot that is nowhere and a slot that is in two places, and passes on a healthy engine."""
from __future__ import annotations

import numpy as np
import pytest

from radixflow.runtime import Engine, demo_model


def test_check_slots_finds_a_lost_and_a_doubled_slot():
    with Engine(demo_model("tiny"), kv_cache_tokens=256) as engine:
        engine.generate(["one two three", "one two four"], {"max_new_tokens": 4})  # slots in the tree too
        scheduler, kv = engine.scheduler, engine.runner.kv_pool

        def check() -> None:
            engine.loop.call(scheduler.check_slots)

        check()
        lost = engine.loop.call(lambda: kv.alloc(2))  # taken, then held by no one
        with pytest.raises(AssertionError, match="KV slots misplaced: 254 placed, 254 distinct, 256 usable"):
            check()
        engine.loop.call(lambda: kv.free(np.array([lost[0], lost[0]], dtype=np.int32)))  # one twice, one lost
        with pytest.raises(AssertionError, match="KV slots misplaced: 256 placed, 255 distinct, 256 usable"):
            check()
        engine.loop.call(lambda: kv.alloc(2))
        engine.loop.call(lambda: kv.free(lost))
        check()
        engine.check_accounting()
