"""OpenAI request and response schemas (msgspec Structs).

Sampling fields are not restated: their types come from runtime SamplingParams, and every one
defaults to None ("the engine's default"), so a default lives only in SamplingParams.
"""
from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

from radixflow.runtime.sampling_params import SamplingParams

# Engine sampling fields an OpenAI request may carry under the engine's own name: OpenAI's
# (temperature ... n, logit_bias) and the usual vLLM/SGLang extras (top_k ... no_stop_trim).
SHARED_SAMPLING_FIELDS = (
    "temperature", "top_p", "n", "stop", "seed", "presence_penalty", "frequency_penalty",
    "top_k", "min_p", "repetition_penalty", "regex", "json_schema", "ebnf", "ignore_eos", "stop_token_ids",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "logit_bias",
)
# vLLM's names of the engine's constraints: `structured_outputs.<name>` (vLLM >= 0.10) and the
# older top-level `guided_<name>` (removed in vLLM 0.12; older clients still send them).
VLLM_CONSTRAINTS = {"json": "json_schema", "regex": "regex", "choice": "choices", "grammar": "ebnf"}
# `structured_outputs` takes them and vLLM's structural_tag (JSON text; never a `guided_` field)
STRUCTURED_OUTPUTS = {**VLLM_CONSTRAINTS, "structural_tag": "structural_tag"}
_TYPES = {f.name: f.type for f in msgspec.structs.fields(SamplingParams)}
_VLLM_FIELDS = [(name, _TYPES[engine] | None, None) for name, engine in VLLM_CONSTRAINTS.items()]
_STRUCTURED_FIELDS = [(name, _TYPES[engine] | None, None) for name, engine in STRUCTURED_OUTPUTS.items()]

SamplingFields = msgspec.defstruct(
    "SamplingFields", [(name, _TYPES[name] | None, None) for name in SHARED_SAMPLING_FIELDS]
    + [("guided_" + name, kind, default) for name, kind, default in _VLLM_FIELDS]
    + [("guided_decoding_backend", str | None, None)],  # no effect: the grammar's kind picks the backend
    kw_only=True, forbid_unknown_fields=True, module=__name__)

StructuredOutputs = msgspec.defstruct(
    "StructuredOutputs", [*_STRUCTURED_FIELDS, ("json_object", bool | None, None),
                          ("disable_fallback", bool | None, None),  # no effect: there is no fallback
                          ("disable_any_whitespace", bool | None, None)],  # no effect: JSON is always compact
    kw_only=True, forbid_unknown_fields=True, module=__name__)


# OpenAI's reasoning_effort values: a chat template variable ("none" also turns thinking off;
# chat_prompt.template_kwargs)
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class StreamOptions(Struct, forbid_unknown_fields=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, each chunk its choice's usage so far


class JsonSchemaFormat(Struct, forbid_unknown_fields=True):
    name: str = "response"
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TagStructure(Struct, forbid_unknown_fields=True):
    """One structure of a structural_tag: `begin` (it starts with a trigger), JSON of `schema`, `end`."""

    begin: str
    schema: dict[str, Any]
    end: str


class ResponseFormat(Struct, forbid_unknown_fields=True):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # structural_tag, as SGLang and vLLM take it; `format` (xgrammar's newer form) is refused by name
    structures: list[TagStructure] | None = None
    triggers: list[str] | None = None
    format: Any = None


class _Common(SamplingFields, kw_only=True, forbid_unknown_fields=True):
    """Fields both endpoints take besides the sampling ones."""

    model: str
    max_tokens: int | None = None
    min_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    user: str | None = None
    priority: int | None = None  # vLLM's: the request's rank under priority scheduling


class CompletionRequest(_Common, kw_only=True, forbid_unknown_fields=True):
    # str | token ids | list of either; element types are checked in completions.py
    prompt: str | list[str | int | list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class TextPart(Struct, forbid_unknown_fields=True):
    type: Literal["text"]
    text: str


class FunctionCall(Struct, forbid_unknown_fields=True):
    name: str
    arguments: str | dict[str, Any] = "{}"  # OpenAI sends a JSON string; some clients the object


class ToolCall(Struct):
    """One call of an assistant turn; other keys clients echo back (a stream's `index`) are dropped."""

    function: FunctionCall
    id: str | None = None
    type: Literal["function"] = "function"


class ChatMessage(Struct, forbid_unknown_fields=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant turns that called tools
    tool_call_id: str | None = None  # tool turns: which call this answers
    refusal: str | None = None
    reasoning_content: str | None = None  # an assistant turn's reasoning, as responses give it back
    reasoning: str | None = None  # the same under vLLM's newer name


class FunctionDefinition(Struct, forbid_unknown_fields=True, omit_defaults=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None  # needs no switch: required / named calls always follow the schema


class Tool(Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(Struct, forbid_unknown_fields=True):
    name: str


class NamedToolChoice(Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionName


class ChatRequest(_Common, kw_only=True, forbid_unknown_fields=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's chat-template options (frontend/chat_prompt.py)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: ReasoningEffort | None = None
    separate_reasoning: bool = True  # SGLang's: false keeps the reasoning in the content (frontend/reasoning.py)
    include_reasoning: bool = True  # vLLM's: false leaves the reasoning out of the response
    store: bool | None = None
    metadata: dict[str, str] | None = None


# -- responses ------------------------------------------------------------------------------


class PromptTokensDetails(Struct):
    cached_tokens: int


class Usage(Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    # radixflow's extension: prefill tokens computed by miss reason, summed over the prompts, and
    # the engine timeline in seconds (queue_s, prefill_s, ttft_s, e2e_s) of the slowest choice
    prefill_miss_tokens: dict[str, int] | None = None
    timings: dict[str, float | None] | None = None


class CompletionLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(Struct):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class Completion(Struct, kw_only=True):
    object: str = "text_completion"
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Struct):
    content: list[TokenLogprob] | None


class CalledFunction(Struct):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ChatToolCall(Struct, kw_only=True):
    id: str
    type: str = "function"
    function: CalledFunction


class AssistantMessage(Struct, kw_only=True, omit_defaults=True):
    role: str  # no default: omit_defaults would leave it out
    content: str | None
    reasoning_content: str | None = None  # with --reasoning-parser (SGLang's and DeepSeek's name)
    reasoning: str | None = None  # the same, under vLLM's newer name
    tool_calls: list[ChatToolCall] | None = None  # present only when the model called tools


class ChatChoice(Struct):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: str | None


class ChatCompletion(Struct, kw_only=True):
    object: str = "chat.completion"
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class DeltaFunction(Struct, kw_only=True, omit_defaults=True):
    name: str | None = None  # in the call's first delta only
    arguments: str  # the next piece of the arguments' JSON text


class DeltaToolCall(Struct, kw_only=True, omit_defaults=True):
    """A piece of a streamed call, as OpenAI streams one: the first has the call's `id`, `type`
    and `function.name`; every one has `index` and the next piece of `function.arguments`."""

    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunction


class Delta(Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(Struct):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(Struct, kw_only=True):
    object: str = "chat.completion.chunk"
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(Struct, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "radixflow"
    root: str
    max_model_len: int
    parent: str | None = None  # a LoRA adapter's base model


class ModelList(Struct, kw_only=True):
    object: str = "list"
    data: list[ModelCard]
