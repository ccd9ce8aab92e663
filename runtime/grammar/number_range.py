"""JSON-schema number bounds as regexes: outlines-core renders any number as any digit run with an
optional fraction and exponent, ignoring `minimum` / `maximum` (both exclusive forms) and
`multipleOf`.

A bounded number is spelled without an exponent. Every value in range still has a spelling (any
JSON number's value has a plain decimal one), while an exact regex over mantissa-and-exponent
pairs would need to compare digit strings shifted by any exponent. Otherwise every JSON spelling
of an in-range value is kept: trailing fraction zeros ("1.50") and "-0" when 0 is in range.
Bounds are compared as decimals: a float bound is the decimal of its shortest repr (0.1 is
1/10), as in the schema text. Alternatives are ordered as integer_range.py explains (one that
matches a string after those matching its extensions).
"""
from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

from radixflow.runtime.grammar.integer_range import digit_class, group, magnitudes

# A range regex (number or integer) past this many characters is refused: only bounds with many
# significant digits, or a long run of zeros after the point (1e-300), get there.
MAX_RANGE_REGEX = 4000
MAX_MULTIPLES = 1000
ANY_FRACTION = r"(\.[0-9]+)?"

Bound = tuple[Decimal, bool]  # (value, strict)


def number_schema_regex(schema: dict) -> str | None:
    """The regex of a `"type": "number"` schema's bounds and `multipleOf`, or None when it has
    neither. ValueError when no number satisfies them, when `multipleOf` leaves more than
    MAX_MULTIPLES values (or the range is open), or when the regex would be too long."""
    lo, hi = number_bounds(schema)
    step = decimal_bound(schema.get("multipleOf"))
    if step is not None and step > 0:
        if lo is None or hi is None or (hi[0] - lo[0]) / step > MAX_MULTIPLES:
            raise ValueError(f"multipleOf on a number needs minimum and maximum at most {MAX_MULTIPLES} steps apart")
        regex = _multiples(lo, hi, step)
    elif lo is None and hi is None:
        return None
    else:
        regex = number_range_regex(lo, hi)
    if regex is None:
        raise ValueError(f"no number satisfies the bounds of {schema}")
    return check_range_regex(regex, schema)


_BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def check_numeric_keywords(schema: dict) -> None:
    """ValueError unless the bounds of a number / integer schema are what JSON Schema allows:
    minimum / maximum finite numbers, the exclusive forms numbers or (draft 4) booleans,
    multipleOf a number above 0. Others would be ignored, and the output then satisfy a schema
    the caller did not write. Bounds beside a list of types are refused too: outlines-core
    renders each type on its own, without them."""
    types = schema.get("type")
    numeric = {"number", "integer"}
    if isinstance(types, list) and numeric.intersection(t for t in types if isinstance(t, str)):
        present = [k for k in _BOUND_KEYS if k in schema]
        if present:
            raise ValueError(f"{present[0]} beside the type list {types} is not supported: "
                             "give the bounded type its own schema under anyOf")
        return
    if not isinstance(types, str) or types not in numeric:
        return
    for key in _BOUND_KEYS:
        value = schema.get(key)
        if key not in schema or (key.startswith("exclusive") and isinstance(value, bool)):
            continue
        number = decimal_bound(value)
        if number is None or (key == "multipleOf" and number <= 0):
            need = "a number above 0" if key == "multipleOf" else "a finite number"
            raise ValueError(f"{key} must be {need}, not {value!r}")


def within_bounds(value: object, schema: dict) -> bool:
    """Whether `value` (an enum or const member) satisfies the schema's bounds and multipleOf;
    a value that is not a number is left to the other keywords."""
    number = decimal_bound(value)
    if number is None:
        return True
    lo, hi = number_bounds(schema)
    step = decimal_bound(schema.get("multipleOf"))
    if lo is not None and (number < lo[0] or (lo[1] and number == lo[0])):
        return False
    if hi is not None and (number > hi[0] or (hi[1] and number == hi[0])):
        return False
    return step is None or is_multiple(number, step)


def is_multiple(value: Decimal | int, step: Decimal) -> bool:
    """Whether `value` is an integer times `step`, exactly (1 is a multiple of 0.1 as the schema
    spells it, though 1 % 0.1 on doubles is 0.09999999999999995; no Decimal context to overflow)."""
    return (Fraction(value) / Fraction(step)).denominator == 1


def check_range_regex(regex: str, schema: dict) -> str:
    """`regex`, or ValueError when it is longer than MAX_RANGE_REGEX."""
    if len(regex) > MAX_RANGE_REGEX:
        raise ValueError(f"the bounds of {schema} need a regex too long ({len(regex)} characters, at most "
                         f"{MAX_RANGE_REGEX}): use bounds with fewer digits")
    return regex


def number_bounds(schema: dict) -> tuple[Bound | None, Bound | None]:
    """(lower, upper) bounds as (value, strict), None when absent, folding the exclusive bounds in
    (numbers since draft 6, booleans beside minimum/maximum in draft 4); the tighter one wins."""
    return (_tighter(schema, "minimum", "exclusiveMinimum", 1), _tighter(schema, "maximum", "exclusiveMaximum", -1))


def _tighter(schema: dict, inclusive: str, exclusive: str, sign: int) -> Bound | None:
    found = []
    value, flag = decimal_bound(schema.get(inclusive)), schema.get(exclusive)
    if value is not None:
        found.append((value, flag is True))
    if decimal_bound(flag) is not None:
        found.append((decimal_bound(flag), True))
    # the greatest lower (least upper) bound; at equal values the strict one
    return max(found, key=lambda b: (sign * b[0], b[1]), default=None)


def decimal_bound(x: object) -> Decimal | None:
    """x as the decimal the schema text spelled (a float by its shortest repr), None unless a
    finite number."""
    if isinstance(x, float):
        return Decimal(repr(x)) if math.isfinite(x) else None
    return Decimal(x) if isinstance(x, int) and not isinstance(x, bool) else None


def number_range_regex(lo: Bound | None, hi: Bound | None) -> str | None:
    """A regex matching exactly the exponent-free JSON numbers within the bounds (None: open on
    that side), or None when none is."""
    zero = (Decimal(0), False)
    parts = []
    # negatives (and "-0", "-0.0", ... when 0 is in range): "-" then magnitudes in [max(0, -hi), -lo]
    low_mag = zero if hi is None or hi[0] > 0 else (-hi[0], hi[1])
    negative = _magnitudes(low_mag, None if lo is None else (-lo[0], lo[1]))
    if negative:
        parts.append("-" + group(negative))
    positive = _magnitudes(zero if lo is None or lo[0] < 0 else lo, hi)
    if positive:
        parts.append(group(positive))
    return group(parts) if parts else None


def _magnitudes(a: Bound, b: Bound | None) -> list[str]:
    """Alternatives matching the plain decimal spellings of the values in [a, b] (0 <= a; b None:
    unbounded): the integer parts strictly between the bounds' take any fraction, the bounds'
    own integer parts only fractions on the right side of theirs."""
    if b is not None and (a[0] > b[0] or a[0] == b[0] and (a[1] or b[1])):
        return []
    a_int, a_frac = _split(a[0])
    if b is None:
        return [group(magnitudes(a_int + 1, None)) + ANY_FRACTION, str(a_int) + _fraction(a_frac, a[1], None, False)]
    b_int, b_frac = _split(b[0])
    if a_int == b_int:
        return [str(a_int) + _fraction(a_frac, a[1], b_frac, b[1])]
    parts = []  # a's integer part last: it may begin the others ("1" of "15")
    top = _fraction("", False, b_frac, b[1])
    if top is not None:  # None: b is an integer, excluded
        parts.append(str(b_int) + top)
    if a_int + 1 < b_int:
        parts.append(group(magnitudes(a_int + 1, b_int - 1)) + ANY_FRACTION)
    return parts + [str(a_int) + _fraction(a_frac, a[1], None, False)]


def _split(x: Decimal) -> tuple[int, str]:
    """(integer part, fraction digits without trailing zeros) of x >= 0."""
    whole, _, frac = format(x, "f").partition(".")
    return int(whole), frac.rstrip("0")


def _fraction(lo: str, lo_strict: bool, hi: str | None, hi_strict: bool) -> str | None:
    """The regex of what may follow an integer part: nothing or "." and digits, whose fraction
    value f satisfies 0.lo <= f <= 0.hi (strict as told; hi None: no upper bound); None if nothing."""
    zero_ok = not lo and not lo_strict and not (hi == "" and hi_strict)
    digits = _digits(lo, lo_strict, hi, hi_strict, empty_ok=False)
    if not digits:
        return "" if zero_ok else None
    dotted = r"\." + group(digits)
    return f"({dotted})?" if zero_ok else dotted


def _digits(lo: str, lo_strict: bool, hi: str | None, hi_strict: bool, empty_ok: bool) -> list[str]:
    """Alternatives matching the digit strings t (empty only if empty_ok) with 0.lo <= 0.t <= 0.hi
    (strict as told; lo and hi without trailing zeros; hi None: no upper bound). The first digit
    decides: one strictly between the bounds' first digits frees the rest; one equal to a bound's
    first digit leaves the same question for the rest of that bound. Size: quadratic in the
    bounds' digits (each alternative repeats its prefix: nesting instead would hit regex nest limits)."""
    if not lo and hi is None:
        return ["0*[1-9][0-9]*"] if lo_strict else ["[0-9]*" if empty_ok else "[0-9]+"]
    if not lo and hi == "":
        return [] if lo_strict or hi_strict else ["0*" if empty_ok else "0+"]
    parts = []
    first_lo = int(lo[0]) if lo else 0
    first_hi = int(hi[0]) if hi else 10  # hi None: no first digit is the bound's
    if first_lo == first_hi:
        parts += [str(first_lo) + p for p in _digits(lo[1:], lo_strict, hi[1:], hi_strict, True)]
    else:
        parts += [str(first_lo) + p for p in _digits(lo[1:], lo_strict, None, False, True)]
        if first_lo + 1 <= min(first_hi - 1, 9):
            parts.append(digit_class(first_lo + 1, min(first_hi - 1, 9)) + "[0-9]*")
        if hi:
            parts += [hi[0] + p for p in _digits("", False, hi[1:], hi_strict, True)]
    # the empty string last: it begins every other
    return parts + [""] if empty_ok and not lo and not lo_strict else parts


def _multiples(lo: Bound, hi: Bound, step: Decimal) -> str | None:
    """The multiples of `step` within the bounds, each spelled plainly with any trailing zeros.
    Descending string order: a spelling's extensions ("1.25" of "1") sort above it, so come first."""
    with localcontext(prec=MAX_RANGE_REGEX):  # exact for any bounds a regex within the cap can hold
        ks = range(math.floor(lo[0] / step), math.ceil(hi[0] / step) + 1)
        values = [k * step for k in ks]
    inside = [v for v in values if (v > lo[0] or v == lo[0] and not lo[1]) and (v < hi[0] or v == hi[0] and not hi[1])]
    spellings = []
    for whole, frac in sorted(((w, f.rstrip("0")) for w, _, f in (format(v, "f").partition(".") for v in inside)),
                              reverse=True):
        spellings.append(f"{whole}\\.{frac}0*" if frac else f"{whole}(\\.0+)?")
    return group(spellings) if spellings else None
