"""Calls between overlapped steps (flush_cache, abort_all, a LoRA load: anything that first
finishes the step in flight) never strand the requests that step finished."""
from __future__ import annotations

import threading

from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model


def test_calls_that_finish_the_step_in_flight_hand_out_what_it_finished():
    with Engine(demo_model("tiny"), dtype="float32", enable_overlap=True, check_invariants=True) as engine:
        stop = threading.Event()
        served = [0, 0]

        def generate(i: int) -> None:
            while not stop.is_set():
                out = engine.generate("the river ran", {"max_new_tokens": 8, "temperature": 0.0})
                assert out["meta_info"]["completion_tokens"] == 8
                served[i] += 1

        def flush() -> None:
            for _ in range(100):
                engine.flush_cache()
            stop.set()

        threads = [threading.Thread(target=generate, args=(i,), daemon=True) for i in range(2)]
        threads.append(threading.Thread(target=flush, daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        assert not any(t.is_alive() for t in threads), "a caller waits for a request the engine finished"
        assert min(served) > 0 and not engine.invariant_violations
