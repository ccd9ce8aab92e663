"""A chat output's reasoning, answer and tool calls (`--reasoning-parser`): the block a thinking
model writes first (runtime/text/reasoning.py) becomes the message's `reasoning_content` (and
`reasoning`, vLLM's newer name), the text after it the `content`, which alone is parsed for tool
calls; and SGLang's POST /separate_reasoning."""
from __future__ import annotations

import msgspec

from radixflow.frontend.tool_calls import Event, Parser
from radixflow.runtime.text.reasoning import ReasoningParser, Thought, split_reasoning


class ChoiceParser:
    """A choice's text as Thought, content and call events: the reasoning split off first, then
    the content parsed for tool calls (`tools`, when the request's tool plan has a parser).
    `include` false drops the Thought pieces (vLLM's `include_reasoning`)."""

    def __init__(self, reasoning: ReasoningParser, tools: Parser | None, include: bool) -> None:
        self.reasoning, self._tools, self._include = reasoning, tools, include

    def feed(self, text: str) -> list[Thought | Event]:
        return self._route(self.reasoning.feed(text), last=False)

    def finish(self) -> list[Thought | Event]:
        return self._route(self.reasoning.finish(), last=True)

    def _route(self, events: list[Thought | str], last: bool) -> list[Thought | Event]:
        out: list[Thought | Event] = []
        for event in events:
            if isinstance(event, Thought):
                if self._include:
                    out.append(event)
            elif self._tools is None:
                out.append(event)
            else:
                out += self._tools.feed(event)
        if last and self._tools is not None:
            out += self._tools.finish()
        return out


class SeparateRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /separate_reasoning (SGLang's): `text` split by `reasoning_parser` (default: the server's)."""

    text: str
    reasoning_parser: str | None = None


class SeparateResponse(msgspec.Struct):
    text: str  # the answer
    reasoning_text: str


def separate(text: str, name: str) -> SeparateResponse:
    """A whole output's answer and reasoning under format `name` (a FORMATS key)."""
    reasoning, answer = split_reasoning(text, name)
    return SeparateResponse(answer, reasoning or "")
