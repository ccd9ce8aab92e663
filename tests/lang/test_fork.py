"""fork(n): exactly one prefill-only request for the shared text, then parallel branches; join gathers."""
from __future__ import annotations

import threading
import time

import pytest

import radixflow.lang as rf


@rf.function
def tips(s, topic):
    s += "Tips about " + topic + ":\n"
    forks = s.fork(3)
    for i, f in enumerate(forks):
        f += f"Tip {i}: " + rf.gen("tip", max_tokens=10)
    forks.join()
    s += "Best: " + forks[1]["tip"]


def test_one_prefill_for_the_shared_text_then_branches(fake):
    state = tips.run(topic="tea", backend=fake)
    shared = "Tips about tea:\n"
    assert fake.requests[0] == {"text": shared, "sampling_params": {"max_new_tokens": 0}}
    assert len(fake.prefills()) == 1
    branch_prompts = sorted(p for p in fake.prompts()[1:4])
    assert branch_prompts == [f"{shared}Tip {i}: " for i in range(3)]
    assert state["tip"] == [f"r{len(shared) + 7}"] * 3
    assert state.text() == f"{shared}Best: r{len(shared) + 7}"
    assert fake.prompts()[4:] == []


def test_branches_run_in_parallel(make_fake):
    barrier = threading.Barrier(3, timeout=10)

    def reply(prompt, sampling):
        barrier.wait()  # all three gens must be in flight at once, or this breaks
        return "ok"

    state = tips.run(topic="tea", backend=make_fake(reply=reply))
    assert state.error() is None
    assert state["tip"] == ["ok"] * 3


def test_branch_state_reads_and_parent_continues(fake):
    @rf.function
    def prog(s):
        s += "base"
        forks = s.fork(2)
        forks[0] += "A" + rf.gen("x")
        forks[1] += "B" + rf.gen("x")
        s += " parent"
        s.join(forks)

    state = prog.run(backend=fake)
    assert state["x"] == ["r5", "r5"]
    assert state.text() == "base parent"
    assert [m for m in fake.prefills()] == [{"text": "base", "sampling_params": {"max_new_tokens": 0}}]


def test_gen_meta_is_gathered_too(fake):
    state = tips.run(topic="x", backend=fake)
    meta = state.get_meta_info("tip")
    assert isinstance(meta, list) and len(meta) == 3 and all("prompt_tokens" in m for m in meta)


def test_fork_rejects_bad_sizes(fake):
    @rf.function
    def prog(s):
        s += "x"
        s.fork(0)

    with pytest.raises(rf.ProgramError, match="positive"):
        prog.run(backend=fake).text()


@pytest.mark.parametrize("n, message", [(True, "not a bool"), (False, "not a bool"), (2.0, "positive int"),
                                        (10**6, "at most 256 branches")])
def test_fork_sizes_are_positive_ints_and_bounded(fake, n, message):
    @rf.function
    def prog(s):
        s += "x"
        s.fork(n)

    start = time.monotonic()
    with pytest.raises(rf.ProgramError, match=message):
        prog.run(backend=fake).text()
    assert time.monotonic() - start < 1
    with pytest.raises(ValueError, match=message if n is not True and n is not False else "not a bool"):
        rf.trace(prog)
    assert fake.prefills() == []
