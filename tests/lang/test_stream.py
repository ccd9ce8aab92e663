"""run(stream=True): text_iter yields pieces in order as they arrive, through the backend's streaming call."""
from __future__ import annotations

import threading
import time

import pytest

import radixflow.lang as rf


@rf.function
def story(s):
    s += "Once:"
    s += rf.gen("a", max_tokens=20)
    s += "|Then:"
    s += rf.gen("b")


def test_text_iter_yields_all_pieces_in_order(make_fake):
    fake = make_fake(reply=lambda prompt, sp: "abcdefg" if prompt.endswith("Once:") else "XYZ", chunk_chars=2)
    state = story.run(stream=True, backend=fake)
    pieces = list(state.text_iter())
    assert pieces == ["Once:", "ab", "cd", "ef", "g", "|Then:", "XY", "Z"]
    assert "".join(pieces) == state.text()
    assert all(r.get("stream") is True for r in fake.requests)
    assert state["a"] == "abcdefg" and state["b"] == "XYZ"


def test_text_iter_of_one_variable(make_fake):
    fake = make_fake(reply=lambda prompt, sp: "abcdefg" if prompt.endswith("Once:") else "XYZ", chunk_chars=3)
    state = story.run(stream=True, backend=fake)
    assert list(state.text_iter("b")) == ["XYZ"]
    assert list(state.text_iter("a")) == ["abc", "def", "g"]


def test_pieces_arrive_before_the_generation_ends(make_fake):
    release = threading.Event()

    class Slow(type(make_fake())):
        def generate_stream(self, body):
            yield {"text": "first", "meta_info": {}}
            release.wait(timeout=10)
            yield {"text": "first second", "meta_info": {}}

    @rf.function
    def prog(s):
        s += rf.gen("x")

    state = prog.run(stream=True, backend=Slow())
    pieces = state.text_iter("x")
    assert next(pieces) == "first"  # while the backend is still holding the rest
    release.set()
    assert list(pieces) == [" second"]
    assert state["x"] == "first second"


def test_stream_error_surfaces_from_text_iter(make_fake):
    def reply(prompt, sp):
        raise RuntimeError("no stream for you")

    state = story.run(stream=True, backend=make_fake(reply=reply))
    with pytest.raises(rf.ProgramError, match="no stream for you"):
        list(state.text_iter())


def test_a_body_that_raises_stops_its_streamed_gen(make_fake):
    closed = threading.Event()
    sent: list[int] = []

    class Endless(type(make_fake())):
        def generate_stream(self, body):
            try:
                for i in range(1, 1000):
                    sent.append(i)
                    yield {"text": "x" * i, "meta_info": {}}
                    time.sleep(0.01)
            finally:  # closing the stream is what aborts the request in every backend
                closed.set()

    @rf.function
    def prog(s):
        s += rf.gen("x")
        next(s.text_iter("x"))  # the gen is running
        raise RuntimeError("the body gave up")

    state = prog.run(stream=True, backend=Endless())
    assert closed.wait(timeout=5), "the gen ran on after the body failed"
    assert len(sent) < 500
    with pytest.raises(rf.ProgramError, match="the body gave up"):
        state.text()


def test_a_body_that_raises_aborts_its_non_streamed_gen(make_fake):
    """A backend that can abort gets a rid with each gen; a failed body aborts its gens in flight."""

    class Blocking(type(make_fake())):
        def __init__(self):
            super().__init__()
            self.started, self.aborted, self.rids = threading.Event(), threading.Event(), []

        def generate(self, body):
            self.rids.append(body["rid"])
            self.started.set()
            self.aborted.wait(timeout=5)
            return {"text": "", "meta_info": {"finish_reason": {"type": "abort", "message": "aborted"}}}

        def abort(self, rid):
            if rid in self.rids:
                self.aborted.set()

    backend = Blocking()

    @rf.function
    def prog(s):
        s += rf.gen("x")
        assert backend.started.wait(timeout=5)
        raise RuntimeError("the body gave up")

    started = time.monotonic()
    state = prog.run(backend=backend)
    with pytest.raises(rf.ProgramError, match="the body gave up"):
        state.text()
    assert backend.aborted.is_set() and time.monotonic() - started < 4


def test_gens_carry_no_rid_for_a_backend_that_cannot_abort(make_fake):
    backend = make_fake()

    @rf.function
    def prog(s):
        s += rf.gen("x", max_tokens=4)

    prog.run(backend=backend).text()
    assert all("rid" not in r for r in backend.requests)
