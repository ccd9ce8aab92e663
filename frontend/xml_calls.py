"""Tool calls in XML-like blocks whose parameter values are raw text, turned into a JSON
arguments object as they are written: Qwen3-Coder's (`--tool-call-parser qwen3_coder`)

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

GLM-4.5's and 4.7's (`glm45`, `glm47`)

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

and MiniMax-M2's (`minimax_m2`), several calls in one block

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

A call starts once its function names one of the tools, and its arguments open with it. A
parameter whose schema type is "string" streams as a JSON string while it is written; any other
value is read when its closing tag comes: as JSON when it is JSON (or a Python literal JSON can
hold), else as a string. Whitespace around a value is layout, not value (Qwen3-Coder: one newline
each side; GLM: all of it). A block that does not open with a tool's function is content as
written; after a call started, text that is not a parameter or a closing tag ends its arguments
there and the rest of the block is dropped (content when no closing tag comes), as in the JSON
formats (call_stream.py).
"""
from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Set

from radixflow.frontend.json_stream import JsonReader
from radixflow.frontend.tool_calls import CLOSE, OPEN, CallArgs, CallStart, Content, Event, StateParser
from radixflow.runtime.text.reasoning import partial_tag

FUNCTION, PARAMETER = "<function=", "<parameter="
END_FUNCTION, END_PARAMETER = "</function>", "</parameter>"
ARG_KEY, END_ARG_KEY, ARG_VALUE, END_ARG_VALUE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
MINIMAX_OPEN, MINIMAX_CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE, NAMED_PARAMETER, END_INVOKE = "<invoke name=", "<parameter name=", "</invoke>"
MAX_NAME = 256  # characters of a function or parameter name: past that, no name is coming


def string_parameters(parameters: Mapping[str, dict | None]) -> dict[str, frozenset[str]]:
    """Per tool name (`parameters`: each tool's parameters schema), its string-typed parameters."""
    out = {}
    for name, schema in parameters.items():
        properties = (schema or {}).get("properties")
        out[name] = frozenset(key for key, prop in (properties if isinstance(properties, dict) else {}).items()
                              if _is_string(prop))
    return out


def _is_string(schema: object) -> bool:
    """The schema's type is or includes "string", itself or in one of its anyOf / oneOf members
    (pydantic's Optional[str])."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "string" or isinstance(kind, list) and "string" in kind:
        return True
    return any(_is_string(member) for key in ("anyOf", "oneOf") for member in schema.get(key) or ())


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _json_value(text: str) -> str:
    """A parameter that is not typed a string: its JSON in canonical spacing when it is JSON, else
    the Python literal's JSON when it is one JSON can hold (`True`, `{'a': 1}`), else the text as
    a JSON string."""
    reader, pieces = JsonReader(), []
    for c in text.strip() + " ":  # the space ends a bare number
        piece = reader.step(c)
        if piece is None:
            break
        pieces.append(piece)
    if reader.done and text.strip():
        return "".join(pieces)
    try:
        return json.dumps(ast.literal_eval(text.strip()), ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return json.dumps(text, ensure_ascii=False)


class _XmlCallsParser(StateParser):
    """`<tool_call>` blocks, any number, anywhere in the text, as states over the buffer: a
    subclass reads the function (`_block`) and each parameter's key (`_function`); values, the
    block's end and breaks are read here. `strings`: per tool, its string-typed parameters
    (streamed as they are written). Content is trimmed where calls were (`Content`)."""

    block_open, block_close = OPEN, CLOSE  # a block's tags
    end_value = ""  # the closing tag of a value
    strip_all = False  # all whitespace around a value is layout (else one newline each side)

    def __init__(self, names: Set[str], strings: Mapping[str, Set[str]] | None = None) -> None:
        self.names, self.strings = names, strings or {}
        self._buf = ""  # text not yet given out
        self._state = "text"  # text | block | function | value | after | broken
        self._name = ""  # the started call's function
        self._members = 0  # parameters given so far
        self._string = False  # the value being read is a string, streamed
        self._lead = False  # the value's first character is still to be seen (a newline there is layout)
        self._scan = 0  # in a value or after a break: where the search for the closing tag goes on
        self._content = Content()

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self._state in ("text", "broken"):
            self._content.text(self._buf, out)  # broken: no closing tag came after the break
        elif self._state == "block":
            self._content.text(self.block_open + self._buf, out)
        elif self._state == "value" and self._buf.strip():  # cut short: the arguments stay unfinished
            out.append(CallArgs(_escaped(self._buf) if self._string else _json_value(self._buf)))
        self._buf, self._state = "", "text"
        self._content.finish(out)
        return out

    def _text(self, out: list[Event]) -> bool:
        self._buf, found = self._content.until(self._buf, self.block_open, out)
        if found:
            self._buf, self._state = self._buf[len(self.block_open):], "block"
        return found

    def _start(self, name: str, body: str, out: list[Event]) -> bool:
        """The block names `name` and goes on with `body`: a call when it is a tool's, else text."""
        if name not in self.names:
            return self._not_a_call(out)
        self._content.call([CallStart(name), CallArgs("{")], out)
        self._buf, self._state, self._name, self._members = body, "function", name, 0
        return True

    def _not_a_call(self, out: list[Event]) -> bool:
        self._content.text(self.block_open, out)  # the block is text, as written
        self._state = "text"
        return True

    def _key(self, key: str, body: str, out: list[Event]) -> bool:
        """A parameter named `key` opens; its value is `body` on."""
        comma = ", " if self._members else ""
        self._string = key in self.strings.get(self._name, ())
        out.append(CallArgs(comma + json.dumps(key, ensure_ascii=False) + ": " + ('"' if self._string else "")))
        self._buf, self._state, self._lead, self._scan = body, "value", True, 0
        return True

    def _close(self, body: str, tags: tuple[tuple[str, str], ...], out: list[Event]) -> bool | None:
        """The call's end: `body` opens with one of `tags` (a tag, the state after it): the
        arguments close. None while `body` may still be one, False when it cannot."""
        for tag, state in tags:
            if body.startswith(tag):
                out.append(CallArgs("}"))
                self._buf, self._state = body[len(tag):], state
                return True
        if not body or any(tag.startswith(body) for tag, _ in tags):
            return None
        return False

    def _value(self, out: list[Event]) -> bool:
        if self._lead:  # GLM: all leading whitespace; Qwen3-Coder: one newline, once it has come
            if not self._buf:
                return False
            self._buf = self._buf.lstrip() if self.strip_all else self._buf.removeprefix("\n")
            self._lead = self.strip_all and not self._buf
            if self._lead:
                return False
        at = self._buf.find(self.end_value, self._scan)
        if at < 0:
            self._scan = max(0, len(self._buf) - len(self.end_value) + 1)
            if self._string:  # all but what may be the closing tag (and the layout before it)
                keep = len(self._buf) - self._held()
                if keep:
                    out.append(CallArgs(_escaped(self._buf[:keep])))
                    self._buf, self._scan = self._buf[keep:], 0
            return False
        value, self._scan = self._buf[:at], 0
        value = value.rstrip() if self.strip_all else value.removesuffix("\n")
        out.append(CallArgs(_escaped(value) + '"' if self._string else _json_value(value)))
        self._buf, self._state = self._buf[at + len(self.end_value):], "function"
        self._members += 1
        return True

    def _held(self) -> int:
        """How much of a string value's end to hold back: a possible closing tag, and the layout
        that may come before it."""
        if not self.strip_all:
            return max(partial_tag(self._buf, "\n" + self.end_value), partial_tag(self._buf, self.end_value))
        body = self._buf[:len(self._buf) - partial_tag(self._buf, self.end_value)]
        return len(self._buf) - len(body.rstrip())

    def _after(self, out: list[Event]) -> bool:
        """After `</function>`: the block's closing tag, or text (a model that left it out)."""
        body = self._buf.lstrip()
        if body.startswith(self.block_close):
            self._buf, self._state = body[len(self.block_close):], "text"
            return True
        if not body or self.block_close.startswith(body):
            return False
        self._state = "text"
        return True

    def _broken(self, out: list[Event]) -> bool:
        """After a break in a started call: the block's rest is dropped up to its closing tag;
        up to a new block, it is content."""
        close, again = self._buf.find(self.block_close, self._scan), self._buf.find(self.block_open, self._scan)
        if close >= 0 and (again < 0 or close < again):
            self._buf, self._state = self._buf[close + len(self.block_close):], "text"
            return True
        if again >= 0:
            self._content.text(self._buf[:again], out)
            self._buf, self._state = self._buf[again:], "text"
            return True
        self._scan = max(0, len(self._buf) - len(self.block_close) + 1)
        return False

    def _break(self) -> bool:
        self._state, self._scan = "broken", 0
        return True


def _tag(body: str, opening: str) -> tuple[str | None, int]:
    """`body` opens with `opening` NAME `>`: (NAME, where the tag ends); (None, -1) while that may
    still come, (None, 0) when it cannot."""
    if not body.startswith(opening):
        return None, (-1 if opening.startswith(body) else 0)
    end = body.find(">", len(opening), len(opening) + MAX_NAME + 1)
    if end < 0:
        return None, (-1 if len(body) - len(opening) <= MAX_NAME else 0)
    return body[len(opening):end], end + 1


class Qwen3CoderParser(_XmlCallsParser):
    """Qwen3-Coder: `<tool_call><function=NAME><parameter=KEY>value</parameter>...</function>
    </tool_call>`; a missing `</function>` is forgiven."""

    end_value = END_PARAMETER

    def _block(self, out: list[Event]) -> bool:
        body = self._buf.lstrip()
        name, end = _tag(body, FUNCTION)
        if name is None:
            return False if end < 0 else self._not_a_call(out)
        return self._start(name, body[end:], out)

    def _function(self, out: list[Event]) -> bool:
        body = self._buf.lstrip()
        key, end = _tag(body, PARAMETER)
        if key is not None:
            return self._key(key, body[end:], out)
        closed = self._close(body, ((END_FUNCTION, "after"), (self.block_close, "text")), out)
        if closed or closed is None or end < 0:
            return bool(closed)
        return self._break()


class Glm45Parser(_XmlCallsParser):
    """GLM-4.5 and 4.7: `<tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>value</arg_value>
    ...</tool_call>` (4.7 may write the first key right after the name); keys and values are
    stripped of whitespace."""

    end_value = END_ARG_VALUE
    strip_all = True

    def _block(self, out: list[Event]) -> bool:
        body = self._buf.lstrip()
        ends = [at for at in (body.find("\n"), body.find(ARG_KEY), body.find(self.block_close)) if at >= 0]
        at = min(ends, default=len(body))
        if at > MAX_NAME:
            return self._not_a_call(out)
        return self._start(body[:at].strip(), body[at:], out) if ends else False

    def _function(self, out: list[Event]) -> bool:
        body = self._buf.lstrip()
        if body.startswith(ARG_KEY):
            end = body.find(END_ARG_KEY, len(ARG_KEY), len(ARG_KEY) + MAX_NAME + len(END_ARG_KEY))
            if end < 0:
                return False if len(body) < len(ARG_KEY) + MAX_NAME + len(END_ARG_KEY) else self._break()
            rest = body[end + len(END_ARG_KEY):].lstrip()
            if rest.startswith(ARG_VALUE):
                return self._key(body[len(ARG_KEY):end].strip(), rest[len(ARG_VALUE):], out)
            return False if ARG_VALUE.startswith(rest) else self._break()
        closed = self._close(body, ((self.block_close, "text"),), out)
        if closed or closed is None or ARG_KEY.startswith(body):
            return bool(closed)
        return self._break()


def _unquoted(name: str) -> str:
    """A tag attribute's value without the quotes around it."""
    name = name.strip()
    return name[1:-1] if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'" else name


class MiniMaxM2Parser(_XmlCallsParser):
    """MiniMax-M2: `<minimax:tool_call><invoke name="NAME"><parameter name="KEY">value</parameter>
    ...</invoke>...</minimax:tool_call>`, any number of invokes in a block; a missing `</invoke>`
    is forgiven (before the block's end or the next invoke), and an invoke of no tool after a call
    breaks the block (its rest is dropped)."""

    block_open, block_close = MINIMAX_OPEN, MINIMAX_CLOSE
    end_value = END_PARAMETER

    def __init__(self, names: Set[str], strings: Mapping[str, Set[str]] | None = None) -> None:
        super().__init__(names, strings)
        self._inner = False  # a call of this block came before: an invoke now is not the block's opening

    def _block(self, out: list[Event]) -> bool:
        body = self._buf.lstrip()
        name, end = _tag(body, INVOKE)
        if name is None:
            return False if end < 0 else (self._break() if self._inner else self._not_a_call(out))
        if self._inner and _unquoted(name) not in self.names:
            return self._break()
        return self._start(_unquoted(name), body[end:], out)

    def _text(self, out: list[Event]) -> bool:
        self._inner = False
        return super()._text(out)

    def _function(self, out: list[Event]) -> bool:
        body = self._buf.lstrip()
        key, end = _tag(body, NAMED_PARAMETER)
        if key is not None:
            return self._key(_unquoted(key), body[end:], out)
        # the call's end: its </invoke>, the block's end, or (</invoke> left out) the next invoke
        closed = self._close(body, ((END_INVOKE, "after"), (self.block_close, "text"), (INVOKE, "block")), out)
        if closed and self._state == "block":
            self._buf, self._inner = INVOKE + self._buf, True
        if closed or closed is None or end < 0:
            return bool(closed)
        return self._break()

    def _after(self, out: list[Event]) -> bool:
        """After `</invoke>`: the block's next invoke, its closing tag, or text (a model that left
        the closing tag out)."""
        body = self._buf.lstrip()
        if body.startswith(INVOKE):
            self._buf, self._state, self._inner = body, "block", True
            return True
        if not body or any(tag.startswith(body) for tag in (INVOKE, self.block_close)):
            return False
        return super()._after(out)
