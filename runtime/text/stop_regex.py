"""Stop regexes matched in linear time, incrementally, with the earliest start a match could still have.

A stop regex is parsed with Python's own parser (so the syntax is `re`'s) and compiled to a
Thompson NFA; `StopMatcher.feed` runs every thread in lock step over the new characters only
(a Pike VM: time O(new chars x NFA states), no backtracking, so `(x+x+)+y` costs what `x+y`
does). Per NFA state only the thread with the earliest start is kept: two threads in one state
have the same future. `hold_from` is the earliest start of a thread still alive: text before it
can never be part of a match and is safe to stream.

Supported: literals, `.`, classes (\\d \\w \\s are ASCII), alternation, groups, greedy and lazy
repeats (bounded ones are expanded, within MAX_STATES), `^`, and the flags i / s / m. Anything
else (backreferences, lookaround, `$`, `\\b`) is a ValueError at validation.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

try:  # Python >= 3.11
    from re import _constants as C, _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as C  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

MAX_STATES = 2000  # NFA states of one request's stop regexes together
MAX_LOOKBACK_CHARS = 4096  # a match longer than this is not found (bounds hold-back and work)

_DIGITS = frozenset("0123456789")
_SPACES = frozenset(" \t\n\r\f\v")
_WORDS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_CATEGORY = {C.CATEGORY_DIGIT: (_DIGITS, False), C.CATEGORY_NOT_DIGIT: (_DIGITS, True),
             C.CATEGORY_SPACE: (_SPACES, False), C.CATEGORY_NOT_SPACE: (_SPACES, True),
             C.CATEGORY_WORD: (_WORDS, False), C.CATEGORY_NOT_WORD: (_WORDS, True)}


@dataclass(frozen=True)
class CharSet:
    """Which characters one NFA step consumes."""

    chars: frozenset[str] = frozenset()
    ranges: tuple[tuple[int, int], ...] = ()
    groups: tuple[tuple[frozenset[str], bool], ...] = ()  # (set, negated) from \d \W ...
    negate: bool = False
    ignore_case: bool = False

    def __contains__(self, ch: str) -> bool:
        if self.ignore_case:
            return self._has(ch.lower()) or self._has(ch.upper())
        return self._has(ch)

    def _has(self, ch: str) -> bool:
        code = ord(ch)
        hit = (ch in self.chars or any(lo <= code <= hi for lo, hi in self.ranges)
               or any((ch in s) != neg for s, neg in self.groups))
        return hit != self.negate


@dataclass
class Nfa:
    """States: ("step", CharSet, next) | ("split", [next...]) | ("bol", next) | ("match",)."""

    states: list[tuple] = field(default_factory=list)
    start: int = 0
    charsets: dict[CharSet, CharSet] = field(default_factory=dict)  # one object per distinct set

    def add(self, state: tuple) -> int:
        if len(self.states) >= MAX_STATES:
            raise ValueError(f"stop_regex is too large (more than {MAX_STATES} automaton states)")
        if state[0] == "step":  # equal sets share one object: a character is tested once per set
            state = ("step", self.charsets.setdefault(state[1], state[1]), state[2])
        self.states.append(state)
        return len(self.states) - 1


class _Builder:
    """Builds NFA fragments right to left: `build(items, next)` returns the entry state."""

    def __init__(self, nfa: Nfa, flags: int) -> None:
        self.nfa, self.flags = nfa, flags

    def seq(self, items: list, nxt: int) -> int:
        for op, av in reversed(items):
            nxt = self.item(op, av, nxt)
        return nxt

    def item(self, op, av, nxt: int) -> int:
        icase = bool(self.flags & re.IGNORECASE)
        if op is C.LITERAL:
            return self.nfa.add(("step", CharSet(chars=frozenset(chr(av)), ignore_case=icase), nxt))
        if op is C.NOT_LITERAL:
            return self.nfa.add(("step", CharSet(chars=frozenset(chr(av)), negate=True, ignore_case=icase), nxt))
        if op is C.ANY:
            dotall = bool(self.flags & re.DOTALL)
            return self.nfa.add(("step", CharSet(chars=frozenset() if dotall else frozenset("\n"), negate=True), nxt))
        if op is C.IN:
            return self.nfa.add(("step", _charset(av, icase), nxt))
        if op is C.BRANCH:
            return self.nfa.add(("split", [self.seq(list(alt), nxt) for alt in av[1]]))
        if op is C.SUBPATTERN:
            return self.seq(list(av[-1]), nxt)
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            return self.repeat(av, nxt)
        if op is C.AT and av in (C.AT_BEGINNING, C.AT_BEGINNING_STRING):
            return self.nfa.add(("bol", nxt, av is C.AT_BEGINNING and bool(self.flags & re.MULTILINE)))
        raise ValueError(f"stop_regex: {str(op).lower()} {'' if av is None else av} is not supported "
                         "(use literals, classes, groups, alternation, repeats and ^)")

    def repeat(self, av, nxt: int) -> int:
        lo, hi, body = av
        items = list(body)
        if hi == C.MAXREPEAT:  # body{lo,}: lo copies, then a loop
            loop = self.nfa.add(("split", []))
            self.nfa.states[loop] = ("split", [self.seq(items, loop), nxt])
            entry = loop
        else:
            entry = nxt
            for _ in range(hi - lo):  # optional copies, innermost first
                entry = self.nfa.add(("split", [self.seq(items, entry), nxt]))
        for _ in range(lo):
            entry = self.seq(items, entry)
        return entry


def _charset(items: list, icase: bool) -> CharSet:
    chars: set[str] = set()
    ranges: list[tuple[int, int]] = []
    groups: list[tuple[frozenset[str], bool]] = []
    negate = False
    for op, av in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            chars.add(chr(av))
        elif op is C.RANGE:
            ranges.append(av)
        elif op is C.CATEGORY and av in _CATEGORY:
            groups.append(_CATEGORY[av])
        else:
            raise ValueError(f"stop_regex: class item {op} is not supported")
    return CharSet(frozenset(chars), tuple(ranges), tuple(groups), negate, icase)


@functools.lru_cache(maxsize=256)
def compile_stop_regexes(patterns: tuple[str, ...]) -> Nfa:
    """One NFA matching any of `patterns` (ValueError naming what is unsupported or too big)."""
    nfa = Nfa()
    match = nfa.add(("match",))
    entries = []
    for pattern in patterns:
        try:
            parsed = sre_parse.parse(pattern)
        except re.error as exc:
            raise ValueError(f"stop_regex {pattern!r} is not a valid regex: {exc}") from exc
        entries.append(_Builder(nfa, parsed.state.flags).seq(list(parsed), match))
        if re.fullmatch(pattern, ""):  # parsed and built above: only supported syntax reaches here
            raise ValueError(f"stop_regex {pattern!r} matches the empty string, so it would end every "
                             "request at its first token")
    nfa.start = entries[0] if len(entries) == 1 else nfa.add(("split", entries))
    return nfa


def _by_start(item: tuple[int, int]) -> int:
    return item[1]


class StopMatcher:
    """Incremental search of one request's output for its stop regexes (engine thread only).

    `feed(new_text)` consumes characters appended since the last call and returns the first
    match (start, end) in the whole text, or None. Threads older than MAX_LOOKBACK_CHARS are
    dropped, so work per character and `hold_from`'s distance stay bounded.
    """

    def __init__(self, nfa: Nfa) -> None:
        self.nfa = nfa
        self.pos = 0  # characters consumed
        self.prev = ""  # the character before `pos`
        self.threads: dict[int, int] = {}  # step or match state -> earliest start
        self._closures: dict[tuple[int, bool, bool], tuple[int, ...]] = {}

    @property
    def hold_from(self) -> int:
        """Earliest start of a match that may still complete (== pos when none can)."""
        return min(self.threads.values(), default=self.pos)

    def feed(self, text: str) -> tuple[int, int] | None:
        for ch in text:
            self._add(self.nfa.start, self.pos)
            hit = self._match_start()
            if hit is not None:
                return hit, self.pos
            self._step(ch)
        self._add(self.nfa.start, self.pos)
        hit = self._match_start()
        return None if hit is None else (hit, self.pos)

    def _match_start(self) -> int | None:
        return self.threads.get(0)  # state 0 is "match"

    def _step(self, ch: str) -> None:
        old, self.threads = self.threads, {}
        self.prev, self.pos = ch, self.pos + 1
        oldest = self.pos - MAX_LOOKBACK_CHARS
        # Earliest start first, so the first thread to reach a state keeps it (see _add).
        accepts: dict[int, bool] = {}  # id(CharSet) -> whether it takes `ch`
        for state, start in (sorted(old.items(), key=_by_start) if len(old) > 1 else old.items()):
            node = self.nfa.states[state]
            if node[0] != "step" or start < oldest:
                continue
            taken = accepts.get(id(node[1]))
            if taken is None:
                taken = accepts[id(node[1])] = ch in node[1]
            if taken:
                self._add(node[2], start)

    def _add(self, state: int, start: int) -> None:
        """Add the threads of `state`'s epsilon closure, started at `start`. Callers add in
        order of start within a position, so a state already held keeps its earlier start."""
        threads = self.threads
        for s in self._closure(state):
            if s not in threads:
                threads[s] = start

    def _closure(self, state: int) -> tuple[int, ...]:
        """Step and match states reachable from `state` without consuming (memoized: `^`
        depends only on whether this is the text's start or a line's)."""
        key = (state, self.pos == 0, self.prev == "\n")
        found = self._closures.get(key)
        if found is not None:
            return found
        out: list[int] = []
        stack, seen = [state], set()
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            node = self.nfa.states[s]
            if node[0] == "split":
                stack.extend(reversed(node[1]))
            elif node[0] == "bol":
                if key[1] or (node[2] and key[2]):
                    stack.append(node[1])
            else:
                out.append(s)
        found = self._closures[key] = tuple(out)
        return found
