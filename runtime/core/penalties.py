"""Frequency, presence and repetition penalties over persistent per-request token counts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixflow.runtime.core.sampler import SampleRow


@dataclass
class RowState:
    """A request's sampler state across steps; the sampler creates and mutates its tensors.

    `counts`: [vocab] int32 occurrences of each token in the output, on the logits' device (a
    view into the last step's batch tensor), covering output_ids[:num_counted]; None until a
    penalty needs it. `prompt_seen`: [vocab] bool, the prompt's tokens (repetition penalty).
    `num_draws`: seeded draws made so far (the counter of runtime/core/seeded.py).
    `bias_ids` [K] int64 / `bias_values` [K] fp32: the request's logit_bias on the logits'
    device (runtime/core/logit_bias.py), None until its first biased step.
    """

    counts: torch.Tensor | None = None
    prompt_seen: torch.Tensor | None = None
    num_counted: int = 0
    num_draws: int = 0
    bias_ids: torch.Tensor | None = None
    bias_values: torch.Tensor | None = None


def _fresh(row: SampleRow, vocab: int, device: torch.device) -> bool:
    """Whether row.state's counts fit this vocab/device and its history (else it restarts)."""
    st = row.state
    return (st.counts is not None and st.counts.shape[0] == vocab and st.counts.device == device
            and st.num_counted <= len(row.output_ids))


def _update_counts(rows: list[SampleRow], vocab: int, device: torch.device) -> torch.Tensor:
    """[P, vocab] int32 output counts of `rows`, brought up to date with one scatter of the tokens
    each row gained since its last step; each row's state then views its row of the result."""
    for r in rows:
        if not _fresh(r, vocab, device):
            r.state.counts, r.state.num_counted = torch.zeros(vocab, dtype=torch.int32, device=device), 0
    counts = torch.stack([r.state.counts for r in rows])  # type: ignore[misc]
    pos, tok = [], []
    for j, r in enumerate(rows):
        new = [t for t in r.output_ids[r.state.num_counted:] if 0 <= t < vocab]
        pos.extend([j] * len(new))
        tok.extend(new)
    if tok:
        idx = torch.tensor([pos, tok], device=device)
        counts.index_put_((idx[0], idx[1]), torch.ones(len(tok), dtype=torch.int32, device=device), accumulate=True)
    for j, r in enumerate(rows):
        r.state.counts, r.state.num_counted = counts[j], len(r.output_ids)
    return counts


def _prompt_seen(rows: list[SampleRow], vocab: int, device: torch.device) -> torch.Tensor:
    """[P, vocab] bool prompt tokens; built once per request."""
    for r in rows:
        st = r.state
        if st.prompt_seen is None or st.prompt_seen.shape[0] != vocab or st.prompt_seen.device != device:
            st.prompt_seen = torch.zeros(vocab, dtype=torch.bool, device=device)
            ids = [t for t in r.prompt_ids if 0 <= t < vocab]
            if ids:
                st.prompt_seen[torch.tensor(ids, device=device)] = True
    return torch.stack([r.state.prompt_seen for r in rows])  # type: ignore[misc]


def apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """OpenAI frequency/presence penalties over output tokens; repetition penalty (CTRL style)
    over prompt and output tokens. Mutates logits [B, vocab] and the penalized rows' states.

    On CUDA dense masked ops over the penalized rows (no host sync); on CPU, where those full
    passes dominate and a sync is free, only the (row, token) entries that carry a penalty.
    """
    pen = [i for i, r in enumerate(rows) if r.penalized]
    if not pen:
        return
    device, vocab = logits.device, logits.shape[1]
    prows = [rows[i] for i in pen]
    counts = _update_counts(prows, vocab, device)  # [P, vocab]
    table = torch.tensor([[r.sampling.frequency_penalty, r.sampling.presence_penalty, r.sampling.repetition_penalty]
                          for r in prows], device=device, dtype=logits.dtype)  # [P, 3]
    idx = torch.tensor(pen, device=device)
    prompt_seen = _prompt_seen(prows, vocab, device) if any(r.sampling.repetition_penalty != 1.0 for r in prows) else None
    penalize = _penalize_dense if logits.is_cuda or DENSE_ON_CPU else _penalize_sparse
    penalize(logits, idx, counts, table, prompt_seen)


# Tests flip this to run the CUDA (dense) path on CPU.
DENSE_ON_CPU = False


def _penalize_dense(logits: torch.Tensor, idx: torch.Tensor, counts: torch.Tensor, table: torch.Tensor,
                    prompt_seen: torch.Tensor | None) -> None:
    sub = logits.index_select(0, idx)  # [P, vocab]
    present = counts > 0
    sub -= table[:, :1] * counts + table[:, 1:2] * present
    if prompt_seen is not None:
        rep = table[:, 2:3]
        sub = torch.where(present | prompt_seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    logits.index_copy_(0, idx, sub)


def _penalize_sparse(logits: torch.Tensor, idx: torch.Tensor, counts: torch.Tensor, table: torch.Tensor,
                     prompt_seen: torch.Tensor | None) -> None:
    r, t = counts.nonzero(as_tuple=True)  # output tokens present, per penalized row
    c = counts[r, t].to(logits.dtype)
    logits.index_put_((idx[r], t), -(table[r, 0] * c + table[r, 1]), accumulate=True)
    if prompt_seen is not None:
        r, t = (prompt_seen | (counts > 0)).nonzero(as_tuple=True)
        vals, rep = logits[idx[r], t], table[r, 2]
        logits[idx[r], t] = torch.where(vals > 0, vals / rep, vals * rep)
