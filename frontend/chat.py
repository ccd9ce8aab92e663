"""POST /v1/chat/completions: the shaping step (chat template with tool messages, chat logprobs, role chunks)."""
from __future__ import annotations

import json
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.errors import APIError
from radixflow.frontend.openai_route import Job, Prompts, finish_reason, handle, response_usage
from radixflow.frontend.openai_schemas import (
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatMessage,
    ChatRequest, ChoiceLogprobs, Delta, TokenLogprob, ToolCall, TopLogprob,
)
from radixflow.runtime.sampling_params import RequestOptions


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


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: text content, `developer` read as `system`,
    tool_calls (arguments decoded) and tool_call_id kept."""
    out = []
    for m in messages:
        content = m.content if m.content is None or isinstance(m.content, str) else "".join(p.text for p in m.content)
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_calls is not None:
            msg["tool_calls"] = _tool_calls(m.tool_calls)
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def message_chars(messages: list[ChatMessage]) -> int:
    """Characters the template renders: content, tool calls, and each message's role, name and
    tool_call_id (so many near-empty messages count too)."""
    total = 0
    for m in messages:
        total += len(m.role) + len(m.name or "") + len(m.tool_call_id or "")
        if isinstance(m.content, str):
            total += len(m.content)
        elif m.content is not None:
            total += sum(len(p.text) for p in m.content)
        total += len(msgspec.json.encode(m.tool_calls)) if m.tool_calls else 0
    return total


def to_logprobs(meta: dict, tokenizer: Any) -> ChoiceLogprobs | None:
    """Native output logprob entries ([logprob, token_id, text]) → OpenAI chat logprobs."""
    if "output_token_logprobs" not in meta:
        return None
    tops = meta.get("output_top_logprobs") or [None] * len(meta["output_token_logprobs"])

    def top(entry: list) -> TopLogprob:
        return TopLogprob(entry[2] or "", entry[0], list(tokenizer.token_bytes(entry[1])))

    content = [TokenLogprob(e[2] or "", e[0], list(tokenizer.token_bytes(e[1])), [top(t) for t in (ts or [])])
               for e, ts in zip(meta["output_token_logprobs"], tops)]
    return ChoiceLogprobs(content)


class ChatShape:
    schema = ChatRequest
    id_prefix = "chatcmpl"
    prompt_param = "messages"

    def check(self, req: ChatRequest, request: Request) -> None:
        limits = request.app.state.server.limits
        if req.tools:
            raise APIError(400, "tools are not supported by this server", param="tools")
        if req.tool_choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools, which this server does not support", param="tool_choice")
        if req.parallel_tool_calls is not None:
            raise APIError(400, "parallel_tool_calls needs tools, which this server does not support",
                           param="parallel_tool_calls")
        if req.top_logprobs is not None:
            if not req.logprobs:
                raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
            limits.check_top_logprobs(req.top_logprobs, "top_logprobs")
        limits.check_messages(len(req.messages), "messages")
        limits.check_text(message_chars(req.messages), "messages")

    def max_tokens(self, req: ChatRequest) -> int | None:
        return req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens

    def max_tokens_param(self, req: ChatRequest) -> str:
        return "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"

    def prompts(self, req: ChatRequest, tokenizer: Any) -> Prompts:
        try:
            ids = tokenizer.apply_chat_template(template_messages(req.messages), add_generation_prompt=True,
                                                tokenize=True)
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from exc
        return Prompts([ids], [""])

    def options(self, req: ChatRequest) -> dict[str, Any]:
        return RequestOptions(return_logprob=req.logprobs, top_logprobs_num=req.top_logprobs or 0,
                              return_text_in_logprobs=True, session_id=req.user).engine_kwargs()

    def response(self, job: Job, results: list[dict], tokenizer: Any) -> ChatCompletion:
        choices = [ChatChoice(i, AssistantMessage(content=r["text"]), to_logprobs(r["meta_info"], tokenizer),
                              finish_reason(r["meta_info"])) for i, r in enumerate(results)]
        return ChatCompletion(**job.head, choices=choices, usage=response_usage(job, results))

    def opening(self, job: Job) -> list[ChatCompletionChunk]:
        """A role chunk per choice first, as OpenAI sends."""
        return [self.chunk(job, [ChatChunkChoice(i, Delta(role="assistant", content=""), None, None)], None)
                for i in range(job.sampling.n)]

    def delta(self, job: Job, index: int, chunk: dict, reason: str | None,
              tokenizer: Any) -> ChatCompletionChunk | None:
        delta = chunk["text"]  # the stream is incremental: only what is new
        lp = to_logprobs(chunk["meta_info"], tokenizer)
        if not (delta or reason is not None or (lp is not None and lp.content)):
            return None
        return self.chunk(job, [ChatChunkChoice(index, Delta(content=delta) if delta else Delta(), lp, reason)],
                          None)

    def chunk(self, job: Job, choices: list, usage: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(**job.head, choices=choices, usage=usage)


SHAPE = ChatShape()


async def create_chat_completion(request: Request) -> Response:
    return await handle(request, SHAPE)
