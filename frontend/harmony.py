"""gpt-oss's chat output (harmony messages, runtime/text/harmony.py) as the chat route's events:
the analysis channel as reasoning, a message to `functions.NAME` as a call of tool NAME (its
body the arguments, streamed as they are written), every other message as content (the final
answer, commentary preambles, messages to built-in tools, which are not served, as written).

`--reasoning-parser gpt_oss` reads reasoning and calls; `--tool-call-parser gpt_oss` alone reads
calls and leaves the analysis in the content (as any format without a reasoning parser).
"""
from __future__ import annotations

from collections.abc import Set

from radixflow.frontend.call_stream import ArgsReader, Event
from radixflow.frontend.tool_calls import Parser
from radixflow.runtime.text.harmony import Body, Header, HarmonyReader
from radixflow.runtime.text.reasoning import Thought

FUNCTIONS = "functions."


class HarmonyChoiceParser:
    """One choice's harmony text → Thought, content and call events. `names`: the tools a call may
    name (None: no calls are read, their bodies are content); `reasoning` false: the analysis is
    content; `include` false: it is dropped (vLLM's include_reasoning); `content`: the parser the
    final channel goes through (tool_choice "required" or a named function: the JSON the grammar
    holds it to), else it is text like the other messages."""

    def __init__(self, names: Set[str] | None, reasoning: bool = True, include: bool = True,
                 content: Parser | None = None) -> None:
        self._reader = HarmonyReader()
        self._names, self._reasoning, self._include, self._content = names, reasoning, include, content
        self._final = False  # the current message is in the final channel
        self._kind = "content"  # of the current message: thought | content | call | dropped
        self._args: ArgsReader | None = None
        self._before = ""  # a call's body before its arguments opened (content if it never does)
        self.saw_reasoning = False

    def feed(self, text: str) -> list[Thought | Event]:
        return self._route(self._reader.feed(text))

    def finish(self) -> list[Thought | Event]:
        out = self._route(self._reader.finish()) + self._close()
        return out + (self._content.finish() if self._content is not None else [])

    def _route(self, events: list[Header | Body]) -> list[Thought | Event]:
        out: list[Thought | Event] = []
        for event in events:
            if isinstance(event, Header):
                out += self._close()
                self._open(event)
            else:
                self._body(event.text, out)
        return out

    def _open(self, header: Header) -> None:
        self._final = header.channel == "final"
        name = (header.recipient or "").removeprefix(FUNCTIONS)
        if header.recipient is None and header.channel == "analysis" and self._reasoning:
            self._kind, self.saw_reasoning = "thought", True
        elif header.recipient is not None and header.recipient.startswith(FUNCTIONS) and self._names is not None \
                and name in self._names:
            self._kind, self._args, self._before = "call", ArgsReader(name), ""
        else:
            self._kind = "content"

    def _body(self, text: str, out: list[Thought | Event]) -> None:
        if self._kind == "thought":
            if self._include:
                out.append(Thought(text))
        elif self._kind == "content":
            self._text(text, out)
        elif self._kind == "call":
            args = self._args
            assert args is not None
            events, used = args.feed(text)
            out += events
            if args.refused:  # not an arguments object: the body is content as written
                self._text(self._before + text, out)
                self._kind = "content"
            elif not args.started:
                self._before += text
            elif args.broken or args.ended:
                self._kind = "dropped"  # what follows a broken or finished object in its body
        # "dropped": nothing

    def _close(self) -> list[Thought | Event]:
        """The end of the current message: a call whose arguments never opened gives its body as content."""
        out: list[Thought | Event] = []
        if self._kind == "call" and self._args is not None and not self._args.started and self._before.strip():
            self._text(self._before, out)
        self._kind, self._args, self._before = "content", None, ""
        return out

    def _text(self, text: str, out: list[Thought | Event]) -> None:
        """Content: the final channel's through `content` where there is one (where the grammar
        holds), the rest as text."""
        if self._content is None or not self._final:
            out.append(text)
        else:
            out += self._content.feed(text)
