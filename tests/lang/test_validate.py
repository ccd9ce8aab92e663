"""Malformed or oversized IR is rejected with a ValueError naming the problem, before any request."""
from __future__ import annotations

import pytest

import radixflow.lang as rf
from radixflow.lang import ir


def gen(tokens: int | None = None) -> ir.Gen:
    return ir.Gen(name="x", params={} if tokens is None else {"max_new_tokens": tokens})


@pytest.mark.parametrize("data, message", [
    (b"not json", "malformed program"),
    (b'{"ops": [{"op": "launch_missiles"}]}', "malformed program"),
    (b'{"ops": [{"op": "text"}]}', "malformed program"),
    (b'{"ops": [{"op": "text", "text": "a", "extra": 1}]}', "malformed program"),
    (b'{"ops": "text"}', "malformed program"),
    ({"ops": [{"op": "gen", "params": {"max_new_tokens": "many"}}]}, "sampling_params"),
    ({"ops": [{"op": "gen", "params": {"temprature": 0}}]}, "unknown sampling_params"),
    ({"ops": [{"op": "gen", "extras": {"stream": True}}]}, "unknown request keys"),
    ({"ops": [{"op": "select", "name": "x", "choices": []}]}, "choices"),
    ({"ops": [{"op": "select", "name": "x", "choices": ["a"], "method": "vibes"}]}, "choices_method"),
    ({"ops": [{"op": "join", "fork": "nope"}]}, "unknown fork"),
    ({"ops": [{"op": "var", "name": "q", "source": "arg"}]}, "not declared"),
    ({"ops": [{"op": "fork", "id": "f", "n": 2, "branches": [[]]}]}, "1 branches for n=2"),
    ({"ops": [{"op": "fork", "id": "f", "n": 1, "branches": [[]], "body": [{"op": "text", "text": "a"}]}]},
     "not both"),
    ({"ops": [{"op": "fork", "id": "f", "n": 1}, {"op": "fork", "id": "f", "n": 1}]}, "used twice"),
])
def test_malformed_programs_raise_value_error(fake, data, message):
    with pytest.raises(ValueError, match=message):
        rf.execute(data, {}, fake)
    assert fake.requests == []


def test_too_many_ops():
    program = ir.Program(ops=[ir.Text("a")] * 11)
    rf.validate_ir(program, rf.Limits(max_ops=11))
    with pytest.raises(ValueError, match="max_ops"):
        rf.validate_ir(program, rf.Limits(max_ops=10))


def test_too_many_tokens_counts_defaults_and_fork_bodies():
    from radixflow.runtime.sampling_params import SamplingParams

    default = SamplingParams().max_new_tokens
    program = ir.Program(ops=[gen(100), gen(), ir.Fork(id="f", n=4, body=[gen(50)])])
    total = 100 + default + 4 * 50
    rf.validate_ir(program, rf.Limits(max_total_new_tokens=total))
    with pytest.raises(ValueError, match=f"{total} tokens.*max_total_new_tokens"):
        rf.validate_ir(program, rf.Limits(max_total_new_tokens=total - 1))


def test_if_counts_its_costlier_branch():
    program = ir.Program(ops=[ir.If(ref=ir.VarRef("x"), equals="a", then=[gen(10)], else_=[gen(30)])])
    rf.validate_ir(program, rf.Limits(max_total_new_tokens=30))
    with pytest.raises(ValueError, match="max_total_new_tokens"):
        rf.validate_ir(program, rf.Limits(max_total_new_tokens=29))


def test_too_many_branches_nested_forks_multiply():
    inner = ir.Fork(id="g", n=5, body=[ir.Text("b")])
    program = ir.Program(ops=[ir.Fork(id="f", n=4, body=[inner])])
    rf.validate_ir(program, rf.Limits(max_branches=4 * (1 + 5)))
    with pytest.raises(ValueError, match="max_branches"):
        rf.validate_ir(program, rf.Limits(max_branches=23))
    with pytest.raises(ValueError, match="max_branches"):
        rf.validate_ir(ir.Program(ops=[ir.Fork(id="f", n=10**9)]))


def test_too_deep():
    ops: list = [ir.Text("leaf")]
    for _ in range(5):
        ops = [ir.If(ref=ir.VarRef("x"), equals="a", then=ops)]
    rf.validate_ir(ir.Program(ops=ops), rf.Limits(max_depth=5))
    with pytest.raises(ValueError, match="max_depth"):
        rf.validate_ir(ir.Program(ops=ops), rf.Limits(max_depth=4))


def test_arguments_are_checked(fake):
    program = ir.Program(ops=[ir.VarRef(name="q", source="arg")], arguments=["q"])
    with pytest.raises(ValueError, match="missing program argument 'q'"):
        rf.execute(program, {}, fake)
    with pytest.raises(ValueError, match="unknown program arguments"):
        rf.execute(program, {"q": "a", "z": "b"}, fake)
    with pytest.raises(ValueError, match="string or number"):
        rf.execute(program, {"q": ["a"]}, fake)
    assert rf.execute(program, {"q": "hi"}, fake)["text"] == "hi"
