"""One step's adapter layout: which rows use which slot, and the batched delta per projection.

Rows of a request are contiguous in the flat token batch, so a request is a segment:

    flat tokens:  | req0 (slot 2) | req1 (base) | req2 (slot 0) | req3 (slot 2) |
    segments:     seg_starts / seg_lens per request, seg_slots = 2, -1, 0, 2 (-1: no delta)

On CUDA the SGMV kernels (kernels/lora.py) run one program per segment. On CPU the rows are
grouped by slot into a padded [num_used_slots, max_rows] index, so each projection costs one
gather of x, one shrink bmm and one expand bmm per part (q/k/v, gate/up), never a loop over rows:

    gather [U, M]: token rows of slot group u, padded with row 0;  keep: the real entries
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from radixflow import kernels
from radixflow.runtime.lora.slots import LoraSlots


@dataclass
class LoraBatch:
    slots: LoraSlots
    seg_starts: torch.Tensor   # [batch] int64, first flat row of each request
    seg_lens: torch.Tensor     # [batch] int64
    seg_slots: torch.Tensor    # [batch] int64, adapter slot of each request, -1 = base
    max_seg_len: int
    use_triton: bool
    group_slots: torch.Tensor | None = None  # [U] int64, the slots used (CPU path)
    gather: torch.Tensor | None = None       # [U, M] int64, token row per group entry
    keep: torch.Tensor | None = None         # [K] int64, flat positions of real entries in [U * M]
    rows: torch.Tensor | None = None         # [K] int64, token row of each real entry
    slot_range: slice | None = None          # group_slots as a range (a view of the weights, no copy)

    def apply(self, layer: int, proj: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """y [T, out] += per row (x [T, in] @ A[slot]) @ B[slot], in place; base rows untouched.
        A projection without slot buffers (not among the target modules) is left alone."""
        a_all = self.slots.a.get(proj)
        if a_all is None:
            return
        a, parts = a_all[layer], [b[layer] for b in self.slots.b[proj]]  # [S, in, P*R], P x [S, R, out_j]
        rank = self.slots.max_rank
        if self.use_triton:
            segs = (self.seg_starts, self.seg_lens, self.seg_slots, self.max_seg_len)
            xa = kernels.lora_shrink(x, a, *segs)  # [T, P*R]
            col = 0
            for j, b in enumerate(parts):  # part j: its rank block of xa into its output columns
                kernels.lora_expand(y[:, col:col + b.shape[2]], xa[:, j * rank:(j + 1) * rank], b, *segs)
                col += b.shape[2]
            return
        assert self.gather is not None and self.group_slots is not None and self.keep is not None
        xa = torch.bmm(x[self.gather], self._weights(a))  # [U, M, in] @ [U, in, P*R] -> [U, M, P*R]
        delta = torch.cat([torch.bmm(xa[..., j * rank:(j + 1) * rank], self._weights(b))  # [U, M, out_j]
                           for j, b in enumerate(parts)], dim=-1)  # [U, M, out]
        y.index_add_(0, self.rows, delta.reshape(-1, y.shape[1]).index_select(0, self.keep))

    def _weights(self, w: torch.Tensor) -> torch.Tensor:
        """The used slots' rows of `w` [S, ...]: a view for consecutive slots, else a gather."""
        assert self.group_slots is not None
        return w[self.slot_range] if self.slot_range is not None else w.index_select(0, self.group_slots)


def make_lora_batch(slots: LoraSlots, req_slots: list[int], extend_lens: list[int],
                    device: torch.device, use_triton: bool) -> LoraBatch | None:
    """The layout for requests with adapter slots `req_slots` (-1 = base) extending `extend_lens`
    tokens each; None when every request is base (the model then adds nothing)."""
    if all(s < 0 for s in req_slots):
        return None
    starts, pos = [], 0
    for n in extend_lens:
        starts.append(pos)
        pos += n

    def t(xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.int64, device=device)

    batch = LoraBatch(slots, t(starts), t(extend_lens), t(req_slots), max(extend_lens, default=0), use_triton)
    if not use_triton:
        _group_rows(batch, req_slots, starts, extend_lens, t)
    return batch


def _group_rows(batch: LoraBatch, req_slots: list[int], starts: list[int], extend_lens: list[int], t) -> None:
    groups: dict[int, list[int]] = {}
    for slot, start, n in zip(req_slots, starts, extend_lens):
        if slot >= 0:
            groups.setdefault(slot, []).extend(range(start, start + n))
    width = max(len(g) for g in groups.values())
    gather, keep, rows = [], [], []
    used = sorted(groups)  # slot order: a run of consecutive slots reads the weights in place
    for u, token_rows in enumerate(groups[s] for s in used):
        gather.extend(token_rows + [0] * (width - len(token_rows)))
        keep.extend(range(u * width, u * width + len(token_rows)))
        rows.extend(token_rows)
    batch.group_slots = t(used)
    if used[-1] - used[0] + 1 == len(used):
        batch.slot_range = slice(used[0], used[-1] + 1)
    batch.gather = t(gather).view(len(groups), width)
    batch.keep, batch.rows = t(keep), t(rows)
