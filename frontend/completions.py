"""POST /v1/completions: the shaping step (prompt strings or token ids; echo, legacy logprobs)."""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from radixflow.frontend.errors import APIError
from radixflow.frontend.openai_route import Job, Prompts, finish_reason, handle, response_usage
from radixflow.frontend.openai_sampling import Constraint
from radixflow.frontend.openai_schemas import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest
from radixflow.runtime.sampling_params import RequestOptions


def check_prompt_size(prompt: Any, limits: Any, param: str = "prompt") -> None:
    """Limits on the raw prompt (`param`: its field), before tokenization."""
    if isinstance(prompt, str):
        limits.check_text(len(prompt), param)
        return
    if not all(isinstance(p, int) for p in prompt):  # else: one prompt of token ids
        limits.check_prompts(len(prompt), param)
    limits.check_text(sum(len(p) for p in prompt if isinstance(p, str)), param)
    limits.check_ids(sum(len(p) if isinstance(p, list) else 1 for p in prompt if not isinstance(p, str)), param)


def parse_prompts(prompt: Any, tokenizer: Any, param: str = "prompt") -> Prompts:
    """Token ids and text per prompt from a string, a list of strings, token ids, or a list of
    those (`param`: the field, for errors)."""
    if isinstance(prompt, str):
        return Prompts([tokenizer.encode(prompt)], [prompt])
    if prompt and all(isinstance(p, str) for p in prompt):
        return Prompts([tokenizer.encode(p) for p in prompt], list(prompt))
    if prompt and all(isinstance(p, int) for p in prompt):
        ids = [list(prompt)]
    elif prompt and all(isinstance(p, list) for p in prompt):
        ids = [list(p) for p in prompt]
    else:
        raise APIError(400, f"{param} must be a string, a list of strings, a list of token ids, or a list "
                       "of token id lists (non-empty, not mixed)", param=param)
    try:
        return Prompts(ids, [tokenizer.decode(p) for p in ids])
    except ValueError as exc:  # negative or oversized ids
        raise APIError(400, f"{param} token ids are invalid: {exc}", param=param) from exc


def to_logprobs(entries: list, tops: list | None, offset: int, tokenizer: Any = None) -> CompletionLogprobs:
    """Native [logprob, token_id, text] entries → OpenAI's legacy logprobs object. Offsets count
    the characters each token adds to the text (a special token such as BOS adds none)."""
    special = tokenizer.special_token_ids if tokenizer is not None else frozenset()
    tokens = [e[2] or "" for e in entries]
    offsets = []
    for entry, token in zip(entries, tokens):
        offsets.append(offset)
        offset += 0 if entry[1] in special else len(token)
    top = [None if t is None else {x[2] or "": x[0] for x in t} for t in tops] if tops else [None] * len(entries)
    return CompletionLogprobs(tokens, [e[0] for e in entries], top, offsets)


def chunk_logprobs(meta: dict, offset: int, echo_text: str | None = None,
                   tokenizer: Any = None) -> CompletionLogprobs | None:
    """This chunk's output tokens from character `offset` on; with `echo_text` (first chunk of an
    echo request) the prompt's tokens first, and the output's offsets start after that text."""
    if "output_token_logprobs" not in meta:
        return None
    start = offset if echo_text is None else len(echo_text)
    out = to_logprobs(meta["output_token_logprobs"], meta.get("output_top_logprobs"), start, tokenizer)
    if echo_text is None:
        return out
    prompt = to_logprobs(meta.get("input_token_logprobs", []), meta.get("input_top_logprobs"), 0, tokenizer)
    return CompletionLogprobs(prompt.tokens + out.tokens, prompt.token_logprobs + out.token_logprobs,
                              prompt.top_logprobs + out.top_logprobs, prompt.text_offset + out.text_offset)


class CompletionShape:
    schema = CompletionRequest
    id_prefix = "cmpl"
    prompt_param = "prompt"

    def check(self, req: CompletionRequest, request: Request) -> None:
        limits = request.app.state.server.limits
        if req.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if req.logprobs is not None:
            limits.check_top_logprobs(req.logprobs, "logprobs")
        if req.best_of is not None and req.best_of != (req.n or 1):
            raise APIError(400, "best_of other than n is not supported", param="best_of")
        check_prompt_size(req.prompt, limits)

    def constraint(self, state: None, own: Constraint | None) -> Constraint | None:
        return own  # a completion's constraints are its own fields

    def max_tokens(self, req: CompletionRequest) -> int | None:
        return req.max_tokens

    def max_tokens_param(self, req: CompletionRequest) -> str:
        return "max_tokens"

    def prompts(self, req: CompletionRequest, tokenizer: Any) -> Prompts:
        return parse_prompts(req.prompt, tokenizer)

    def options(self, req: CompletionRequest) -> dict[str, Any]:
        return RequestOptions(return_logprob=req.logprobs is not None, top_logprobs_num=req.logprobs or 0,
                              return_text_in_logprobs=True, logprob_start_len=0 if req.echo else -1,
                              session_id=req.user, priority=req.priority).engine_kwargs()

    def _echo(self, job: Job, index: int) -> str | None:
        return job.prompts.texts[index // job.sampling.n] if job.req.echo else None

    def response(self, job: Job, results: list[dict], tokenizer: Any) -> Completion:
        choices = []
        for index, res in enumerate(results):
            meta, echo = res["meta_info"], self._echo(job, index)
            lp = chunk_logprobs(meta, 0, echo, tokenizer)
            choices.append(CompletionChoice(index, (echo or "") + res["text"], lp, finish_reason(meta)))
        return Completion(**job.head, choices=choices, usage=response_usage(job, results))

    def opening(self, job: Job) -> list[Completion]:
        return []

    def delta(self, job: Job, index: int, chunk: dict, reason: str | None, tokenizer: Any) -> Completion | None:
        state = job.streams.setdefault(index, {"offset": 0, "first": True})
        echo = self._echo(job, index) if state["first"] else None
        state["first"] = False
        delta = (echo or "") + chunk["text"]  # the stream is incremental: only what is new
        lp = chunk_logprobs(chunk["meta_info"], state["offset"], echo, tokenizer)
        if lp is not None and lp.text_offset:
            last = chunk["meta_info"]["output_token_logprobs"]
            last_id = last[-1][1] if last else None
            state["offset"] = lp.text_offset[-1] + (0 if last_id in tokenizer.special_token_ids else len(lp.tokens[-1]))
        if not (delta or reason is not None or (lp is not None and lp.tokens)):
            return None
        return Completion(**job.head, choices=[CompletionChoice(index, delta, lp, reason)])

    def chunk(self, job: Job, choices: list, usage: Any) -> Completion:
        return Completion(**job.head, choices=choices, usage=usage)


SHAPE = CompletionShape()


async def create_completion(request: Request) -> Response:
    return await handle(request, SHAPE)
