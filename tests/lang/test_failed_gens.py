"""A request that ends with finish reason `error` or `abort` fails the program with BackendError, on every path."""
from __future__ import annotations

import time

import pytest

import radixflow.lang as rf
from radixflow.lang import ir

from .conftest import FakeBackend

ERROR = {"type": "error", "message": "boom: CUDA fell over"}
ABORT = {"type": "abort", "message": "aborted"}


class Failing(FakeBackend):
    """Every request whose prompt contains `marker` ends with `reason` (partial text kept)."""

    def __init__(self, reason: dict, marker: str = "FAIL", **kwargs) -> None:
        super().__init__(**kwargs)
        self.reason, self.marker = reason, marker

    def _one(self, tokens: list[str], body: dict) -> dict:
        out = super()._one(tokens, body)
        if self.marker in "".join(tokens):
            out["meta_info"]["finish_reason"] = self.reason
        return out


@rf.function
def two_gens(s):
    s += "FAIL here:" + rf.gen("a", max_tokens=8)
    s += " then" + rf.gen("b", max_tokens=8)


@pytest.mark.parametrize("reason, words", [(ERROR, "boom: CUDA fell over"), (ABORT, "aborted")])
@pytest.mark.parametrize("stream", [False, True])
def test_local_program_fails_with_backend_error(reason, words, stream):
    backend = Failing(reason)
    state = two_gens.run(backend=backend, stream=stream)
    if stream:
        with pytest.raises(rf.ProgramError, match=words):
            list(state.text_iter())
    assert isinstance(state.error(), rf.BackendError)
    assert f"gen 'a' ended with finish reason {reason['type']}" in str(state.error()) and words in str(state.error())
    with pytest.raises(rf.ProgramError, match=words):
        state.text()
    assert len(backend.requests) == 1  # the program stopped at the failed gen


@pytest.mark.parametrize("reason", [ERROR, ABORT])
@pytest.mark.parametrize("program", [
    [ir.Text("FAIL"), ir.Gen(name="a"), ir.Text("after")],
    [ir.Text("FAIL"), ir.Select(name="s", choices=["x", "y"])],
    [ir.Text("FAIL"), ir.Fork(id="f", n=2, body=[ir.Text("z")])],  # the shared prefill
], ids=["gen", "select", "fork"])
def test_interpreted_program_fails_with_backend_error(reason, program):
    with pytest.raises(rf.BackendError, match=reason["message"]):
        rf.execute(ir.Program(ops=program), {}, Failing(reason))


def test_a_normal_finish_is_not_a_failure():
    for finish in ({"type": "stop", "matched": "\n"}, {"type": "length", "length": 8}, None):
        backend = Failing(finish)
        assert two_gens.run(backend=backend).error() is None


def test_engine_abort_mid_gen_fails_the_program():
    from radixflow.runtime.model.demo import demo_model

    @rf.function
    def long(s):
        s += "Once upon a time" + rf.gen("a", max_tokens=1500, ignore_eos=True)
        s += " and then"

    with rf.Engine(demo_model("tiny")) as backend:
        state = long.run(backend=backend, stream=True)
        pieces = state.text_iter("a")
        next(pieces)  # the gen is running
        backend.engine.abort_all()
        with pytest.raises(rf.ProgramError, match="abort"):
            list(pieces)
        assert isinstance(state.error(), rf.BackendError)
        assert " and then" not in state._ctx.text
        for _ in range(500):
            if not backend.engine.stats().num_running:
                break
            time.sleep(0.01)
        assert backend.engine.stats().num_running == 0


def test_a_failed_body_aborts_its_engine_gen_in_flight():
    """A non-streamed gen on the in-process engine is aborted when the body fails after it."""
    from radixflow.runtime.model.demo import demo_model

    with rf.Engine(demo_model("tiny")) as backend:
        @rf.function
        def gives_up(s):
            s += "Once upon a time" + rf.gen("a", max_tokens=1500, ignore_eos=True)
            for _ in range(500):  # until the gen runs
                if backend.engine.stats().num_running:
                    break
                time.sleep(0.01)
            raise RuntimeError("the body gave up")

        state = gives_up.run(backend=backend)
        with pytest.raises(rf.ProgramError, match="gave up"):
            state.text()
        for _ in range(300):
            if not backend.engine.stats().num_running:
                break
            time.sleep(0.01)
        stats = backend.engine.stats()
        assert stats.num_running == 0 and stats.finish_counts.get("abort") == 1
        assert stats.generated_tokens < 1500
