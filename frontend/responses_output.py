"""A response's output items, built in order from its reasoning, text and tool calls (the chat
path's parser events), and the stream events each step makes: the streamed and the whole response
are the same walk, so they give the same items."""
from __future__ import annotations

import secrets
from typing import Any

import msgspec

from radixflow.frontend.openai_schemas import Usage
from radixflow.frontend.responses_schemas import (
    CallItem, FunctionCall, IncompleteDetails, InputTokensDetails, Item, MessageItem, OutputItem, OutputMessage,
    OutputText, OutputTokensDetails, ReasoningOutput, ReasoningText, ResponseUsage, ThoughtItem,
)
from radixflow.frontend.tool_calls import CallArgs, CallStart, Event
from radixflow.runtime.text.reasoning import Thought


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class OutputItems:
    """`items` so far. Reasoning goes to the open reasoning item, text to the open message item
    (one is opened for text after anything else); a call's start closes them and opens a
    function_call item, which its argument pieces go to until anything else comes. Each method
    returns the stream events it makes, without sequence numbers; items in them are snapshots."""

    def __init__(self) -> None:
        self.items: list[OutputItem] = []
        self._message: OutputMessage | None = None
        self._pieces: list[str] = []  # the open message's text
        self._index = 0  # the open message's output_index
        self._reasoning: ReasoningOutput | None = None
        self._thoughts: list[str] = []  # the open reasoning item's text
        self._call: FunctionCall | None = None
        self._call_index = 0  # the open call's output_index
        self._arguments: list[str] = []  # the open call's arguments so far
        self._logprobs: list[Any] = []  # token logprob entries not yet given with text
        self._part_logprobs: list[Any] = []  # the open message's

    def logprobs(self, entries: list[Any]) -> None:
        """Token logprob entries (include message.output_text.logprobs): they go with the next text."""
        self._logprobs += entries

    def add(self, event: Event | Thought) -> list[dict[str, Any]]:
        if isinstance(event, CallArgs):
            return self._args(event.text)
        out = self._close_call("completed")
        if isinstance(event, Thought):
            return out + self._close("completed") + self._thought(event.text)
        out += self._close_reasoning("completed")
        if isinstance(event, CallStart):
            return out + self._close("completed") + self._open_call(event.name)
        return out + (self._text(event) if event else [])

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Close the open item with `status` (an output of nothing is one empty message)."""
        out = [] if self.items else self._open()
        return out + self._close_reasoning(status) + self._close(status) + self._close_call(status)

    def _thought(self, text: str) -> list[dict[str, Any]]:
        out = []
        if self._reasoning is None:
            item = self._reasoning = ReasoningOutput(id=item_id("rs"), status="in_progress")
            self.items.append(item)
            out.append({"type": "response.output_item.added", "output_index": len(self.items) - 1,
                        "item": _builtins(item)})
        self._thoughts.append(text)
        return out + [{"type": "response.reasoning_text.delta", **self._reasoning_at(), "delta": text}]

    def _close_reasoning(self, status: str) -> list[dict[str, Any]]:
        item = self._reasoning
        if item is None:
            return []
        at = self._reasoning_at()
        item.content, item.status = [ReasoningText(text="".join(self._thoughts))], status
        self._reasoning, self._thoughts = None, []
        return [{"type": "response.reasoning_text.done", **at, "text": item.content[0].text},
                {"type": "response.output_item.done", "output_index": at["output_index"], "item": _builtins(item)}]

    def _reasoning_at(self) -> dict[str, Any]:
        assert self._reasoning is not None
        return {"item_id": self._reasoning.id, "output_index": len(self.items) - 1, "content_index": 0}

    def _open(self) -> list[dict[str, Any]]:
        message = self._message = OutputMessage(id=item_id("msg"), status="in_progress")
        self.items.append(message)
        index = self._index = len(self.items) - 1
        added = _builtins(message)
        message.content.append(OutputText(text=""))
        return [{"type": "response.output_item.added", "output_index": index, "item": added},
                {"type": "response.content_part.added", **self._at(), "part": _builtins(message.content[0])}]

    def _text(self, text: str) -> list[dict[str, Any]]:
        out = self._open() if self._message is None else []
        self._pieces.append(text)
        entries, self._logprobs = self._logprobs, []
        self._part_logprobs += entries
        return out + [{"type": "response.output_text.delta", **self._at(), "delta": text,
                       "logprobs": _builtins_list(entries)}]

    def _close(self, status: str) -> list[dict[str, Any]]:
        message = self._message
        if message is None:
            return []
        # entries of tokens with no text left (a stop token): an empty delta, so the deltas' entries are the part's
        out = self._text("") if self._logprobs else []
        part = message.content[0]
        part.text, message.status = "".join(self._pieces), status
        part.logprobs, self._part_logprobs = _builtins_list(self._part_logprobs), []
        out += [{"type": "response.output_text.done", **self._at(), "text": part.text, "logprobs": part.logprobs},
               {"type": "response.content_part.done", **self._at(), "part": _builtins(part)},
               {"type": "response.output_item.done", "output_index": self._index, "item": _builtins(message)}]
        self._message, self._pieces = None, []
        return out

    def _open_call(self, name: str) -> list[dict[str, Any]]:
        item = self._call = FunctionCall(id=item_id("fc"), call_id=item_id("call"), name=name, arguments="",
                                         status="in_progress")
        self.items.append(item)
        self._call_index = len(self.items) - 1
        return [{"type": "response.output_item.added", "output_index": self._call_index, "item": _builtins(item)}]

    def _args(self, text: str) -> list[dict[str, Any]]:
        self._arguments.append(text)
        return [{"type": "response.function_call_arguments.delta", **self._call_at(), "delta": text}]

    def _close_call(self, status: str) -> list[dict[str, Any]]:
        item = self._call
        if item is None:
            return []
        at = self._call_at()
        item.arguments, item.status = "".join(self._arguments), status
        self._call, self._arguments = None, []
        return [{"type": "response.function_call_arguments.done", **at, "arguments": item.arguments},
                {"type": "response.output_item.done", "output_index": at["output_index"], "item": _builtins(item)}]

    def _call_at(self) -> dict[str, Any]:
        assert self._call is not None
        return {"item_id": self._call.id, "output_index": self._call_index}

    def _at(self) -> dict[str, Any]:
        assert self._message is not None
        return {"item_id": self._message.id, "output_index": self._index, "content_index": 0}


def _builtins(struct: msgspec.Struct) -> Any:
    return msgspec.to_builtins(struct)


def _builtins_list(entries: list[Any]) -> list[Any]:
    return [msgspec.to_builtins(e) for e in entries]


# an item's id prefix by type, for the items a request sent without one
_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def listed_items(items: list[Item], sent: str | list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """A request's input items as GET /v1/responses/{id}/input_items lists them: as they were sent
    (`sent`, the request's checked `input`: parts, refusals, summaries and ids kept), a message's
    text content as one part (output_text, with its annotations, for the assistant's), each item
    without an id given one; built from the conversation `items` when the input was a string."""
    if isinstance(sent, list):
        return [_as_listed(raw) for raw in sent]
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, MessageItem):
            part = {"type": "output_text", "text": item.text, "annotations": []} if item.role == "assistant" else {
                "type": "input_text", "text": item.text}
            out.append({"type": "message", "id": item_id("msg"), "role": item.role, "status": "completed",
                        "content": [part]})
        elif isinstance(item, CallItem):
            out.append({"type": "function_call", "id": item_id("fc"), "call_id": item.call_id, "name": item.name,
                        "arguments": item.arguments, "status": "completed"})
        elif isinstance(item, ThoughtItem):
            out.append({"type": "reasoning", "id": item_id("rs"), "summary": [],
                        "content": [{"type": "reasoning_text", "text": item.text}]})
        else:
            out.append({"type": "function_call_output", "id": item_id("fco"), "call_id": item.call_id,
                        "output": item.output, "status": "completed"})
    return out


def _as_listed(raw: dict[str, Any]) -> dict[str, Any]:
    kind = raw.get("type", "message")
    item = {"type": kind, **raw, "id": raw.get("id") or item_id(_ID_PREFIXES.get(kind, "item"))}
    if kind != "reasoning":
        item.setdefault("status", "completed")
    if kind == "message":
        assistant = raw.get("role") == "assistant"
        content = raw.get("content")
        if isinstance(content, str):
            content = [{"type": "output_text" if assistant else "input_text", "text": content}]
        item["content"] = [{**part, "annotations": part.get("annotations", [])} if part.get("type") == "output_text"
                           else part for part in content]
    if kind == "reasoning":
        item.setdefault("summary", [])
    return item


def conversation_items(output: list[OutputItem]) -> list[Item]:
    """A response's output as items of the conversation a later response continues."""
    out: list[Item] = []
    for item in output:
        if isinstance(item, FunctionCall):
            out.append(CallItem(item.call_id, item.name, item.arguments))
        elif isinstance(item, ReasoningOutput):
            out.append(ThoughtItem("".join(part.text for part in item.content)))
        else:
            out.append(MessageItem("assistant", "".join(p.text for p in item.content)))
    return out


def status_of(reason: str | None) -> tuple[str, IncompleteDetails | None]:
    """The response's status from its finish reason: stop → completed; length → incomplete
    (max_output_tokens); abort → incomplete (abort)."""
    if reason == "length":
        return "incomplete", IncompleteDetails("max_output_tokens")
    if reason == "abort":
        return "incomplete", IncompleteDetails("abort")
    return "completed", None


def response_usage(usage: Usage) -> ResponseUsage:
    cached = usage.prompt_tokens_details.cached_tokens
    return ResponseUsage(usage.prompt_tokens, InputTokensDetails(cached, usage.prompt_tokens - cached),
                         usage.completion_tokens, OutputTokensDetails(), usage.total_tokens)
