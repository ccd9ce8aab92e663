"""outlines-core backend: grammar -> regex -> token-level Index (built in a killable worker)."""
from __future__ import annotations

import json
import math
import pickle

from outlines_core import Guide, Index
from outlines_core.json_schema import build_regex_from_schema

from radixflow.runtime.grammar.backend import GrammarCancelled, GrammarError, Gone, never
from radixflow.runtime.grammar.integer_range import integer_range_regex
from radixflow.runtime.grammar.number_range import (
    check_numeric_keywords, check_range_regex, decimal_bound, is_multiple, number_schema_regex, within_bounds,
)
from radixflow.runtime.grammar.schema_keywords import check_enforceable
from radixflow.runtime.grammar.spec import GrammarKey
from radixflow.runtime.grammar.vocab import TokenVocab
from radixflow.runtime.grammar.worker import CompileCancelled, CompileFailed, CompileTimeout, CompileWorkers

# JSON is compiled with no optional whitespace at all ({"a":1,"b":[2,3]}): every byte between
# values is then forced, which is what makes jump-forward runs long.
JSON_WHITESPACE = ""
MAX_FORCED_BYTES = 4096
MAX_INTEGER_ENUM = 1000
_REGEX_META = set("\\.+*?()|[]{}^$#&-~")


def escape_literal(text: str) -> str:
    """A regex (Rust `regex` syntax, as outlines-core parses it) matching exactly `text`."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


_NUMERIC_KEYS = ("type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def integer_bounds(schema: dict) -> tuple[int | None, int | None]:
    """The least and greatest integer `schema` allows (None: unbounded), folding the exclusive
    bounds in (numbers since draft 6, booleans beside minimum/maximum in draft 4). A float bound
    is the decimal its text spells: 1e300 is 10**300, not the nearest double's 301 digits."""
    lo, hi = decimal_bound(schema.get("minimum")), decimal_bound(schema.get("maximum"))
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    lo = None if lo is None else math.floor(lo) + 1 if xlo is True else math.ceil(lo)
    hi = None if hi is None else math.ceil(hi) - 1 if xhi is True else math.floor(hi)
    if decimal_bound(xlo) is not None:
        xlo = math.floor(decimal_bound(xlo)) + 1
        lo = max(lo, xlo) if lo is not None else xlo
    if decimal_bound(xhi) is not None:
        xhi = math.ceil(decimal_bound(xhi)) - 1
        hi = min(hi, xhi) if hi is not None else xhi
    return lo, hi


def bound_integers(schema: object) -> object:
    """outlines-core ignores `minimum`/`maximum` (and the exclusive forms, `multipleOf`) of
    integers: an integer with at most MAX_INTEGER_ENUM allowed values becomes the equivalent
    enum. ValueError for what no regex here can hold: `multipleOf` over a wider range,
    `uniqueItems` on arrays that may have two items, and an empty `enum`."""
    if isinstance(schema, list):
        return [bound_integers(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bound_integers(v) if k not in ("enum", "const") else v for k, v in schema.items()}
    if out.get("enum") == []:  # outlines-core renders it as nothing: `{"a":}` would end `stop`
        raise ValueError("an empty enum: no value satisfies it")
    if out.get("uniqueItems") is True and not (isinstance(out.get("maxItems"), int) and out["maxItems"] <= 1):
        raise ValueError("uniqueItems is not supported (the grammar cannot see earlier items)")
    check_numeric_keywords(out)
    if out.get("type") in ("number", "integer") and ("enum" in out or "const" in out):
        return _pinned(out)
    if out.get("type") != "integer":
        return out
    lo, hi = integer_bounds(out)
    step = out.get("multipleOf")
    if lo is not None and hi is not None and hi - lo < MAX_INTEGER_ENUM:
        values = [v for v in range(lo, hi + 1) if decimal_bound(step) is None or is_multiple(v, decimal_bound(step))]
        if not values:
            raise ValueError(f"no integer satisfies the bounds of {json.dumps(schema)}")
        rest = {k: v for k, v in out.items() if k not in _NUMERIC_KEYS}
        return {**rest, "enum": values}
    if step is not None and step != 1:
        raise ValueError(f"multipleOf on an integer needs minimum and maximum at most {MAX_INTEGER_ENUM} apart")
    return out


def _pinned(schema: dict) -> dict:
    """A number / integer schema pinned by enum or const: the members its bounds and multipleOf
    allow, as an enum (outlines-core would render every member, bounds ignored)."""
    values = schema["enum"] if "enum" in schema else [schema["const"]]
    if not isinstance(values, list):
        return schema
    allowed = [v for v in values if within_bounds(v, schema)]
    if not allowed:
        raise ValueError(f"no member of the enum / const of {json.dumps(schema)} satisfies its bounds")
    rest = {k: v for k, v in schema.items() if k not in _NUMERIC_KEYS or k == "type"}
    rest = {k: v for k, v in rest.items() if k not in ("enum", "const")}
    return {**rest, "enum": allowed}


_PLACEHOLDER = "RFxRANGEx{}xQZ"


def range_placeholders(schema: object, regexes: list[str]) -> object:
    """`schema` with each bounded integer left by `bound_integers`, and each number with bounds or
    `multipleOf` (not pinned by enum / const), replaced by a unique string const; its range regex
    (integer_range.py, number_range.py) is appended to `regexes` (the const's rendering is
    swapped for it). ValueError for number bounds number_range.py refuses."""
    if isinstance(schema, list):
        return [range_placeholders(s, regexes) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: range_placeholders(v, regexes) if k not in ("enum", "const") else v for k, v in schema.items()}
    if out.get("type") == "integer" and integer_bounds(out) != (None, None):
        regex = check_range_regex(integer_range_regex(*integer_bounds(out)), out)
    elif out.get("type") == "number" and "enum" not in out and "const" not in out:
        regex = number_schema_regex(out)
    else:
        regex = None
    if regex is None:
        return out
    regexes.append(regex)
    rest = {k: v for k, v in out.items() if k not in _NUMERIC_KEYS}
    return {**rest, "const": _PLACEHOLDER.format(len(regexes) - 1)}


def json_schema_regex(schema: object) -> str:
    """The regex of a JSON schema, integer and number bounds included; ValueError for a keyword
    outlines-core would ignore (schema_keywords.py)."""
    check_enforceable(schema)
    regexes: list[str] = []
    schema = range_placeholders(bound_integers(schema), regexes)
    regex = build_regex_from_schema(json.dumps(schema), whitespace_pattern=JSON_WHITESPACE)
    for k, rx in enumerate(regexes):
        regex = regex.replace(f'"{_PLACEHOLDER.format(k)}"', f"({rx})")
    return regex


# Any JSON object (`{"type": "object"}`, what response_format json_object asks for) as nested at
# most two levels deep: an object of scalars, arrays of scalars and objects of scalars.
# outlines-core's own rendering nests three levels, and building its index takes ~11 s on a
# 2-core CPU even over a 95-token vocabulary (past the default compile limit), this one ~0.2 s.
_SCALAR = {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]}
GENERIC_OBJECT = {"type": "object", "additionalProperties": {"anyOf": [
    _SCALAR, {"type": "array", "items": _SCALAR}, {"type": "object", "additionalProperties": _SCALAR}]}}


def to_regex(key: GrammarKey) -> str:
    if key.kind == "regex":
        return key.text
    if key.kind == "json_schema":
        try:
            parsed = json.loads(key.text)
            if parsed == {"type": "object"}:
                parsed = GENERIC_OBJECT
            return json_schema_regex(parsed)
        except (ValueError, TypeError) as exc:
            raise GrammarError(f"json_schema is not supported: {exc}") from exc
        except RecursionError:  # deeper than the server's JSON depth limit allows, if raised
            raise GrammarError("json_schema is nested too deeply") from None
    if key.kind == "choices":
        # descending: a choice that begins another comes after it (integer_range.py says why)
        return "(" + "|".join(escape_literal(c) for c in sorted(json.loads(key.text), reverse=True)) + ")"
    raise GrammarError(f"unknown grammar kind {key.kind!r}")


class OutlinesGrammar:
    """A compiled Index plus per-state facts computed lazily and memoized (engine thread):
    whether a non-EOS token is allowed, and the forced byte run from the state."""

    def __init__(self, index: Index, vocab: TokenVocab, nbytes: int, eos_id: int) -> None:
        self.index, self.vocab, self.nbytes, self.eos_id = index, vocab, nbytes, eos_id
        self._summary: dict[int, tuple[bool, int | None]] = {}
        self._forced: dict[int, tuple[bytes, int]] = {}

    def new_matcher(self) -> OutlinesMatcher:
        return OutlinesMatcher(self)

    def summary(self, state: int) -> tuple[bool, int | None]:
        """(has a non-EOS continuation, the byte every continuation starts with or None)."""
        hit = self._summary.get(state)
        if hit is None:
            allowed = [t for t in self.index.get_allowed_tokens(state) if t != self.eos_id]
            firsts = {self.vocab.first_byte[t] for t in allowed}
            forced = firsts.pop() if len(firsts) == 1 and not self.index.is_final_state(state) else None
            hit = self._summary[state] = (bool(allowed), forced)
        return hit

    def forced(self, state: int) -> tuple[bytes, int]:
        """The forced bytes from `state` and the state they lead to.

        A byte is forced when the state is not final and every allowed token starts with it;
        the walk then follows that byte's single-byte token (tokenizers without one stop there).
        """
        hit = self._forced.get(state)
        if hit is not None:
            return hit
        out, s = bytearray(), state
        while len(out) < MAX_FORCED_BYTES:
            byte = self.summary(s)[1]
            tok = self.vocab.single_byte.get(byte) if byte is not None else None
            nxt = self.index.get_next_state(s, tok) if tok is not None else None
            if nxt is None:
                break
            out.append(byte)
            s = nxt
        hit = self._forced[state] = (bytes(out), s)
        return hit

    def walk(self, state: int, tokens: list[int]) -> tuple[int, int]:
        """(how many of `tokens` are valid from `state`, the state after them)."""
        for n, t in enumerate(tokens):
            nxt = self.index.get_next_state(state, t)
            if nxt is None:
                return n, state
            state = nxt
        return len(tokens), state

    def is_terminal(self, state: int) -> bool:
        return self.index.is_final_state(state) and not self.summary(state)[0]


class OutlinesMatcher:
    def __init__(self, grammar: OutlinesGrammar) -> None:
        self.grammar = grammar
        self.guide = Guide(grammar.index)
        self.error: str | None = None

    def fill_mask(self, ptr: int, num_words: int) -> None:
        self.guide.write_mask_into(ptr, num_words, 4)

    def accept(self, token: int) -> bool:
        try:
            self.guide.advance(token, return_tokens=False)
        except ValueError:
            return False
        return True

    def is_accepting(self) -> bool:
        return self.guide.is_finished()

    def can_continue(self) -> bool:
        return self.grammar.summary(self.guide.get_state())[0]

    def forced_bytes(self) -> bytes:
        return self.grammar.forced(self.guide.get_state())[0]

    def count_valid(self, tokens: list[int]) -> int:
        return self.grammar.walk(self.guide.get_state(), tokens)[0]

    def accepting_after(self, tokens: list[int]) -> bool:
        n, state = self.grammar.walk(self.guide.get_state(), tokens)
        return n == len(tokens) and self.grammar.index.is_final_state(state)

    def terminates_after(self, tokens: list[int]) -> bool:
        n, state = self.grammar.walk(self.guide.get_state(), tokens)
        return n == len(tokens) and self.grammar.is_terminal(state)


class OutlinesBackend:
    """Compiles in `CompileWorkers` processes; the returned Index is unpickled here."""

    def __init__(self, vocab: TokenVocab, max_workers: int = 2) -> None:
        self.vocab = vocab
        # outlines-core takes one EOS id; any id it never sees as a real token will do, since
        # the engine rewrites the EOS bits of every mask row itself.
        self.eos_id = vocab.eos_ids[0] if vocab.eos_ids else len(vocab.token_bytes)
        self.workers = CompileWorkers(self.eos_id, vocab.outlines_map(), max_workers=max_workers)

    def compile(self, key: GrammarKey, timeout_s: float, gone: Gone = never) -> OutlinesGrammar:
        regex = to_regex(key)
        try:
            blob = self.workers.build_index(regex, timeout_s, gone)
        except CompileCancelled as exc:
            raise GrammarCancelled(str(exc)) from exc
        except CompileTimeout as exc:
            err = GrammarError(f"{key.kind}: {exc}")
            err.ran_s = exc.ran_s  # type: ignore[attr-defined]
            raise err from exc
        except CompileFailed as exc:
            raise GrammarError(f"{key.kind} does not compile: {exc}") from exc
        grammar = OutlinesGrammar(pickle.loads(blob), self.vocab, len(blob), self.eos_id)
        start = grammar.index.get_initial_state()
        if not grammar.summary(start)[0]:
            raise GrammarError(f"{key.kind} matches only the empty string: nothing to generate")
        return grammar

    def close(self) -> None:
        self.workers.close()
