"""select(): score each choice by the logprobs of its tokens after the context, pick the best.

Protocol (the same requests SGLang's RuntimeEndpoint sends, adjusted at the boundary):
  1. {"text": context, max_new_tokens 0}                      → P = meta_info.prompt_tokens
  2. {"text": [context + c ...], max_new_tokens 0, return_logprob, return_text_in_logprobs,
      logprob_start_len: P - 1}                                → input_token_logprobs per choice
  3. only for unconditional_likelihood_normalized:
     {"input_ids": [choice token ids ...], max_new_tokens 0, return_logprob, logprob_start_len 0}

Entries of step 2 start at position P - 1:

    position:   0 ........ P-2 | P-1 | P ......... N-1
    tokens:     context          last  choice tokens
                                 ctx
                                 tok?

Positions >= P are the choice's. Position P - 1 is the context's last token unless tokenizing
context + choice merged it with the choice's first characters; then its text is no longer a
suffix of the context and it is scored as part of the choice.
"""
from __future__ import annotations

import math
from typing import Any

from radixflow.lang.backend import check_finished

Entry = list  # [logprob | None, token_id, token_text | None]


class ChoicesMethod:
    """How per-token logprobs of each choice become one score per choice (highest wins, first on ties)."""

    name = ""
    needs_unconditional = False

    def scores(self, cond: list[list[Entry]], uncond: list[list[Entry]] | None) -> list[float]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"rf.{self.name}"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else -math.inf


def _logprobs(entries: list[Entry]) -> list[float]:
    return [e[0] for e in entries if e[0] is not None]


class TokenLengthNormalized(ChoicesMethod):
    """Mean logprob of the choice's tokens."""

    name = "token_length_normalized"

    def scores(self, cond, uncond):
        return [_mean(_logprobs(entries)) for entries in cond]


class UnconditionalLikelihoodNormalized(ChoicesMethod):
    """Mean over the choice's tokens of log P(tok | context, ...) - log P(tok | choice alone, ...).

    The choice's first token has no unconditional logprob (null at position 0): it counts as 0
    (SGLang's definition, after EleutherAI's multiple-choice normalization). When the backend
    returns more positions than the choice has tokens (a BOS it added), the last ones are used.
    """

    name = "unconditional_likelihood_normalized"
    needs_unconditional = True

    def scores(self, cond, uncond):
        out = []
        for c, u in zip(cond, uncond):
            u = u[len(u) - len(c):] if len(u) >= len(c) else u
            if len(u) != len(c):
                raise ValueError("unconditional logprobs do not cover the choice's tokens")
            diffs = [(ce[0] or 0.0) - (ue[0] or 0.0) for ce, ue in zip(c, u)]
            out.append(_mean(diffs))
        return out


class GreedyTokenSelection(ChoicesMethod):
    """Compare first-token logprobs, then second, ... among the tied; a shorter choice is padded
    with its own mean logprob (SGLang's greedy_token_selection). Scores: 1 for the winner, else 0."""

    name = "greedy_token_selection"

    def scores(self, cond, uncond):
        rows = [_logprobs(entries) for entries in cond]
        width = max((len(r) for r in rows), default=0)
        matrix = [r + [_mean(r)] * (width - len(r)) for r in rows]
        remaining = list(range(len(rows)))
        for j in range(width):
            best = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == best]
            if len(remaining) == 1:
                break
        return [1.0 if i == remaining[0] else 0.0 for i in range(len(rows))]


token_length_normalized = TokenLengthNormalized()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
greedy_token_selection = GreedyTokenSelection()
METHODS = {m.name: m for m in (token_length_normalized, unconditional_likelihood_normalized, greedy_token_selection)}


def method_name(method: ChoicesMethod | str) -> str:
    name = method.name if isinstance(method, ChoicesMethod) else method
    if name not in METHODS:
        raise ValueError(f"unknown choices_method {name!r}; known: {', '.join(METHODS)}")
    return name


def choice_entries(entries: list[Entry], start: int, prompt_tokens: int, context: str) -> list[Entry]:
    """The entries (starting at position `start`) that belong to the choice; see the module map."""
    out = []
    for offset, entry in enumerate(entries):
        position = start + offset
        if position >= prompt_tokens:
            out.append(entry)
        elif position == prompt_tokens - 1 and entry[2] is not None and not context.endswith(entry[2]):
            out.append(entry)  # merged across the boundary
    return out


def _as_list(response: dict | list[dict]) -> list[dict]:
    return response if isinstance(response, list) else [response]


def run_select(backend: Any, context: str, choices: list[str], method: ChoicesMethod | str) -> tuple[str, dict]:
    """Send the select requests to `backend`; return (chosen text, meta info with every score)."""
    method = METHODS[method_name(method)]
    prefill = backend.generate({"text": context, "sampling_params": {"max_new_tokens": 0}})
    check_finished(prefill, "select's prefill")
    prompt_tokens = prefill["meta_info"]["prompt_tokens"]
    start = max(prompt_tokens - 1, 0)
    scored = _as_list(backend.generate({
        "text": [context + c for c in choices],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": start,
    }))
    for response in scored:
        check_finished(response, "select's scoring request")
    cond = [choice_entries(r["meta_info"]["input_token_logprobs"], start, prompt_tokens, context) for r in scored]
    uncond = None
    if method.needs_unconditional:
        alone = _as_list(backend.generate({
            "input_ids": [[e[1] for e in entries] for entries in cond],
            "sampling_params": {"max_new_tokens": 0}, "return_logprob": True, "logprob_start_len": 0,
        }))
        for response in alone:
            check_finished(response, "select's unconditional scoring request")
        uncond = [r["meta_info"]["input_token_logprobs"] for r in alone]
    scores = method.scores(cond, uncond)
    best = max(range(len(choices)), key=scores.__getitem__)
    meta = {
        "choices": list(choices),
        "scores": scores,
        "normalized_prompt_logprobs": token_length_normalized.scores(cond, None),
        "input_token_logprobs": cond,
        "output_token_logprobs": [[] for _ in choices],
    }
    if uncond is not None:
        meta["unconditional_token_logprobs"] = uncond
    return choices[best], meta
