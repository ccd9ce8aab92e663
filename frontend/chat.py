"""POST /v1/chat/completions: the shaping step (chat template with tools and tool messages, tool
calls out of the text, chat logprobs, role chunks)."""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.chat_prompt import check_chat_prompt, message_text, render_chat, template_kwargs
from radixflow.frontend.errors import APIError
from radixflow.frontend.openai_route import Job, Prompts, finish_reason, handle, response_usage
from radixflow.frontend.openai_sampling import Constraint
from radixflow.frontend.openai_schemas import (
    AssistantMessage, CalledFunction, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatRequest, ChatToolCall, ChoiceLogprobs, Delta, DeltaFunction, DeltaToolCall, TokenLogprob, TopLogprob,
)
from radixflow.frontend.harmony import HarmonyChoiceParser
from radixflow.frontend.reasoning import ChoiceParser
from radixflow.frontend.tool_calls import Call, CallArgs, CallStart, FirstCallOnly, Parser, whole
from radixflow.frontend.tools import ToolPlan, template_tools, tool_plan
from radixflow.runtime.sampling_params import RequestOptions
from radixflow.runtime.text.reasoning import FORMATS, ReasoningParser, Thought, leaves_open


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


@dataclass(frozen=True)
class ChatPlan:
    """How a chat request's output is read: its tool plan, and the reasoning format it is split
    by (None: not split), whether the output starts inside the block, whether the reasoning is
    returned (frontend/reasoning.py)."""

    tools: ToolPlan
    reasoning: str | None = None
    opened: bool = False
    include_reasoning: bool = True
    thinking: bool = False  # a constraint holds after the block (the template was not told not to think)
    harmony_server: bool = False  # the server's --reasoning-parser is gpt_oss (calls read even when not split)

    def constraint(self, own: Constraint | None) -> Constraint | None:
        """The output's grammar: the tool plan's, else the request's own; with a reasoning
        format and thinking on, it starts after the format's closing tag (`</think>`)."""
        constraint = self.tools.constraint or own
        if constraint is None or not self.thinking:
            return constraint
        assert self.reasoning is not None, "thinking is set with a reasoning format only"
        return Constraint({**constraint.params, "constrain_after": FORMATS[self.reasoning].close_tag}, constraint.param)

    @property
    def harmony(self) -> bool:
        """The output is read as gpt-oss's harmony messages (its markers are special tokens the
        text must keep): under --reasoning-parser gpt_oss, or --tool-call-parser gpt_oss with tools."""
        return (self.reasoning is not None and FORMATS[self.reasoning].harmony) or (
            self.tools.mode == "auto" and (self.tools.call_format == "gpt_oss" or self.harmony_server))

    def parser(self) -> Parser | ChoiceParser | HarmonyChoiceParser | FirstCallOnly | None:
        """A fresh parser for one choice's text; None when the text is plain content."""
        if self.harmony:
            auto = self.tools.mode == "auto"
            parser = HarmonyChoiceParser(self.tools.names if auto else None, self.reasoning is not None,
                                         self.include_reasoning, None if auto else self.tools.parser())
            return parser if not auto or self.tools.parallel else FirstCallOnly(parser)  # type: ignore[arg-type]
        tools = self.tools.parser()
        if self.reasoning is None:
            return tools
        return ChoiceParser(ReasoningParser(self.opened, FORMATS[self.reasoning]), tools, self.include_reasoning)


def reasoning_plan(req: ChatRequest, tools: ToolPlan, reasoning_parser: str | None) -> ChatPlan:
    """The request's ChatPlan under the server's `--reasoning-parser`. The output starts inside
    the block when the format says so, unless the template was told not to think (enable_thinking
    or thinking false among its variables, `reasoning_effort` "none"; deepseek_v3's unless it was
    told to think, `thinking` true): then it is reasoning only
    when it opens with <think>, and a grammar holds from the first token, else from after </think>.
    With `continue_final_message` the output goes on from the final message's text, not from the
    start of a turn the template opened: it is in the block when that text leaves one open."""
    if reasoning_parser is None or not req.separate_reasoning:
        return ChatPlan(tools, harmony_server=reasoning_parser is not None and FORMATS[reasoning_parser].harmony)
    kwargs = template_kwargs(req)
    fmt = FORMATS[reasoning_parser]
    # unset: the template's default (DeepSeek-V3.1's thinks only when told to)
    thinking = kwargs.get("enable_thinking", kwargs.get("thinking", None if fmt.thinks_by_default else False))
    thinking = thinking is not False
    opened = fmt.opened and thinking
    if req.continue_final_message and req.messages:  # (no messages: the template refuses them)
        opened = thinking = leaves_open(message_text(req.messages[-1]), fmt)
    return ChatPlan(tools, reasoning_parser, opened, req.include_reasoning, thinking)


def _split(events: list[Any]) -> tuple[str, str, list[Any]]:
    """(reasoning, content, call events) of parser events."""
    return ("".join(e.text for e in events if isinstance(e, Thought)), "".join(e for e in events if isinstance(e, str)),
            [e for e in events if isinstance(e, (CallStart, CallArgs))])


def _saw_reasoning(parser: Any) -> bool:
    parser = parser.parser if isinstance(parser, FirstCallOnly) else parser
    if isinstance(parser, HarmonyChoiceParser):
        return parser.saw_reasoning
    return isinstance(parser, ChoiceParser) and parser.reasoning.saw_block


class _ChoiceStream:
    """One streamed choice's parser, and how many calls it gave out (the next call's index)."""

    def __init__(self, parser: Parser | ChoiceParser) -> None:
        self.parser, self.calls = parser, 0

    def step(self, text: str, last: bool) -> tuple[str, str, list[DeltaToolCall]]:
        events = self.parser.feed(text) + (self.parser.finish() if last else [])
        thought, text, calls = _split(events)
        out: list[DeltaToolCall] = []
        for event in calls:  # a call's start and the pieces after it in this step are one delta
            if isinstance(event, CallStart):
                self.calls += 1
                out.append(DeltaToolCall(index=self.calls - 1, id=call_id(), type="function",
                                         function=DeltaFunction(name=event.name, arguments="")))
            elif out:
                out[-1].function.arguments += event.text
            else:
                out.append(DeltaToolCall(index=self.calls - 1, function=DeltaFunction(arguments=event.text)))
        return thought, text, out


def assistant_message(plan: ChatPlan, text: str, reason: str | None) -> tuple[AssistantMessage, str | None]:
    """A whole choice's message and finish_reason: its reasoning split off and its text parsed
    for tool calls when the plan says so; content null when the output is calls or reasoning
    only."""
    parser = plan.parser()
    if parser is None:
        return AssistantMessage(role="assistant", content=text), reason
    thought, content, events = _split(parser.feed(text) + parser.finish())
    calls = [c for c in whole(events) if isinstance(c, Call)]
    reasoning = thought if _saw_reasoning(parser) and plan.include_reasoning else None
    tool_calls = [ChatToolCall(id=call_id(), function=CalledFunction(c.name, c.arguments)) for c in calls]
    empty = not content and (calls or _saw_reasoning(parser))
    message = AssistantMessage(role="assistant", content=None if empty else content, reasoning_content=reasoning,
                               reasoning=reasoning, tool_calls=tool_calls or None)
    return message, tool_reason(reason, bool(calls))


class ChatShape:
    schema = ChatRequest
    id_prefix = "chatcmpl"
    prompt_param = "messages"

    def check(self, req: ChatRequest, request: Request) -> ChatPlan:
        server = request.app.state.server
        limits = server.limits
        if req.top_logprobs is not None:
            if not req.logprobs:
                raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
            limits.check_top_logprobs(req.top_logprobs, "top_logprobs")
        check_chat_prompt(req, limits)
        tools = tool_plan(req, limits, getattr(server.engine, "supports_grammar", False), server.tool_call_parser)
        plan = reasoning_plan(req, tools, server.reasoning_parser)
        if (tools.keeps_special_tokens or plan.harmony) and req.skip_special_tokens is None:
            req.skip_special_tokens = False  # the format's markers are special tokens
        return plan

    def constraint(self, plan: ChatPlan, own: Constraint | None) -> Constraint | None:
        return plan.constraint(own)

    def max_tokens(self, req: ChatRequest) -> int | None:
        return req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens

    def max_tokens_param(self, req: ChatRequest) -> str:
        return "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"

    def prompts(self, req: ChatRequest, tokenizer: Any) -> Prompts:
        text = render_chat(req, tokenizer, template_tools(req))
        return Prompts([tokenizer.encode(text, add_special_tokens=False)], [""])

    def options(self, req: ChatRequest) -> dict[str, Any]:
        return RequestOptions(return_logprob=req.logprobs, top_logprobs_num=req.top_logprobs or 0,
                              return_text_in_logprobs=True, session_id=req.user, priority=req.priority).engine_kwargs()

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
        thought, delta, calls = "", chunk["text"], []  # the stream is incremental: only what is new
        stream = job.streams.get(index)
        if stream is None and (parser := job.state.parser()) is not None:
            stream = job.streams[index] = _ChoiceStream(parser)
        if stream is not None:
            thought, delta, calls = stream.step(delta, reason is not None)
            reason = tool_reason(reason, stream.calls > 0)
        lp = to_logprobs(chunk["meta_info"], tokenizer)
        if not (thought or delta or calls or reason is not None or (lp is not None and lp.content)):
            return None
        out = Delta(content=delta or None, reasoning_content=thought or None, reasoning=thought or None,
                    tool_calls=calls or None)
        return self.chunk(job, [ChatChunkChoice(index, out, lp, reason)], None)

    def chunk(self, job: Job, choices: list, usage: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(**job.head, choices=choices, usage=usage)


SHAPE = ChatShape()


async def create_chat_completion(request: Request) -> Response:
    return await handle(request, SHAPE)
