"""CPU-fast torch twin of extend attention: causal extend through SDPA or, for a few new tokens
over a long context, chunked matmuls (decode: kernels/torch_decode.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native
from ._attention import softcap_scores, softmax_with_sinks
from .extend_attention import _check_extend

# Short extends over long contexts take _attend_chunked: extend_len up to MAX_CHUNKED_EXTEND,
# seq_len * num_kv_heads * head_dim from MIN_CHUNKED_CONTEXT_FLOATS (4 MiB of fp32 K). Chunks hold
# about CHUNK_FLOATS of scores and fp32 K/V.
MAX_CHUNKED_EXTEND = 128
MIN_CHUNKED_CONTEXT_FLOATS = 1 << 20
CHUNK_FLOATS = 1 << 19
MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS = 1024, 8192
# A sliding window's or soft-capped extend goes in blocks of this many queries, each over its block's window only.
WINDOW_QUERY_BLOCK = 1024
LOG2E = 1.4426950408889634  # exp(x) = exp2(x * LOG2E)


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

    One SDPA call, causal from the lower right (query i sees keys 0 .. prefix_len + i); torch's
    CPU flash kernel reads a KV head once for its query heads (enable_gqa). About 2x the chunked
    matmul + softmax it replaced for long extends (measured at 256 new tokens over prefixes of 1
    to 5,000, head_dim 64, one core).
    NOTE: on CPU the mask is the boolean matrix torch's `causal_lower_right` bias would make there;
    that module imports torch._dynamo (2 s of every process's start), so only CUDA loads it, where
    the bias runs flash attention without a mask.
    """
    extend_len, seq_len = q.shape[0], k.shape[0]
    assert seq_len == prefix_len + extend_len, (seq_len, prefix_len, extend_len)
    mask = None
    if prefix_len and q.is_cuda:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(extend_len, seq_len)
    elif prefix_len:
        mask = torch.ones(extend_len, seq_len, dtype=torch.bool, device=q.device).tril_(prefix_len)
    o = F.scaled_dot_product_attention(  # [1, num_heads, extend_len, head_dim]
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=mask, is_causal=not prefix_len, scale=sm_scale, enable_gqa=True)
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
    """`_attend_request` for a short extend: per chunk of the context, two matmuls with a KV
    head's query heads stacked as columns, token-major (GQA), merged by an online softmax.
    Returns fp32 [extend_len, num_heads, head_dim].

    Scores are kept key-major, [num_kv_heads, chunk, rows], so the first matmul reads K in the
    cache's own layout (a slice of it when the slots are one ascending run: no gather) and has
    the long dimension as its rows; they are in log2 units (LOG2E folded into the query scale) so
    the weights are exp2(s - m), about 3x cheaper than exp on CPU. Per chunk, p = exp2(s - m),
    l = sum(p) and o = p^T @ v, rescaled by exp2(m - running max) as in flash attention.
    Measured at 16 new tokens over 100K, 4 x 16 heads over 2 KV heads, one AVX-512 core, medians
    of 9 alternating calls: 16.3 ms before (query-major scores, softmax, a gather per chunk),
    13.4 ms after; 21 -> 18.6 ms with the slots shuffled (gathered). The two matmuls are ~60% of
    what is left (~65 GFLOP/s each: head_dim 16 is their inner or outer dimension).
    """
    extend_len, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group, rows = num_heads // num_kv_heads, extend_len * (num_heads // num_kv_heads)
    seq_len = prefix_len + extend_len
    floats_per_token = num_heads * extend_len + 2 * num_kv_heads * head_dim
    chunk_len = min(max(CHUNK_FLOATS // floats_per_token, MIN_CHUNK_TOKENS), MAX_CHUNK_TOKENS)
    hidden = torch.ones(extend_len, extend_len, dtype=torch.bool).triu_(1).t()  # [new key, query]: key after query
    is_fp8 = k_cache.dtype == torch.uint8
    first = _run_start(slots)
    qk_scale, v_rest = sm_scale * LOG2E * (k_scale if is_fp8 else 1.0), v_scale if is_fp8 else 1.0
    qg = q.to(torch.float32).view(extend_len, num_kv_heads, group, head_dim).permute(1, 3, 0, 2)
    qg = qg.reshape(num_kv_heads, head_dim, rows) * qk_scale  # [num_kv_heads, head_dim, rows], row = token * group + g
    m_run = l_run = acc = None
    for a, b in _chunk_bounds(prefix_len, seq_len, chunk_len):
        run = None if first is None else first + a
        k, _ = _gather_kv(k_cache, slots[a:b], run, k_scale)  # [b - a, num_kv_heads, head_dim]
        v, _ = _gather_kv(v_cache, slots[a:b], run, v_scale)
        s = torch.matmul(k.transpose(0, 1), qg)  # [num_kv_heads, b - a, rows]
        if b == seq_len and extend_len > 1:  # the new tokens' keys: causal
            s[:, prefix_len - a:].view(num_kv_heads, extend_len, extend_len, group).masked_fill_(
                hidden[None, :, :, None], float("-inf"))
        m = s.amax(dim=1, keepdim=True)  # [num_kv_heads, 1, rows]
        p = s.sub_(m).exp2_()
        l = p.sum(dim=1, keepdim=True)
        o = torch.matmul(p.transpose(1, 2), v.transpose(0, 1))  # [num_kv_heads, rows, head_dim]
        m, l = m.transpose(1, 2), l.transpose(1, 2)  # [num_kv_heads, rows, 1]
        if acc is None:
            m_run, l_run, acc = m, l, o
            continue
        m_new = torch.maximum(m_run, m)
        old, new = (m_run - m_new).exp2_(), (m - m_new).exp2_()
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


def _attend_masked(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                   prefix_len: int, sm_scale: float, k_scale: float, v_scale: float, window: int | None,
                   softcap: float | None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """`_attend_request` through a sliding window (query p sees keys p - window + 1..p) and/or
    with soft-capped scores or attention sinks (fp32 [num_heads]). Per block of WINDOW_QUERY_BLOCK
    queries, over the keys the block's windows reach: one band-masked SDPA call, or with a soft-cap
    or sinks the scores in two matmuls (SDPA has neither); fp32 result."""
    extend_len, num_heads, head_dim = q.shape
    group = num_heads // k_cache.shape[1]
    out = torch.empty(q.shape, dtype=torch.float32)
    for a in range(0, extend_len, WINDOW_QUERY_BLOCK):
        b = min(a + WINDOW_QUERY_BLOCK, extend_len)
        first, last = 0 if window is None else max(0, prefix_len + a - window + 1), prefix_len + b  # keys [first, last)
        keys = slots[first:last]
        run = _run_start(keys)
        k, k_rest = _gather_kv(k_cache, keys, run, k_scale)
        v, v_rest = _gather_kv(v_cache, keys, run, v_scale)
        query_pos = torch.arange(prefix_len + a, prefix_len + b)[:, None]
        key_pos = torch.arange(first, last)[None, :]
        visible = key_pos <= query_pos  # [b - a, last - first]
        if window is not None:
            visible &= key_pos > query_pos - window
        qh, kh, vh = q[a:b].to(torch.float32).transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # heads first
        if softcap is None and sinks is None:
            o = F.scaled_dot_product_attention(qh[None], kh[None], vh[None], attn_mask=visible, scale=sm_scale * k_rest,
                                               enable_gqa=True)[0]  # [num_heads, b - a, head_dim]
        else:
            kh, vh = kh.repeat_interleave(group, dim=0), vh.repeat_interleave(group, dim=0)
            scores = softcap_scores(torch.matmul(qh, kh.transpose(1, 2)).mul_(sm_scale * k_rest), softcap)
            scores = scores.masked_fill_(~visible, float("-inf"))
            o = torch.matmul(softmax_with_sinks(scores, None if sinks is None else sinks[:, None, None]), vh)
        out[a:b] = o.transpose(0, 1) * v_rest
    return out


def extend_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           req_to_token: torch.Tensor, req_rows: torch.Tensor, prefix_lens: torch.Tensor,
                           extend_lens: torch.Tensor, extend_starts: torch.Tensor, sm_scale: float,
                           k_scale: float = 1.0, v_scale: float = 1.0,
                           max_extend_len: int | None = None, max_seq_len: int | None = None,
                           num_kv_splits: int | None = None, window: int | None = None,
                           softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """CPU-fast twin of `extend_attention_ref` (same contract); the launch hints are unused.

    The whole batch in one call of the native kernel (kernels/cpu_extend.c: the caches read in
    place) where it takes the caches; else, per request, exact-length gathers and one causal SDPA
    call or chunked matmuls (see `_attend_request`), or, past a sliding `window` or with a
    `softcap` or `sinks`, per block of queries over the keys their windows reach (`_attend_masked`).
    Rows no request covers are zero.
    """
    _check_extend(q, k_cache, v_cache, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts,
                  sm_scale, k_scale, v_scale, max_extend_len, max_seq_len, num_kv_splits, window, softcap, sinks)
    within_window = window is None or req_rows.shape[0] == 0 or int((prefix_lens + extend_lens).max()) <= window
    if within_window and softcap is None and sinks is None and native.supports_extend(k_cache, v_cache, q.shape[1]):
        return native.extend_attention_native(q, k_cache, v_cache, req_to_token, req_rows, prefix_lens,
                                              extend_lens, extend_starts, sm_scale).to(q.dtype)
    out = torch.zeros_like(q, memory_format=torch.contiguous_format)
    per_req = zip(req_rows.tolist(), prefix_lens.tolist(), extend_lens.tolist(), extend_starts.tolist())
    for row, prefix_len, extend_len, start in per_req:
        if extend_len == 0:
            continue
        slots = req_to_token[row, :prefix_len + extend_len]
        qi = q[start:start + extend_len]
        # a window holding the whole context is none
        own_window = window if window is not None and prefix_len + extend_len > window else None
        if own_window is not None or softcap is not None or sinks is not None:
            out[start:start + extend_len] = _attend_masked(qi, k_cache, v_cache, slots, prefix_len, sm_scale,
                                                           k_scale, v_scale, own_window, softcap,
                                                           None if sinks is None else sinks.float())
        else:
            out[start:start + extend_len] = _attend_request(qi, k_cache, v_cache, slots, prefix_len, sm_scale,
                                                            k_scale, v_scale)
    return out
