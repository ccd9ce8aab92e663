"""Tool calls as they are written: the events a parser gives (a call's start with its name, then
pieces of its arguments), and the readers that turn a call object, or a list of them, into those
events while the model is still writing it.

A call starts once its name is one of the tools and its arguments object has opened (or the object
closed without arguments: `{}`); from then on its arguments come out as they are read, in
canonical spacing (json_stream.py), so a stream shows a long argument while it is generated.
Before it starts, whatever makes the object not a call of the tools (an unknown name, arguments
that are not an object, JSON that breaks) refuses it, and the parser gives the text as written.
After it starts nothing can take it back: JSON that breaks ends its arguments where they broke,
and an output cut short leaves them unfinished (OpenAI's arguments, too, may not be valid JSON).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Set
from dataclasses import dataclass

from radixflow.frontend.json_stream import WHITESPACE, JsonReader


@dataclass(frozen=True)
class CallStart:
    name: str


@dataclass(frozen=True)
class CallArgs:
    text: str  # the next piece of the started call's arguments (OpenAI's `function.arguments`)


@dataclass(frozen=True)
class Call:
    """A whole call: its start and all its argument pieces."""

    name: str
    arguments: str


Event = str | CallStart | CallArgs


def call_events(call: Call) -> list[Event]:
    return [CallStart(call.name), CallArgs(call.arguments)]


def joined(events: list[Event]) -> list[Event]:
    """`events` with adjacent argument pieces joined (one piece a call a step in a stream)."""
    out: list[Event] = []
    for event in events:
        if isinstance(event, CallArgs) and out and isinstance(out[-1], CallArgs):
            out[-1] = CallArgs(out[-1].text + event.text)
        else:
            out.append(event)
    return out


def whole(events: Iterable[object]) -> list[object]:
    """`events` with each call's start and argument pieces folded into one Call (other events as
    they are)."""
    out: list[object] = []
    for event in events:
        if isinstance(event, CallStart):
            out.append(Call(event.name, ""))
        elif isinstance(event, CallArgs):
            last = out[-1]
            assert isinstance(last, Call), "arguments before their call's start"
            out[-1] = Call(last.name, last.arguments + event.text)
        else:
            out.append(event)
    return out


class _ObjectReader:
    """What CallReader and ArgsReader share: a JSON reader, whether the call `started`, was
    `refused` before it started or `broken` after, and `ended` (the reader reads no more)."""

    def __init__(self) -> None:
        self._json = JsonReader()
        self.started = self.refused = self.broken = False

    @property
    def ended(self) -> bool:
        return self._json.done or self.refused or self.broken


class CallReader(_ObjectReader):
    """One call object, `{"name": ..., "arguments": {...}}` (`keys`: where the arguments may be,
    the first met wins), read a piece at a time. `feed` stops at the object's end; `ended` says
    the reader reads no more: the object ended, was `refused` before the call started, or broke
    after (`broken`)."""

    def __init__(self, names: Set[str], keys: tuple[str, ...] = ("arguments",)) -> None:
        super().__init__()
        self.names, self.keys = names, keys
        self._name: list[str] | None = []  # the name value's text; None once read
        self.name: str | None = None  # a tool's name, once read
        self._args: list[str] = []  # the arguments read before the call started
        self._args_at = "none"  # none | open | closed

    def feed(self, text: str) -> tuple[list[Event], int]:
        """The events `text` makes, and how much of it was read (all of it unless the reading ended)."""
        out: list[Event] = []
        i = 0
        while i < len(text) and not self.ended:
            end = self._json.plain(text, i)
            if end > i:  # a run inside a string: no token ends in it
                self._take(text[i:end], out)
                i = end
            elif self._read(text[i], out):
                i += 1
        return joined(out), i

    def _read(self, c: str, out: list[Event]) -> bool:
        """Read `c`; False when it breaks the JSON (it is not read: it is where what follows starts)."""
        reader = self._json
        piece = reader.step(c)
        if piece is None:
            self.broken, self.refused = self.started, not self.started
            return False
        self._take(piece, out)
        if self.refused:
            return True
        if not self.started and self.name is not None and (self._args_at != "none" or reader.done):
            self.started = True
            out += [CallStart(self.name), CallArgs("".join(self._args) or "{}")]
        elif reader.done and not self.started:
            self.refused = True
        return True

    def _take(self, piece: str, out: list[Event]) -> None:
        """A read piece to the name or the arguments, as the member it is in says."""
        reader, member = self._json, self._json.member
        if reader.member_value and member == "name" and self._name is not None:
            self._name.append(piece)
            if reader.member_closed:
                self._read_name()
        elif reader.member_value and member in self.keys and self._args_at != "closed":
            if self._args_at == "none" and piece:
                if piece != "{":
                    self.refused = not self.started
                    return
                self._args_at = "open"
            if self._args_at == "open":
                if self.started:
                    if piece:
                        out.append(CallArgs(piece))
                else:
                    self._args.append(piece)
                if reader.member_closed:
                    self._args_at = "closed"
        elif reader.member_closed and member == "name" and self._name is not None:
            self._read_name()  # a number ends only at what follows it

    def _read_name(self) -> None:
        text, self._name = "".join(self._name or ()), None
        try:
            name = json.loads(text)
        except ValueError:
            name = None
        if isinstance(name, str) and name in self.names:
            self.name = name
        else:
            self.refused = not self.started


class ArgsReader(_ObjectReader):
    """The arguments object of a call whose name is already known (a named function's constrained
    output, Mistral's `[TOOL_CALLS]name[ARGS]{...}`), read a piece at a time: the call starts at
    its opening brace, after any whitespace. CallReader's interface: `refused` when something
    else opens it, `broken` when its JSON breaks."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def feed(self, text: str) -> tuple[list[Event], int]:
        out: list[Event] = []
        i = 0
        while i < len(text) and not self.ended:
            if not self.started:
                if text[i] in WHITESPACE:
                    i += 1
                    continue
                if text[i] != "{":
                    self.refused = True
                    break
                self.started = True
                out.append(CallStart(self.name))
            end = self._json.plain(text, i)
            if end > i:
                out.append(CallArgs(text[i:end]))
                i = end
                continue
            piece = self._json.step(text[i])
            if piece is None:
                self.broken = True
                break
            if piece:
                out.append(CallArgs(piece))
            i += 1
        return joined(out), i


class CallListReader:
    """A JSON list of call objects read a piece at a time, each item through a CallReader. Like
    it, `feed` stops at the list's end and `ended` says it reads no more. The first item that is
    not a call refuses the rest of the list (`refused`, with `refused_at` where that item started in
    what was fed, or where the list went wrong); an empty list is refused too."""

    def __init__(self, names: Set[str]) -> None:
        self.names = names
        self.state = "open"  # open | item | after | end | refused | broken
        self.item: CallReader | None = None
        self.calls = 0  # calls started
        self.read = 0  # characters read so far
        self.item_at = 0  # where the item being read started
        self.refused_at = -1

    @property
    def ended(self) -> bool:
        return self.state in ("end", "refused", "broken")

    @property
    def refused(self) -> bool:
        return self.state == "refused"

    @property
    def broken(self) -> bool:
        return self.state == "broken"

    def feed(self, text: str, one: bool = False) -> tuple[list[Event], int]:
        """The events `text` makes and how much of it was read; `one`: read one character, or
        while an item is being read, up to that item's end."""
        out: list[Event] = []
        i = 0
        while i < len(text) and not self.ended:
            if self.item is not None:
                events, used = self.item.feed(text[i:])
                out += events
                self.calls += sum(isinstance(e, CallStart) for e in events)
                i, self.read = i + used, self.read + used
                self._item_read()
            else:
                self._step(text[i])
                i, self.read = i + 1, self.read + 1
            if one:
                break
        return out, i

    def _step(self, c: str) -> None:
        if c in WHITESPACE:
            return
        if self.state == "open" and c == "[":
            self.state = "item"
        elif self.state == "item" and c == "{":
            self.item, self.item_at = CallReader(self.names), self.read
            self.item.feed(c)
        elif self.state == "after" and c in ",]":
            self.state = "item" if c == "," else "end"
        else:
            self.state, self.refused_at = "refused", self.read

    def _item_read(self) -> None:
        item = self.item
        assert item is not None
        if item.refused:
            self.state, self.refused_at = "refused", self.item_at
        elif item.broken:
            self.state = "broken"
        elif item.ended:
            self.item, self.state = None, "after"
