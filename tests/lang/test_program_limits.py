"""Program bombs: text doubling, gens and choices in the budget (gen n refused), deadlines, null and nested values, shared fork threads."""
from __future__ import annotations

import threading
import time

import pytest

import radixflow.lang as rf
from radixflow.lang import ir
from radixflow.lang.fork import BranchPool


def doubling(rounds: int) -> ir.Program:
    """`scope_begin v; var u; var u; scope_end v` style: the text doubles every round, no generation."""
    ops: list = [ir.Text("ab"), ir.ScopeBegin("u0"), ir.Text("x"), ir.ScopeEnd("u0")]
    for i in range(1, rounds + 1):
        ops += [ir.ScopeBegin(f"u{i}"), ir.VarRef(f"u{i - 1}"), ir.VarRef(f"u{i - 1}"), ir.ScopeEnd(f"u{i}")]
    return ir.Program(ops=ops)


def test_text_doubling_is_stopped_as_it_grows(fake):
    start = time.monotonic()
    with pytest.raises(ValueError, match="max_text_chars"):
        rf.execute(doubling(40), {}, fake, rf.Limits(max_text_chars=100_000))
    assert time.monotonic() - start < 2
    assert rf.execute(doubling(5), {}, fake, rf.Limits(max_text_chars=100_000))["variables"]["u5"] == "x" * 32


def test_fork_copies_count_against_the_text_budget(fake):
    program = ir.Program(ops=[ir.Text("y" * 1000), ir.Fork(id="f", n=50, body=[ir.Text("z")])])
    rf.execute(program, {}, fake, rf.Limits(max_text_chars=60_000))
    with pytest.raises(ValueError, match="max_text_chars"):
        rf.execute(program, {}, fake, rf.Limits(max_text_chars=40_000))


def test_gens_count_in_the_token_budget():
    program = ir.Program(ops=[ir.Gen(name="x", params={"max_new_tokens": 100})] * 8)
    rf.validate_ir(program, rf.Limits(max_total_new_tokens=800))
    with pytest.raises(ValueError, match="800 tokens.*max_total_new_tokens"):
        rf.validate_ir(program, rf.Limits(max_total_new_tokens=799))


def test_gen_with_n_is_refused_before_running(fake):
    # n samples have no place in a program's single text (the language says: use fork)
    program = ir.Program(ops=[ir.Gen(name="x", params={"max_new_tokens": 5, "n": 3})])
    with pytest.raises(ValueError, match="n=3.*fork"):
        rf.execute(program, {}, fake)
    assert not fake.requests
    rf.validate_ir(ir.Program(ops=[ir.Gen(name="x", params={"n": 1})]))


def test_select_choices_are_bounded_and_counted():
    many = ir.Program(ops=[ir.Select("x", [f"c{i}" for i in range(2000)])])
    with pytest.raises(ValueError, match="2000 choices.*max_choices"):
        rf.validate_ir(many)
    some = ir.Program(ops=[ir.Select("x", [f"c{i}" for i in range(100)])] * 10)
    with pytest.raises(ValueError, match="max_requests"):
        rf.validate_ir(some, rf.Limits(max_requests=500))
    with pytest.raises(ValueError, match="max_total_new_tokens"):
        rf.validate_ir(some, rf.Limits(max_total_new_tokens=999))


def test_prefill_only_gens_count_as_requests():
    program = ir.Program(ops=[ir.Gen(params={"max_new_tokens": 0})] * 100)
    rf.validate_ir(program, rf.Limits(max_requests=100))
    with pytest.raises(ValueError, match="100 engine requests.*max_requests"):
        rf.validate_ir(program, rf.Limits(max_requests=99))


def test_null_max_new_tokens_means_the_default(fake):
    out = rf.execute({"ops": [{"op": "gen", "name": "a", "params": {"max_new_tokens": None}}]}, {}, fake)
    assert out["variables"]["a"]


def test_deeply_nested_program_is_a_value_error():
    nested: dict = {"op": "text", "text": "x"}
    for _ in range(5000):
        nested = {"op": "if", "ref": {"name": "a"}, "equals": "b", "then": [nested]}
    with pytest.raises(ValueError, match="malformed program|max_depth"):
        rf.execute({"ops": [nested]}, {}, None)


def test_deadline_stops_the_program(fake):
    slow = type(fake)(reply=lambda prompt, sp: time.sleep(0.05) or "r")
    program = ir.Program(ops=[ir.Gen(name=f"g{i}", params={"max_new_tokens": 1}) for i in range(100)])
    start = time.monotonic()
    with pytest.raises(rf.ProgramTimeout, match="deadline_s"):
        rf.execute(program, {}, slow, rf.Limits(deadline_s=0.2))
    assert time.monotonic() - start < 1.5
    assert len(slow.requests) < 20


def test_branch_pool_is_bounded_and_nested_forks_do_not_deadlock():
    pool = BranchPool(max_threads=2)
    seen: set[str] = set()
    lock = threading.Lock()

    def leaf() -> None:
        with lock:
            seen.add(threading.current_thread().name)
        time.sleep(0.01)

    def parent() -> None:
        pool.run_all([leaf] * 4)

    pool.run_all([parent] * 4)
    workers = {name for name in seen if name.startswith("rf-branch")}
    assert 1 <= len(workers) <= 2  # never more threads than the pool has
    with pytest.raises(KeyError):
        pool.run_all([leaf, lambda: {}["missing"], leaf])


def test_forks_use_no_thread_per_branch(fake):
    before = threading.active_count()
    program = ir.Program(ops=[ir.Fork(id="f", n=200, body=[ir.Gen(name="x", params={"max_new_tokens": 1})])])
    rf.execute(program, {}, fake)
    assert threading.active_count() - before <= 64


@pytest.mark.parametrize("tokens", ["2047", 2047.0, "2.047e3"])
def test_token_budget_counts_the_value_that_will_run(tokens):
    # sampling params convert as everywhere in the API ("4" is 4): the budget counts the result
    program = {"ops": [{"op": "gen", "params": {"max_new_tokens": tokens}}] * 200}
    with pytest.raises(ValueError, match="409400 tokens.*max_total_new_tokens"):
        rf.validate_ir(ir.decode_program(program))
    rf.validate_ir(ir.decode_program(program), rf.Limits(max_total_new_tokens=409_400))
