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

Text that does not open with a marker or ` to=` (markers stripped, or not a harmony model) is
one headerless message of content; a header whose `<|message|>` does not start within
MAX_HEADER characters is content as written from its start, and so is a header cut short that
holds no harmony marker (`<|im_start|>...`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from radixflow.runtime.text.reasoning import Thought, partial_tag

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, *ENDS)
MAX_HEADER = 512  # a header's `<|message|>` starts within this many characters, else it is content
# how the first header may open: its channel, or its recipient (the prompt ended `<|start|>assistant`)
_OPENINGS = ("<|", "to=")
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
        a harmony marker or a recipient: the output was cut inside a header; content otherwise)."""
        buf, self._buf = self._buf, ""
        if not buf:
            return []
        if self._state in (_BODY, _PLAIN):
            return [Body(buf)]
        cut = any(m in buf for m in MARKERS) or buf.lstrip().startswith("to=")
        return [] if cut else [Header(""), Body(buf)]

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
                if not any(lead.startswith(o) for o in _OPENINGS):
                    if not lead or any(o.startswith(lead) for o in _OPENINGS):
                        return False  # may still open a header
                    out.append(Header(""))  # not harmony: all of it is content
                    self._state = _PLAIN
                    return True
            self._started = True
            at = buf.find(MESSAGE)
            # no <|message|> starting within MAX_HEADER (decided the same however the text is cut)
            if at > MAX_HEADER or (at < 0 and len(buf) >= MAX_HEADER + len(MESSAGE)):
                out.append(Header(""))
                self._state = _PLAIN
                return True
            if at < 0:
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
