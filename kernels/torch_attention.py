"""CPU-fast torch twins of decode/extend attention: batched padded decode, causal extend through SDPA
or, for a few new tokens over a long context, chunked matmuls."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from .decode_attention import _check_decode
from .extend_attention import _check_extend

# Context tokens gathered at once by decode (see decode_attention_gathered).
GATHER_CHUNK_TOKENS = 1024
# Short extends over long contexts take _attend_chunked: extend_len up to MAX_CHUNKED_EXTEND,
# seq_len * num_kv_heads * head_dim from MIN_CHUNKED_CONTEXT_FLOATS (4 MiB of fp32 K). Chunks hold
# about CHUNK_FLOATS of scores and fp32 K/V.
MAX_CHUNKED_EXTEND = 128
MIN_CHUNKED_CONTEXT_FLOATS = 1 << 20
CHUNK_FLOATS = 1 << 19
MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS = 1024, 8192


def _run_start(slots: torch.Tensor) -> int | None:
    """slots[0] when `slots` [n >= 1] is the run slots[0], slots[0] + 1, ..., else None.

    A fresh pool hands a long prefill ascending runs, so a long cached prefix often is one;
    comparing against an arange costs ~0.1 ms at 100K slots, a gather of them 1-4 ms.
    """
    first, n = int(slots[0]), slots.shape[0]
    if int(slots[-1]) - first != n - 1:
        return None
    return first if torch.equal(slots, torch.arange(first, first + n, dtype=slots.dtype, device=slots.device)) else None


def _gather_kv(cache: torch.Tensor, slots: torch.Tensor, first: int | None,
               scale: float) -> tuple[torch.Tensor, float]:
    """cache[slots] as fp32 [len(slots), num_kv_heads, head_dim], and the scale still to apply.

    `first`: slots[0] when the slots are one ascending run (see _run_start), read as a slice of
    the cache; an fp32 cache then comes back as a view, no copy. fp32 rows are never copied twice;
    fp8 ones come back without their scale, which the caller folds into sm_scale (K) or the output (V).
    NOTE: index_select on a [num_slots, num_kv_heads * head_dim] view measured the same as on the
    3-D cache (100K shuffled slots, 2 x 16 and 4 x 64 heads), so the gather stays 3-D.
    """
    rows = cache.narrow(0, first, slots.shape[0]) if first is not None else cache.index_select(0, slots)
    if cache.dtype == torch.uint8:
        return rows.view(torch.float8_e4m3fn).to(torch.float32), scale
    return rows.to(torch.float32), 1.0


def _attend_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, sm_scale: float) -> torch.Tensor:
    """Causal attention of q [extend_len, num_heads, head_dim] at positions prefix_len.. over
    k, v [prefix_len + extend_len, num_kv_heads, head_dim], all fp32; returns [extend_len, num_heads, head_dim].

    One SDPA call with a lower-right causal bias (query i sees keys 0 .. prefix_len + i): torch's
    CPU flash kernel skips the blocks above the diagonal and reads a KV head once for its query
    heads (enable_gqa). About 2x the chunked matmul + softmax it replaced for long extends
    (measured at 256 new tokens over prefixes of 1 to 5,000, head_dim 64, one core).
    """
    extend_len, seq_len = q.shape[0], k.shape[0]
    assert seq_len == prefix_len + extend_len, (seq_len, prefix_len, extend_len)
    o = F.scaled_dot_product_attention(  # [1, num_heads, extend_len, head_dim]
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=causal_lower_right(extend_len, seq_len), scale=sm_scale, enable_gqa=True)
    return o[0].transpose(0, 1)


def _chunk_bounds(prefix_len: int, seq_len: int, chunk_len: int) -> list[tuple[int, int]]:
    """[start, end) chunks of the context, each chunk_len long but the last, which runs to seq_len:

        | chunk | chunk | ... | last chunk: .. prefix | new tokens |
        0                      ^ start <= prefix_len              seq_len

    The new tokens' keys all fall in the last chunk, and every query sees its first key, so no
    chunk has a row with every key masked (softmax would give NaN).
    """
    starts = list(range(0, max(prefix_len, 1), chunk_len))
    return list(zip(starts, starts[1:] + [seq_len]))


def _attend_chunked(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                    prefix_len: int, sm_scale: float, k_scale: float, v_scale: float) -> torch.Tensor:
    """`_attend_request` for a short extend: per chunk of the context, a gather and two matmuls with a KV head's query heads stacked as rows, token-major (GQA),
    merged by an online softmax. Returns fp32 [extend_len, num_heads, head_dim].

    Per chunk, with s the scores and m their row max: p = softmax(s) = exp(s - m) / l, and p is 1 / l
    where s is m, so l = 1 / max(p). The chunk's output p @ v times l is its unnormalized sum,
    rescaled by exp(m - running max) as in flash attention.
    NOTE: chunks are gathered even when the slots are one run: the gathered chunk is hot in cache
    for the two matmuls, and reading a view in place measured no faster (22 vs 20 ms, 16 new
    tokens over 100K, 4 x 16 heads over 2 KV heads, one core).
    """
    extend_len, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group, rows = num_heads // num_kv_heads, extend_len * (num_heads // num_kv_heads)
    seq_len = prefix_len + extend_len
    floats_per_token = num_heads * extend_len + 2 * num_kv_heads * head_dim
    chunk_len = min(max(CHUNK_FLOATS // floats_per_token, MIN_CHUNK_TOKENS), MAX_CHUNK_TOKENS)
    hidden = torch.ones(extend_len, extend_len, dtype=torch.bool).triu_(1)  # [query, new key]: key after query
    is_fp8 = k_cache.dtype == torch.uint8
    qk_scale, v_rest = sm_scale * (k_scale if is_fp8 else 1.0), v_scale if is_fp8 else 1.0
    qg = q.to(torch.float32).view(extend_len, num_kv_heads, group, head_dim).transpose(0, 1)
    qg = qg.reshape(num_kv_heads, rows, head_dim) * qk_scale  # [num_kv_heads, rows, head_dim], row = token * group + g
    m_run = l_run = acc = None
    for a, b in _chunk_bounds(prefix_len, seq_len, chunk_len):
        k, _ = _gather_kv(k_cache, slots[a:b], None, k_scale)  # [b - a, num_kv_heads, head_dim]
        v, _ = _gather_kv(v_cache, slots[a:b], None, v_scale)
        s = torch.matmul(qg, k.permute(1, 2, 0))  # [num_kv_heads, rows, b - a]
        if b == seq_len and extend_len > 1:  # the new tokens' keys: causal
            s[:, :, prefix_len - a:].view(num_kv_heads, extend_len, group, extend_len).masked_fill_(
                hidden[None, :, None, :], float("-inf"))
        m = s.amax(dim=-1, keepdim=True)  # [num_kv_heads, rows, 1]
        p = s.softmax(dim=-1)
        l = p.amax(dim=-1, keepdim=True).reciprocal_()
        o = torch.matmul(p, v.transpose(0, 1)).mul_(l)  # [num_kv_heads, rows, head_dim]
        if acc is None:
            m_run, l_run, acc = m, l, o
            continue
        m_new = torch.maximum(m_run, m)
        old, new = (m_run - m_new).exp_(), (m - m_new).exp_()
        acc = acc.mul_(old).add_(o.mul_(new))
        l_run = l_run.mul_(old).add_(l.mul_(new))
        m_run = m_new
    out = acc.div_(l_run).mul_(v_rest)
    return out.view(num_kv_heads, extend_len, group, head_dim).transpose(0, 1).reshape(extend_len, num_heads, head_dim)


def _attend_request(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                    prefix_len: int, sm_scale: float, k_scale: float, v_scale: float) -> torch.Tensor:
    """One request: q [extend_len, num_heads, head_dim] over the context at `slots` [seq_len]; fp32 result.

    Short extends over long contexts take the chunked matmuls (see _attend_chunked), the rest one
    SDPA call. The rule as measured (one core, contiguous slots, 4 heads x 16 over 2 KV heads and
    12 x 64 over 4, so 32K and 4K tokens of context at the threshold): above it SDPA took 1.0-1.6x
    as long for 1 to 128 new tokens (2.1x for one token over 10K tokens at 12 x 64), and about as
    long for 256; below it up to 1.2x less (2x less at 64 new tokens over 1-3K tokens).
    """
    num_kv_heads, head_dim = k_cache.shape[1:]
    is_long = slots.shape[0] * num_kv_heads * head_dim >= MIN_CHUNKED_CONTEXT_FLOATS
    if q.shape[0] <= MAX_CHUNKED_EXTEND and is_long:
        return _attend_chunked(q, k_cache, v_cache, slots, prefix_len, sm_scale, k_scale, v_scale)
    first = _run_start(slots)
    k, k_rest = _gather_kv(k_cache, slots, first, k_scale)  # [seq_len, num_kv_heads, head_dim]
    v, v_rest = _gather_kv(v_cache, slots, first, v_scale)
    out = _attend_sdpa(q.to(torch.float32), k, v, prefix_len, sm_scale * k_rest)
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
