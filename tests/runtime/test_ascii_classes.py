"""Regex classes \\d \\w \\s reach the grammar backend as ASCII sets (outlines-core reads them as Unicode)."""
from __future__ import annotations

import re

import pytest

from radixflow.runtime.grammar.ascii_classes import ascii_classes, ascii_schema_patterns
from radixflow.runtime.grammar.spec import grammar_key
from radixflow.runtime.sampling_params import SamplingParams


@pytest.mark.parametrize("regex, expected", [
    (r"\d{6}", r"[0-9]{6}"),
    (r"\w+\s\S\D\W", r"[a-zA-Z0-9_]+[ \t\n\r\f\v][^ \t\n\r\f\v][^0-9][^a-zA-Z0-9_]"),
    (r"[\d.]+", r"[0-9.]+"),
    (r"[^\w]", r"[^a-zA-Z0-9_]"),
    (r"\\d", r"\\d"),  # an escaped backslash, then a literal d
    (r"[]\d]", r"[]0-9]"),
    (r"\.\n", r"\.\n"),
])
def test_translation(regex, expected):
    assert ascii_classes(regex) == expected


@pytest.mark.parametrize("regex", [r"\d+", r"\w+@\w+", r"[\d\s]+x", r"\S+", r"(\d{1,3}\.){3}\d{1,3}"])
def test_same_language_on_ascii_and_no_unicode_digits(regex):
    ascii_re = re.compile(ascii_classes(regex))
    for text in ["123", "ab@cd", "1 2x", "a.b", "10.0.0.1", "x", "٠١", "꣗30246"]:
        assert bool(ascii_re.fullmatch(text)) == bool(re.fullmatch(regex, text, re.ASCII)), (regex, text)


def test_grammar_key_translates_regex_and_schema_patterns():
    assert grammar_key(SamplingParams(regex=r"\d{3}")).text == "[0-9]{3}"
    schema = {"type": "object", "properties": {"zip": {"type": "string", "pattern": r"^\d{5}$"}}}
    assert r"[0-9]{5}" in grammar_key(SamplingParams(json_schema=schema)).text
    assert ascii_schema_patterns({"patternProperties": {r"\w+": {"pattern": r"\s"}}}) == \
        {"patternProperties": {"[a-zA-Z0-9_]+": {"pattern": "[ \\t\\n\\r\\f\\v]"}}}


def test_engine_regex_digits_are_ascii():
    from radixflow.runtime import Engine
    from radixflow.runtime.model.demo import demo_model

    with Engine(demo_model("tiny"), kv_cache_tokens=2048) as engine:
        for seed in range(4):
            out = engine.generate("Number:", {"regex": r"\d{6}", "seed": seed, "max_new_tokens": 12})
            assert re.fullmatch(r"[0-9]{6}", out["text"]), out["text"]
