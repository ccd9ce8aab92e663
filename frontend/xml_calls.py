"""Qwen3-Coder's tool calls (`--tool-call-parser qwen3_coder`): XML-like blocks whose parameter
values are raw text, turned into a JSON arguments object as they are written.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A call starts once `<function=NAME>` names one of the tools, and its arguments open with it. A
parameter whose schema type is "string" streams as a JSON string while it is written; any other
value is read when its `</parameter>` comes: as JSON when it is JSON, else as a string. One newline
after `<parameter=KEY>` and one before `</parameter>` belong to the layout, not the value. A block
that does not open with a tool's `<function=...>` is content as written; after a call started,
text that is not a parameter or a closing tag ends its arguments there and the rest of the block
is dropped (content when no closing tag comes), as in the JSON formats (call_stream.py).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Set

from radixflow.frontend.json_stream import JsonReader
from radixflow.frontend.tool_calls import CLOSE, OPEN, CallArgs, CallStart, Content, Event
from radixflow.runtime.text.reasoning import partial_tag

FUNCTION, PARAMETER = "<function=", "<parameter="
END_FUNCTION, END_PARAMETER = "</function>", "</parameter>"
MAX_NAME = 256  # characters of a function or parameter name: past that, no name is coming


def string_parameters(parameters: Mapping[str, dict | None]) -> dict[str, frozenset[str]]:
    """Per tool name (`parameters`: each tool's parameters schema), its parameters whose schema
    type is (or includes) "string"."""
    out = {}
    for name, schema in parameters.items():
        properties = (schema or {}).get("properties")
        out[name] = frozenset(
            key for key, prop in (properties if isinstance(properties, dict) else {}).items()
            if isinstance(prop, dict) and (prop.get("type") == "string"
                                           or isinstance(prop.get("type"), list) and "string" in prop["type"]))
    return out


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _json_value(text: str) -> str:
    """A parameter that is not typed a string: its JSON in canonical spacing when it is JSON,
    else the text as a JSON string."""
    reader, pieces = JsonReader(), []
    for c in text.strip() + " ":  # the space ends a bare number
        piece = reader.step(c)
        if piece is None:
            return json.dumps(text, ensure_ascii=False)
        pieces.append(piece)
    return "".join(pieces) if reader.done and text.strip() else json.dumps(text, ensure_ascii=False)


class Qwen3CoderParser:
    """`<tool_call><function=NAME><parameter=KEY>value</parameter>...</function></tool_call>`
    blocks, any number, anywhere in the text (Qwen3-Coder). `strings`: per tool, its string-typed
    parameters (streamed as they are written). Content is trimmed where calls were (`Content`)."""

    def __init__(self, names: Set[str], strings: Mapping[str, Set[str]] | None = None) -> None:
        self.names, self.strings = names, strings or {}
        self._buf = ""  # text not yet given out
        self._state = "text"  # text | block | function | value | after | broken
        self._name = ""  # the started call's function
        self._members = 0  # parameters given so far
        self._string = False  # the value being read is a string, streamed
        self._lead = False  # the value's first character is still to be seen (a newline there is layout)
        self._content = Content()

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while getattr(self, "_" + self._state)(out):
            pass
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self._state in ("text", "broken"):
            self._content.text(self._buf, out)  # broken: no closing tag came after the break
        elif self._state == "block":
            self._content.text(OPEN + self._buf, out)
        elif self._state == "value" and self._string and self._buf:
            out.append(CallArgs(_escaped(self._buf)))  # cut short: the arguments stay unfinished
        self._buf, self._state = "", "text"
        self._content.finish(out)
        return out

    def _text(self, out: list[Event]) -> bool:
        self._buf, found = self._content.until(self._buf, OPEN, out)
        if found:
            self._buf, self._state = self._buf[len(OPEN):], "block"
        return found

    def _block(self, out: list[Event]) -> bool:
        """After `<tool_call>`: a tool's `<function=NAME>`, or the block is content."""
        body = self._buf.lstrip()
        name, end = self._tag(body, FUNCTION)
        if name is None:
            if end < 0:
                return False
            self._content.text(OPEN, out)  # not a call: the block is text, as written
            self._state = "text"
            return True
        if name not in self.names:
            self._content.text(OPEN, out)
            self._state = "text"
            return True
        self._content.call([CallStart(name), CallArgs("{")], out)
        self._buf, self._state, self._name, self._members = body[end:], "function", name, 0
        return True

    def _tag(self, body: str, opening: str) -> tuple[str | None, int]:
        """`body` opens with `opening` NAME `>`: (NAME, where the tag ends); (None, -1) while that
        may still come, (None, 0) when it cannot."""
        if not body.startswith(opening):
            return None, (-1 if opening.startswith(body) else 0)
        end = body.find(">", len(opening))
        if end < 0:
            return None, (-1 if len(body) - len(opening) <= MAX_NAME else 0)
        return body[len(opening):end], end + 1

    def _function(self, out: list[Event]) -> bool:
        """In a call: a parameter, or its end."""
        body = self._buf.lstrip()
        key, end = self._tag(body, PARAMETER)
        if key is not None:
            comma = ", " if self._members else ""
            self._string = key in self.strings.get(self._name, ())
            out.append(CallArgs(comma + json.dumps(key, ensure_ascii=False) + ": " + ('"' if self._string else "")))
            self._buf, self._state, self._lead = body[end:], "value", True
            return True
        for tag, state in ((END_FUNCTION, "after"), (CLOSE, "text")):  # a missing </function> is forgiven
            if body.startswith(tag):
                out.append(CallArgs("}"))
                self._buf, self._state = body[len(tag):], state
                return True
        if end < 0 or any(tag.startswith(body) for tag in (END_FUNCTION, CLOSE)):
            return False
        self._state = "broken"
        return True

    def _value(self, out: list[Event]) -> bool:
        if self._lead:
            if not self._buf:
                return False
            self._buf, self._lead = self._buf.removeprefix("\n"), False
        at = self._buf.find(END_PARAMETER)
        if at < 0:
            if self._string:  # all but what may be the closing tag (and the newline before it)
                keep = len(self._buf) - max(partial_tag(self._buf, "\n" + END_PARAMETER),
                                            partial_tag(self._buf, END_PARAMETER))
                if keep:
                    out.append(CallArgs(_escaped(self._buf[:keep])))
                    self._buf = self._buf[keep:]
            return False
        value = self._buf[:at].removesuffix("\n")
        out.append(CallArgs(_escaped(value) + '"' if self._string else _json_value(value)))
        self._buf, self._state = self._buf[at + len(END_PARAMETER):], "function"
        self._members += 1
        return True

    def _after(self, out: list[Event]) -> bool:
        """After `</function>`: the block's closing tag, or text (a model that left it out)."""
        body = self._buf.lstrip()
        if body.startswith(CLOSE):
            self._buf, self._state = body[len(CLOSE):], "text"
            return True
        if not body or CLOSE.startswith(body):
            return False
        self._state = "text"
        return True

    def _broken(self, out: list[Event]) -> bool:
        """After a break in a started call: the block's rest is dropped up to its closing tag;
        up to a new block, it is content."""
        close, again = self._buf.find(CLOSE), self._buf.find(OPEN)
        if close >= 0 and (again < 0 or close < again):
            self._buf, self._state = self._buf[close + len(CLOSE):], "text"
            return True
        if again >= 0:
            self._content.text(self._buf[:again], out)
            self._buf, self._state = self._buf[again:], "text"
            return True
        return False
