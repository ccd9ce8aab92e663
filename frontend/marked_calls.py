"""Tool calls between special-token markers, each a header naming the function and a JSON
arguments object: DeepSeek-V3's / R1's (`--tool-call-parser deepseek_v3`)

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

DeepSeek-V3.1's (`deepseek_v31`)

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

and Kimi K2's (`kimi_k2`)

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

Any number of calls in a section, and sections anywhere in the text. A call starts once its
header names one of the tools and its arguments open, and its arguments stream as they are written
(ArgsReader). A section whose first call does not name a tool (or is not a call) is content as
written; after a call, text that breaks the call or the section drops the section's rest up to its
closing marker (content when none comes), as in the other formats. Text after the section is
content, trimmed where calls were (`Content`).
"""
from __future__ import annotations

from collections.abc import Set

from radixflow.frontend.call_stream import ArgsReader
from radixflow.frontend.tool_calls import Content, Event, StateParser
from radixflow.runtime.text.reasoning import partial_tag

MAX_NAME = 256  # characters of a header: past that, no call is coming
DEEPSEEK_SECTION = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
DEEPSEEK_CALL = ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
DEEPSEEK_SEP = "<｜tool▁sep｜>"
KIMI_SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
KIMI_OLD_SECTION = ("<|tool_call_section_begin|>", "<|tool_call_section_end|>")  # a spelling some Kimi outputs use
KIMI_CALL = ("<|tool_call_begin|>", "<|tool_call_end|>")
KIMI_ARGS = "<|tool_call_argument_begin|>"

WAIT, NO = -1, 0  # a header's verdicts besides its arguments' start: more text may make it one; it cannot


def _first(buf: str, markers: tuple[str, ...], start: int) -> tuple[int, str]:
    """Where in `buf` (from `start`) the first of `markers` is, and which; (-1, "") when none is."""
    found = [(at, m) for m in markers if (at := buf.find(m, start)) >= 0]
    return min(found) if found else (-1, "")


def _prefix(body: str, part: str) -> int | None:
    """`body` opens with `part`: its length; WAIT while `body` is a proper prefix of it; None when not."""
    if body.startswith(part):
        return len(part)
    return WAIT if part.startswith(body) else None


class _MarkedCallsParser(StateParser):
    """Sections of calls as states over the buffer (StateParser): `text` (searching for a section's
    opening), `section` (a call's opening or the section's end), `header` (a subclass's
    `_parse_header` reads it), `args` (the arguments, through ArgsReader), `after` (what ends the
    arguments, then the call's closing marker) and `broken` (the section's rest dropped). The
    markers stay in `_buf` until the section's first call starts, so a section that is not calls
    is content as written."""

    openings: tuple[str, ...] = ()  # a section's opening markers
    closings: tuple[str, ...] = ()  # its closing markers
    call_open, call_close = "", ""
    args_suffix = ""  # what may come between the arguments' end and the call's closing (besides whitespace)

    def __init__(self, names: Set[str]) -> None:
        self.names = names
        self._buf = ""
        self._state = "text"
        self._at = 0  # in section / header: where the part being read starts in _buf
        self._calls = 0  # calls started in the open section
        self._reader: ArgsReader | None = None
        self._scan = 0  # broken: where the search for the closing marker goes on
        self._content = Content()

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self._state == "broken":
            self._content.text(self._buf, out)  # no closing marker came after the break
        elif self._state in ("text", "section", "header") and not self._calls:
            self._content.text(self._buf, out)  # no call: as written
        self._buf, self._state, self._calls = "", "text", 0
        self._content.finish(out)
        return out

    def _parse_header(self, body: str) -> tuple[str | None, int]:
        """`body` (from after a call's opening) is its header: (the function's name, where its
        arguments' `{` is); (None, WAIT) while it may still become one, (None, NO) when it cannot."""
        raise NotImplementedError

    def _text(self, out: list[Event]) -> bool:
        at, opening = _first(self._buf, self.openings, 0)
        if at < 0:  # all but what may be an opening's start
            at = len(self._buf) - max(partial_tag(self._buf, m) for m in self.openings)
        self._content.text(self._buf[:at], out)
        self._buf = self._buf[at:]
        if not opening:
            return False
        self._state, self._at, self._calls = "section", len(opening), 0
        return True

    def _section(self, out: list[Event]) -> bool:
        rest = self._buf[self._at:]
        body = rest.lstrip()
        skipped = len(rest) - len(body)
        for marker, state in ((self.call_open, "header"), *((close, "text") for close in self.closings)):
            n = _prefix(body, marker)
            if n is None:
                continue
            if n == WAIT:
                return False
            if state == "text" and not self._calls:  # an empty section: as written
                return self._not_calls(out)
            self._at += skipped + n
            if state == "text":
                self._buf, self._state = self._buf[self._at:], "text"
            else:
                self._state = "header"
            return True
        if not body:
            return False
        return self._not_calls(out) if not self._calls else self._break()

    def _header(self, out: list[Event]) -> bool:
        name, at = self._parse_header(self._buf[self._at:])
        if name is None:
            if at == WAIT:
                return False
            return self._not_calls(out) if not self._calls else self._break()
        if name not in self.names:
            return self._not_calls(out) if not self._calls else self._break()
        self._buf, self._state = self._buf[self._at + at:], "args"
        self._reader = ArgsReader(name)
        return True

    def _args(self, out: list[Event]) -> bool:
        reader = self._reader
        assert reader is not None
        used = self._content.read(reader, self._buf, out)
        self._buf = self._buf[used:]
        if not reader.ended:
            return False
        self._calls += 1
        if reader.broken:
            return self._break()
        self._state = "after"
        return True

    def _after(self, out: list[Event]) -> bool:
        body = self._buf.lstrip()
        if self.args_suffix:
            n = _prefix(body, self.args_suffix)
            if n == WAIT:
                return False
            if n is not None:
                body = body[n:].lstrip()
        n = _prefix(body, self.call_close)
        if n == WAIT or not body:
            return False
        if n is None:
            return self._break()
        self._buf, self._state, self._at = body[n:], "section", 0
        return True

    def _broken(self, out: list[Event]) -> bool:
        """After a break in a started call: the section's rest is dropped up to its closing marker;
        up to a new section, it is content."""
        close, closing = _first(self._buf, self.closings, self._scan)
        again, _ = _first(self._buf, self.openings, self._scan)
        if close >= 0 and (again < 0 or close < again):
            self._buf, self._state = self._buf[close + len(closing):], "text"
            return True
        if again >= 0:
            self._content.text(self._buf[:again], out)
            self._buf, self._state = self._buf[again:], "text"
            return True
        longest = max(len(m) for m in (*self.closings, *self.openings))  # a marker may have begun at the end
        self._scan = max(0, len(self._buf) - longest + 1)
        return False

    def _break(self) -> bool:
        self._state, self._scan = "broken", 0
        return True

    def _not_calls(self, out: list[Event]) -> bool:
        """The open section gave no call: its opening marker is content, and the search goes on after it."""
        opening = next(m for m in self.openings if self._buf.startswith(m))
        self._content.text(opening, out)
        self._buf, self._state = self._buf[len(opening):], "text"
        return True


def _with_args(name: str, body: str, at: int) -> tuple[str | None, int]:
    """A header naming `name` whose last part ends at body[at]: (name, where the arguments' `{` is,
    after whitespace); (None, WAIT) while only whitespace came, (None, NO) when something else follows."""
    after = body[at:].lstrip()
    if not after:
        return None, WAIT
    return (name, len(body) - len(after)) if after[0] == "{" else (None, NO)


def _name_until(body: str, end: str) -> tuple[str | None, int]:
    """`body` opens with a name that `end` closes (within MAX_NAME characters): (the name, where
    `end` starts); (None, WAIT) while it may still come, (None, NO) when it cannot."""
    at = body.find(end, 0, MAX_NAME + len(end))
    if at < 0:
        return None, (WAIT if len(body) < MAX_NAME + len(end) else NO)
    return body[:at].strip(), at


class DeepSeekV3Parser(_MarkedCallsParser):
    """DeepSeek-V3 and R1: `function<｜tool▁sep｜>NAME`, a newline, and the arguments in a
    ```json fence."""

    openings, closings = (DEEPSEEK_SECTION[0],), (DEEPSEEK_SECTION[1],)
    call_open, call_close = DEEPSEEK_CALL
    args_suffix = "```"

    def _parse_header(self, body: str) -> tuple[str | None, int]:
        n = _prefix(body, "function" + DEEPSEEK_SEP)
        if n is None or n == WAIT:
            return None, NO if n is None else WAIT
        name, at = _name_until(body[n:], "\n")
        if name is None:
            return None, at
        at += n
        rest = body[at:].lstrip()
        fence = _prefix(rest, "```json")
        if fence is None or fence == WAIT:
            return None, NO if fence is None else WAIT
        return _with_args(name, body, len(body) - len(rest) + fence)


class DeepSeekV31Parser(_MarkedCallsParser):
    """DeepSeek-V3.1: `NAME<｜tool▁sep｜>` and the arguments."""

    openings, closings = (DEEPSEEK_SECTION[0],), (DEEPSEEK_SECTION[1],)
    call_open, call_close = DEEPSEEK_CALL

    def _parse_header(self, body: str) -> tuple[str | None, int]:
        name, at = _name_until(body, DEEPSEEK_SEP)
        return (None, at) if name is None else _with_args(name, body, at + len(DEEPSEEK_SEP))


class KimiK2Parser(_MarkedCallsParser):
    """Kimi K2: `functions.NAME:INDEX<|tool_call_argument_begin|>` and the arguments (the call's id
    is not kept: the response gives each call an id of its own); its sections' markers in either
    spelling (`tool_calls_section` or `tool_call_section`)."""

    openings, closings = (KIMI_SECTION[0], KIMI_OLD_SECTION[0]), (KIMI_SECTION[1], KIMI_OLD_SECTION[1])
    call_open, call_close = KIMI_CALL

    def _parse_header(self, body: str) -> tuple[str | None, int]:
        head, at = _name_until(body, KIMI_ARGS)
        if head is None:
            return None, at
        name = head.removeprefix("functions.")
        return _with_args(name.rsplit(":", 1)[0] if ":" in name else name, body, at + len(KIMI_ARGS))
