"""Schemas of POST /v1/responses (OpenAI's Responses API): the request, its conversation items and
the response object. Input items and tools arrive as JSON objects and are checked one by one in
responses_input.py, so an unsupported kind is a 400 that says what it is."""
from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

from radixflow.frontend.openai_schemas import ReasoningEffort


class TextFormat(Struct, forbid_unknown_fields=True, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None  # json_schema: 1-64 of a-z, A-Z, 0-9, _ and -
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None  # needs no switch: the grammar always enforces the schema


class TextConfig(Struct, forbid_unknown_fields=True):
    format: TextFormat = msgspec.field(default_factory=lambda: TextFormat("text"))


class Reasoning(Struct, forbid_unknown_fields=True):
    """`effort` is the chat request's `reasoning_effort` (a template variable; "none" also turns
    thinking off); summaries are refused (nothing here writes one)."""

    effort: ReasoningEffort | None = None
    summary: str | None = None
    generate_summary: str | None = None


class FunctionChoice(Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    name: str


class ResponsesRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    input: str | list[dict[str, Any]] | None = None  # items: responses_input.py
    instructions: str | None = None  # a system message first; not carried on by previous_response_id
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None  # {"type": "function", "name", "description", "parameters", "strict"}
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool | None = None  # default: stored when the server keeps responses
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    top_logprobs: int | None = None  # with include message.output_text.logprobs: alternatives per token
    priority: int | None = None  # vLLM's: the request's rank under priority scheduling
    # accepted only with the values that ask for nothing radixflow lacks (responses_input.py)
    include: list[str] | None = None
    reasoning: Reasoning | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: str | None = None


# -- conversation items: what a request's input and a stored response's output become ----------


class MessageItem(Struct):
    role: str  # user | system | developer | assistant
    text: str


class CallItem(Struct):
    call_id: str
    name: str
    arguments: str  # JSON text


class CallOutputItem(Struct):
    call_id: str
    output: str


class ThoughtItem(Struct):
    text: str  # a reasoning item's text: the next assistant turn's reasoning_content


Item = MessageItem | CallItem | CallOutputItem | ThoughtItem


# -- the response object ----------------------------------------------------------------------


class OutputText(Struct, kw_only=True, tag_field="type", tag="output_text"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] = msgspec.field(default_factory=list)  # with include message.output_text.logprobs


class OutputMessage(Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    status: str  # in_progress | completed | incomplete
    role: str = "assistant"
    content: list[OutputText] = msgspec.field(default_factory=list)


class FunctionCall(Struct, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


class ReasoningText(Struct, kw_only=True, tag_field="type", tag="reasoning_text"):
    text: str


class ReasoningOutput(Struct, kw_only=True, tag_field="type", tag="reasoning"):
    """A thinking model's block (with --reasoning-parser): its text as one reasoning_text part."""

    id: str
    status: str
    summary: list[Any] = msgspec.field(default_factory=list)
    content: list[ReasoningText] = msgspec.field(default_factory=list)


OutputItem = OutputMessage | FunctionCall | ReasoningOutput


class InputTokensDetails(Struct):
    cached_tokens: int  # prompt tokens served from the radix cache
    cache_write_tokens: int = 0  # the prompt tokens it did not hold: computed now, and kept there


class OutputTokensDetails(Struct):
    reasoning_tokens: int = 0


class ResponseUsage(Struct):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(Struct):
    reason: str  # max_output_tokens; radixflow's own: abort (the request was aborted)


class ResponseError(Struct):
    code: str
    message: str


class ResponseObject(Struct, kw_only=True):
    id: str
    object: str = "response"
    created_at: int
    status: str  # in_progress | completed | incomplete | failed
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: Reasoning
    store: bool
    temperature: float | None  # null: the engine's default
    text: TextConfig
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice
    tools: list[dict[str, Any]]
    top_p: float | None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None
    metadata: dict[str, str]


class DeletedResponse(Struct):
    id: str
    object: str = "response"
    deleted: bool = True
