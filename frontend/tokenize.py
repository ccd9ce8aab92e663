"""POST /tokenize and /detokenize (also under /v1/): the served model's tokenizer and chat template,
without the engine.

Shapes: vLLM's (`{count, max_model_len, tokens, token_strs}`; a chat request's `messages` render
through the chat template as /v1/chat/completions renders them, so `count` is that request's
`prompt_tokens`) and SGLang's (`prompt` may be a list of strings: `tokens` and `count` are then
lists). /detokenize answers the text under both projects' names, `prompt` (vLLM) and `text`
(SGLang).
"""
from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.body import json_response, off_loop_if_large, read_json
from radixflow.frontend.chat_prompt import check_chat_prompt, render_chat
from radixflow.frontend.errors import APIError
from radixflow.frontend.openai_common import check_model
from radixflow.frontend.openai_schemas import ChatMessage, ReasoningEffort, Tool


class TokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Exactly one of `prompt` and `messages`. `add_special_tokens` defaults to True for a prompt
    (BOS where the tokenizer adds it, as a completion's prompt) and False for messages (the chat
    template writes its own). With messages, `tools` and the template options are a chat
    request's (the tools are shown to the template as with tool_choice auto)."""

    model: str | None = None
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: ReasoningEffort | None = None
    return_token_strs: bool = False


class TokenizeResponse(msgspec.Struct):
    count: int | list[int]
    max_model_len: int
    tokens: list[int | list[int]]  # one prompt's ids, or one list per prompt
    token_strs: list[str | None | list[str | None]] | None


class DetokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    tokens: list[int | list[int]]  # one sequence's ids, or a list of them
    model: str | None = None
    skip_special_tokens: bool = False  # the text of exactly these ids, as a round trip expects


class DetokenizeResponse(msgspec.Struct):
    prompt: str | list[str]
    text: str | list[str]


def _check_model(request: Request, model: str | None) -> None:
    if model is not None:
        check_model(request, model)  # a LoRA adapter's name serves too: it shares the tokenizer


def _encode(req: TokenizeRequest, tokenizer: Any) -> list[list[int]]:
    if req.messages is not None:
        text = render_chat(req, tokenizer, msgspec.to_builtins(req.tools) if req.tools else None)
        return [tokenizer.encode(text, add_special_tokens=bool(req.add_special_tokens))]
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    special = req.add_special_tokens is not False
    return [tokenizer.encode(p, add_special_tokens=special) for p in prompts]


def _check_tokenize(request: Request, req: TokenizeRequest) -> None:
    limits = request.app.state.server.limits
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "send exactly one of prompt and messages")
    if req.prompt is not None and (req.tools or req.chat_template_kwargs or req.continue_final_message
                                   or req.reasoning_effort is not None):
        raise APIError(400, "tools, chat_template_kwargs, continue_final_message and reasoning_effort go with "
                       "messages, not a prompt")
    if req.messages is not None:
        if not req.messages:
            raise APIError(400, "messages must not be empty", param="messages")
        check_chat_prompt(req, limits)
    else:
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        limits.check_prompts(len(prompts), "prompt")
        limits.check_text(sum(map(len, prompts)), "prompt")


async def tokenize(request: Request) -> Response:
    req = await read_json(request, TokenizeRequest)
    _check_model(request, req.model)
    _check_tokenize(request, req)
    engine = request.app.state.server.engine
    ids = await off_loop_if_large(request, _encode, req, engine.tokenizer)
    strs = [[engine.tokenizer.id_to_token(i) for i in one] for one in ids] if req.return_token_strs else None
    if isinstance(req.prompt, list):
        return json_response(TokenizeResponse([len(one) for one in ids], engine.max_context_len, ids, strs))
    return json_response(TokenizeResponse(len(ids[0]), engine.max_context_len, ids[0], strs and strs[0]))


async def detokenize(request: Request) -> Response:
    req = await read_json(request, DetokenizeRequest)
    _check_model(request, req.model)
    server = request.app.state.server
    many = bool(req.tokens) and isinstance(req.tokens[0], list)
    if any(isinstance(t, list) != many for t in req.tokens):
        raise APIError(400, "tokens must be a list of ids or a list of lists of ids, not both", param="tokens")
    lists: list[list[int]] = req.tokens if many else [req.tokens]  # type: ignore[assignment]
    server.limits.check_prompts(len(lists), "tokens")
    server.limits.check_ids(sum(map(len, lists)), "tokens")
    vocab = server.engine.vocab_size
    bad = next((i for one in lists for i in one if not 0 <= i < vocab), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is outside the vocabulary [0, {vocab})", param="tokens")
    texts = [server.engine.tokenizer.decode(one, skip_special_tokens=req.skip_special_tokens) for one in lists]
    text = texts if many else texts[0]
    return json_response(DetokenizeResponse(text, text))
