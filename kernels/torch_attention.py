"""CPU-fast torch twins of decode/extend attention: batched padded decode, causal extend through SDPA."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from .decode_attention import _check_decode
from .extend_attention import _check_extend

# Context tokens gathered at once by decode (see decode_attention_gathered).
GATHER_CHUNK_TOKENS = 1024


def _gather_kv(cache: torch.Tensor, slots: torch.Tensor, scale: float) -> tuple[torch.Tensor, float]:
    """cache[slots] as fp32 [len(slots), num_kv_heads, head_dim], and the scale still to apply.

    fp32 caches come back as the gathered rows themselves (no second copy); fp8 ones
    without their scale, which the caller folds into sm_scale (K) or the output (V).
    """
    rows = cache.index_select(0, slots)
    if cache.dtype == torch.uint8:
        return rows.view(torch.float8_e4m3fn).to(torch.float32), scale
    return rows.to(torch.float32), 1.0


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, sm_scale: float) -> torch.Tensor:
    """Causal attention of q [extend_len, num_heads, head_dim] at positions prefix_len.. over
    k, v [prefix_len + extend_len, num_kv_heads, head_dim], all fp32; returns [extend_len, num_heads, head_dim].

    One SDPA call with a lower-right causal bias (query i sees keys 0 .. prefix_len + i), never
    materialized: torch's CPU flash kernel skips the blocks above the diagonal and reads a KV
    head once for its query heads (enable_gqa). About 2x the chunked matmul + softmax it replaced
    (measured at 256 new tokens over prefixes of 1 to 5,000, head_dim 64, one core).
    """
    extend_len, seq_len = q.shape[0], k.shape[0]
    assert seq_len == prefix_len + extend_len, (seq_len, prefix_len, extend_len)
    o = F.scaled_dot_product_attention(  # [1, num_heads, extend_len, head_dim]
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=causal_lower_right(extend_len, seq_len), scale=sm_scale, enable_gqa=True)
    return o[0].transpose(0, 1)


def _attend_request(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                    prefix_len: int, sm_scale: float, k_scale: float, v_scale: float) -> torch.Tensor:
    """One request: q [extend_len, num_heads, head_dim] over the context at `slots` [seq_len]; fp32 result."""
    k, k_rest = _gather_kv(k_cache, slots, k_scale)  # [seq_len, num_kv_heads, head_dim]
    v, v_rest = _gather_kv(v_cache, slots, v_scale)
    out = _attend(q.to(torch.float32), k, v, prefix_len, sm_scale * k_rest)
    return out.mul_(v_rest) if v_rest != 1.0 else out


@dataclass(frozen=True)
class DecodeGather:
    """A decode step's contexts padded to the longest, computed once and shared by every layer.

        slots row i:  | req i's seq_len slot ids | its slot at position 0, repeated (hidden) |
                      0                          seq_lens[i]                                max_len

    Padding repeats a slot the request owns, so no stale table entry or the dummy slot 0
    (whose bytes may be anything) is ever read; the hidden columns get probability 0.
    A seq_len 0 row (CUDA-graph padding) reads its column 0 and is zeroed afterwards.
    """

    slots: torch.Tensor    # [batch * max_len] int64, row-major [batch, max_len]
    visible: torch.Tensor  # [batch, 1, 1, max_len] bool
    empty: torch.Tensor    # [batch, 1, 1] bool, rows with seq_len 0
    max_len: int


def plan_decode(req_to_token: torch.Tensor, req_rows: torch.Tensor, seq_lens: torch.Tensor) -> DecodeGather:
    """The padded layout of a decode step; one host sync (the longest context)."""
    batch = seq_lens.shape[0]
    max_len = max(int(seq_lens.max()), 1) if batch else 1
    table = req_to_token[req_rows.long(), :max_len].long()  # [batch, max_len]
    visible = torch.arange(max_len, device=seq_lens.device)[None, :] < seq_lens.clamp(min=1)[:, None]
    slots = torch.where(visible, table, table[:, :1])
    return DecodeGather(slots.reshape(-1), visible[:, None, None, :], (seq_lens == 0)[:, None, None], max_len)


def _gather_padded(cache: torch.Tensor, slots: torch.Tensor, max_len: int, dtype: torch.dtype,
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


def decode_attention_gathered(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodeGather,
                              sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Decode attention of q [batch, num_heads, head_dim] over the contexts of `plan`: per chunk of
    requests, one gather per cache (to fp32) and two matmuls with a KV head's query heads stacked
    as rows (GQA). Unchecked: the engine's per-layer hot path, with inputs `decode_attention_torch`
    validates. Math in fp32 whatever the cache dtype; returns q's dtype.

    NOTE: not SDPA: for one query per request torch's CPU flash kernel ran ~7x slower than these
    two matmuls in bf16 (~1 ms vs 0.14-0.19 ms at 4 requests x 260 tokens, 9/3 heads, one core),
    60% of SmolLM2's bf16 decode step at batch 16. Chunks of about GATHER_CHUNK_TOKENS context
    tokens keep the gathered K/V in cache between the gather and the matmuls; one gather of a
    whole large batch ran ~3x slower (one core).
    """
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    batch, num_heads, head_dim = q.shape
    num_kv_heads, max_len = k_cache.shape[1], plan.max_len
    group = num_heads // num_kv_heads
    step = max(1, GATHER_CHUNK_TOKENS // max_len)
    for a in range(0, batch, step):
        b = min(a + step, batch)
        slots = plan.slots[a * max_len: b * max_len]
        k = _gather_padded(k_cache, slots, max_len, torch.float32, k_scale)  # [rows, num_kv_heads, max_len, head_dim]
        v = _gather_padded(v_cache, slots, max_len, torch.float32, v_scale)
        qg = q[a:b].to(torch.float32).view(b - a, num_kv_heads, group, head_dim)
        scores = torch.matmul(qg, k.transpose(-1, -2)).mul_(sm_scale)  # [rows, num_kv_heads, group, max_len]
        scores.masked_fill_(~plan.visible[a:b], float("-inf"))
        o = torch.matmul(scores.softmax(dim=-1), v)  # [rows, num_kv_heads, group, head_dim]
        out[a:b] = o.view(b - a, num_heads, head_dim)
    return out.masked_fill_(plan.empty, 0.0)


def decode_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           req_to_token: torch.Tensor, req_rows: torch.Tensor, seq_lens: torch.Tensor,
                           sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                           num_kv_splits: int = 8) -> torch.Tensor:
    """CPU-fast twin of `decode_attention_ref` (same contract); `num_kv_splits` is unused.

    Batched over requests, padded to the longest context (see DecodeGather); syncs once on
    seq_lens. The engine plans once per step and calls `decode_attention_gathered` per layer.
    """
    _check_decode(q, k_cache, v_cache, req_to_token, req_rows, seq_lens, sm_scale, k_scale, v_scale, num_kv_splits)
    plan = plan_decode(req_to_token, req_rows, seq_lens)
    return decode_attention_gathered(q, k_cache, v_cache, plan, sm_scale, k_scale, v_scale)


def extend_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           req_to_token: torch.Tensor, req_rows: torch.Tensor, prefix_lens: torch.Tensor,
                           extend_lens: torch.Tensor, extend_starts: torch.Tensor, sm_scale: float,
                           k_scale: float = 1.0, v_scale: float = 1.0,
                           max_extend_len: int | None = None, max_seq_len: int | None = None,
                           num_kv_splits: int | None = None) -> torch.Tensor:
    """CPU-fast twin of `extend_attention_ref` (same contract); the launch hints are unused.

    Per request, exact-length gathers and one causal SDPA call (see `_attend`). Rows no request covers are zero.
    """
    _check_extend(q, k_cache, v_cache, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts,
                  sm_scale, k_scale, v_scale, max_extend_len, max_seq_len, num_kv_splits)
    out = torch.zeros_like(q, memory_format=torch.contiguous_format)
    per_req = zip(req_rows.tolist(), prefix_lens.tolist(), extend_lens.tolist(), extend_starts.tolist())
    for row, prefix_len, extend_len, start in per_req:
        if extend_len == 0:
            continue
        slots = req_to_token[row, :prefix_len + extend_len]
        out[start:start + extend_len] = _attend_request(q[start:start + extend_len], k_cache, v_cache, slots,
                                                        prefix_len, sm_scale, k_scale, v_scale)
    return out
