"""run_batch: states in input order; a failing program carries its error and the others finish."""
from __future__ import annotations

import random
import time

import pytest

import radixflow.lang as rf


@rf.function
def echo(s, word):
    s += word + ":" + rf.gen("out")


def test_order_is_input_order_even_when_programs_finish_out_of_order(make_fake):
    def reply(prompt, sampling):
        time.sleep(random.random() * 0.02)
        return prompt.upper()

    words = [f"w{i}" for i in range(12)]
    states = echo.run_batch([{"word": w} for w in words], backend=make_fake(reply=reply), num_threads=6)
    assert [st["out"] for st in states] == [f"{w}:".upper() for w in words]


def test_a_failure_is_carried_by_its_state_only(make_fake):
    def reply(prompt, sampling):
        if prompt.startswith("bad"):
            raise RuntimeError("backend exploded")
        return "fine"

    states = echo.run_batch([{"word": "a"}, {"word": "bad"}, {"word": "c"}], backend=make_fake(reply=reply))
    assert states[0]["out"] == "fine" and states[2]["out"] == "fine"
    assert isinstance(states[1].error(), RuntimeError)
    with pytest.raises(rf.ProgramError, match="backend exploded") as info:
        states[1]["out"]
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(rf.ProgramError):
        states[1].text()


def test_an_exception_in_the_body_is_carried_too(fake):
    @rf.function
    def prog(s, n):
        s += "x"
        if n == 1:
            raise KeyError("user bug")

    states = prog.run_batch([{"n": 0}, {"n": 1}], backend=fake)
    assert states[0].error() is None and isinstance(states[1].error(), KeyError)


def test_defaults_and_bad_arguments(fake):
    states = echo.run_batch([{"word": "a"}], backend=fake, temperature=0, progress_bar=True)
    assert fake.requests[0]["sampling_params"] == {"temperature": 0}
    assert states[0]["out"] == "r2"
    with pytest.raises(TypeError, match="list of keyword-argument dicts"):
        echo.run_batch({"word": "a"}, backend=fake)
    with pytest.raises(ValueError, match="num_threads"):
        echo.run_batch([{"word": "a"}], backend=fake, num_threads=0)
