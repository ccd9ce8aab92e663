"""Extend (prefill) attention: new tokens attend to their cached prefix and causally to each other."""
from __future__ import annotations

import torch

from . import _triton as tr
from ._attention import LOG2E, attend_kv_range, dot_precision, gather_kv
from ._checks import check, check_attention, check_index, check_same_device, check_scales
from ._triton import tl, triton


def _check_extend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                  req_rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                  extend_starts: torch.Tensor, sm_scale: float, k_scale: float, v_scale: float,
                  max_extend_len: int | None) -> None:
    check_attention(q, k_cache, v_cache, req_to_token, sm_scale)
    check_scales(k_scale, v_scale)
    batch = req_rows.shape[0] if isinstance(req_rows, torch.Tensor) else -1
    for name, t in (("req_rows", req_rows), ("prefix_lens", prefix_lens), ("extend_lens", extend_lens),
                    ("extend_starts", extend_starts)):
        check_index(name, t, batch)
    check(max_extend_len is None or (isinstance(max_extend_len, int) and max_extend_len >= 0),
          f"max_extend_len must be None or an int >= 0, got {max_extend_len!r}")
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, req_to_token=req_to_token, req_rows=req_rows,
                      prefix_lens=prefix_lens, extend_lens=extend_lens, extend_starts=extend_starts)


def extend_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                         req_rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                         extend_starts: torch.Tensor, sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                         max_extend_len: int | None = None) -> torch.Tensor:
    """Causal attention of the new tokens of each request over its whole context.

        q rows:   | req0 new tokens | req1 new tokens | ...      [num_tokens, num_heads, head_dim]
                  ^ extend_starts[0] ^ extend_starts[1]
        context of req i: slots req_to_token[req_rows[i], :prefix_lens[i] + extend_lens[i]]

    Query j of request i (position prefix_lens[i] + j) sees positions 0..prefix_lens[i] + j.
    The new tokens' K/V must already be stored. GQA: head h reads KV head
    h // (num_heads // num_kv_heads). uint8 caches hold fp8 e4m3, dequantized as
    fp8 * scale (scales are unused otherwise). Returns a new [num_tokens, num_heads,
    head_dim] tensor of q's dtype; rows no request covers are zero. fp32 math;
    `max_extend_len` is unused here. Memory: num_heads * extend_len * seq_len floats.
    """
    _check_extend(q, k_cache, v_cache, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts,
                  sm_scale, k_scale, v_scale, max_extend_len)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    out = torch.zeros((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    per_req = zip(req_rows.tolist(), prefix_lens.tolist(), extend_lens.tolist(), extend_starts.tolist())
    for row, prefix_len, extend_len, start in per_req:
        if extend_len == 0:
            continue
        seq_len = prefix_len + extend_len
        slots = req_to_token[row, :seq_len]
        k = gather_kv(k_cache, slots, k_scale)  # [seq_len, num_kv_heads, head_dim]
        v = gather_kv(v_cache, slots, v_scale)
        qi = q[start:start + extend_len].to(torch.float32).reshape(extend_len, num_kv_heads, group, head_dim)
        scores = torch.einsum("ekgd,skd->kges", qi, k) * sm_scale  # [num_kv_heads, group, extend_len, seq_len]
        query_pos = prefix_len + torch.arange(extend_len, device=q.device)
        visible = torch.arange(seq_len, device=q.device)[None, :] <= query_pos[:, None]  # [extend_len, seq_len]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        oi = torch.einsum("kges,skd->ekgd", probs, v)  # [extend_len, num_kv_heads, group, head_dim]
        out[start:start + extend_len] = oi.reshape(extend_len, num_heads, head_dim).to(q.dtype)
    return out


@triton.jit
def _extend_attention_kernel(
    q, k_cache, v_cache, out, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts,
    qk_scale, v_scale,
    stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
    stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head, stride_r2t_row,
    GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_WHILE: tl.constexpr,
):
    # grid: (request, query head, block of BLOCK_M new tokens)
    req = tl.program_id(0)
    head = tl.program_id(1)
    m_block = tl.program_id(2)
    extend_len = tl.load(extend_lens + req).to(tl.int32)
    if m_block * BLOCK_M >= extend_len:
        return
    prefix_len = tl.load(prefix_lens + req).to(tl.int32)
    first_tok = tl.load(extend_starts + req).to(tl.int64)
    row = tl.load(req_rows + req).to(tl.int64)
    kv_head = head // GROUP_SIZE

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < extend_len
    mask_d = offs_d < HEAD_DIM
    mask_md = mask_m[:, None] & mask_d[None, :]
    q_ptrs = q + (first_tok + offs_m)[:, None] * stride_q_tok + head * stride_q_head + offs_d[None, :]
    q_blk = tl.load(q_ptrs, mask=mask_md, other=0.0)  # [BLOCK_M, BLOCK_D]

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # see attend_kv_range
    # the block's last query sits at prefix_len + min(end of block, extend_len) - 1
    hi = prefix_len + tl.minimum((m_block + 1) * BLOCK_M, extend_len)
    acc, l_i, m_i = attend_kv_range(
        acc, l_i, m_i, q_blk, k_cache + kv_head * stride_kc_head, v_cache + kv_head * stride_vc_head,
        req_to_token + row * stride_r2t_row, 0, hi, prefix_len + offs_m, qk_scale,
        stride_kc_slot, stride_vc_slot, offs_d, mask_d, BLOCK_N, IS_FP8, DOT_PRECISION, USE_WHILE)

    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None] * v_scale
    o_ptrs = out + (first_tok + offs_m)[:, None] * stride_o_tok + head * stride_o_head + offs_d[None, :]
    tl.store(o_ptrs, o.to(out.dtype.element_ty), mask=mask_md)


def _launch_config(dtype: torch.dtype, block_d: int, is_cuda: bool) -> dict[str, int]:
    """Tile sizes. NOTE: chosen from sm90 AOT compiles (fewest register spills), not timed on a GPU yet."""
    if not is_cuda:  # interpreter: fewer, larger blocks run faster
        return dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=1)
    if dtype == torch.float32 or block_d > 128:  # larger tiles spill heavily
        return dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2)
    return dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2)


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                     req_rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                     extend_starts: torch.Tensor, sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                     max_extend_len: int | None = None) -> torch.Tensor:
    """Triton twin of `extend_attention_ref` (same contract).

    One launch for all requests: grid (batch, num_heads, cdiv(max_extend_len, BLOCK_M)).
    Pass `max_extend_len` (an upper bound is fine) to avoid a device-to-host sync.
    The caller must keep num_tokens >= every extend_starts[i] + extend_lens[i]
    (not checked: that would sync).
    """
    _check_extend(q, k_cache, v_cache, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts,
                  sm_scale, k_scale, v_scale, max_extend_len)
    tr.require_triton("extend_attention")
    num_tokens, num_heads, head_dim = q.shape
    batch = req_rows.shape[0]
    out = torch.zeros((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max()) if batch else 0
    if batch == 0 or num_tokens == 0 or max_extend_len == 0:
        return out
    is_fp8 = k_cache.dtype == torch.uint8
    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs K >= 16
    cfg = _launch_config(q.dtype, block_d, q.is_cuda)
    grid = (batch, num_heads, triton.cdiv(max_extend_len, cfg["BLOCK_M"]))
    _extend_attention_kernel[grid](
        q, k_cache, v_cache, out, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts,
        sm_scale * (k_scale if is_fp8 else 1.0) * LOG2E, v_scale if is_fp8 else 1.0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), req_to_token.stride(0),
        GROUP_SIZE=num_heads // k_cache.shape[1], HEAD_DIM=head_dim, BLOCK_D=block_d,
        IS_FP8=is_fp8, DOT_PRECISION=dot_precision(q.dtype), USE_WHILE=tr.use_while_loop(q.device),
        **cfg,
    )
    return out
