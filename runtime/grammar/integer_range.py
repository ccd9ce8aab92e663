"""JSON-schema integer bounds as regexes: outlines-core renders any integer as any digit run.

Alternatives are ordered so that one matching a string comes after every one matching a longer
string that begins with it (wider numbers first): outlines-core determinizes with leftmost-first
semantics, where a match of an earlier alternative ends the later ones, so "(1|1[0-9])" at the
end of a grammar would never give 10..19.
"""
from __future__ import annotations

import math


def integer_range_regex(lo: int | None, hi: int | None) -> str:
    """A regex matching exactly the canonical decimal spellings (no leading zeros, no "-0") of
    the integers in [lo, hi]; None is unbounded on that side."""
    parts = []
    if lo is None or lo < 0:  # negatives: "-" then magnitudes in [max(1, -hi), -lo]
        low_mag = 1 if hi is None or hi >= 0 else -hi
        if low_mag <= (math.inf if lo is None else -lo):
            parts.append("-" + group(magnitudes(low_mag, None if lo is None else -lo)))
    if hi is None or hi >= 0:
        parts.append(group(magnitudes(max(lo or 0, 0), hi)))
    return group(parts)


def group(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def magnitudes(a: int, b: int | None) -> list[str]:
    """Alternatives matching the canonical spellings of the integers in [a, b] (0 <= a; b None:
    unbounded), widest first. Consecutive widths wholly inside are one repetition, so a bound
    like 10**300 costs a few alternatives, not three per width."""
    parts: list[str] = []
    full: list[int] = []  # the current run of widths (> 1) wholly in [a, b]
    top = len(str(a)) if b is None else len(str(b))
    for width in range(len(str(a)), top + 1):
        start = max(a, 0 if width == 1 else 10 ** (width - 1))
        end = 10 ** width - 1 if b is None else min(b, 10 ** width - 1)
        if width > 1 and start == 10 ** (width - 1) and end == 10 ** width - 1:
            full.append(width)
            continue
        parts += _widths(full)
        full = []
        if start <= end:
            parts += _same_width(str(start), str(end))
    if b is None:  # every wider number
        full.append(top + 1)
    return (parts + _widths(full, unbounded=b is None))[::-1]


def _widths(run: list[int], unbounded: bool = False) -> list[str]:
    """The numbers of every width in `run` (consecutive widths > 1; the last one open when unbounded)."""
    if not run:
        return []
    return [f"[1-9][0-9]{{{run[0] - 1},{'' if unbounded else run[-1] - 1}}}"]


def _same_width(a: str, b: str) -> list[str]:
    """Alternatives matching the digit strings of a's width from a to b (a <= b)."""
    if not a:
        return [""]
    if set(a) == {"0"} and set(b) == {"9"}:
        return ["[0-9]" if len(a) == 1 else f"[0-9]{{{len(a)}}}"]
    if a[0] == b[0]:
        return [a[0] + p for p in _same_width(a[1:], b[1:])]
    rest = len(a) - 1
    parts = [a[0] + p for p in _same_width(a[1:], "9" * rest)]
    if int(a[0]) + 1 <= int(b[0]) - 1:
        parts.append(digit_class(int(a[0]) + 1, int(b[0]) - 1) + (f"[0-9]{{{rest}}}" if rest else ""))
    parts += [b[0] + p for p in _same_width("0" * rest, b[1:])]
    return parts


def digit_class(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"[{lo}-{hi}]"
