"""Constrained decoding combined with other request options (stop token ids, JSON-schema keywords
a regex cannot express), on the tiny demo model: its output is nonsense, so every valid output is
the grammar's doing."""
from __future__ import annotations

import json
import re
from decimal import Decimal

import jsonschema
import pytest

from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model


@pytest.fixture(scope="module")
def engine():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=8192, check_invariants=True) as e:
        yield e
    assert not e.invariant_violations


def _letter_ids(engine) -> list[int]:
    """Ids of the tokens spelled with lowercase ASCII letters only."""
    tok = engine.tokenizer
    return [i for i in range(tok.vocab_size)
            if i not in tok.special_token_ids and re.fullmatch(b"[a-z]+", tok.token_bytes(i))]


def test_stop_token_ids_end_a_constrained_request_only_where_its_text_matches(engine):
    """A stop token id ends the request with its text included: under a grammar it may be drawn
    only where the output with it is a complete match."""
    params = {"regex": "[a-z]{6}", "stop_token_ids": _letter_ids(engine), "temperature": 1.0,
              "max_new_tokens": 16}
    out = engine.generate([f"Stop {i}" for i in range(20)], params)
    for r in out:
        assert r["meta_info"]["finish_reason"]["type"] == "stop"
        assert re.fullmatch("[a-z]{6}", r["text"]), r


@pytest.mark.parametrize("jump_forward", [True, False])
def test_forced_tokens_do_not_stop_on_a_stop_token_id(jump_forward):
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=4096, jump_forward=jump_forward) as e:
        regex = "hello world and goodbye"
        # every token of the text longer than a byte: each has a spelling in shorter tokens
        stops = [t for t in e.tokenizer.encode(regex, add_special_tokens=False) if len(e.tokenizer.token_bytes(t)) > 1]
        r = e.generate("Say:", {"regex": regex, "stop_token_ids": stops, "temperature": 0,
                                "max_new_tokens": 32})
        assert r["meta_info"]["finish_reason"]["type"] == "stop" and r["text"] == regex, r


def test_stop_token_ids_under_llguidance():
    pytest.importorskip("llguidance")
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=4096, grammar_backend="llguidance") as e:
        params = {"regex": "[a-z]{6}", "stop_token_ids": _letter_ids(e), "temperature": 1.0, "max_new_tokens": 16}
        for r in e.generate([f"Stop {i}" for i in range(10)], params):
            assert r["meta_info"]["finish_reason"]["type"] == "stop" and re.fullmatch("[a-z]{6}", r["text"]), r


INTEGERS = {
    "type": "object",
    "properties": {
        "wide": {"type": "integer", "minimum": -50, "maximum": 5000},
        "low": {"type": "integer", "minimum": 10, "maximum": 999999},
        "high": {"type": "integer", "minimum": -99999, "maximum": -7},
        "open": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 5},
        "step": {"type": "integer", "minimum": 0, "maximum": 9, "multipleOf": 3},
    },
    "required": ["wide", "low", "high", "open", "step"],
    "additionalProperties": False,
}


def test_integer_bounds_hold_in_every_sample(engine):
    """outlines-core ignores integer bounds past a small enum: every bound must still hold."""
    out = engine.generate([f"Ints {i}" for i in range(30)],
                          {"json_schema": INTEGERS, "temperature": 1.0, "max_new_tokens": 48})
    done = [r for r in out if r["meta_info"]["finish_reason"]["type"] == "stop"]
    assert len(done) > 10
    for r in done:
        jsonschema.validate(json.loads(r["text"]), INTEGERS)


NUMBERS = {
    "unit": {"type": "number", "minimum": 0.5, "maximum": 2.25},
    "open": {"type": "number", "exclusiveMinimum": -1e-3, "exclusiveMaximum": 0},
    "draft4": {"type": "number", "minimum": -3.5, "exclusiveMinimum": True, "maximum": 7, "exclusiveMaximum": True},
    "low": {"type": "number", "minimum": 1e3},
    "high": {"type": "number", "maximum": -3.7},
    "step": {"type": "number", "minimum": 0, "maximum": 2, "multipleOf": 0.25},
}
IN_RANGE = {  # compared exactly: a float may round onto an exclusive bound
    "unit": lambda x: Decimal("0.5") <= x <= Decimal("2.25"),
    "open": lambda x: Decimal("-0.001") < x < 0,
    "draft4": lambda x: Decimal("-3.5") < x < 7,
    "low": lambda x: x >= 1000,
    "high": lambda x: x <= Decimal("-3.7"),
    "step": lambda x: 0 <= x <= 2 and x % Decimal("0.25") == 0,
}


def _finished_numbers(engine, name: str, schema: dict, n: int) -> list[Decimal]:
    """The values of the finished samples of `schema` alone and as an object's one property (the
    tiny model likes digits: a fraction often runs past max_new_tokens, hence both forms)."""
    wrapped = {"type": "object", "properties": {name: schema}, "required": [name], "additionalProperties": False}
    values = []
    for form in (schema, wrapped):
        out = engine.generate([f"Num {name} {i}" for i in range(n)],
                              {"json_schema": form, "temperature": 1.0, "max_new_tokens": 64})
        for r in out:
            if r["meta_info"]["finish_reason"]["type"] == "stop":
                value = json.loads(r["text"], parse_float=Decimal, parse_int=Decimal)
                values.append(value if form is schema else value[name])
    return values


@pytest.mark.parametrize("name", list(NUMBERS))
def test_number_bounds_hold_in_every_sample(engine, name):
    """outlines-core ignores number bounds: the range regex must hold every one of them."""
    values = _finished_numbers(engine, name, NUMBERS[name], 20)
    assert len(values) >= 5
    for x in values:
        assert IN_RANGE[name](x), (name, x)


def test_number_bounds_under_llguidance():
    """llguidance enforces number bounds itself, except that "-0" passes an exclusive upper bound
    of 0 (llguidance 1.x; the README says so). multipleOf on numbers is not checked here."""
    pytest.importorskip("llguidance")
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=8192, grammar_backend="llguidance") as e:
        for name in ("unit", "open", "draft4", "high"):
            for x in _finished_numbers(e, name, NUMBERS[name], 8):
                assert IN_RANGE[name](x) or name == "open" and x == 0, (name, x)


def test_schema_keywords_a_regex_cannot_hold_are_refused(engine):
    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(ValueError, match="uniqueItems"):
        engine.generate("x", {"json_schema": unique})
    with pytest.raises(ValueError, match="multipleOf"):
        engine.generate("x", {"json_schema": {"type": "integer", "multipleOf": 7}})
    with pytest.raises(ValueError, match="multipleOf"):
        engine.generate("x", {"json_schema": {"type": "number", "minimum": 0, "multipleOf": 0.5}})
    with pytest.raises(ValueError, match="too long"):
        engine.generate("x", {"json_schema": {"type": "number", "minimum": 1e-300}})
    assert engine.generate("ok", {"json_schema": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True,
                                                  "maxItems": 1}, "max_new_tokens": 16})


@pytest.mark.parametrize("lo,hi", [(None, None), (0, None), (7, None), (None, -3), (None, 12), (-120, -5),
                                   (-50, 5000), (3, 3), (0, 0), (99, 1001), (-9, 9)])
def test_integer_range_regex_matches_exactly_the_range(lo, hi):
    from radixflow.runtime.grammar.integer_range import integer_range_regex

    rx = re.compile(integer_range_regex(lo, hi))
    for n in range(-1200, 6000):
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert bool(rx.fullmatch(str(n))) == inside, (n, rx.pattern)
    assert not rx.fullmatch("-0") and not rx.fullmatch("007")
    if hi is None:
        assert rx.fullmatch("123456789012345678901")


def test_stop_string_trims_a_constrained_output_to_a_prefix_of_a_match(engine):
    """The README's rule: a stop string still ends the output; the text is a prefix of a match."""
    date = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r = engine.generate("Date:", {"regex": date, "stop": ["-"], "temperature": 0, "max_new_tokens": 20})
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": "-"}
    assert re.fullmatch(r"(19|20)[0-9]{2}", r["text"]), r
    r = engine.generate("Date:", {"regex": "ab", "min_new_tokens": 5, "temperature": 0, "max_new_tokens": 20})
    assert r["text"] == "ab" and r["meta_info"]["finish_reason"]["type"] == "stop"
