"""A Responses request as the chat request it means: fields radixflow cannot honour refused (400
naming the field), input items read into conversation items, the conversation (a previous
response's, then the new input) as chat messages, the flat function tools as chat's, and
`text.format` as the grammar chat's json_schema field gives. The chat path does the rest."""
from __future__ import annotations

import re
from typing import Any

from radixflow.frontend.errors import APIError
from radixflow.frontend.openai_schemas import (
    ChatMessage, ChatRequest, FunctionCall, FunctionDefinition, FunctionName, NamedToolChoice, Tool, ToolCall,
)
from radixflow.frontend.responses_schemas import (
    CallItem, CallOutputItem, FunctionChoice, Item, MessageItem, ResponsesRequest, TextFormat, ThoughtItem,
)

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}  # part type → its text key
_REASONING_PARTS = {"reasoning_text": "text", "summary_text": "text"}
_TOOL_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})


LOGPROBS = "message.output_text.logprobs"  # the one `include` entry radixflow gives
MAX_TOP_LOGPROBS = 20  # OpenAI's bound


def wants_logprobs(req: ResponsesRequest) -> bool:
    return LOGPROBS in (req.include or ())


def check_request(req: ResponsesRequest, supports_grammar: bool) -> None:
    """Refuse what would change the request's meaning if ignored."""
    other = [entry for entry in req.include or () if entry != LOGPROBS]
    if other:
        raise APIError(400, f"include {other[0]!r} is not supported (no built-in tools, images or encrypted "
                       f"reasoning here; {LOGPROBS!r} is)", param="include")
    if wants_logprobs(req) and req.tools and req.tool_choice != "none":
        raise APIError(400, f"include {LOGPROBS!r} is not supported with tools (the output's tokens are not "
                       "split between text and calls)", param="include")
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
        raise APIError(400, f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs")
    if req.reasoning is not None and (req.reasoning.summary or req.reasoning.generate_summary):
        raise APIError(400, "reasoning summaries are not supported (with --reasoning-parser a thinking model's "
                       "block is a reasoning item, as written); send reasoning.summary null", param="reasoning")
    if req.background:
        raise APIError(400, "background responses are not supported", param="background")
    if req.truncation == "auto":
        raise APIError(400, "truncation 'auto' is not supported: an input past the context is a 400",
                       param="truncation")
    if req.service_tier not in (None, "auto", "default"):
        raise APIError(400, "service_tier must be 'auto' or 'default'", param="service_tier")
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise APIError(400, "max_output_tokens must be at least 1", param="max_output_tokens")
    if req.input is None and req.previous_response_id is None:
        raise APIError(400, "input is required", param="input")
    if isinstance(req.input, list) and not req.input and req.previous_response_id is None:
        raise APIError(400, "input has no items", param="input")
    _check_metadata(req.metadata)
    _check_format(req.text.format if req.text else None, supports_grammar)


# OpenAI's bounds on `metadata`: pairs, and characters of a key and of a value
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if not metadata:
        return
    if len(metadata) > METADATA_PAIRS:
        raise APIError(400, f"metadata has {len(metadata)} pairs; at most {METADATA_PAIRS} are allowed",
                       param="metadata")
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_CHARS or len(value) > METADATA_VALUE_CHARS:
            raise APIError(400, f"metadata keys are at most {METADATA_KEY_CHARS} characters and values at most "
                           f"{METADATA_VALUE_CHARS}", param="metadata")


def _check_format(fmt: TextFormat | None, supports_grammar: bool) -> None:
    if fmt is not None and fmt.type != "json_schema" and (fmt.schema is not None or fmt.name is not None):
        raise APIError(400, f"text.format {fmt.type!r} takes no name or schema (json_schema does)", param="text")
    if fmt is None or fmt.type == "text":
        return
    if not supports_grammar:
        raise APIError(400, f"text.format {fmt.type!r} needs constrained decoding, which this engine does not have",
                       param="text")
    if fmt.type == "json_schema" and fmt.schema is None:
        raise APIError(400, "text.format json_schema needs a schema", param="text")
    if fmt.type == "json_schema" and not _NAME.fullmatch(fmt.name or ""):
        raise APIError(400, "text.format.name must be 1-64 of a-z, A-Z, 0-9, _ and -", param="text")


def format_schema(fmt: TextFormat | None) -> dict[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    return {"type": "object"} if fmt.type == "json_object" else fmt.schema


def read_items(value: str | list[dict[str, Any]] | None) -> list[Item]:
    """The request's input as conversation items; a string is one user message."""
    if value is None:
        return []
    if isinstance(value, str):
        return [MessageItem("user", value)]
    return [_item(i, raw) for i, raw in enumerate(value)]


def _item(i: int, raw: dict[str, Any]) -> Item:
    kind = raw.get("type", "message")
    try:
        if kind == "message":
            role = raw["role"]
            if role not in _ROLES:
                raise APIError(400, f"input[{i}].role must be one of {', '.join(_ROLES)} (tool results are "
                               "function_call_output items)", param="input")
            return MessageItem(role, _text(raw["content"], f"input[{i}].content"))
        if kind == "function_call":
            return CallItem(_str(raw, "call_id"), _str(raw, "name"), _str(raw, "arguments"))
        if kind == "function_call_output":
            return CallOutputItem(_str(raw, "call_id"), _text(raw["output"], f"input[{i}].output"))
        if kind == "reasoning":  # a response's reasoning item sent back: its text, else its summary's
            return ThoughtItem(_text(raw.get("content") or raw.get("summary") or [], f"input[{i}].content",
                                     _REASONING_PARTS))
    except KeyError as exc:
        raise APIError(400, f"input[{i}] ({kind}) needs {exc.args[0]!r}", param="input") from None
    except TypeError as exc:
        raise APIError(400, f"input[{i}] ({kind}): {exc}", param="input") from None
    raise APIError(400, f"input[{i}]: items of type {kind!r} are not supported (messages, function_call, "
                   "function_call_output and reasoning are)", param="input")


def _str(raw: dict[str, Any], key: str) -> str:
    value = raw[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a string")
    return value


def _text(content: Any, where: str, parts: dict[str, str] = _TEXT_PARTS) -> str:
    """A message's text: a string, or text parts joined (images, files and audio are refused).
    `parts`: the part types taken, each with the key of its text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TypeError("content must be a string or a list of parts")
    out = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = parts.get(kind) if isinstance(kind, str) else None
        if key is None or not isinstance(part.get(key), str):
            raise APIError(400, f"{where}[{k}]: only text parts are supported ({', '.join(parts)}), "
                           f"not {kind!r}", param="input")
        out.append(part[key])
    return "".join(out)


def chat_messages(items: list[Item]) -> list[ChatMessage]:
    """Items as the chat template's turns: function_call items join the assistant turn before them
    (or make one) as its tool_calls; a function_call_output is a tool turn; a reasoning item is
    the reasoning_content of the assistant turn after it, or an assistant turn of its own."""
    out: list[ChatMessage] = []
    thought: str | None = None
    for item in items:
        if isinstance(item, ThoughtItem):
            thought = item.text if thought is None else thought + item.text
            continue
        assistant = isinstance(item, CallItem) or (isinstance(item, MessageItem) and item.role == "assistant")
        if thought is not None and not assistant:
            out.append(ChatMessage(role="assistant", content=None, reasoning_content=thought))
            thought = None
        if isinstance(item, MessageItem):
            out.append(ChatMessage(role=item.role, content=item.text))  # type: ignore[arg-type]
        elif isinstance(item, CallItem):
            call = ToolCall(FunctionCall(item.name, item.arguments), id=item.call_id)
            last = out[-1] if out else None
            if last is None or last.role != "assistant" or thought is not None:
                last = ChatMessage(role="assistant", content=None)
                out.append(last)
            last.tool_calls = [*(last.tool_calls or []), call]
        else:
            out.append(ChatMessage(role="tool", content=item.output, tool_call_id=item.call_id))
        if out[-1].role == "assistant" and thought is not None:
            out[-1].reasoning_content, thought = thought, None
    if thought is not None:
        out.append(ChatMessage(role="assistant", content=None, reasoning_content=thought))
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[Tool] | None:
    """Flat Responses function tools as chat's nested ones; other tool types are refused."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise APIError(400, f"tools[{i}]: {kind!r} tools are not supported (function tools are)", param="tools")
        unknown = sorted(set(tool) - _TOOL_KEYS)
        if unknown:
            raise APIError(400, f"tools[{i}] has unknown field {unknown[0]!r}", param="tools")
        name, parameters = tool.get("name"), tool.get("parameters")
        description, strict = tool.get("description"), tool.get("strict")
        if not (isinstance(name, str) and isinstance(parameters, (dict, type(None)))
                and isinstance(description, (str, type(None))) and isinstance(strict, (bool, type(None)))):
            raise APIError(400, f"tools[{i}] needs a string name; parameters an object, description a string, "
                           "strict a boolean", param="tools")
        out.append(Tool("function", FunctionDefinition(name, description, parameters, strict)))
    return out


def chat_request(req: ResponsesRequest, conversation: list[Item]) -> ChatRequest:
    """The chat request of the Responses request whose whole conversation is `conversation`."""
    instructions = [ChatMessage(role="system", content=req.instructions)] if req.instructions is not None else []
    tools = chat_tools(req.tools)
    choice = req.tool_choice
    schema = format_schema(req.text.format if req.text else None)
    if schema is not None and (choice == "required" or isinstance(choice, FunctionChoice)):
        raise APIError(400, "tool_choice 'required' or a named function and text.format both constrain the "
                       "output; give one of them", param="tool_choice")
    return ChatRequest(
        model=req.model, messages=instructions + chat_messages(conversation), max_completion_tokens=req.max_output_tokens,
        reasoning_effort=req.reasoning.effort if req.reasoning is not None else None,
        temperature=req.temperature, top_p=req.top_p, tools=tools, json_schema=schema, user=req.user,
        priority=req.priority,
        logprobs=wants_logprobs(req), top_logprobs=req.top_logprobs if wants_logprobs(req) else None,
        tool_choice=NamedToolChoice("function", FunctionName(choice.name)) if isinstance(choice, FunctionChoice)
        else choice, parallel_tool_calls=req.parallel_tool_calls if tools else None)
