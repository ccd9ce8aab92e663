"""CPU-fast torch twins of decode/extend attention: batched padded decode, query-chunked causal extend."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .decode_attention import _check_decode
from .extend_attention import _check_extend

# Query rows per causal chunk: small enough that the chunks above the diagonal, which are
# never computed, save most of the causal half; large enough that matmuls stay efficient
# (128 was fastest at head_dim 64 on a 2-core CPU; benchmarks/cpu_attention.py).
QUERY_CHUNK = 128
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

    Queries go in chunks of QUERY_CHUNK rows [a, b); a chunk reads only the columns it can see:

        columns:  | prefix: all visible | a .. b: causal mask | b ..: never computed |
                  0                     prefix_len + a        prefix_len + b

    GQA: a KV head's `group` query heads are stacked as extra rows of one matmul.
    """
    extend_len, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    # [num_kv_heads, group, extend_len, head_dim], a view
    q_kv = q.view(extend_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    k_t = k.permute(1, 2, 0)  # [num_kv_heads, head_dim, seq_len], a view
    v_h = v.transpose(0, 1)  # [num_kv_heads, seq_len, head_dim], a view
    out = q.new_empty(extend_len, num_kv_heads, group, head_dim)
    chunk = min(QUERY_CHUNK, extend_len)
    above_diagonal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    for a in range(0, extend_len, chunk):
        b = min(a + chunk, extend_len)
        rows, cols = b - a, prefix_len + b
        q_chunk = q_kv[:, :, a:b].reshape(num_kv_heads, group * rows, head_dim)
        scores = torch.matmul(q_chunk, k_t[:, :, :cols]).mul_(sm_scale)  # [num_kv_heads, group * rows, cols]
        diagonal = scores.view(num_kv_heads, group, rows, cols)[..., prefix_len + a:]
        diagonal.masked_fill_(above_diagonal[:rows, :rows], float("-inf"))
        probs = scores.softmax(dim=-1)  # every row sees at least column 0: no all -inf rows
        o = torch.matmul(probs, v_h[:, :cols])  # [num_kv_heads, group * rows, head_dim]
        out[a:b] = o.view(num_kv_heads, group, rows, head_dim).permute(2, 0, 1, 3)
    return out.view(extend_len, num_heads, head_dim)


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
    """cache rows at slots [rows * max_len] as [rows, num_kv_heads, max_len, head_dim] (a permuted view)."""
    num_kv_heads, head_dim = cache.shape[1:]
    rows = cache.index_select(0, slots)  # [rows * max_len, num_kv_heads, head_dim]
    if cache.dtype == torch.uint8:
        rows = rows.view(torch.float8_e4m3fn).to(dtype).mul_(scale)
    elif rows.dtype != dtype:
        rows = rows.to(dtype)
    return rows.view(-1, max_len, num_kv_heads, head_dim).transpose(1, 2)


def decode_attention_gathered(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodeGather,
                              sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Decode attention of q [batch, num_heads, head_dim] over the contexts of `plan`: per chunk of
    requests, one gather per cache and one fused SDPA call (GQA native). Unchecked: the engine's
    per-layer hot path, with inputs `decode_attention_torch` validates. Returns q's dtype;
    bf16/fp16 math accumulates in fp32 inside SDPA, fp8 caches are dequantized to q's dtype.

    NOTE: chunks of about GATHER_CHUNK_TOKENS context tokens keep the gathered K/V in cache
    between the gather and SDPA; one gather of a whole large batch ran ~3x slower (one core).
    """
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    batch, max_len = q.shape[0], plan.max_len
    step = max(1, GATHER_CHUNK_TOKENS // max_len)
    gqa = k_cache.shape[1] != q.shape[1]
    for a in range(0, batch, step):
        b = min(a + step, batch)
        slots = plan.slots[a * max_len: b * max_len]
        k = _gather_padded(k_cache, slots, max_len, q.dtype, k_scale)  # [rows, num_kv_heads, max_len, head_dim]
        v = _gather_padded(v_cache, slots, max_len, q.dtype, v_scale)
        o = F.scaled_dot_product_attention(q[a:b, :, None, :], k, v, attn_mask=plan.visible[a:b], scale=sm_scale,
                                           enable_gqa=gqa)  # [rows, num_heads, 1, head_dim]
        out[a:b] = o[:, :, 0]
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

    Per request, exact-length gathers and causal chunks that skip the masked upper
    triangle (see `_attend`). Rows no request covers are zero.
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
