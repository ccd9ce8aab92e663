"""Partial rotary embeddings (Phi-4-mini rotates 3/4 of each head) on the whole-head RoPE kernels:
each q and k head's dims are reordered once at load so that the rotated ones form the kernels'
pairs and the others sit where the tables rotate by nothing (model.rope_tables).

A checkpoint's head of D dims rotates its first r as rotate-half pairs (i, i + r/2) and passes the
rest through; the kernels pair (j, j + D/2). Stored order → ours:

    checkpoint:  | rot a: 0 .. r/2 | rot b: r/2 .. r | pass c: r .. r+(D-r)/2 | pass d: .. D |
    ours:        | a | c | b | d |     pair j < r/2 = (a_j, b_j) rotates; j >= r/2 = (c, d) does not

q . k is unchanged by any order both share, so attention is; the KV pool holds k in this order.
"""
from __future__ import annotations

import torch


def rotary_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """The checkpoint dim each of our head dims takes ([head_dim] int64)."""
    half, rot_half = head_dim // 2, rotary_dim // 2
    rest = (head_dim - rotary_dim) // 2
    return torch.cat([torch.arange(0, rot_half), torch.arange(rotary_dim, rotary_dim + rest),
                      torch.arange(rot_half, rotary_dim), torch.arange(rotary_dim + rest, head_dim)]) \
        if rotary_dim < head_dim else torch.arange(half * 2)


def to_rotary_order(rows: torch.Tensor, head_dim: int, rotary_dim: int) -> torch.Tensor:
    """`rows` [heads * head_dim, ...] (a q or k projection's weight or bias, or an adapter's lora_B
    part) with each head's rows in our order."""
    heads = rows.shape[0] // head_dim
    order = rotary_order(head_dim, rotary_dim).to(rows.device)
    return rows.reshape(heads, head_dim, *rows.shape[1:])[:, order].reshape(rows.shape)


def qkv_to_rotary_order(qkv: torch.Tensor, q_size: int, kv_size: int, head_dim: int,
                        rotary_dim: int) -> torch.Tensor:
    """A fused q | k | v projection's weight or bias with its q and k heads in our order."""
    q, k, v = qkv.split([q_size, kv_size, qkv.shape[0] - q_size - kv_size])
    return torch.cat([to_rotary_order(q, head_dim, rotary_dim), to_rotary_order(k, head_dim, rotary_dim), v])


def pass_through_columns(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Our head dims that are not rotated (their table columns: cos 1, sin 0)."""
    half, rot_half = head_dim // 2, rotary_dim // 2
    return torch.cat([torch.arange(rot_half, half), torch.arange(half + rot_half, head_dim)])
