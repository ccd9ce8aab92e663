"""JSON read as it is generated, one character at a time, so a tool call's arguments can be given
out while the model writes them.

`JsonReader.step` checks each character against JSON's grammar and returns its text in canonical
spacing: no whitespace between tokens, `", "` after a comma and `": "` after a colon (the spacing
Python's `json.dumps` writes). Strings, numbers and literals keep their characters as written,
except that a raw control character inside a string (a newline models put in code arguments) is
written as its escape. What has been returned is always the start of a JSON text: a character
that breaks the grammar returns None and the reader stops there, and an escape comes out only once
its next character shows it is valid.
"""
from __future__ import annotations

import json
import re

WHITESPACE = " \t\n\r"
CLOSING = {"{": "}", "[": "]"}
SIMPLE_ESCAPES = '"\\/bfnrt'
CONTROL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
HEX = "0123456789abcdefABCDEF"
LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
PLAIN = re.compile(r'[^"\\\x00-\x1f]+')  # string characters that are their own canonical text
# A number's states: what was read last; ACCEPT: states where the number may end.
NUMBER_STEPS = {
    ("start", "-"): "sign", ("start", "0"): "zero", ("sign", "0"): "zero",
    ("zero", "."): "dot", ("int", "."): "dot", ("zero", "e"): "e", ("int", "e"): "e",
    ("frac", "e"): "e", ("e", "+"): "esign", ("e", "-"): "esign",
}
ACCEPT = {"zero", "int", "frac", "exp"}


def _number_step(state: str, c: str) -> str | None:
    if c in "0123456789" and not (c == "0" and state in ("start", "sign")):
        return {"start": "int", "sign": "int", "int": "int", "dot": "frac", "frac": "frac",
                "e": "exp", "esign": "exp", "exp": "exp"}.get(state)
    return NUMBER_STEPS.get((state, c.lower() if c in "eE" else c))


class JsonReader:
    """One JSON value read a character at a time. After each `step`, `member_value` says whether
    that character was part of the value of a member of the outermost object (its key is
    `member`), `key_char` whether it was part of such a member's key, and `member_closed` whether
    it ended that member's value; `done` says the value is complete, `failed` that it broke."""

    def __init__(self) -> None:
        self.stack: list[str] = []  # the open containers' opening brackets
        self.state = "value"  # value | key | colon | after | string | escape | hex | number | literal | end | error
        self.member: str | None = None  # the key of the outermost object's member being read
        self.member_value = self.key_char = self.member_closed = False
        self._in_member = False  # a member value of the outermost object is being read
        self._in_key = False  # the string being read is a key
        self._key: list[str] = []  # an outermost key's characters so far
        self._first = False  # just after an opening bracket: the closing one may follow
        self._hex = 0  # \\u digits read
        self._rest = ""  # a literal's characters still to come
        self._number = ""  # the number's state

    @property
    def done(self) -> bool:
        return self.state == "end"

    @property
    def failed(self) -> bool:
        return self.state == "error"

    def step(self, c: str) -> str | None:
        """`c`'s canonical text ("" for whitespace between tokens), or None when `c` breaks JSON."""
        self.member_value, self.key_char, self.member_closed = self._in_member, False, False
        if self.state == "number":
            nxt = _number_step(self._number, c)
            if nxt is not None:
                self._number = nxt
                return c
            if self._number not in ACCEPT:
                return self._fail()
            self._value_end()  # the number ended before c, which is read as what follows it
            self.member_value = self._in_member
        piece = getattr(self, "_on_" + self.state)(c)
        return self._fail() if piece is None else piece

    def plain(self, text: str, at: int) -> int:
        """Inside a value's string: read the run of plain characters of `text` from `at` at once
        (what `step` would give each as it is); where the run ends (`at` when there is none)."""
        if self.state != "string" or self._in_key:
            return at
        run = PLAIN.match(text, at)
        if run is None:
            return at
        self.member_value, self.key_char, self.member_closed = self._in_member, False, False
        return run.end()

    def _fail(self) -> None:
        self.state = "error"
        return None

    def _outermost(self) -> bool:
        return self.stack == ["{"]

    def _start_value(self) -> None:
        if self._outermost():
            self._in_member = self.member_value = True

    def _value_end(self) -> None:
        if self._in_member and self._outermost():
            self._in_member, self.member_closed = False, True
        self.state = "after" if self.stack else "end"

    def _on_value(self, c: str) -> str | None:
        if c in WHITESPACE:
            return ""
        if c == "]" and self._first and self.stack[-1] == "[":
            return self._close(c)
        self._first = False
        self._start_value()
        if c in "{[":
            self.stack.append(c)
            self.state, self._first = ("key" if c == "{" else "value"), True
            return c
        if c == '"':
            self.state, self._in_key = "string", False
            return c
        if c in LITERALS:
            self.state, self._rest = "literal", LITERALS[c]
            return c
        nxt = _number_step("start", c)
        if nxt is None:
            return None
        self.state, self._number = "number", nxt
        return c

    def _on_key(self, c: str) -> str | None:
        if c in WHITESPACE:
            return ""
        if c == "}" and self._first:
            return self._close(c)
        if c != '"':
            return None
        self._first, self.state, self._in_key = False, "string", True
        return self._key_piece(c)

    def _key_piece(self, piece: str) -> str:
        if self._outermost():
            self.key_char = True
            self._key.append(piece)
        return piece

    def _on_colon(self, c: str) -> str | None:
        if c in WHITESPACE:
            return ""
        if c != ":":
            return None
        self.state = "value"
        return ": "

    def _on_after(self, c: str) -> str | None:
        if c in WHITESPACE:
            return ""
        if c == ",":
            self.state = "key" if self.stack[-1] == "{" else "value"
            return ", "
        if c == CLOSING[self.stack[-1]]:
            return self._close(c)
        return None

    def _close(self, c: str) -> str:
        self.stack.pop()
        self._first = False
        if not self.stack:  # the outermost value itself closed
            self.state = "end"
            return c
        self._value_end()
        return c

    def _on_string(self, c: str) -> str | None:
        if c == '"':
            if self._in_key:
                self.state = "colon"
                piece = self._key_piece(c)
                if self._outermost():
                    self.member = _decoded("".join(self._key))
                    self._key = []
                return piece
            self._value_end()
            return c
        if c == "\\":
            self.state = "escape"
            return ""
        piece = CONTROL_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20 else c)
        return self._key_piece(piece) if self._in_key else piece

    def _on_escape(self, c: str) -> str | None:
        if c == "u":
            self.state, self._hex = "hex", 0
        elif c in SIMPLE_ESCAPES:
            self.state = "string"
        else:
            return None
        return self._key_piece("\\" + c) if self._in_key else "\\" + c

    def _on_hex(self, c: str) -> str | None:
        if c not in HEX:
            return None
        self._hex += 1
        if self._hex == 4:
            self.state = "string"
        return self._key_piece(c) if self._in_key else c

    def _on_literal(self, c: str) -> str | None:
        if c != self._rest[0]:
            return None
        self._rest = self._rest[1:]
        if not self._rest:
            self._value_end()
        return c

    def _on_end(self, c: str) -> str | None:
        return "" if c in WHITESPACE else None


def _decoded(key: str) -> str:
    return json.loads(key)
