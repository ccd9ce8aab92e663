"""POST /v1/chat/completions: the shaping step (chat template with tools and tool messages, tool
calls out of the text, chat logprobs, role chunks)."""
from __future__ import annotations

import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.chat_prompt import check_chat_prompt, render_chat
from radixflow.frontend.errors import APIError
from radixflow.frontend.openai_route import Job, Prompts, finish_reason, handle, response_usage
from radixflow.frontend.openai_sampling import Constraint
from radixflow.frontend.openai_schemas import (
    AssistantMessage, CalledFunction, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatRequest, ChatToolCall, ChoiceLogprobs, Delta, DeltaToolCall, TokenLogprob, TopLogprob,
)
from radixflow.frontend.tool_calls import Call, Event, Parser
from radixflow.frontend.tools import ToolPlan, template_tools, tool_plan
from radixflow.runtime.sampling_params import RequestOptions


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


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def tool_reason(reason: str | None, called: bool) -> str | None:
    """"tool_calls" for an output that called tools and ended by itself (as vLLM reports it)."""
    return "tool_calls" if called and reason == "stop" else reason


def _text_and_calls(events: list[Event]) -> tuple[str, list[Call]]:
    return "".join(e for e in events if isinstance(e, str)), [e for e in events if isinstance(e, Call)]


class _ToolStream:
    """One streamed choice's parser, and how many calls it gave out (the next call's index)."""

    def __init__(self, parser: Parser) -> None:
        self.parser, self.calls = parser, 0

    def step(self, text: str, last: bool) -> tuple[str, list[DeltaToolCall]]:
        events = self.parser.feed(text) + (self.parser.finish() if last else [])
        text, calls = _text_and_calls(events)
        out = [DeltaToolCall(index=self.calls + k, id=call_id(), function=CalledFunction(c.name, c.arguments))
               for k, c in enumerate(calls)]
        self.calls += len(out)
        return text, out


def assistant_message(plan: ToolPlan, text: str, reason: str | None) -> tuple[AssistantMessage, str | None]:
    """A whole choice's message and finish_reason: its text parsed for tool calls when the plan
    says so; content null when the output is calls only."""
    parser = plan.parser()
    if parser is None:
        return AssistantMessage(role="assistant", content=text), reason
    content, calls = _text_and_calls(parser.feed(text) + parser.finish())
    tool_calls = [ChatToolCall(id=call_id(), function=CalledFunction(c.name, c.arguments)) for c in calls]
    message = AssistantMessage(role="assistant", content=None if calls and not content else content,
                               tool_calls=tool_calls or None)
    return message, tool_reason(reason, bool(calls))


class ChatShape:
    schema = ChatRequest
    id_prefix = "chatcmpl"
    prompt_param = "messages"

    def check(self, req: ChatRequest, request: Request) -> ToolPlan:
        server = request.app.state.server
        limits = server.limits
        if req.top_logprobs is not None:
            if not req.logprobs:
                raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
            limits.check_top_logprobs(req.top_logprobs, "top_logprobs")
        check_chat_prompt(req, limits)
        return tool_plan(req, limits, getattr(server.engine, "supports_grammar", False), server.tool_call_parser)

    def constraint(self, plan: ToolPlan) -> Constraint | None:
        return plan.constraint

    def max_tokens(self, req: ChatRequest) -> int | None:
        return req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens

    def max_tokens_param(self, req: ChatRequest) -> str:
        return "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"

    def prompts(self, req: ChatRequest, tokenizer: Any) -> Prompts:
        text = render_chat(req, tokenizer, template_tools(req))
        return Prompts([tokenizer.encode(text, add_special_tokens=False)], [""])

    def options(self, req: ChatRequest) -> dict[str, Any]:
        return RequestOptions(return_logprob=req.logprobs, top_logprobs_num=req.top_logprobs or 0,
                              return_text_in_logprobs=True, session_id=req.user).engine_kwargs()

    def response(self, job: Job, results: list[dict], tokenizer: Any) -> ChatCompletion:
        choices = []
        for i, r in enumerate(results):
            message, reason = assistant_message(job.state, r["text"], finish_reason(r["meta_info"]))
            choices.append(ChatChoice(i, message, to_logprobs(r["meta_info"], tokenizer), reason))
        return ChatCompletion(**job.head, choices=choices, usage=response_usage(job, results))

    def opening(self, job: Job) -> list[ChatCompletionChunk]:
        """A role chunk per choice first, as OpenAI sends."""
        return [self.chunk(job, [ChatChunkChoice(i, Delta(role="assistant", content=""), None, None)], None)
                for i in range(job.sampling.n)]

    def delta(self, job: Job, index: int, chunk: dict, reason: str | None,
              tokenizer: Any) -> ChatCompletionChunk | None:
        delta, calls = chunk["text"], []  # the stream is incremental: only what is new
        stream = job.streams.get(index)
        if stream is None and (parser := job.state.parser()) is not None:
            stream = job.streams[index] = _ToolStream(parser)
        if stream is not None:
            delta, calls = stream.step(delta, reason is not None)
            reason = tool_reason(reason, stream.calls > 0)
        lp = to_logprobs(chunk["meta_info"], tokenizer)
        if not (delta or calls or reason is not None or (lp is not None and lp.content)):
            return None
        return self.chunk(job, [ChatChunkChoice(index, Delta(content=delta or None, tool_calls=calls or None), lp,
                                                reason)], None)

    def chunk(self, job: Job, choices: list, usage: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(**job.head, choices=choices, usage=usage)


SHAPE = ChatShape()


async def create_chat_completion(request: Request) -> Response:
    return await handle(request, SHAPE)
