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


def fork_then(var: dict) -> dict:
    """A fork of 2 branches that each set y, then `var` (a var op reading y)."""
    return {"ops": [{"op": "text", "text": "hi"},
                    {"op": "fork", "id": "f", "n": 2,
                     "body": [{"op": "gen", "name": "y", "params": {"max_new_tokens": 2}}]},
                    {"op": "join", "fork": "f"}, var]}


@pytest.mark.parametrize("var", [
    {"op": "var", "name": "y", "fork": "f"},
    {"op": "var", "name": "y", "fork": "f", "index": 2},
    {"op": "var", "name": "y", "fork": "f", "index": 5},
    {"op": "var", "name": "y", "fork": "f", "index": -1},
    {"op": "var", "name": "y", "fork": "f", "index": -3},
])
def test_a_fork_variable_needs_a_branch_index_in_range(fake, var):
    with pytest.raises(ValueError, match=r"variable 'y' of fork 'f' needs an index in \[0, 2\)"):
        rf.execute(fork_then(var), {}, fake)
    assert fake.requests == []
    branch = {"op": "if", "ref": var, "equals": "a"}  # an if's ref is checked the same way
    with pytest.raises(ValueError, match=r"needs an index in \[0, 2\)"):
        rf.execute(fork_then(branch), {}, fake)


def test_list_element_indexes_count_from_the_end_when_negative(fake):
    last = rf.execute(fork_then({"op": "var", "name": "y", "index": -1}), {}, fake)
    assert last["text"].endswith(last["variables"]["y"][1])
    second = rf.execute(fork_then({"op": "var", "name": "y", "index": 1}), {}, fake)
    assert second["text"].endswith(second["variables"]["y"][1])
    with pytest.raises(ValueError, match="variable 'y' has no element -3"):
        rf.execute(fork_then({"op": "var", "name": "y", "index": -3}), {}, fake)
    first = rf.execute(fork_then({"op": "var", "name": "y", "fork": "f", "index": 0}), {}, fake)
    assert first["text"].endswith(first["variables"]["y"][0])


@pytest.mark.parametrize("index, message", [
    (None, r"variable 'y' of fork 'f' needs an index in \[0, 2\)"),
    (2, r"variable 'y' of fork 'f' needs an index in \[0, 2\)"),
    (-1, r"variable 'y' of fork 'f' needs an index in \[0, 2\)"),
])
def test_an_unvalidated_fork_index_is_a_value_error_at_run_time(fake, index, message):
    from radixflow.lang.context import ProgramContext
    from radixflow.lang.ops import lookup

    ctx = ProgramContext(backend=fake)
    ctx.forks["f"] = [ctx.child(("f", i)) for i in range(2)]
    for i, branch in enumerate(ctx.forks["f"]):
        branch.set_var("y", f"y{i}")
    assert lookup(ctx, ir.VarRef(name="y", fork="f", index=1)) == "y1"
    with pytest.raises(ValueError, match=message):
        lookup(ctx, ir.VarRef(name="y", fork="f", index=index))
    ctx.set_var("z", ["a", "b"])
    assert lookup(ctx, ir.VarRef(name="z", index=-1)) == "b"  # a list's element: from the end, as in Python
    with pytest.raises(ValueError, match="variable 'z' has no element -3"):
        lookup(ctx, ir.VarRef(name="z", index=-3))
