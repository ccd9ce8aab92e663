"""separate_reasoning(gen(...)): a thinking model's block split off a gen, as SGLang's frontend does:
the answer is the variable and the only text the program keeps, the block is
`<name>_reasoning_content`, whole runs and streamed runs alike; a constrained gen's grammar holds
after </think>; bad uses are ValueErrors, also for a program sent as IR."""
from __future__ import annotations

import pytest

import radixflow.lang as rf
from radixflow.lang import ir

THOUGHT = "<think>\nFrance's capital.\n</think>\n\nParis"


@rf.function
def quiz(s, model_type="deepseek-r1"):
    s += "Q: capital of France? A:"
    s += rf.separate_reasoning(rf.gen("answer", max_tokens=30), model_type=model_type)
    s += " Q: and Italy? A:" + rf.gen("next", max_tokens=5)


def _reply(prompt, sp):
    return THOUGHT if prompt.endswith("A:") and "Italy" not in prompt else "Rome"


@pytest.mark.parametrize("stream", [False, True])
def test_the_answer_is_the_variable_and_the_text(make_fake, stream):
    fake = make_fake(reply=_reply, chunk_chars=3)
    state = quiz.run(backend=fake, stream=stream)
    pieces = list(state.text_iter()) if stream else [state.text()]
    assert state["answer"] == "Paris" and state["answer_reasoning_content"] == "France's capital."
    assert state.text() == "".join(pieces) == "Q: capital of France? A:Paris Q: and Italy? A:Rome"
    assert fake.requests[1]["text"] == "Q: capital of France? A:Paris Q: and Italy? A:"  # the block is not kept
    assert "constrain_after" not in fake.requests[0]["sampling_params"]


def test_qwen3_without_a_block_and_a_constrained_gen(make_fake):
    fake = make_fake(reply=lambda prompt, sp: "<think>x</think>42" if sp.get("regex") else "plain")
    state = quiz.run(backend=fake, model_type="qwen3")
    assert state["answer"] == "plain" and state["answer_reasoning_content"] == ""

    @rf.function
    def number(s):
        s += "n=" + rf.separate_reasoning(rf.gen_int("n"))

    state = number.run(backend=fake)
    assert state["n"] == 42 and state["n_reasoning_content"] == "x" and state.text() == "n=42"
    assert fake.requests[-1]["sampling_params"]["constrain_after"] == "</think>"


@pytest.mark.parametrize("model_type, reply, answer, thought", [
    ("qwen3", "plain", "plain", ""),  # no block: all content, streamed as well as whole
    ("seed_oss", "<seed:think>x</seed:think>Paris", "Paris", "x"),  # its own tags
    ("gpt-oss", "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>Paris",
     "Paris", "x"),
])
def test_a_streamed_run_shows_the_answer_of_each_format(make_fake, model_type, reply, answer, thought):
    fake = make_fake(reply=lambda prompt, sp: reply if "Italy" not in prompt else "Rome", chunk_chars=2)
    state = quiz.run(backend=fake, model_type=model_type, stream=True)
    pieces = list(state.text_iter())
    assert state["answer"] == answer and state["answer_reasoning_content"] == thought
    assert "".join(pieces) == state.text() == f"Q: capital of France? A:{answer} Q: and Italy? A:Rome"


@pytest.mark.parametrize("model_type, after", [("deepseek-r1", "</think>"), ("seed_oss", "</seed:think>"),
                                               ("gpt_oss", "<|channel|>final<|message|>")])
def test_a_constrained_gen_holds_after_its_formats_closing_tag(make_fake, model_type, after):
    """The grammar starts where the format's answer does (Seed-OSS's own tag, gpt-oss's final
    channel), and gpt-oss's text keeps the special tokens its channels are marked by."""
    fake = make_fake(reply=lambda prompt, sp: "7")

    @rf.function
    def number(s):
        s += "n=" + rf.separate_reasoning(rf.gen_int("n"), model_type=model_type)

    number.run(backend=fake)
    sp = fake.requests[-1]["sampling_params"]
    assert sp["constrain_after"] == after
    assert sp.get("skip_special_tokens", True) is (model_type != "gpt_oss")


def test_bad_uses_are_value_errors():
    with pytest.raises(ValueError, match="model_type must be one of"):
        rf.separate_reasoning(rf.gen("a"), model_type="o1")
    with pytest.raises(ValueError, match="takes gen"):
        rf.separate_reasoning(rf.select("a", choices=["x", "y"]))
    with pytest.raises(ValueError, match="needs a gen"):
        rf.separate_reasoning("text")
    with pytest.raises(ValueError, match="must be a str"):
        rf.trace(quiz)  # traced, model_type is an argument of the program

    @rf.function
    def r1(s):
        s += "A:" + rf.separate_reasoning(rf.gen("answer")) + rf.gen("next")

    program = rf.trace(r1)
    decoded = ir.decode_program(ir.encode_program(program))
    assert [op.reasoning for op in decoded.ops if isinstance(op, ir.Gen)] == ["deepseek_r1", None]
    rf.validate_ir(decoded)
    bad = ir.decode_program(ir.encode_program(decoded).replace(b'"deepseek_r1"', b'"o1"'))
    with pytest.raises(ValueError, match="model_type must be one of"):
        rf.validate_ir(bad)
