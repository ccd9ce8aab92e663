"""Grammars over HTTP: SGLang's `ebnf`, vLLM's `structured_outputs` and its older `guided_*`
fields, each mapped onto the engine's constraints; a bad grammar or two constraints are a 400
naming the fields."""
from __future__ import annotations

import json
import re

import pytest

YES_NO = 'root ::= "yes" | "no"'
LIST = 'root ::= "[" item ("," item)* "]"\nitem ::= [a-c] | root'  # nested lists: no regex says this
CHOICES = ["red", "green", "blue"]
# Free text where each "e" opens a structure (the tiny model's random text has many): none holds
# an "e", so the text before the last "e" of an output is a complete match of STRUCTURED.
TAGGED = {"structures": [{"begin": "e[", "schema": {"type": "integer", "minimum": 0, "maximum": 99}, "end": "]"},
                         {"begin": "e(", "schema": {"enum": ["x", "yy"]}, "end": ")"}],
          "triggers": ["e"]}
STRUCTURED = r'(?:[^e]*(?:e\[(?:0|[1-9][0-9]?)\]|e\("(?:x|yy)"\)))*[^e]*'
DEEP = '{"type": "object", "properties": {"x": ' * 40 + "{}" + "}}" * 40  # JSON text 81 deep: past --max-json-depth


def _list_state(text: str) -> str:
    """"complete" when `text` is in LIST's language (a bracketed, comma-separated list of a-c or
    such lists), "prefix" when it is a prefix of a member, "bad" otherwise."""
    depth, expect = 0, "["
    for ch in text:
        if ch == "[" and expect in ("[", "item"):
            depth, expect = depth + 1, "item"
        elif expect == "item" and ch in "abc":
            expect = "after"
        elif expect == "after" and ch == ",":
            expect = "item"
        elif expect == "after" and ch == "]":
            depth -= 1
            expect = "after" if depth else "end"
        else:
            return "bad"
    return "complete" if expect == "end" else "prefix"


def _error(r, param: str) -> str:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    return err["message"]


def test_native_ebnf(client):
    assert [_list_state(t) for t in ("[a,[b],c]", "[[a]]", "[a,[b", "[a]]", "[]")] == [
        "complete", "complete", "prefix", "bad", "bad"]
    body = {"text": [f"A list {i}:" for i in range(6)],
            "sampling_params": {"ebnf": LIST, "max_new_tokens": 24, "temperature": 1.0}}
    out = client.post("/generate", json=body)
    assert out.status_code == 200, out.text
    for r in out.json():  # finished: a complete list; cut by max_new_tokens: the start of one, or a
        # whole one whose closing bracket was the last token allowed (EOS had no step left)
        finished = r["meta_info"]["finish_reason"]["type"] == "stop"
        assert _list_state(r["text"]) in (("complete",) if finished else ("prefix", "complete")), r
        assert finished or r["meta_info"]["completion_tokens"] == 24, r
    assert "ebnf" in _error(client.post("/generate", json={"text": "x", "sampling_params": {"ebnf": "root ::= [a"}}),
                            "ebnf")


@pytest.mark.parametrize("route, field, value, check", [
    ("/v1/completions", "structured_outputs", {"grammar": YES_NO}, lambda t: t in ("yes", "no")),
    ("/v1/chat/completions", "guided_grammar", YES_NO, lambda t: t in ("yes", "no")),
    ("/v1/completions", "ebnf", YES_NO, lambda t: t in ("yes", "no")),
    ("/v1/chat/completions", "guided_choice", CHOICES, lambda t: t in CHOICES),
    ("/v1/completions", "structured_outputs", {"choice": CHOICES}, lambda t: t in CHOICES),
    ("/v1/completions", "guided_regex", "[0-9]{3}", lambda t: re.fullmatch("[0-9]{3}", t)),
    ("/v1/chat/completions", "structured_outputs", {"json": {"enum": ["on", "off"]}},
     lambda t: json.loads(t) in ("on", "off")),
    ("/v1/completions", "guided_json", json.dumps({"type": "boolean"}), lambda t: json.loads(t) in (True, False)),
])
def test_vllm_fields_constrain_the_output(client, route, field, value, check):
    prompt = {"messages": [{"role": "user", "content": "?"}]} if "chat" in route else {"prompt": "?"}
    body = {"model": "tiny", **prompt, "max_tokens": 12, "temperature": 1.0, "n": 2, field: value}
    r = client.post(route, json=body)
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        text = choice["message"]["content"] if "chat" in route else choice["text"]
        assert choice["finish_reason"] == "stop" and check(text), choice


@pytest.mark.parametrize("extra, param", [
    ({"structured_outputs": {"grammar": "root ::= [a"}}, "structured_outputs.grammar"),
    ({"guided_grammar": "root ::= undefined"}, "guided_grammar"),
    ({"structured_outputs": {"choice": ["a", ""]}}, "structured_outputs.choice"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_json": {"type": "no-such-type"}}, "guided_json"),
    ({"guided_grammar": "x" * 70_000}, "guided_grammar"),  # --max-grammar-chars
    ({"guided_json": DEEP}, "guided_json"),  # --max-json-depth, of a schema sent as JSON text too
    ({"structured_outputs": {"regex": "a", "grammar": YES_NO}}, "structured_outputs.regex"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": {"structural_tag": "{structures"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": {"structural_tag": json.dumps({**TAGGED, "triggers": ["<f"]})}},
     "structured_outputs.structural_tag"),  # a begin that starts with no trigger
    ({"structured_outputs": {"structural_tag": json.dumps({"type": "structural_tag", "format": {}})}},
     "structured_outputs.structural_tag"),  # xgrammar's newer form
    ({"response_format": {"type": "structural_tag", "triggers": ["e"]}}, "response_format"),
    ({"response_format": {"type": "structural_tag", "structures": [{"begin": "e", "schema": [1], "end": ""}],
                          "triggers": ["e"]}}, "response_format"),
    ({"response_format": {"type": "structural_tag", "format": {"type": "triggered_tags"}}}, "response_format"),
    ({"response_format": {"type": "json_object", "triggers": ["e"]}}, "response_format"),
    ({"response_format": {"type": "structural_tag", "structures": [{"begin": "e", "schema": json.loads(DEEP),
                                                                    "end": ""}], "triggers": ["e"]}},
     "response_format"),  # --max-json-depth holds for each structure's schema
])
def test_bad_vllm_constraints_are_400_naming_the_field(client, extra, param):
    body = {"model": "tiny", "prompt": "x", "max_tokens": 4, **extra}
    _error(client.post("/v1/completions", json=body), param)


@pytest.mark.parametrize("fields", [
    {"guided_json": {"type": "object"}, "response_format": {"type": "json_object"}},
    {"guided_choice": ["a"], "regex": "a"},
    {"structured_outputs": {"grammar": YES_NO}, "guided_grammar": YES_NO},
    {"ebnf": YES_NO, "json_schema": {"type": "object"}},
    {"response_format": {"type": "structural_tag", **TAGGED}, "guided_regex": "a"},
])
def test_two_constraints_are_a_400_naming_both(client, fields):
    names = sorted(fields)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, **fields}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert all(name in message for name in names) and r.json()["error"]["param"] in message, message


@pytest.mark.parametrize("route, fields", [
    ("/v1/chat/completions", {"response_format": {"type": "structural_tag", **TAGGED}}),
    ("/v1/completions", {"structured_outputs": {"structural_tag": json.dumps(TAGGED)}}),
    ("/generate", {"sampling_params": {"structural_tag": json.dumps({"type": "structural_tag", **TAGGED}),
                                       "max_new_tokens": 24, "temperature": 1.0, "n": 3}}),
])
def test_structural_tag_on_each_route(client, route, fields):
    prompt = {"messages": [{"role": "user", "content": "?"}]} if "chat" in route else {"prompt": "?"}
    body = ({"text": "?", **fields} if route == "/generate" else
            {"model": "tiny", **prompt, "max_tokens": 24, "temperature": 1.0, "n": 3, **fields})
    r = client.post(route, json=body)
    assert r.status_code == 200, r.text
    outputs = r.json() if route == "/generate" else r.json()["choices"]
    texts = [o["text"] if "text" in o else o["message"]["content"] for o in outputs]
    for text in texts:
        assert re.fullmatch(STRUCTURED, text[: text.rfind("e")] if "e" in text else text), text
    assert any(re.search(r'e(\[[0-9]|\(")', t) for t in texts), texts
