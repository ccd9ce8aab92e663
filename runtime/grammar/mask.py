"""One batched int32 allowed-token bitmask per step for the constrained rows of a batch."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from radixflow.runtime.grammar.state import GrammarState
from radixflow.runtime.core.request import Req


def _bit(token: int) -> tuple[int, int]:
    """(word, int32 value of the token's bit); bit 31 is the sign bit."""
    word, bit = divmod(token, 32)
    value = 1 << bit
    return word, value - (1 << 32) if value >= 1 << 31 else value


def _drop_early_stop_ids(row: torch.Tensor, g: GrammarState) -> None:
    """Clear the bits of stop token ids in `row` [num_words] int32 (on the CPU) that would end
    the request with an incomplete match (a stop token's text is kept in the output), unless
    nothing else would be left: then the stop token ends it, as a stop string may (a prefix of
    a match)."""
    words = row.numpy().view(np.uint32)
    ids = np.fromiter(g.stop_ids, dtype=np.int64, count=len(g.stop_ids))
    allowed = ids[(words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1 == 1]
    early = [int(t) for t in allowed if not g.matcher.accepting_after([int(t)])]
    if not early:
        return
    kept = words.copy()
    for t in early:
        words[t >> 5] &= ~np.uint32(1 << (t & 31))
    if not words.any() and not g.matcher.is_accepting():
        words[:] = kept


def grammar_bitmask(reqs: list[Req], device: torch.device,
                    on_error: Callable[[Req, Exception], None] | None = None,
                    ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(bitmask [num_constrained, num_words] int32 on `device`, rows [num_constrained] int64:
    index into `reqs` of each bitmask row), or None when no request has a grammar.

    Each row is written by the backend straight into the tensor (`fill_mask`), or holds one bit
    for a pinned (forced, jump-forward off) token. EOS bits are then rewritten: allowed exactly
    in accepting states of requests that may stop on EOS, never on a pinned row.
    Stop token ids are allowed only where they complete a match (`_drop_early_stop_ids`).
    A row whose grammar raises is reported to `on_error` (re-raised without one) and allows
    only EOS.
    """
    rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
    if not rows:
        return None
    states: list[GrammarState] = [reqs[i].grammar for i in rows]
    vocab = states[0].vocab
    bitmask = torch.zeros((len(rows), vocab.num_words), dtype=torch.int32)  # [R, num_words]
    accepting, broken = [], []
    for k, g in enumerate(states):
        try:
            pinned = g.pinned_token()
            if pinned is not None:
                word, value = _bit(pinned)
                bitmask[k, word] = value
                continue
            g.matcher.fill_mask(bitmask[k].data_ptr(), vocab.num_words)
            if g.stop_ids:
                _drop_early_stop_ids(bitmask[k], g)
        except Exception as exc:  # this request's grammar: the caller fails it alone
            if on_error is None:
                raise
            on_error(reqs[rows[k]], exc)
            broken.append(k)
            continue
        if g.error is not None:
            broken.append(k)  # EOS only: the engine aborts it after this step
        elif g.allow_eos and g.matcher.is_accepting():
            accepting.append(k)
    if broken:
        bitmask[broken] = 0
    ends = accepting + broken
    for eos in vocab.eos_ids:
        word, value = _bit(eos)
        bitmask[:, word] &= ~value
        if ends:
            bitmask[ends, word] |= value
    return bitmask.to(device), torch.tensor(rows, dtype=torch.int64, device=device)
