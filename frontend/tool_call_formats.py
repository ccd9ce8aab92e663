"""The call formats tool_choice "auto" can parse (`radixflow serve --tool-call-parser`): Hermes
(tool_calls.py), Llama 3 JSON, Mistral `[TOOL_CALLS]`, Granite `<tool_call>[...]`, pythonic lists,
the XML-like blocks of Qwen3-Coder, GLM-4.5 / 4.7 and MiniMax-M2 (xml_calls.py), gpt-oss's
harmony messages (harmony.py), and the marked sections of DeepSeek-V3 / V3.1 and Kimi K2
(marked_calls.py).

The middle four write their calls as a bracketed value (an object, a list) where the output starts
(Llama 3.2: several objects, `;` between; Mistral: also after its marker). Such a value is held
back from its opening bracket: the JSON formats read it as it comes (call_stream.py: a call
starts once its name and its arguments' opening are read, and its arguments stream), pythonic
lists are parsed when they close. A value that gave no call is content as written (an unclosed
one too). Text that cannot start a call streams as it comes; each parser gives its content and
calls through `Content` (the whitespace rules Hermes has).
"""
from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping, Set

from radixflow.frontend.harmony import HarmonyChoiceParser
from radixflow.frontend.marked_calls import DeepSeekV3Parser, DeepSeekV31Parser, KimiK2Parser
from radixflow.frontend.xml_calls import Glm45Parser, MiniMaxM2Parser, Qwen3CoderParser
from radixflow.frontend.tool_calls import (
    ArgsReader, Call, CallListReader, CallReader, Content, Event, FirstCallOnly, HermesParser, Parser, StateParser,
    call_events,
)


class _Value:
    """A bracketed value held back in a parser's buffer, opened at `start`: where it closes is
    found as the buffer grows, each character read once. ( [ { open and ) ] } close outside
    strings (quoted by one of `quotes`, with backslash escapes); mismatched brackets count as
    matching, and the parse that follows rejects what they close."""

    def __init__(self, start: int, quotes: str) -> None:
        self.start = self._read = start
        self._quotes = quotes
        self._depth = 0
        self._quote = ""  # the quote of the string being read, "" outside strings
        self._escaped = False

    def end(self, buf: str) -> int:
        """Read buf on from where the last call stopped; the index just past the value, or -1."""
        for i in range(self._read, len(buf)):
            c = buf[i]
            if self._quote:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == self._quote:
                    self._quote = ""
            elif c in self._quotes:
                self._quote = c
            elif c in "([{":
                self._depth += 1
            elif c in ")]}":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        self._read = len(buf)
        return -1


class _ValueParser(StateParser):
    """A format that writes its calls as a bracketed value (StateParser's states). A subclass has
    `_start` (what the output opens with) and either `_reader` (a fresh reader of a value as it
    comes) or `_calls` (a closed value's calls, or None when it is not calls of the tools)."""

    quotes = '"'  # the string quotes of the values
    after = "text"  # the state after a value that was calls

    def __init__(self, names: Set[str]) -> None:
        self.names = names
        self._buf = ""  # text not yet given out
        self._state = "start"  # start | held (a value read on) | text | a format's own (gap, marker)
        self._value: _Value | None = None
        self._reading: CallReader | CallListReader | ArgsReader | None = None  # the held value's reader
        self._fed = 0  # how much of _buf the reader read
        self._value_at = 0  # where in _buf the held value starts
        self._content = Content()

    def finish(self) -> list[Event]:
        out: list[Event] = []
        reader = self._reading if self._state == "held" else None
        if reader is not None:  # the output ended inside the value
            if reader.broken:
                self._buf = self._buf[self._fed:]  # the value never closed: the text after the break
            elif _calls_given(reader):  # a call cut short, or the calls before an unfinished item
                item = reader.item if isinstance(reader, CallListReader) else None
                self._buf = "" if item is None or item.started else self._buf[self._value_at + reader.item_at:]
        if self._state != "gap":  # a gap holds only a separator: dropped
            self._content.text(self._buf, out)  # an unclosed value too, as written
        self._buf, self._state = "", "text"
        self._content.finish(out)
        return out

    def _start(self, out: list[Event]) -> bool:
        raise NotImplementedError

    def _reader(self) -> CallReader | CallListReader | ArgsReader | None:
        return None

    def _calls(self, value: str) -> list[Call] | None:
        raise NotImplementedError

    def _hold(self, start: int, reader: ArgsReader | None = None) -> None:
        self._value, self._state = _Value(start, self.quotes), "held"
        self._reading, self._fed, self._value_at = reader or self._reader(), start, start

    def _open(self, body: str, bracket: str) -> bool:
        """`body` is the buffer's tail past any whitespace (and marker): hold the value it opens
        with `bracket`, else read it as text; False while it is empty (nothing to decide yet)."""
        if not body:
            return False
        if body[0] == bracket:
            self._hold(len(self._buf) - len(body))
        else:
            self._state = "text"
        return True

    def _held(self, out: list[Event]) -> bool:
        value, reader = self._value, self._reading
        assert value is not None
        if reader is None:  # read whole when it closes
            end = value.end(self._buf)
            if end < 0:
                return False
            calls = self._calls(self._buf[value.start:end])
            for call in calls or ():
                self._content.call(call_events(call), out)
            return self._after(end, bool(calls), out)
        if not reader.ended:
            self._fed += self._content.read(reader, self._buf[self._fed:], out)
            if not reader.ended:
                return False
        if reader.broken:  # the rest of the value is dropped, once it closes
            end = value.end(self._buf)
            return end >= 0 and self._after(end, True, out)
        given = _calls_given(reader)
        if isinstance(reader, CallListReader) and reader.refused and given:  # the rest is content, as written
            self._content.text(self._buf[self._value_at + reader.refused_at:self._fed], out)
            self._buf, self._state = self._buf[self._fed:], "text"
            return True
        return self._after(self._fed, given and not reader.refused, out)

    def _after(self, end: int, given: bool, out: list[Event]) -> bool:
        """The value ended before _buf[end]: it gave calls, or it is content as written."""
        if not given:
            self._content.text(self._buf[:end], out)  # with what led to it
        self._buf, self._state = self._buf[end:], self.after if given else "text"
        return True

    def _text(self, out: list[Event]) -> bool:
        self._content.text(self._buf, out)
        self._buf = ""
        return False


def _calls_given(reader: CallReader | CallListReader | ArgsReader) -> bool:
    return reader.calls > 0 if isinstance(reader, CallListReader) else reader.started


PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(_ValueParser):
    """Llama 3.1 / 3.2: the output is `{"name": ..., "parameters": {...}}` ("arguments" taken too),
    after an optional `<|python_tag|>`; Llama 3.2 separates several calls with `;`. Each object
    is read as it comes (CallReader). Output that does not start with an object is content; so
    is the first object that gives no call, and everything after it."""

    after = "gap"

    def _start(self, out: list[Event]) -> bool:
        body = self._buf.lstrip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):].lstrip()
        elif PYTHON_TAG.startswith(body):
            return False  # nothing yet, or maybe the tag
        return self._open(body, "{")

    def _reader(self) -> CallReader:
        return CallReader(self.names, ("parameters", "arguments"))

    def _gap(self, out: list[Event]) -> bool:
        """After a call: `;` and the next object, or the rest as content (with the `;`, unless
        only whitespace follows it)."""
        body = self._buf.lstrip()
        if body.startswith(";"):
            after = body[1:].lstrip()
            if not after:
                return False
            if after[0] == "{":
                self._buf = after
                self._hold(0)
                return True
        elif not body:
            return False
        self._buf, self._state = body, "text"
        return True


TOOL_CALLS = "[TOOL_CALLS]"
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # OpenAI's function names (and dots)
CALL_ID = re.compile(r"[A-Za-z0-9]{0,64}")


def _named_call(body: str) -> tuple[str | None, int]:
    """`body` (after the marker) is `NAME[CALL_ID]id[ARGS]{`, both tags optional: (NAME, where
    its `{` is); (None, -1) while it may still become one, (None, 0) when it cannot."""
    name = TOOL_NAME.match(body)
    if name is None:
        return None, 0
    at = name.end()
    for tag, then in (("[CALL_ID]", CALL_ID), ("[ARGS]", None)):
        rest = body[at:]
        if rest.startswith(tag):
            at += len(tag)
            if then is not None:
                at = then.match(body, at).end()
        elif tag.startswith(rest) or (not rest.strip() and tag == "[ARGS]"):
            return None, -1  # the name, the id or the tag may still go on
    at += len(body[at:]) - len(body[at:].lstrip())
    if at == len(body):
        return None, -1
    return (name.group(), at) if body[at] == "{" else (None, 0)


class MistralParser(_ValueParser):
    """Mistral: `[TOOL_CALLS]` and a JSON list of {"name", "arguments"} objects, after content or
    none; or, from tokenizer v11 on (Mistral Small 3.1+, Devstral, Magistral), `[TOOL_CALLS]NAME
    [ARGS]{...}` per call (`[CALL_ID]id` may come before `[ARGS]`). `[TOOL_CALLS]` and `[ARGS]` are
    special tokens: the chat route keeps them in the text under this parser (tools.py), and a
    list that starts the output is read as calls too, in case a request drops them. A list is
    read as it comes (CallListReader): its items are calls until one is not a call of the tools,
    which with the rest of the list is content as written (the whole list when no call came
    before it); a named call's arguments stream as they are written (ArgsReader). Text after
    the calls is content (and may hold another marker)."""

    def _start(self, out: list[Event]) -> bool:
        body = self._buf.lstrip()
        if not body or (len(body) < len(TOOL_CALLS) and TOOL_CALLS.startswith(body)):
            return False  # nothing yet, or maybe the marker
        if body[0] == "[" and not body.startswith(TOOL_CALLS):
            self._hold(len(self._buf) - len(body))
        else:
            self._state = "text"
        return True

    def _text(self, out: list[Event]) -> bool:
        self._buf, found = self._content.until(self._buf, TOOL_CALLS, out)
        if found:
            self._state = "marker"
        return found

    def _marker(self, out: list[Event]) -> bool:
        """The buffer starts with the marker: a list or a tool's name follows, or the marker is content."""
        body = self._buf[len(TOOL_CALLS):].lstrip()
        if not body:
            return False
        if body[0] == "[":
            self._hold(len(self._buf) - len(body))
            return True
        name, at = _named_call(body)
        if name is None and at < 0:
            return False
        if name is not None and name in self.names:
            self._hold(len(self._buf) - len(body) + at, ArgsReader(name))
        else:  # the search goes on after it
            self._content.text(TOOL_CALLS, out)
            self._buf, self._state = self._buf[len(TOOL_CALLS):], "text"
        return True

    def _reader(self) -> CallListReader:
        return CallListReader(self.names)


GRANITE_MARKERS = ("<|tool_call|>", "<tool_call>")  # Granite 3.0's special token, 3.1+'s text


class GraniteParser(_ValueParser):
    """IBM Granite 3: the output opens with `<|tool_call|>` (3.0, a special token) or `<tool_call>`
    (3.1+) and a JSON list of {"name", "arguments"} objects, read as it comes like Mistral's
    (CallListReader); a bare list at the start is read too (the special token skipped). A marker
    after other text, or before anything but a list, is content; text after the list is content."""

    MARKERS: tuple[str, ...] = GRANITE_MARKERS

    def _start(self, out: list[Event]) -> bool:
        body = self._buf.lstrip()
        for marker in self.MARKERS:
            if body.startswith(marker):
                return self._open(body[len(marker):].lstrip(), "[")
            if body and marker.startswith(body):
                return False  # maybe the marker, not yet whole
        return self._open(body, "[")

    def _reader(self) -> CallListReader:
        return CallListReader(self.names)


class Phi4MiniParser(GraniteParser):
    """Phi-4-mini: the output opens with `functools` and a JSON list of {"name", "arguments"}
    objects (`functools[{...}, ...]`), read as Granite's is (a bare list at the start too; the
    marker after other text is content)."""

    MARKERS = ("functools",)


class PythonicParser(_ValueParser):
    """Llama 3.2 / 4 pythonic calls: the output starts with a Python list of calls,
    `[get_weather(city="Paris"), add(a=1)]`, keyword arguments whose values are literals (read
    with `ast`, never evaluated). The list is given whole when it closes: all calls, or content as
    written when any item is not such a call of a tool. Text after it is content; output that
    does not start with `[` is content."""

    quotes = "'\""

    def _start(self, out: list[Event]) -> bool:
        return self._open(self._buf.lstrip(), "[")

    def _calls(self, value: str) -> list[Call] | None:
        return python_calls(value, self.names)


def python_calls(source: str, names: Set[str]) -> list[Call] | None:
    """The calls of a Python list of calls with literal keyword arguments, or None."""
    try:
        tree = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names
                and not node.args and all(k.arg is not None for k in node.keywords)):
            return None
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None  # not a literal, or not one JSON can hold (a set, bytes, inf)
        calls.append(Call(node.func.id, text))
    return calls


PARSERS: dict[str, Callable[[Set[str]], Parser]] = {
    "hermes": HermesParser, "llama3_json": Llama3JsonParser, "mistral": MistralParser, "pythonic": PythonicParser,
    "qwen3_coder": Qwen3CoderParser, "glm45": Glm45Parser, "glm47": Glm45Parser, "granite": GraniteParser,
    "phi4_mini_json": Phi4MiniParser, "gpt_oss": lambda names: HarmonyChoiceParser(names, reasoning=False),
    "minimax_m2": MiniMaxM2Parser, "deepseek_v3": DeepSeekV3Parser, "deepseek_v31": DeepSeekV31Parser,
    "kimi_k2": KimiK2Parser,
}
TYPED = (Qwen3CoderParser, Glm45Parser, MiniMaxM2Parser)  # the formats whose values are raw text: they need the parameters' types


# other servers' names for a format: gpt-oss's is SGLang's gpt-oss and vLLM's openai; DeepSeek's
# are SGLang's deepseekv3 / deepseekv31
ALIASES = {"gpt-oss": "gpt_oss", "openai": "gpt_oss", "deepseekv3": "deepseek_v3", "deepseekv31": "deepseek_v31"}
# the formats whose markers are special tokens the text must keep
SPECIAL_TOKEN_FORMATS = ("mistral", "deepseek_v3", "deepseek_v31", "kimi_k2")


def check_parser_name(name: str) -> str:
    """The format `name` means (an alias read as its format); ValueError for an unknown one."""
    name = ALIASES.get(name, name)
    if name not in PARSERS:
        raise ValueError(f"--tool-call-parser must be one of {', '.join(PARSERS)}; got {name!r}")
    return name


def auto_parser(name: str, names: Set[str], parallel: bool, strings: Mapping[str, Set[str]] | None = None) -> Parser:
    """A fresh parser of format `name` (a PARSERS key) for one choice's text under tool_choice
    "auto"; with `parallel` false it gives the first call only. `strings`: per tool, its
    string-typed parameters (the formats whose values are raw text need them)."""
    factory = PARSERS[check_parser_name(name)]
    parser = factory(names, strings) if factory in TYPED else factory(names)
    return parser if parallel else FirstCallOnly(parser)
