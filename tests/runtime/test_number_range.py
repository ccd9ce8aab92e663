"""number_range.py: the regex of a bounded JSON-schema number accepts exactly the plain (exponent-free)
JSON number strings whose value is in range, checked against Decimal over many spellings."""
from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest

from radixflow.runtime.grammar.number_range import MAX_RANGE_REGEX, number_schema_regex
from radixflow.runtime.grammar.outlines_backend import OutlinesBackend
from radixflow.runtime.grammar.spec import GrammarKey
from radixflow.runtime.grammar.vocab import TokenVocab
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.text.tokenizer import Tokenizer

JSON_PLAIN_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")

# (schema, lower, upper): each bound (value, strict) or None
CASES = [
    ({"minimum": 0.5, "maximum": 2.25}, (Decimal("0.5"), False), (Decimal("2.25"), False)),
    ({"exclusiveMinimum": 0.5, "exclusiveMaximum": 2.25}, (Decimal("0.5"), True), (Decimal("2.25"), True)),
    ({"minimum": 0.5, "exclusiveMinimum": True, "maximum": 7, "exclusiveMaximum": True},
     (Decimal("0.5"), True), (Decimal(7), True)),
    ({"minimum": 0.5, "exclusiveMinimum": False}, (Decimal("0.5"), False), None),
    ({"minimum": -1e-3, "maximum": 1e-3}, (Decimal("-0.001"), False), (Decimal("0.001"), False)),
    ({"exclusiveMinimum": -1e-3, "exclusiveMaximum": 0}, (Decimal("-0.001"), True), (Decimal(0), True)),
    ({"minimum": 0}, (Decimal(0), False), None),
    ({"exclusiveMinimum": 0}, (Decimal(0), True), None),
    ({"maximum": 0}, None, (Decimal(0), False)),
    ({"exclusiveMaximum": 0}, None, (Decimal(0), True)),
    ({"maximum": -3.7}, None, (Decimal("-3.7"), False)),
    ({"minimum": -1199.999, "maximum": -1.05}, (Decimal("-1199.999"), False), (Decimal("-1.05"), False)),
    ({"minimum": -50.125, "maximum": 5000.5}, (Decimal("-50.125"), False), (Decimal("5000.5"), False)),
    ({"minimum": 99.99, "exclusiveMaximum": 1001}, (Decimal("99.99"), False), (Decimal(1001), True)),
    ({"minimum": 3.14159, "maximum": 3.1416}, (Decimal("3.14159"), False), (Decimal("3.1416"), False)),
    ({"minimum": 0.5, "maximum": 0.5}, (Decimal("0.5"), False), (Decimal("0.5"), False)),
    ({"minimum": 0, "maximum": 0}, (Decimal(0), False), (Decimal(0), False)),
    ({"minimum": 12, "maximum": 12.0001}, (Decimal(12), False), (Decimal("12.0001"), False)),
    ({"minimum": 0.0901, "maximum": 0.91}, (Decimal("0.0901"), False), (Decimal("0.91"), False)),
    ({"minimum": 2, "exclusiveMinimum": 1.5}, (Decimal(2), False), None),  # the tighter bound wins
    ({"minimum": 1.5, "exclusiveMinimum": 1.5, "maximum": 4, "exclusiveMaximum": 4.5},
     (Decimal("1.5"), True), (Decimal(4), False)),
    ({"minimum": 1e3}, (Decimal(1000), False), None),
    ({"maximum": 1e3, "minimum": -999.9}, (Decimal("-999.9"), False), (Decimal(1000), False)),
]


def _inside(x: Decimal, lo, hi) -> bool:
    return ((lo is None or x > lo[0] or x == lo[0] and not lo[1])
            and (hi is None or x < hi[0] or x == hi[0] and not hi[1]))


def _fraction_digits(n: int) -> list[str]:
    return [f"{k:0{n}d}" for k in range(10 ** n)]


def _candidates(lo, hi) -> set[str]:
    """Integer parts -1200..6000 with a few fractions each; near each bound every fraction of up to
    4 digits; negative zero, leading zeros, exponents and other non-JSON spellings."""
    out = set()
    few = ["", "0", "5", "00", "05", "50", "001", "999"]
    for n in range(-1200, 6001):
        for f in few:
            out.add(f"{n}.{f}" if f else str(n))
    every = [f for n in range(1, 5) for f in _fraction_digits(n)]
    for bound in (lo, hi):
        if bound is None:
            continue
        whole = int(bound[0])
        for n in (whole - 1, whole, whole + 1):
            for sign in ("-", ""):
                for f in every:
                    out.add(f"{sign}{abs(n)}.{f}")
    out |= {"-0", "-0.0", "-0.000", "0.0", "007", "00.5", "-01.5", "01", "-", ".5", "5.", "+1", "1e2", "5E-1",
            "0e0", "-0e0", "1.5e0", "", "1 ", "0x1"}
    return out


@pytest.mark.parametrize("schema,lo,hi", CASES, ids=[str(c[0]) for c in CASES])
def test_number_regex_matches_exactly_the_range(schema, lo, hi):
    rx = re.compile(number_schema_regex({"type": "number", **schema}))
    for s in _candidates(lo, hi):
        expected = bool(JSON_PLAIN_NUMBER.fullmatch(s)) and _inside(Decimal(s), lo, hi)
        assert bool(rx.fullmatch(s)) == expected, (s, rx.pattern)


def test_long_spellings_near_the_bounds():
    """Fractions longer than the bound's (trailing zeros, digits past it) fall on the right side."""
    rx = re.compile(number_schema_regex({"type": "number", "exclusiveMinimum": 0.25, "maximum": 0.75}))
    assert rx.fullmatch("0.2500000000001") and not rx.fullmatch("0.25000000000") and not rx.fullmatch("0.25")
    assert rx.fullmatch("0.75000000000") and not rx.fullmatch("0.7500000000001")
    assert rx.fullmatch("0.2499999999999999999999") is None


def test_unbounded_sides_reach_any_size():
    rx = re.compile(number_schema_regex({"type": "number", "minimum": -2.5}))
    assert rx.fullmatch("123456789012345678901234567890.123456789") and rx.fullmatch("-2.5")
    rx = re.compile(number_schema_regex({"type": "number", "maximum": 2.5}))
    assert rx.fullmatch("-123456789012345678901234567890.5") and not rx.fullmatch("2.51")


def test_no_bounds_means_no_regex():
    assert number_schema_regex({"type": "number"}) is None
    assert number_schema_regex({"type": "number", "exclusiveMinimum": False}) is None


def test_huge_and_tiny_bounds_stay_small():
    """1e300 / 1e-30 are cheap: runs of full digit widths are one repetition."""
    for schema in ({"maximum": 1e300}, {"minimum": -1e300, "maximum": 1e300}, {"exclusiveMinimum": 0, "maximum": 1e-30},
                   {"minimum": 1e10, "maximum": 1e12}):
        assert len(number_schema_regex({"type": "number", **schema})) < 2000, schema
    rx = re.compile(number_schema_regex({"type": "number", "minimum": 0, "maximum": 1e300}))
    assert rx.fullmatch("9" * 300 + ".5") and rx.fullmatch("1" + "0" * 300) and not rx.fullmatch("1" + "0" * 300 + ".1")


def test_too_precise_bounds_are_refused():
    with pytest.raises(ValueError, match="too long"):
        number_schema_regex({"type": "number", "minimum": 0, "maximum": int("1234567890" * 60)})
    with pytest.raises(ValueError, match="too long"):
        number_schema_regex({"type": "number", "minimum": 1e-300})
    assert MAX_RANGE_REGEX >= 2000


def test_empty_ranges_are_refused():
    for schema in ({"minimum": 2, "maximum": 1}, {"minimum": 1, "exclusiveMaximum": 1}, {"exclusiveMinimum": 0.5,
                                                                                          "maximum": 0.5}):
        with pytest.raises(ValueError, match="no number satisfies"):
            number_schema_regex({"type": "number", **schema})


def test_multiple_of_enumerates_a_bounded_range():
    rx = re.compile(number_schema_regex({"type": "number", "minimum": -1, "exclusiveMaximum": 1, "multipleOf": 0.25}))
    for s in _candidates((Decimal(-1), False), (Decimal(1), True)):
        x = Decimal(s) if JSON_PLAIN_NUMBER.fullmatch(s) else None
        if rx.fullmatch(s):
            assert x is not None and -1 <= x < 1 and x % Decimal("0.25") == 0, s
    for v in ("-1", "-0.75", "-0.5", "-0.25", "0", "0.25", "0.5", "0.75", "0.50", "-1.0"):
        assert rx.fullmatch(v), v
    assert not rx.fullmatch("1") and not rx.fullmatch("0.3")
    rx = re.compile(number_schema_regex({"type": "number", "minimum": 0, "maximum": 0.3, "multipleOf": 0.1}))
    assert all(rx.fullmatch(v) for v in ("0", "0.1", "0.2", "0.3")) and not rx.fullmatch("0.35")


def test_multiple_of_without_a_small_range_is_refused():
    for schema in ({"multipleOf": 0.5}, {"minimum": 0, "multipleOf": 0.5},
                   {"minimum": 0, "maximum": 1e6, "multipleOf": 0.5}):
        with pytest.raises(ValueError, match="multipleOf"):
            number_schema_regex({"type": "number", **schema})
    with pytest.raises(ValueError, match="no number satisfies"):
        number_schema_regex({"type": "number", "minimum": 0.1, "maximum": 0.2, "multipleOf": 0.25})


@pytest.fixture(scope="module")
def backend():
    tokenizer = Tokenizer.from_dir(demo_model("tiny"))
    b = OutlinesBackend(TokenVocab.from_tokenizer(tokenizer, tokenizer.vocab_size, tokenizer.eos_token_ids))
    yield b
    b.close()


def _index_accepts(backend, grammar, text: str) -> bool:
    """Whether outlines-core's index, walked a byte at a time, ends `text` in a final state."""
    single = {bytes(b): t for t, b in enumerate(backend.vocab.token_bytes) if len(b) == 1}
    state = grammar.index.get_initial_state()
    for byte in text.encode():
        state = grammar.index.get_next_state(state, single[bytes([byte])])
        if state is None:
            return False
    return grammar.index.is_final_state(state)


@pytest.mark.parametrize("schema,lo,hi", [CASES[1], CASES[4], CASES[12], CASES[13], CASES[17], CASES[18]],
                         ids=lambda x: str(x) if isinstance(x, dict) else "")
def test_the_compiled_index_accepts_exactly_the_range(backend, schema, lo, hi):
    """Through outlines-core's index: exact for a number followed by more JSON (an object's value);
    alone (the end of the grammar) never out of range. There outlines-core drops a byte leading
    from a complete match to an incomplete one ("2" then "."), so "2.5" needs a token like ".5"."""
    number = {"type": "number", **schema}
    wrapped = {"type": "object", "properties": {"x": number}, "required": ["x"], "additionalProperties": False}
    inner = backend.compile(GrammarKey("json_schema", json.dumps(wrapped)), 30.0)
    alone = backend.compile(GrammarKey("json_schema", json.dumps(number)), 30.0)
    few = ["", "0", "5", "05", "50", "25", "001", "999"]
    texts = {f"{n}.{f}" if f else str(n) for n in range(-60, 1100) for f in few} | {"-0", "-0.0", "007", "1e2"}
    for bound in (lo, hi):
        whole = int(bound[0])
        texts |= {f"{s}{abs(n)}.{f}" for n in (whole - 1, whole, whole + 1) for s in "-" ""
                  for f in _fraction_digits(1) + _fraction_digits(2) + _fraction_digits(3)}
    for s in texts:
        expected = bool(JSON_PLAIN_NUMBER.fullmatch(s)) and _inside(Decimal(s), lo, hi)
        assert _index_accepts(backend, inner, '{"x":' + s + "}") == expected, s
        assert expected or not _index_accepts(backend, alone, s), s


def test_compiled_integers_and_choices_keep_every_alternative(backend):
    grammar = backend.compile(GrammarKey("json_schema", json.dumps({"type": "integer", "minimum": -50,
                                                                    "maximum": 5000})), 30.0)
    for n in range(-60, 5100):
        assert _index_accepts(backend, grammar, str(n)) == (-50 <= n <= 5000), n
    steps = {"type": "number", "minimum": -1, "maximum": 12, "multipleOf": 0.25}
    grammar = backend.compile(GrammarKey("json_schema", json.dumps({"type": "array", "items": steps})), 30.0)
    for s in ("-1", "-0.75", "0", "1", "1.25", "1.250", "10", "12", "12.0"):
        assert _index_accepts(backend, grammar, f"[{s}]"), s
    assert not _index_accepts(backend, grammar, "[1.3]")
    grammar = backend.compile(GrammarKey("choices", json.dumps(["a", "ab", "abc", "b"])), 30.0)
    assert all(_index_accepts(backend, grammar, c) for c in ("a", "ab", "abc", "b"))


def test_integer_bounds_are_the_decimals_spelled_and_capped():
    """A float bound of an integer is its text's decimal (1e300 is 10**300, not the double's 301
    significant digits, which made an 82,617-character regex); a too-long range is refused."""
    from radixflow.runtime.grammar.outlines_backend import json_schema_regex

    rx = json_schema_regex({"type": "integer", "minimum": 0, "exclusiveMaximum": 1e300})
    assert len(rx) < 2000 and re.fullmatch(rx, "9" * 300) and not re.fullmatch(rx, "1" + "0" * 300)
    with pytest.raises(ValueError, match="too long"):
        json_schema_regex({"type": "integer", "minimum": 0, "maximum": int("1234567890" * 60)})


def test_multiples_of_precise_bounds_stay_inside():
    """Bounds and step with more digits than Decimal's default 28 still give only in-range multiples."""
    lo, hi = 10 ** 30, 10 ** 30 + 2
    rx = re.compile(number_schema_regex({"type": "number", "exclusiveMinimum": lo, "maximum": hi, "multipleOf": 0.5}))
    assert rx.fullmatch(str(lo) + ".5") and rx.fullmatch(str(hi)) and not rx.fullmatch(str(lo))
    assert not rx.fullmatch(str(hi) + ".5")


@pytest.mark.parametrize("schema", [
    {"type": "number", "minimum": "3"},
    {"type": "number", "maximum": True},
    {"type": "integer", "minimum": [1], "maximum": 9},
    {"type": "number", "minimum": 0, "maximum": 10, "multipleOf": -2},
    {"type": "integer", "minimum": 0, "maximum": 5, "multipleOf": 0},  # was "integer modulo by zero"
    {"type": "number", "multipleOf": {"a": 1}, "minimum": 1, "maximum": 2},
    {"type": "integer", "exclusiveMinimum": "x", "minimum": 0, "maximum": 3},
    {"type": ["number", "null"], "minimum": 5, "maximum": 6},  # outlines-core would drop the bounds
])
def test_bounds_json_schema_forbids_are_refused(schema):
    """Such bounds used to be ignored: the output then satisfied a schema nobody wrote."""
    from radixflow.runtime.grammar.outlines_backend import json_schema_regex

    with pytest.raises(ValueError, match="(?i)minimum|maximum|multipleOf"):
        json_schema_regex({"type": "object", "properties": {"v": schema}})


@pytest.mark.parametrize("schema", [{"type": ["string", "null"]}, {"type": ["integer", "string"]}, {"type": {}}])
def test_type_lists_without_bounds_still_compile(schema):
    from radixflow.runtime.grammar.outlines_backend import bound_integers

    assert bound_integers(schema) == schema


@pytest.mark.parametrize("schema, allowed, refused", [
    ({"type": "integer", "enum": [1, 2, 100], "maximum": 5}, ["1", "2"], ["100"]),
    ({"type": "number", "enum": [0.5, 1.5, "x"], "exclusiveMinimum": 0.5, "multipleOf": 0.5}, ["1.5"], ["0.5"]),
    ({"type": "number", "const": 3, "minimum": 3}, ["3"], ["4"]),
])
def test_enum_and_const_members_keep_to_the_bounds(schema, allowed, refused):
    from radixflow.runtime.grammar.outlines_backend import json_schema_regex

    regex = json_schema_regex(schema)
    assert all(re.fullmatch(regex, s) for s in allowed) and not any(re.fullmatch(regex, s) for s in refused)
    with pytest.raises(ValueError, match="no member"):
        json_schema_regex({"type": "number", "const": 100, "maximum": 5})


@pytest.mark.parametrize("step, values", [(0.1, [0, 1, 2, 3, 4, 5]), (0.3, [0, 3]), (1e-320, [0, 1, 2, 3, 4, 5]),
                                          (1.5, [0, 3]), (2, [0, 2, 4])])
def test_integer_multiples_of_a_fraction_are_exact(step, values):
    """An integer's multipleOf is the decimal the schema spells: 1 = 10 * 0.1 is a multiple (float
    modulo said 1 % 0.1 = 0.09999999999999995 and left only 0)."""
    from radixflow.runtime.grammar.outlines_backend import bound_integers

    assert bound_integers({"type": "integer", "minimum": 0, "maximum": 5, "multipleOf": step})["enum"] == values
