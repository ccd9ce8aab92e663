"""Turns a request into the SGLang-native response shape: {"text", "output_ids", "meta_info"}."""
from __future__ import annotations

from typing import Any

from radixflow.runtime.output import visible_text
from radixflow.runtime.request import Req

LogprobEntry = tuple[int, float | None, list[tuple[int, float]] | None]


def _triples(entries: list[LogprobEntry], decode: Any, with_text: bool) -> tuple[list, list]:
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
    if req.logprob.return_logprob:
        top = req.logprob.top_logprobs_num > 0
        if include_input:
            vals, tops = _triples(req.input_logprobs, decode, with_text)
            meta["input_token_logprobs"] = vals
            if top:
                meta["input_top_logprobs"] = tops
        vals, tops = _triples(req.output_logprobs[out_start:], decode, with_text)
        meta["output_token_logprobs"] = vals
        meta["output_token_logprobs_length"] = len(req.output_logprobs)
        if top:
            meta["output_top_logprobs"] = tops
    return meta


def make_result(req: Req, decode: Any, with_text: bool) -> dict[str, Any]:
    return {"text": visible_text(req), "output_ids": list(req.output_ids),
            "meta_info": meta_info(req, decode, with_text)}
