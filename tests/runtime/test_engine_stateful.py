"""Hypothesis state machine over the engine's request lifecycle: submit / abort / step / inject a
fault / flush / wait / shutdown, against a model of which requests must have finished (exactly once).
The engine steps on its own thread; the `step` rule waits for its next step."""
from __future__ import annotations

import threading
import time

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.errors import EngineClosedError
from radixflow.runtime.core.faults import Fault, FaultInjector
from radixflow.runtime.core.request import OutputOptions
from radixflow.runtime.sampling_params import SamplingParams

WAIT_S = 20.0
REASONS = {"stop", "length", "abort", "error"}

faults = st.sampled_from([
    None,
    Fault("forward", probability=0.3, exc=RuntimeError),
    Fault("forward", probability=0.5, times=2, exc=torch.cuda.OutOfMemoryError),
    Fault("sampler", probability=0.3),
    Fault("sampler", probability=0.2, step_level=True),
    Fault("detokenizer", probability=0.2),
])


class EngineLifecycle(RuleBasedStateMachine):
    """The model: every submitted rid; how often each was answered; the engine's state."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = self.make_engine()
        self.submitted: list[str] = []
        self.answers: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self.closed = False

    def make_engine(self) -> Engine:
        return Engine(demo_model("tiny"), kv_cache_tokens=96, max_num_seqs=4, chunked_prefill_size=8, check_invariants=True)

    def _on_output(self, req, finished: bool) -> None:
        if finished:
            with self.lock:
                self.answers.setdefault(req.rid, []).append(req.finish_reason["type"])

    @rule(prompt_len=st.integers(1, 40), max_new=st.integers(0, 40), seed=st.integers(0, 1000))
    def submit(self, prompt_len: int, max_new: int, seed: int) -> None:
        e = self.engine
        ids = [(seed * 31 + 7 * i) % e.runner.args.vocab_size for i in range(prompt_len)]
        sp = SamplingParams.from_dict({"max_new_tokens": max_new, "ignore_eos": True,
                                       "temperature": 0 if seed % 2 else 1.0})
        rid = f"q{len(self.submitted)}"
        req = e._make_req(ids, sp, OutputOptions(), rid, None, self._on_output)
        if self.closed:
            try:
                e.loop.submit(req)
            except EngineClosedError:
                return
            raise AssertionError("a closed engine accepted a request")
        e.loop.submit(req)
        self.submitted.append(rid)

    @precondition(lambda self: self.submitted)
    @rule(data=st.data())
    def abort(self, data) -> None:
        self.engine.abort(data.draw(st.sampled_from(self.submitted)))

    @precondition(lambda self: not self.closed)
    @rule()
    def step(self) -> None:
        """With work in flight, the loop takes another step (or fails one) within a bounded time."""
        e = self.engine

        def progress() -> tuple[int, bool]:
            return e.loop.step.num_steps + e.loop.step.num_failed_steps, e.scheduler.has_work()

        before, busy = e.loop.call(progress)
        deadline = time.monotonic() + WAIT_S
        while busy:
            now, busy = e.loop.call(progress)
            if now != before:
                return
            assert time.monotonic() < deadline, "the engine has work but takes no step"
            time.sleep(0.001)

    @precondition(lambda self: not self.closed)
    @rule(fault=faults, seed=st.integers(0, 100))
    def inject(self, fault, seed: int) -> None:
        injector = None if fault is None else FaultInjector([Fault(
            fault.point, probability=fault.probability, times=fault.times, exc=fault.exc,
            step_level=fault.step_level)], seed=seed)
        self.engine.set_fault_injector(injector)

    @precondition(lambda self: not self.closed)
    @rule()
    def flush(self) -> None:
        assert self.engine.flush_cache()

    @rule()
    def wait_idle(self) -> None:
        """With faults removed, everything submitted is answered within a bounded time."""
        if not self.closed:
            self.engine.set_fault_injector(None)
        self._wait_all_answered()

    @precondition(lambda self: not self.closed)
    @rule()
    def shutdown(self) -> None:
        self.engine.shutdown()
        self.closed = True
        self._wait_all_answered()

    def _wait_all_answered(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            with self.lock:
                if all(rid in self.answers for rid in self.submitted):
                    return
            time.sleep(0.01)
        missing = [r for r in self.submitted if r not in self.answers]
        raise AssertionError(f"requests never answered: {missing}")

    @invariant()
    def answered_at_most_once_with_a_reason(self) -> None:
        with self.lock:
            for rid, reasons in self.answers.items():
                assert len(reasons) == 1, (rid, reasons)
                assert reasons[0] in REASONS

    @invariant()
    def no_invariant_violation(self) -> None:
        assert self.engine.invariant_violations == []

    def teardown(self) -> None:
        if not self.closed:
            self.engine.set_fault_injector(None)
            self._wait_all_answered()
            self.engine.check_accounting()
            assert self.engine.scheduler.cache.protected_size() == 0
        self.engine.shutdown()
        self._wait_all_answered()
        self.answered_at_most_once_with_a_reason()


EngineLifecycle.TestCase.settings = settings(max_examples=12, stateful_step_count=25, deadline=None,
                                             suppress_health_check=[HealthCheck.too_slow])
test_engine_lifecycle = EngineLifecycle.TestCase
