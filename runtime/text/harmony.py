"""gpt-oss's output in the harmony format: a sequence of messages, each a header naming its
channel (and, for a tool call, its recipient) and a body, marked by special tokens (so the text
is read with skip_special_tokens false):

    <|channel|>analysis<|message|>The user wants 2 + 2.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2}<|call|>
    <|start|>assistant<|channel|>final<|message|>4<|return|>

The first header follows the prompt's `<|start|>assistant` directly. `analysis` is the model's
reasoning, `final` its answer, `commentary` a tool call when it names a recipient (`to=` before
or after the channel) and a preamble the user sees otherwise. `HarmonyReader` turns the text,
fed in any pieces, into Header / Body events (a marker split across pieces is held back until it
is whole); `HarmonyReasoning` is the reasoning split of `--reasoning-parser gpt_oss` (the
frontend reads tool calls from the same events: frontend/harmony.py).

Text that does not open with a marker (markers stripped, or not a harmony model) is one
headerless message of content; a header that runs past MAX_HEADER characters without its
`<|message|>` is content as written from its start.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from radixflow.runtime.text.reasoning import Thought, partial_tag

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, *ENDS)
MAX_HEADER = 512
# the answer's opening: a constraint (response_format, tools) holds after it
FINAL_OPENING = CHANNEL + "final" + MESSAGE
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]*)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


@dataclass(frozen=True)
class Header:
    """A message's header: its channel ("" when it names none, or the text is not harmony) and
    recipient (`functions.add`; None for a message to the user)."""

    channel: str
    recipient: str | None = None


@dataclass(frozen=True)
class Body:
    """The next piece of the current message's body."""

    text: str


def parse_header(text: str) -> Header:
    """The header of the text between a message's start and its `<|message|>`."""
    channel = _CHANNEL.search(text)
    recipient = _RECIPIENT.search(text)
    return Header(channel.group(1) if channel else "", recipient.group(1) if recipient else None)


def _held(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that may still become one of `markers`."""
    return max(partial_tag(text, m) for m in markers)


_HEAD, _BODY, _PLAIN = range(3)


class HarmonyReader:
    """One output's harmony text, fed in pieces, as Header and Body events (see the module)."""

    def __init__(self) -> None:
        self._state = _HEAD
        self._buf = ""
        self._started = False  # some text was read

    def feed(self, text: str) -> list[Header | Body]:
        out: list[Header | Body] = []
        self._buf += text
        while self._step(out):
            pass
        return out

    def finish(self) -> list[Header | Body]:
        """What was held back: the end of a body, or a header never closed (dropped when it holds
        a marker: the output was cut inside a header; content when it holds none)."""
        buf, self._buf = self._buf, ""
        if not buf:
            return []
        if self._state in (_BODY, _PLAIN):
            return [Body(buf)]
        return [] if "<|" in buf else [Header(""), Body(buf)]

    def _step(self, out: list[Header | Body]) -> bool:
        buf = self._buf
        if not buf:
            return False
        if self._state == _PLAIN:
            out.append(Body(buf))
            self._buf = ""
            return False
        if self._state == _HEAD:
            if not self._started:
                lead = buf.lstrip()
                if lead and not lead.startswith("<|") and not "<|".startswith(lead):
                    out.append(Header(""))  # not harmony: all of it is content
                    self._state = _PLAIN
                    return True
                if not lead or "<|".startswith(lead):
                    return False
            self._started = True
            at = buf.find(MESSAGE)
            if at < 0:
                if len(buf) > MAX_HEADER:
                    out.append(Header(""))
                    self._state = _PLAIN
                    return True
                return False
            out.append(parse_header(buf[:at]))
            self._buf, self._state = buf[at + len(MESSAGE):], _BODY
            return True
        ends = [(buf.find(m), m) for m in (*ENDS, START) if m in buf]
        if not ends:
            keep = _held(buf, (*ENDS, START))
            if len(buf) > keep:
                out.append(Body(buf[:len(buf) - keep]))
                self._buf = buf[len(buf) - keep:]
            return False
        at, marker = min(ends)
        if at:
            out.append(Body(buf[:at]))
        # a body ends at its end marker; a <|start|> with none before it starts the next header
        self._buf = buf[at + (0 if marker == START else len(marker)):]
        self._state = _HEAD
        return True


class HarmonyReasoning:
    """`--reasoning-parser gpt_oss`: the analysis channel as Thought pieces, every other message's
    body as content (tool calls too: frontend/harmony.py reads them where a request has tools);
    `saw_block` once an analysis message began. The ReasoningParser interface."""

    def __init__(self) -> None:
        self._reader = HarmonyReader()
        self._thinking = False
        self.saw_block = False

    def feed(self, text: str) -> list[Thought | str]:
        return self._route(self._reader.feed(text))

    def finish(self) -> list[Thought | str]:
        return self._route(self._reader.finish())

    def _route(self, events: list[Header | Body]) -> list[Thought | str]:
        out: list[Thought | str] = []
        for event in events:
            if isinstance(event, Header):
                self._thinking = event.channel == "analysis" and event.recipient is None
                self.saw_block = self.saw_block or self._thinking
            elif event.text:
                out.append(Thought(event.text) if self._thinking else event.text)
        return out
