"""A step's rows to sample and their outcomes: the sampler's side of runtime/core/step.py."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from radixflow.runtime.core.request import Req
from radixflow.runtime.core.sampler import BROKEN_ROW, SampleRow

# One sampled row: (token, its logprob or None, its top logprobs or None), or the row's error.
Sampled = tuple[int, float | None, list | None] | Exception


@dataclass
class RowsToSample:
    """Logit rows ready to sample: their requests, sampler rows and grammar bitmask. Made from
    the requests' state once their previous tokens are appended (`StepRunner._prepare_rows`)."""

    rows: list[int]
    reqs: list[Req]
    sample_rows: list[SampleRow]
    bitmask: tuple[torch.Tensor, torch.Tensor] | None
    plain: bool  # every sampler row is `plain` (an argmax; nothing blocked, penalized or biased)


def rows_to_sample(logits: torch.Tensor, prepared: RowsToSample) -> torch.Tensor:
    """The logit rows to sample, which `sample` may change in place: a copy, unless they are all
    the rows (ascending: a decode step) and nothing will change them (no grammar mask, penalty,
    blocked id or logit bias), so a row-by-row retry after a failure still reads the model's logits."""
    rows = prepared.rows
    whole = len(rows) == logits.shape[0] and rows[-1] == len(rows) - 1
    if whole and prepared.bitmask is None and (prepared.plain or not any(
            r.blocked_ids or r.penalized or r.biased for r in prepared.sample_rows)):
        return logits
    return logits[torch.tensor(rows, device=logits.device)]


def unpack(result) -> list[Sampled]:
    """Per row (token, logprob, tops), or the row's error (token -1: its logits held a NaN)."""
    n = len(result.tokens)
    if result.logprobs is None and result.top_logprobs is None and (not n or min(result.tokens) >= 0):
        return [(t, None, None) for t in result.tokens]  # the common case: tokens alone
    lps = result.logprobs if result.logprobs is not None else [None] * n
    tops = result.top_logprobs if result.top_logprobs is not None else [None] * n
    return [(t, lp, top) if t >= 0 else ValueError(BROKEN_ROW)
            for t, lp, top in zip(result.tokens, lps, tops)]


def bitmask_row(bitmask: tuple[torch.Tensor, torch.Tensor] | None,
                 i: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The part of a batch's grammar bitmask for sample row `i` alone (or None)."""
    if bitmask is None:
        return None
    bits, rows = bitmask
    k = (rows == i).nonzero()
    if k.numel() == 0:
        return None
    k = int(k[0, 0])
    return bits[k: k + 1], torch.zeros(1, dtype=rows.dtype, device=rows.device)
