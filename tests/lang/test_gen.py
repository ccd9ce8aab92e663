"""gen(): one request per call whose prompt is all text so far; parameters derived from SamplingParams."""
from __future__ import annotations

import pytest

import radixflow.lang as rf
from radixflow.lang import ir


def test_each_gen_sends_everything_so_far(fake):
    @rf.function
    def prog(s, q):
        s += "Q: " + q + "\nA:"
        s += rf.gen("a", max_tokens=8, stop="\n", temperature=0)
        s += "\nMore:" + rf.gen("b")

    state = prog.run(q="1+1", backend=fake)
    first = "Q: 1+1\nA:"
    second = f"{first}r{len(first)}\nMore:"
    assert fake.prompts() == [first, second]
    assert fake.requests[0]["sampling_params"] == {"max_new_tokens": 8, "stop": "\n", "temperature": 0}
    assert fake.requests[1]["sampling_params"] == {}
    assert state["a"] == f"r{len(first)}" and state["b"] == f"r{len(second)}"
    assert state.text() == f"{second}r{len(second)}"


def test_concatenation_builds_a_sequence():
    expr = "Answer: " + rf.gen("x", max_tokens=3) + "."
    assert [type(op) for op in expr.ops] == [ir.Text, ir.Gen, ir.Text]
    assert expr.ops[1].params == {"max_new_tokens": 3}


def test_unknown_keyword_is_rejected_with_the_accepted_names():
    with pytest.raises(TypeError, match="max_tokenz.*max_new_tokens"):
        rf.gen("x", max_tokenz=3)


def test_values_are_checked_by_the_runtime_declaration():
    with pytest.raises(ValueError, match="temperature"):
        rf.gen("x", temperature=-1)


def test_aliases_and_request_keys_are_split():
    op = rf.gen("x", max_tokens=5, min_tokens=1, return_logprob=True, top_logprobs_num=2, top_p=None,
                priority=4).ops[0]
    assert op.params == {"max_new_tokens": 5, "min_new_tokens": 1}
    assert op.extras == {"return_logprob": True, "top_logprobs_num": 2, "priority": 4}


def test_every_declared_sampling_param_is_accepted():
    from radixflow.runtime.sampling_params import SamplingParams

    samples = {"stop": "x", "stop_token_ids": [3], "stop_regex": "y", "regex": "a+", "seed": 3,
               "json_schema": "{}", "choices": ["a"], "ebnf": 'root ::= "a"', "stream_interval": 2,
               "constrain_after": "</think>", "logit_bias": {"5": 1.0},
               "structural_tag": '{"structures": [{"begin": "<a>", "schema": {}, "end": ""}], "triggers": ["<a"]}'}
    for name in SamplingParams.__struct_fields__:
        value = samples.get(name, getattr(SamplingParams(), name))
        assert rf.gen("x", **{name: value}).ops[0].params == {name: value}


@pytest.mark.parametrize("dtype, reply, value", [(int, "-42", -42), (float, "2.5", 2.5), (bool, "True", True),
                                                 (str, '"hi"', "hi")])
def test_dtype_becomes_regex_and_converted_value(make_fake, dtype, reply, value):
    fake = make_fake(reply=lambda prompt, sp: reply)

    @rf.function
    def prog(s):
        s += "n=" + rf.gen("n", dtype=dtype)

    state = prog.run(backend=fake)
    assert fake.requests[0]["sampling_params"]["regex"] == rf.gen("n", dtype=dtype).ops[0].params["regex"]
    assert state["n"] == value and type(state["n"]) is type(value)
    assert state.text() == "n=" + reply


def test_dtype_int_regex_is_the_documented_one():
    assert rf.gen_int("n").ops[0].params["regex"] == "[-+]?[0-9]+"


def test_choices_go_to_the_choices_sampling_param(fake):
    @rf.function
    def prog(s):
        s += rf.gen("c", choices=["yes", "no"])

    prog.run(backend=fake)
    assert fake.requests[0]["sampling_params"] == {"choices": ["yes", "no"]}


def test_json_schema_dict_is_sent_as_a_string():
    op = rf.gen("j", json_schema={"type": "object"}).ops[0]
    assert op.params == {"json_schema": '{"type": "object"}'}


def test_run_keywords_become_default_sampling_params(fake):
    @rf.function
    def prog(s, q):
        s += q + rf.gen("a") + rf.gen("b", temperature=0.7)

    prog.run(q="x", temperature=0, max_tokens=4, backend=fake)
    assert fake.requests[0]["sampling_params"] == {"temperature": 0, "max_new_tokens": 4}
    assert fake.requests[1]["sampling_params"] == {"temperature": 0.7, "max_new_tokens": 4}


def test_gen_meta_info_and_logprob_options(fake):
    @rf.function
    def prog(s):
        s += "abc" + rf.gen("x", return_logprob=True, logprob_start_len=1)

    state = prog.run(backend=fake)
    assert fake.requests[0]["return_logprob"] is True and fake.requests[0]["logprob_start_len"] == 1
    meta = state.get_meta_info("x")
    assert meta["prompt_tokens"] == 3 and len(meta["input_token_logprobs"]) == 2


def test_var_scope_captures_text(fake):
    @rf.function
    def prog(s):
        s += "a"
        with s.var_scope("mid"):
            s += "b" + rf.gen("g")
        s += "c"

    state = prog.run(backend=fake)
    assert state["mid"] == "br2" and state.text() == "abr2c"


def test_set_get_var_and_missing_var(fake):
    @rf.function
    def prog(s):
        s += "x"
        s.set_var("k", 7)

    state = prog.run(backend=fake)
    assert state.get_var("k") == 7
    with pytest.raises(KeyError, match="never set"):
        state["nope"]


def test_nested_program_call_runs_on_the_same_state(fake):
    @rf.function
    def inner(s, word):
        s += word + rf.gen("w")

    @rf.function
    def outer(s):
        s += "a "
        inner(s, "b")

    state = outer.run(backend=fake)
    assert state.text() == "a br3" and state["w"] == "r3"


def test_no_backend_is_a_clear_error():
    rf.set_default_backend(None)

    @rf.function
    def prog(s):
        s += "x"

    with pytest.raises(ValueError, match="set_default_backend"):
        prog.run()


def test_default_backend(fake):
    @rf.function
    def prog(s):
        s += "x" + rf.gen("y")

    rf.set_default_backend(fake)
    try:
        assert prog.run()["y"] == "r1"
    finally:
        rf.set_default_backend(None)


@pytest.mark.parametrize("make", [lambda: rf.gen(5), lambda: rf.gen_int(b"x"), lambda: rf.select(5, ["a"])])
def test_variable_names_must_be_str(make):
    with pytest.raises(ValueError, match="name must be a str"):
        make()


@pytest.mark.parametrize("value", [5, 2.5, True, None, ["a"], b"x"])
def test_only_text_and_expressions_can_be_appended(fake, value):
    @rf.function
    def prog(s):
        s += "x"
        s += value

    with pytest.raises(rf.ProgramError, match=f"cannot append {type(value).__name__}.*str.*gen.*select") as info:
        prog.run(backend=fake).text()
    assert isinstance(info.value.__cause__, TypeError)
    with pytest.raises(TypeError, match="cannot append"):
        _ = "a" + rf.gen("x") + value
    if value is not None:  # rf.user() / rf.user(None) is an empty turn
        with pytest.raises(TypeError, match="cannot append"):
            rf.user(value)
