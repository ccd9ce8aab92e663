"""How a chat request's messages become its prompt: the chat template's view of the messages,
the size they count toward the prompt limit, and the template options vLLM takes beside them
(`add_generation_prompt`, `continue_final_message`, `chat_template_kwargs`). Shared by
/v1/chat/completions and /tokenize, so a tokenized conversation is the chat request's prompt."""
from __future__ import annotations

import json
from typing import Any

import msgspec

from radixflow.frontend.errors import APIError
from radixflow.frontend.openai_schemas import ChatMessage, ToolCall
from radixflow.frontend.tools import tool_chars

# variables the request itself gives the template: chat_template_kwargs may not set them
_OWN_VARIABLES = frozenset({"messages", "add_generation_prompt", "continue_final_message", "tools", "tokenize"})


def _tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """As dicts for the template. OpenAI sends function arguments as a JSON string; chat
    templates expect the object (a string that is not JSON is passed on as sent)."""
    out = []
    for call in calls:
        arguments = call.function.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (json.JSONDecodeError, RecursionError):
                pass  # not JSON (or nested past the parser's depth): the template gets the string as sent
        entry = {"type": call.type, "function": {"name": call.function.name, "arguments": arguments}}
        out.append(entry if call.id is None else {"id": call.id, **entry})
    return out


def message_text(message: ChatMessage) -> str:
    """A message's text: its content, or its text parts joined ("" for none)."""
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(p.text for p in content)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: text content, `developer` read as `system`,
    tool_calls (arguments decoded) and tool_call_id kept, an assistant turn's reasoning as
    `reasoning_content` and `thinking` (sent as `reasoning_content` or `reasoning`)."""
    out = []
    for m in messages:
        content = m.content if m.content is None else message_text(m)
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_calls is not None:
            msg["tool_calls"] = _tool_calls(m.tool_calls)
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        reasoning = m.reasoning_content if m.reasoning_content is not None else m.reasoning
        if reasoning is not None:  # the names thinking models' templates read: gpt-oss's `thinking`, others'
            msg["reasoning_content"] = msg["thinking"] = reasoning
        out.append(msg)
    return out


def message_chars(messages: list[ChatMessage]) -> int:
    """Characters the template renders: content, tool calls, and each message's role, name and
    tool_call_id (so many near-empty messages count too)."""
    total = 0
    for m in messages:
        total += len(m.role) + len(m.name or "") + len(m.tool_call_id or "")
        total += len(m.reasoning_content or "") + len(m.reasoning or "")
        if isinstance(m.content, str):
            total += len(m.content)
        elif m.content is not None:
            total += sum(len(p.text) for p in m.content)
        total += len(msgspec.json.encode(m.tool_calls)) if m.tool_calls else 0
    return total


def check_chat_prompt(req: Any, limits: Any) -> None:
    """Limits and option conflicts of a request with `messages` and the template options (a
    ChatRequest or a TokenizeRequest); APIError(400) naming the field."""
    limits.check_messages(len(req.messages), "messages")
    kwargs = req.chat_template_kwargs or {}
    limits.check_text(message_chars(req.messages) + tool_chars(req) + (len(msgspec.json.encode(kwargs)) if kwargs else 0),
                      "messages")
    if req.continue_final_message and req.add_generation_prompt:
        raise APIError(400, "continue_final_message continues the last message and add_generation_prompt "
                       "(true by default) opens a new one: send add_generation_prompt false",
                       param="continue_final_message")
    reserved = sorted(_OWN_VARIABLES.intersection(kwargs))
    if reserved:
        raise APIError(400, f"chat_template_kwargs may not set {', '.join(reserved)}: the request's own "
                       "fields give them", param="chat_template_kwargs")


def template_kwargs(req: Any) -> dict[str, Any]:
    """The template variables beside the messages: `chat_template_kwargs`, and OpenAI's
    `reasoning_effort` as the variable of that name (templates of models with effort levels read
    it); effort "none" also sets `enable_thinking` false (Qwen3's switch), unless the request's
    own kwargs set either."""
    effort = getattr(req, "reasoning_effort", None)
    given = req.chat_template_kwargs or {}
    if effort is None:
        return given
    implied: dict[str, Any] = {"reasoning_effort": effort}
    if effort == "none":
        implied["enable_thinking"] = False
    return {**implied, **given}


def render_chat(req: Any, tokenizer: Any, tools: list[dict[str, Any]] | None) -> str:
    """The prompt text of a checked request (check_chat_prompt); the template's refusal (a role
    it does not know, a final message with nothing to continue) is a 400 on `messages`."""
    try:
        return tokenizer.apply_chat_template(
            template_messages(req.messages), add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message, tools=tools, **template_kwargs(req))
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages") from exc
