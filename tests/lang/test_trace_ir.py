"""trace → msgspec encode/decode → execute gives what running the program locally gives."""
from __future__ import annotations

import re

import msgspec
import pytest

import radixflow.lang as rf
from radixflow.lang import ir


@rf.function
def triage(s, ticket, n_ideas=2):
    s += rf.system("You route tickets.")
    s += rf.user(ticket)
    s += rf.assistant("Team: " + rf.select("team", ["billing", "bugs", "sales"]))
    s += rf.if_(s["team"] == "bugs",
                then=rf.user("Summary?") + rf.assistant(rf.gen("summary", max_tokens=20)),
                else_=rf.user("Thanks") + rf.assistant(rf.gen("reply", max_tokens=5)))
    forks = s.fork(n_ideas)
    for i, f in enumerate(forks):
        with f.var_scope("idea_line"):
            f += f"Idea {i}: " + rf.gen("idea", max_tokens=8, stop="\n")
    forks.join()
    s += "First idea: " + forks[0]["idea"] + ". Second: " + s["idea"][1]
    s += rf.if_(s["team"] != "sales", then="Count: " + rf.gen_int("count"))


def logprob_for(word):
    return lambda prefix, tok: -0.1 if tok.strip() and tok.strip()[0] in word else -2.0


def reply(prompt, sampling):
    if sampling.get("regex") == "[-+]?[0-9]+":
        return "7"
    return f"g{len(prompt) % 97}"


@pytest.mark.parametrize("team", ["bugs", "sales"])
def test_traced_program_matches_local_run(make_fake, team):
    local_fake = make_fake(reply=reply, logprob=logprob_for(team))
    local = triage.run(ticket="It crashes", backend=local_fake)

    program = rf.trace(triage)
    decoded = ir.decode_program(ir.encode_program(program))
    assert decoded == program
    remote_fake = make_fake(reply=reply, logprob=logprob_for(team))
    result = rf.execute(decoded, {"ticket": "It crashes"}, remote_fake)

    assert local["team"] == team
    assert result["variables"] == local.variables()
    assert result["text"] == local.text()
    assert sorted(map(str, remote_fake.requests)) == sorted(map(str, local_fake.requests))
    assert result["meta"]["team"]["scores"] == local.get_meta_info("team")["scores"]


def test_trace_records_arguments_defaults_and_structure():
    program = rf.trace(triage, n_ideas=3)
    assert program.arguments == ["ticket"]
    forks = [op for op, _ in ir.walk(program.ops) if isinstance(op, ir.Fork)]
    assert len(forks) == 1 and forks[0].n == 3 and len(forks[0].branches) == 3
    assert any(isinstance(op, ir.Join) for op in program.ops)
    ifs = [op for op in program.ops if isinstance(op, ir.If)]
    assert ifs[0].ref == ir.VarRef(name="team") and ifs[0].equals == "bugs"
    assert ifs[1].then == [] and ifs[1].else_  # != swaps the branches


def test_str_defaults_become_argument_defaults(fake):
    @rf.function
    def greet(s, name="world"):
        s += "Hello " + name + rf.gen("x")

    program = rf.trace(greet)
    assert program.arguments == ["name"] and program.defaults == {"name": "world"}
    assert rf.execute(program, {}, fake)["text"] == "Hello worldr11"
    assert rf.execute(program, {"name": "you"}, fake)["text"] == "Hello your9"


def test_fork_body_form_with_fork_index(fake):
    program = ir.Program(ops=[
        ir.Text("Q"),
        ir.Fork(id="f", n=2, body=[ir.Text("#{fork_index}:"), ir.Gen(name="a")]),
        ir.Join(fork="f"),
        ir.VarRef(name="a", fork="f", index=1),
    ])
    result = rf.execute(msgspec.json.encode(program), {}, fake)
    assert result["variables"]["a"] == ["r4", "r4"]
    assert result["text"] == "Qr4"
    assert sorted(fake.prompts()[1:]) == ["Q#0:", "Q#1:"]


@pytest.mark.parametrize("body, message", [
    (lambda s: bool(s["x"]), "Python control flow"),
    (lambda s: s.__iadd__(f"{s['x']}"), "string formatting"),
    (lambda s: s["x"].upper(), ".upper"),
    (lambda s: s.text(), "s.text()"),
    (lambda s: s.set_var("a", 1), "set_var"),
])
def test_value_dependent_programs_cannot_be_traced(body, message):
    with pytest.raises(rf.TraceError, match="cannot be traced.*" + re.escape(message)):
        rf.trace(rf.function(lambda s: body(s)))


def test_python_if_on_a_variable_fails_with_a_hint():
    @rf.function
    def prog(s):
        s += rf.select("team", ["a", "b"])
        if s["team"] == "a":
            s += "A"

    with pytest.raises(rf.TraceError, match=r"cannot be traced.*rf\.if_"):
        rf.trace(prog)


def test_argument_used_as_python_value_fails():
    @rf.function
    def prog(s, q):
        s += q.lower()

    with pytest.raises(rf.TraceError, match="argument 'q'"):
        rf.trace(prog)


def test_local_if_picks_an_expression(fake):
    @rf.function
    def prog(s):
        s += rf.select("t", ["a", "b"])
        s += rf.if_(s["t"] == "zzz", then="yes", else_="no")

    assert prog.run(backend=fake).text().endswith("no")


def test_a_traced_negative_index_counts_from_the_end(make_fake):
    @rf.function
    def last(s):
        forks = s.fork(2)
        for f in forks:
            f += rf.gen("y", max_tokens=2)
        forks.join()
        s += s["y"][-1]

    local = last.run(backend=make_fake())
    remote = rf.execute(rf.trace(last), {}, make_fake())
    assert remote["text"] == local.text() and local.text().endswith(local["y"][-1])


def test_an_unknown_ir_version_is_refused():
    with pytest.raises(ValueError, match="version"):
        ir.decode_program({"ops": [{"op": "text", "text": "hi"}], "version": 99})
    assert ir.decode_program({"ops": [{"op": "text", "text": "hi"}], "version": 1}).version == 1
