"""Tool calls in generated text: the Parser protocol, Hermes-style `<tool_call>` blocks (the default
format of tool_choice "auto"; the others are in tool_call_formats.py) and the JSON that
tool_choice "required" or a named function constrains the output to.

A parser is fed a choice's text as it is generated and returns events: text (content) or a complete
`Call`; `finish()` flushes what it held back. The non-streamed response feeds the whole text at
once, so a stream and a response give the same calls and the same content. Text that could still
become part of a call is held back until it cannot (a stream shows it late, never twice).
"""
from __future__ import annotations

import json
from collections.abc import Set
from dataclasses import dataclass
from typing import Protocol

from radixflow.runtime.text.reasoning import partial_tag

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # the arguments object as JSON text (OpenAI's `function.arguments`)


Event = str | Call


class Parser(Protocol):
    def feed(self, text: str) -> list[Event]: ...
    def finish(self) -> list[Event]: ...


def _arguments(value: object) -> str:
    """`value` as JSON text; ValueError for NaN and infinities, which Python's json reads but JSON lacks."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def parse_call(payload: str, names: Set[str], keys: tuple[str, ...] = ("arguments",)) -> Call | None:
    """The call in JSON `payload`, or None unless it is {"name": <one of names>, "arguments": {...}}
    (missing arguments are {}, as models write a call of a function without parameters).
    `keys`: where the arguments may be, first found wins (Llama 3 writes "parameters")."""
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    return call_of(obj, names, keys)


def call_of(obj: object, names: Set[str], keys: tuple[str, ...] = ("arguments",)) -> Call | None:
    """parse_call of decoded JSON."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in names:
        return None
    arguments = next((obj[k] for k in keys if k in obj), {})
    if not isinstance(arguments, dict):
        return None
    try:
        return Call(obj["name"], _arguments(arguments))
    except ValueError:
        return None


class Content:
    """A choice's events as a parser finds them, content trimmed where calls were (the newlines
    models put around calls): whitespace after a call and at the end is dropped once a call was
    parsed, and whitespace before a call too unless text follows the calls, which it then
    separates from the text before them (`"Hi <call> x"` is `"Hi x"`); without calls the text is
    kept exactly. Each parser of "auto" gives its text and calls through one of these."""

    def __init__(self) -> None:
        self._space = ""  # trailing whitespace held back (dropped if a call follows)
        self._trim = False  # just after a call: leading whitespace is dropped
        self._sep = ""  # the whitespace before the calls since the last text: owed to the next text
        self._said = False  # some text was given out
        self.calls = 0

    def call(self, call: Call, out: list[Event]) -> None:
        out.append(call)
        self.calls += 1
        if self._said and not self._sep:
            self._sep = self._space
        self._space, self._trim = "", True

    def text(self, text: str, out: list[Event]) -> None:
        if self._trim:
            text = text.lstrip()
            if not text:
                return
            self._trim = False
        text = self._space + self._sep + text
        self._sep = ""
        body = text.rstrip()
        self._space = text[len(body):]
        if body:
            out.append(body)
            self._said = True

    def finish(self, out: list[Event]) -> None:
        """The whitespace held back at the end: kept only when there was no call."""
        if self._space and not self.calls:
            out.append(self._space)
        self._space = ""


class HermesParser:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number, anywhere in the text
    (Qwen2.5 and Hermes models). A block that does not parse, or names an unknown tool, stays
    content as written; so does an unclosed one, unless the output ends with it complete.
    Content is trimmed where calls were (see `Content`)."""

    def __init__(self, names: Set[str]) -> None:
        self.names = names
        self._buf = ""  # text not yet given out: a possible tag start, or a call's body so far
        self._in_call = False
        self._searched = 0  # in a call: where the search for CLOSE goes on (each text is scanned once)
        self._content = Content()

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while True:
            if self._in_call:
                end = self._buf.find(CLOSE, self._searched)
                if end < 0:
                    self._searched = max(0, len(self._buf) - len(CLOSE) + 1)
                    return out
                payload, self._buf = self._buf[:end], self._buf[end + len(CLOSE):]
                self._in_call = False
                self._block(payload, OPEN + payload + CLOSE, out)
            else:
                start = self._buf.find(OPEN)
                if start < 0:
                    keep = len(self._buf) - partial_tag(self._buf, OPEN)
                    self._content.text(self._buf[:keep], out)
                    self._buf = self._buf[keep:]
                    return out
                self._content.text(self._buf[:start], out)
                self._buf = self._buf[start + len(OPEN):]
                self._in_call, self._searched = True, 0

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self._in_call:
            self._block(self._buf, OPEN + self._buf, out)
        else:
            self._content.text(self._buf, out)
        self._buf, self._in_call = "", False
        self._content.finish(out)
        return out

    def _block(self, payload: str, raw: str, out: list[Event]) -> None:
        call = parse_call(payload, self.names)
        if call is None:
            self._content.text(raw, out)
        else:
            self._content.call(call, out)


class FirstCallOnly:
    """parallel_tool_calls false under "auto": `parser`'s events with every call after the first
    dropped (OpenAI's at most one call). The dropped calls are not content; text around them is."""

    def __init__(self, parser: Parser) -> None:
        self.parser = parser
        self._called = False

    def feed(self, text: str) -> list[Event]:
        return self._keep(self.parser.feed(text))

    def finish(self) -> list[Event]:
        return self._keep(self.parser.finish())

    def _keep(self, events: list[Event]) -> list[Event]:
        out = []
        for event in events:
            if isinstance(event, Call):
                if self._called:
                    continue
                self._called = True
            out.append(event)
        return out


class JsonCallsParser:
    """The constrained output of tool_choice "required", `[{"name": ..., "arguments": {...}}, ...]`,
    or of a named function (`name`), its arguments object. Each call comes out as soon as its object
    closes. What is left when the output ends unfinished (cut by max_tokens) is content, as written."""

    def __init__(self, names: Set[str], name: str | None = None) -> None:
        self.names, self.name = names, name
        self._level = 0 if name is not None else 1  # the depth at which a call's object opens
        self._text = ""  # not yet given out
        self._pos = 0  # how far _text is scanned
        self._start: int | None = None  # where the current call's object opened
        self._depth = 0
        self._in_string = self._escaped = False

    def feed(self, text: str) -> list[Event]:
        self._text += text
        out: list[Event] = []
        while self._pos < len(self._text):
            c, i = self._text[self._pos], self._pos
            self._pos += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                if c == "{" and self._depth == self._level:
                    self._start = i
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if c == "}" and self._depth == self._level and self._start is not None:
                    out.append(self._call(self._text[self._start:i + 1]))
                    self._text, self._pos, self._start = self._text[i + 1:], 0, None
        return out

    def finish(self) -> list[Event]:
        rest, self._text = self._text, ""
        return [rest] if rest.strip(" \t\n[],") else []

    def _call(self, value: str) -> Event:
        if self.name is None:
            return parse_call(value, self.names) or value
        try:
            return Call(self.name, _arguments(json.loads(value)))
        except (ValueError, RecursionError):
            return value
