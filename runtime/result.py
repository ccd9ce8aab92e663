"""Turns a request into the SGLang-native response shape: {"text", "output_ids", "meta_info"}."""
from __future__ import annotations

from typing import Any

from radixflow.runtime.core.output import visible_text
from radixflow.runtime.core.request import Req

LogprobEntry = tuple[int, float | None, list[tuple[int, float]] | None]


def logprob_triples(entries: list[LogprobEntry], decode: Any, with_text: bool) -> tuple[list, list]:
    """[(token, logprob, tops)] → ([logprob, token, text]), ([[logprob, token, text], ...])."""

    def one(lp: float | None, tok: int) -> list:
        return [lp, tok, decode(tok) if with_text else None]

    values = [one(lp, tok) for tok, lp, _ in entries]
    tops = [None if t is None else [one(lp, tok) for tok, lp in t] for _, _, t in entries]
    return values, tops


def meta_info(req: Req, decode: Any, with_text: bool, out_start: int = 0,
              include_input: bool = True) -> dict[str, Any]:
    """`out_start`: first output logprob entry to include (streaming sends only new ones)."""
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": req.finish_reason,
        "prompt_tokens": len(req.prompt_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_len,
    }
    if req.is_finished:
        meta.update(finished_stats(req))
    if req.options.return_logprob:
        top = req.options.top_logprobs_num > 0
        if include_input:
            vals, tops = logprob_triples(req.input_logprobs, decode, with_text)
            meta["input_token_logprobs"] = vals
            if top:
                meta["input_top_logprobs"] = tops
        vals, tops = logprob_triples(req.output_logprobs[out_start:], decode, with_text)
        meta["output_token_logprobs"] = vals
        meta["output_token_logprobs_length"] = len(req.output_logprobs)
        if top:
            meta["output_top_logprobs"] = tops
    return meta


def make_result(req: Req, decode: Any, with_text: bool) -> dict[str, Any]:
    if req.embed:  # SGLang's /encode shape
        return {"embedding": req.embedding, "meta_info": meta_info(req, decode, with_text)}
    return {"text": visible_text(req), "output_ids": list(req.output_ids),
            "meta_info": meta_info(req, decode, with_text)}


def finished_stats(req: Req) -> dict[str, Any]:
    """What a finished request reports of its prefill misses and its timeline (seconds)."""
    t = req.times

    def since(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(b - a, 6)

    stats = {
        "prefill_miss_tokens": dict(req.miss_tokens),
        "divergent_at": req.divergent_at,
        "weight_version": req.weight_version,
        "timings": {"queue_s": since(t.arrival, t.scheduled), "prefill_s": since(t.scheduled, t.first_token),
                    "ttft_s": since(t.arrival, t.first_token), "e2e_s": since(t.arrival, t.finished)},
    }
    if req.num_verify_steps:  # speculative decoding drafted for it: SGLang's count of verify steps
        stats["spec_verify_ct"] = req.num_verify_steps
    if req.options.return_hidden_states:
        stats["hidden_states"] = hidden_states_output(req)
    return stats


def hidden_states_output(req: Req) -> list[list]:
    """meta_info["hidden_states"] in SGLang's shape: the prompt positions' [n][hidden] first, then
    one [hidden] per later position (each output token fed back), as far as they were computed."""
    if not req.hidden_states:
        return []
    import torch  # the engine's side only: the API server process never imports torch

    rows = torch.cat(req.hidden_states) if len(req.hidden_states) > 1 else req.hidden_states[0]
    prompt = len(req.prompt_ids)
    return [rows[:prompt].tolist(), *rows[prompt:].tolist()]
