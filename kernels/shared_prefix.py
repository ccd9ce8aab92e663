"""Attention over a context prefix several requests share, read once for all of them.

The radix cache hands requests that share a prompt prefix the same KV slots. Attention splits
over disjoint sets of keys: the shared prefix (one matmul per KV head, every member's query
heads stacked as rows) and each request's own keys, kept as softmax parts (row max, sum of
exponentials, unnormalized output) and merged. Used by CPU decode (kernels/torch_decode.py)
and extend (kernels/torch_attention.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# A prefix is read once for its requests when at least this many of their leading slots are the
# same (and at least two requests share it). Shared prefixes are read in chunks of this many tokens.
MIN_SHARED_PREFIX_TOKENS = 64
SHARED_CHUNK_TOKENS = 4096


@dataclass(frozen=True)
class SharedPrefix:
    """Batch rows `rows` whose contexts all begin with the KV at `slots`."""

    rows: torch.Tensor   # [n] int64, n >= 2
    slots: torch.Tensor  # [prefix_len] int64


def find(table: torch.Tensor, caps: torch.Tensor) -> tuple[list[SharedPrefix], torch.Tensor]:
    """Groups of rows of `table` [rows, >= max(caps)] whose first MIN_SHARED_PREFIX_TOKENS or more
    slots are the same, each with its longest common prefix (at most each member's `caps` entry),
    and each row's shared length (0 outside the groups). Rows are grouped by their first slot."""
    starts = torch.zeros_like(caps)
    candidates = (caps >= MIN_SHARED_PREFIX_TOKENS).nonzero().flatten()
    if candidates.numel() < 2:
        return [], starts
    _, group_of, counts = torch.unique(table[candidates, 0], return_inverse=True, return_counts=True)
    shared = []
    for g in (counts >= 2).nonzero().flatten().tolist():
        rows = candidates[group_of == g]
        cap = int(caps[rows].min())
        same = (table[rows, :cap] == table[rows[:1], :cap]).all(dim=0)
        differs = (~same).nonzero()
        prefix_len = int(differs[0]) if differs.numel() else cap
        if prefix_len >= MIN_SHARED_PREFIX_TOKENS:
            shared.append(SharedPrefix(rows, table[rows[0], :prefix_len].clone()))
            starts[rows] = prefix_len
    return shared, starts


def gather_padded(cache: torch.Tensor, slots: torch.Tensor, max_len: int, dtype: torch.dtype,
                   scale: float) -> torch.Tensor:
    """cache rows at slots [rows * max_len] as a contiguous [rows, num_kv_heads, max_len, head_dim]
    of `dtype`: the conversion and the head-major transpose in one copy (a matmul over a permuted
    view would copy it again)."""
    num_kv_heads, head_dim = cache.shape[1:]
    rows = cache.index_select(0, slots)  # [rows * max_len, num_kv_heads, head_dim]
    if cache.dtype == torch.uint8:
        rows = rows.view(torch.float8_e4m3fn)
    heads = rows.view(-1, max_len, num_kv_heads, head_dim).transpose(1, 2)
    out = torch.empty(heads.shape, dtype=dtype, device=cache.device).copy_(heads)
    return out.mul_(scale) if cache.dtype == torch.uint8 and scale != 1.0 else out


Parts = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (row max, sum of exp, unnormalized output)


def softmax_parts(scores: torch.Tensor, v: torch.Tensor) -> Parts:
    """softmax(scores) @ v kept apart as (m, l, o): o / l is the attention output. scores [..., n]
    with at least one finite entry per row; v [..., n, head_dim]."""
    m = scores.amax(dim=-1)
    p = scores.sub_(m[..., None]).exp_()
    return m, p.sum(dim=-1), torch.matmul(p, v)


def merge_parts(x: Parts, y: Parts) -> Parts:
    """The parts of attention over two disjoint sets of keys, combined."""
    m = torch.maximum(x[0], y[0])
    a, b = (x[0] - m).exp_(), (y[0] - m).exp_()
    return m, x[1] * a + y[1] * b, x[2] * a[..., None] + y[2] * b[..., None]


def prefix_parts(qg: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                  sm_scale: float, k_scale: float, v_scale: float) -> Parts:
    """Attention parts of qg [n, num_kv_heads, group, head_dim] over the shared prefix at `slots`:
    per KV head one matmul with every request's query heads as rows, in chunks of the prefix."""
    n, num_kv_heads, group, head_dim = qg.shape
    rows = qg.permute(1, 0, 2, 3).reshape(num_kv_heads, n * group, head_dim)  # row = request * group + g
    parts = None
    for a in range(0, slots.shape[0], SHARED_CHUNK_TOKENS):
        chunk = slots[a: a + SHARED_CHUNK_TOKENS]
        k = gather_padded(k_cache, chunk, chunk.shape[0], torch.float32, k_scale)[0]  # [num_kv_heads, len, head_dim]
        v = gather_padded(v_cache, chunk, chunk.shape[0], torch.float32, v_scale)[0]
        part = softmax_parts(torch.matmul(rows, k.transpose(-1, -2)).mul_(sm_scale), v)
        parts = part if parts is None else merge_parts(parts, part)
    assert parts is not None
    m, l, o = parts  # [num_kv_heads, n * group] ...
    return (m.view(num_kv_heads, n, group).transpose(0, 1), l.view(num_kv_heads, n, group).transpose(0, 1),
            o.view(num_kv_heads, n, group, head_dim).transpose(0, 1))
