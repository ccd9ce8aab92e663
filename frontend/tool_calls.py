"""Tool calls in generated text: the Parser protocol, Hermes-style `<tool_call>` blocks (the default
format of tool_choice "auto"; the others are in tool_call_formats.py) and the JSON that
tool_choice "required" or a named function constrains the output to.

A parser is fed a choice's text as it is generated and returns events: text (content), a call's
start and pieces of its arguments (call_stream.py: a call's arguments come out as they are
written); `finish()` flushes what it held back. The non-streamed response feeds the whole text at
once, so a stream and a response give the same calls and the same content. Text that could still
become part of a call is held back until it cannot (a stream shows it late, never twice).
"""
from __future__ import annotations

from collections.abc import Set
from typing import Protocol

from radixflow.frontend.call_stream import (
    Call, CallArgs, CallListReader, CallReader, CallStart, Event, call_events, joined, whole,
)
from radixflow.frontend.json_stream import WHITESPACE, JsonReader
from radixflow.runtime.text.reasoning import partial_tag

__all__ = ["Call", "CallArgs", "CallStart", "Event", "call_events", "whole"]
OPEN, CLOSE = "<tool_call>", "</tool_call>"


class Parser(Protocol):
    def feed(self, text: str) -> list[Event]: ...
    def finish(self) -> list[Event]: ...


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

    def call(self, events: list[Event], out: list[Event]) -> None:
        """Reader events: a call's start is trimmed around as the class says; its pieces pass."""
        for event in events:
            if isinstance(event, CallStart):
                self._start(event, out)
            else:
                out.append(event)

    def _start(self, start: CallStart, out: list[Event]) -> None:
        out.append(start)
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
    (Qwen2.5 and Hermes models). A block's object is read as it comes (CallReader): the call
    starts once its name and the opening of its arguments are read, and its arguments stream from
    there; text in the block after the object is dropped. A block refused before its call started
    (not JSON, an unknown tool, arguments that are not an object), or left unclosed before it
    started, stays content as written. Content is trimmed where calls were (see `Content`)."""

    def __init__(self, names: Set[str]) -> None:
        self.names = names
        self._buf = ""  # text not yet given out: a possible tag start, or a block's body so far
        self._reader: CallReader | None = None  # the open block's, None outside blocks
        self._read = 0  # in a block: how much of _buf the reader was given
        self._searched = 0  # in a block: where the search for CLOSE goes on (each text is scanned once)
        self._content = Content()

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while True:
            if self._reader is not None:
                end = self._buf.find(CLOSE, self._searched)
                if end < 0:
                    self._searched = max(0, len(self._buf) - len(CLOSE) + 1)
                    self._give(len(self._buf) - partial_tag(self._buf, CLOSE), out)
                    return out
                self._give(end, out)
                payload, self._buf = self._buf[:end], self._buf[end + len(CLOSE):]
                self._block(OPEN + payload + CLOSE, out)
            else:
                start = self._buf.find(OPEN)
                if start < 0:
                    keep = len(self._buf) - partial_tag(self._buf, OPEN)
                    self._content.text(self._buf[:keep], out)
                    self._buf = self._buf[keep:]
                    return out
                self._content.text(self._buf[:start], out)
                self._buf = self._buf[start + len(OPEN):]
                self._reader, self._read, self._searched = CallReader(self.names), 0, 0

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self._reader is not None:
            self._give(len(self._buf), out)
            self._block(OPEN + self._buf, out)
        else:
            self._content.text(self._buf, out)
        self._buf = ""
        self._content.finish(out)
        return out

    def _give(self, end: int, out: list[Event]) -> None:
        """The block's text up to `end` to its reader."""
        reader = self._reader
        assert reader is not None
        if end > self._read and not reader.ended:
            events, _ = reader.feed(self._buf[self._read:end])
            self._content.call(events, out)
        self._read = max(self._read, end)

    def _block(self, raw: str, out: list[Event]) -> None:
        """The block ended (its closing tag, or the output's end)."""
        reader, self._reader = self._reader, None
        assert reader is not None
        if not reader.started:
            self._content.text(raw, out)


class FirstCallOnly:
    """parallel_tool_calls false under "auto": `parser`'s events with every call after the first
    dropped (OpenAI's at most one call). The dropped calls are not content; text around them is."""

    def __init__(self, parser: Parser) -> None:
        self.parser = parser
        self._called = self._dropping = False

    def feed(self, text: str) -> list[Event]:
        return self._keep(self.parser.feed(text))

    def finish(self) -> list[Event]:
        return self._keep(self.parser.finish())

    def _keep(self, events: list[Event]) -> list[Event]:
        out = []
        for event in events:
            if isinstance(event, CallStart):
                self._dropping, self._called = self._called, True
            elif not isinstance(event, CallArgs):
                self._dropping = False
            if not self._dropping:
                out.append(event)
        return out


class JsonCallsParser:
    """The constrained output of tool_choice "required", `[{"name": ..., "arguments": {...}}, ...]`
    (CallListReader), or of a named function (`name`), its arguments object: each call starts as
    soon as its name and its arguments' opening are read, and its arguments stream. Text read
    while no call is being written is held: it is content if the output ends there (cut by
    max_tokens) or an item is not a call of the tools (then the rest of the output is too)."""

    def __init__(self, names: Set[str], name: str | None = None) -> None:
        self.name = name
        self._list = CallListReader(names) if name is None else None
        self._args = JsonReader()  # a named function's arguments
        self._held = ""
        self._refused = False

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        i = 0
        while i < len(text) and not self._refused:
            if self._list is not None:
                self._feed_list(text[i], out)
            else:
                self._feed_arguments(text[i], out)
            i += 1
        if self._refused and (rest := self._held + text[i:]):
            out.append(rest)  # the rest of the output, as written
            self._held = ""
        return joined(out)

    def finish(self) -> list[Event]:
        rest, self._held = self._held, ""
        return [rest] if rest.strip(" \t\n[],") and not self._refused else []

    def _feed_list(self, c: str, out: list[Event]) -> None:
        reader = self._list
        assert reader is not None
        if reader.ended and not reader.refused:
            return  # after the list (the grammar ends there), or after a call that broke
        writing = reader.item is not None and reader.item.started
        events, _ = reader.feed(c)
        if reader.refused:
            self._held += c
            self._refused = True
        elif any(isinstance(e, CallStart) for e in events):
            self._held = ""  # the list's syntax and the object's opening are the call
        elif not writing:
            self._held += c
        out += events

    def _feed_arguments(self, c: str, out: list[Event]) -> None:
        reader = self._args
        if reader.done or reader.failed:
            return
        if not reader.stack:  # nothing read yet
            if c in WHITESPACE:
                self._held += c
                return
            if c != "{":
                self._held += c
                self._refused = True
                return
            out.append(CallStart(self.name or ""))
            self._held = ""
        piece = reader.step(c)
        if piece:
            out.append(CallArgs(piece))
