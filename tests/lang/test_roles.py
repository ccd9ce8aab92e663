"""Roles render through the backend's markers; bos once; assistant gens stop at a plain-text end marker."""
from __future__ import annotations

import pytest

import radixflow.lang as rf
from radixflow.lang.roles import RoleMarkers


@rf.function
def chat(s, question):
    s += rf.system("Be brief.")
    s += rf.user(question)
    s += rf.assistant(rf.gen("answer", max_tokens=16))
    with s.user():
        s += "Thanks. " + "Again?"
    with s.assistant():
        s += rf.gen("again", stop="\n")


def test_rendering_with_markers_and_bos_once(fake):
    state = chat.run(question="Hi?", backend=fake)
    p1 = "<s>[SYS]Be brief.[/SYS]\n[USER]Hi?[/USER]\n[ASST]"
    a1 = f"r{len(p1)}"
    p2 = f"{p1}{a1}### END\n[USER]Thanks. Again?[/USER]\n[ASST]"
    a2 = f"r{len(p2)}"
    assert fake.prompts() == [p1, p2]
    assert state.text() == f"{p2}{a2}### END\n"
    assert state.text().count("<s>") == 1
    assert state.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": a1},
        {"role": "user", "content": "Thanks. Again?"},
        {"role": "assistant", "content": a2},
    ]


def test_assistant_gen_stops_at_a_plain_text_end_marker(fake):
    chat.run(question="Hi?", backend=fake)
    assert fake.requests[0]["sampling_params"] == {"max_new_tokens": 16, "stop": ["### END"]}
    assert fake.requests[1]["sampling_params"] == {"stop": ["\n", "### END"]}


def test_special_token_end_marker_is_not_a_stop_string(make_fake):
    markers = {"bos": "", "system": ["<|im_start|>system\n", "<|im_end|>\n"],
               "user": ["<|im_start|>user\n", "<|im_end|>\n"],
               "assistant": ["<|im_start|>assistant\n", "<|im_end|>\n"]}
    fake = make_fake(markers=markers)
    state = chat.run(question="Hi?", backend=fake)
    assert fake.requests[0]["sampling_params"] == {"max_new_tokens": 16}
    assert state.text().startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")


def test_gen_outside_a_role_gets_no_extra_stop(fake):
    @rf.function
    def prog(s):
        s += "plain " + rf.gen("x")

    prog.run(backend=fake)
    assert fake.requests[0]["sampling_params"] == {}
    assert "<s>" not in fake.requests[0]["text"]


def test_begin_end_helpers_and_errors(fake):
    @rf.function
    def prog(s):
        s += rf.user_begin() + "a" + rf.user_end()

    assert prog.run(backend=fake).text() == "<s>[USER]a[/USER]\n"

    @rf.function
    def nested(s):
        s += rf.user_begin() + rf.assistant("x")

    with pytest.raises(rf.ProgramError, match="inside the open 'user' turn"):
        nested.run(backend=fake).text()


def test_unknown_role_and_malformed_markers(make_fake):
    fake = make_fake(markers={"bos": "", "user": ["<u>", "</u>"]})

    @rf.function
    def prog(s):
        s += rf.system("x")

    state = prog.run(backend=fake)
    assert "no role 'system'" in str(state.error())
    with pytest.raises(ValueError, match="begin, end"):
        RoleMarkers.from_dict({"bos": "", "user": "<u>"})
