"""CPU-fast torch twins of decode/extend attention: exact-length gathers, query-chunked causal softmax."""
from __future__ import annotations

import torch

from .decode_attention import _check_decode
from .extend_attention import _check_extend

# Query rows per causal chunk: small enough that the chunks above the diagonal, which are
# never computed, save most of the causal half; large enough that matmuls stay efficient
# (128 was fastest at head_dim 64 on a 2-core CPU; benchmarks/cpu_attention.py).
QUERY_CHUNK = 128


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


def decode_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           req_to_token: torch.Tensor, req_rows: torch.Tensor, seq_lens: torch.Tensor,
                           sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                           num_kv_splits: int = 8) -> torch.Tensor:
    """CPU-fast twin of `decode_attention_ref` (same contract); `num_kv_splits` is unused.

    One request at a time, reading exactly its seq_len slots: no padding, so neither
    stale table entries nor the padding slot's bytes are ever read. Syncs on seq_lens.
    """
    _check_decode(q, k_cache, v_cache, req_to_token, req_rows, seq_lens, sm_scale, k_scale, v_scale, num_kv_splits)
    out = torch.zeros_like(q, memory_format=torch.contiguous_format)  # seq_len 0 rows stay zero
    for i, (row, seq_len) in enumerate(zip(req_rows.tolist(), seq_lens.tolist())):
        if seq_len == 0:
            continue
        slots = req_to_token[row, :seq_len]
        out[i] = _attend_request(q[i:i + 1], k_cache, v_cache, slots, seq_len - 1, sm_scale, k_scale, v_scale)[0]
    return out


def extend_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           req_to_token: torch.Tensor, req_rows: torch.Tensor, prefix_lens: torch.Tensor,
                           extend_lens: torch.Tensor, extend_starts: torch.Tensor, sm_scale: float,
                           k_scale: float = 1.0, v_scale: float = 1.0,
                           max_extend_len: int | None = None) -> torch.Tensor:
    """CPU-fast twin of `extend_attention_ref` (same contract); `max_extend_len` is unused.

    Per request, exact-length gathers and causal chunks that skip the masked upper
    triangle (see `_attend`). Rows no request covers are zero.
    """
    _check_extend(q, k_cache, v_cache, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts,
                  sm_scale, k_scale, v_scale, max_extend_len)
    out = torch.zeros_like(q, memory_format=torch.contiguous_format)
    per_req = zip(req_rows.tolist(), prefix_lens.tolist(), extend_lens.tolist(), extend_starts.tolist())
    for row, prefix_len, extend_len, start in per_req:
        if extend_len == 0:
            continue
        slots = req_to_token[row, :prefix_len + extend_len]
        out[start:start + extend_len] = _attend_request(q[start:start + extend_len], k_cache, v_cache, slots,
                                                        prefix_len, sm_scale, k_scale, v_scale)
    return out
