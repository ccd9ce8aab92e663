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
    ArgsReader, Call, CallArgs, CallListReader, CallReader, CallStart, Event, call_events, joined, whole,
)
from radixflow.runtime.text.reasoning import partial_tag

__all__ = ["ArgsReader", "Call", "CallArgs", "CallStart", "Event", "call_events", "whole"]
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

    def read(self, reader: CallReader | CallListReader | ArgsReader, text: str, out: list[Event]) -> int:
        """Feed `text` to `reader`, its events through `call`; how much of `text` it read."""
        events, used = reader.feed(text)
        self.call(events, out)
        return used

    def until(self, buf: str, tag: str, out: list[Event]) -> tuple[str, bool]:
        """`buf`'s text before `tag` given as text; (the rest: from the tag, or what may start it;
        whether the tag is there)."""
        at = buf.find(tag)
        if at < 0:
            at = len(buf) - partial_tag(buf, tag)
        self.text(buf[:at], out)
        return buf[at:], buf.startswith(tag, at)

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


class StateParser:
    """A parser as states over its buffer: `_<state>(out)` reads `_buf` and returns True when it
    moved on and the next state should read, False when it needs more text."""

    _buf: str
    _state: str

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while getattr(self, "_" + self._state)(out):
            pass
        return out


class HermesParser:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number, anywhere in the text
    (Qwen2.5 and Hermes models). A block's object is read as it comes (CallReader), so a closing
    tag inside one of its strings is the string's. The call starts once its name and the opening of
    its arguments are read, and its arguments stream from there; the block ends at the closing tag
    after its object, or where text other than that tag follows the object. A block refused before
    its call started (not JSON, an unknown tool, arguments that are not an object) is content as
    written from the moment it is refused, and so is one the output ended inside before its call
    started. After JSON that broke in a started call, the text up to the closing tag is dropped;
    without one (a new block opens, or the output ends), that text is content. Content is
    trimmed where calls were (see `Content`)."""

    def __init__(self, names: Set[str]) -> None:
        self.names = names
        self._buf = ""  # text not yet given out: a possible tag start, or the open block's text
        self._reader: CallReader | None = None  # the open block's, None outside blocks
        self._read = 0  # in a block: how much of _buf its reader read
        self._content = Content()

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        reader, rest = self._reader, self._buf[self._read:]
        if reader is None:
            self._content.text(self._buf, out)
        elif not reader.started:
            self._content.text(OPEN + self._buf, out)  # as written
        elif reader.broken or (reader.ended and not CLOSE.startswith(rest.strip())):
            self._content.text(rest, out)  # no closing tag came after the break (or the object)
        self._buf, self._reader = "", None
        self._content.finish(out)
        return out

    def _step(self, out: list[Event]) -> bool:
        """One move on _buf; False when more text is needed."""
        reader = self._reader
        if reader is None:
            self._buf, found = self._content.until(self._buf, OPEN, out)
            if found:
                self._buf, self._reader, self._read = self._buf[len(OPEN):], CallReader(self.names), 0
            return found
        if not reader.ended:
            self._read += self._content.read(reader, self._buf[self._read:], out)
            if not reader.ended:
                return False
        rest = self._buf[self._read:]
        if reader.refused:  # as written; what follows is text again
            self._content.text(OPEN + self._buf[:self._read], out)
            return self._end(self._read)
        if reader.broken:
            close, again = rest.find(CLOSE), rest.find(OPEN)
            if close >= 0 and (again < 0 or close < again):
                return self._end(self._read + close + len(CLOSE))  # the block's rest is dropped
            if again >= 0:
                self._content.text(rest[:again], out)
                return self._end(self._read + again)
            return False
        body = rest.lstrip()  # the object closed
        if body.startswith(CLOSE):
            return self._end(len(self._buf) - len(body) + len(CLOSE))
        if not body or CLOSE.startswith(body):
            return False
        return self._end(self._read)  # no closing tag: what follows is text

    def _end(self, at: int) -> bool:
        """The open block ends before _buf[at]."""
        self._buf, self._reader = self._buf[at:], None
        return True


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
    (CallListReader), or of a named function (`name`), its arguments object (ArgsReader): each call
    starts as soon as its name and its arguments' opening are read, and its arguments stream. Text
    read while no call is being written is held: it is content if the output ends there (cut by
    max_tokens) or an item is not a call of the tools (then the rest of the output is too)."""

    def __init__(self, names: Set[str], name: str | None = None) -> None:
        self._reader = CallListReader(names) if name is None else ArgsReader(name)
        self._held = ""
        self._refused = False

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        i = 0
        while i < len(text) and not self._refused:
            i += self._feed(text[i:], out)
        if self._refused and (rest := self._held + text[i:]):
            out.append(rest)  # the rest of the output, as written
            self._held = ""
        return joined(out)

    def finish(self) -> list[Event]:
        rest, self._held = self._held, ""
        return [rest] if rest.strip(" \t\n[],") and not self._refused else []

    def _feed(self, text: str, out: list[Event]) -> int:
        """Read a character of `text`, or a started call's arguments up to their end; how much was read."""
        reader = self._reader
        if reader.ended and not reader.refused:
            return len(text)  # after the output's value (the grammar ends there), or after a break
        if isinstance(reader, ArgsReader):
            writing = reader.started
            events, used = reader.feed(text)
        else:
            writing = reader.item is not None and reader.item.started
            events, used = reader.feed(text, one=True)
        if reader.refused:
            self._held += text[:used]
            self._refused = True
        elif any(isinstance(e, CallStart) for e in events):
            self._held = ""  # the list's syntax and the object's opening are the call
        elif not writing:
            self._held += text[:used]
        out += events
        return used
