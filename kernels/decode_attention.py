"""Decode attention: one query per request over its whole context, split-KV in two stages."""
from __future__ import annotations

import torch

from . import _triton as tr
from ._attention import (LOG2E, LOG2E_JIT, attend_kv_range, dot_precision, gather_kv, softcap_args, softcap_scores,
                         softmax_with_sinks)
from ._checks import check, check_attention, check_index, check_same_device, check_scales, check_sinks
from ._triton import tl, triton


# A split shorter than this many tokens costs more in partials and merging than it saves.
MIN_SPLIT_LEN = 256
MAX_KV_SPLITS = 64


def choose_kv_splits(batch: int, num_kv_heads: int, max_seq_len: int, num_sms: int,
                     min_split_len: int = MIN_SPLIT_LEN, max_splits: int = MAX_KV_SPLITS) -> int:
    """KV splits for a decode step: enough stage-1 programs (batch x KV heads x splits) to give
    every SM two, but no split shorter than `min_split_len` tokens of the longest context.

    Batch 1 x 8 KV heads x 4,096 tokens on 132 SMs: 16 splits; batch 64: 1 (the batch alone
    fills the GPU, and stage 2 and the fp32 partials would only add traffic).
    """
    programs = max(1, batch * num_kv_heads)
    fill = -(-2 * num_sms // programs)
    by_len = -(-max(max_seq_len, 1) // min_split_len)
    return max(1, min(fill, by_len, max_splits))


def window_context(req_to_token: torch.Tensor, req_rows: torch.Tensor, seq_lens: torch.Tensor,
                   window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decode step's contexts cut to their last `window` positions (a layer's sliding window),
    as the (req_to_token, req_rows, seq_lens) any decode attention takes: a new slot table
    [batch, min(window, width)] whose row i holds request i's last slots, rows 0..batch-1, and
    lengths min(seq_len, window). Device ops only (no host sync: CUDA-graph safe); costs a
    gather of batch x window slot ids per step, shared by the step's windowed layers."""
    check(isinstance(window, int) and not isinstance(window, bool) and window >= 1,
          f"window must be an int >= 1, got {window!r}")
    width = min(window, req_to_token.shape[1])
    cols = torch.arange(width, device=seq_lens.device)[None, :] + (seq_lens[:, None] - width).clamp(min=0)
    table = req_to_token[req_rows.long()[:, None], cols.clamp(max=req_to_token.shape[1] - 1)]
    rows = torch.arange(seq_lens.shape[0], dtype=req_rows.dtype, device=req_rows.device)
    return table, rows, seq_lens.clamp(max=width)


def chunk_context(req_to_token: torch.Tensor, req_rows: torch.Tensor, seq_lens: torch.Tensor,
                  chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decode step's contexts cut to the chunk their last position is in (Llama 4's chunked
    attention: a query sees the keys of its own `chunk`-token chunk up to itself), as window_context
    gives them: a slot table [batch, min(chunk, width)] whose row i starts at request i's chunk
    start ((seq_len - 1) // chunk * chunk), rows 0..batch-1, and lengths from there. Device ops only."""
    check(isinstance(chunk, int) and not isinstance(chunk, bool) and chunk >= 1,
          f"chunk must be an int >= 1, got {chunk!r}")
    width = min(chunk, req_to_token.shape[1])
    start = (seq_lens - 1).clamp(min=0) // chunk * chunk
    cols = torch.arange(width, device=seq_lens.device)[None, :] + start[:, None]
    table = req_to_token[req_rows.long()[:, None], cols.clamp(max=req_to_token.shape[1] - 1)]
    rows = torch.arange(seq_lens.shape[0], dtype=req_rows.dtype, device=req_rows.device)
    return table, rows, seq_lens - start


def _check_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                  req_rows: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float, k_scale: float,
                  v_scale: float, num_kv_splits: int, softcap: float | None = None,
                  sinks: torch.Tensor | None = None) -> None:
    check_attention(q, k_cache, v_cache, req_to_token, sm_scale, softcap)
    check_sinks(sinks, q)
    check_scales(k_scale, v_scale)
    check_index("req_rows", req_rows, q.shape[0])
    check_index("seq_lens", seq_lens, q.shape[0])
    check(isinstance(num_kv_splits, int) and 1 <= num_kv_splits <= 256,
          f"num_kv_splits must be an int in [1, 256], got {num_kv_splits!r}")
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, req_to_token=req_to_token, req_rows=req_rows,
                      seq_lens=seq_lens)


def decode_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                         req_rows: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float, k_scale: float = 1.0,
                         v_scale: float = 1.0, num_kv_splits: int = 8, softcap: float | None = None,
                         sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of q [batch, num_heads, head_dim] (one query per request) over its context
    (scores soft-capped to softcap * tanh(score / softcap) where `softcap` is given; `sinks`
    as extend_attention_ref's).

    Request i sees the seq_lens[i] slots req_to_token[req_rows[i], :seq_lens[i]],
    its own new token included (already stored). A request with seq_len 0 (CUDA
    graph padding) gets zeros. GQA and fp8 as in extend_attention_ref. Returns a
    new [batch, num_heads, head_dim] tensor of q's dtype; fp32 math; batched
    over requests, padded to the longest context; `num_kv_splits` is unused here.
    """
    _check_decode(q, k_cache, v_cache, req_to_token, req_rows, seq_lens, sm_scale, k_scale, v_scale, num_kv_splits,
                  softcap, sinks)
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    max_len = int(seq_lens.max()) if batch else 0
    positions = torch.arange(max_len, device=q.device)
    visible = positions[None, :] < seq_lens[:, None]  # [batch, max_len]
    # past seq_len the table may hold stale ids: read slot 0 there, and zero it, since
    # 0 * NaN would leak the dummy slot's bytes into the sum
    slots = torch.where(visible, req_to_token[req_rows.long(), :max_len].long(), 0)
    hidden = ~visible[:, :, None, None]
    k = gather_kv(k_cache, slots, k_scale).masked_fill(hidden, 0.0)  # [batch, max_len, num_kv_heads, head_dim]
    v = gather_kv(v_cache, slots, v_scale).masked_fill(hidden, 0.0)
    qg = q.to(torch.float32).reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.einsum("bkgd,blkd->bkgl", qg, k) * sm_scale  # [batch, num_kv_heads, group, max_len]
    scores = softcap_scores(scores, softcap)
    mask = visible[:, None, None, :]
    head_sinks = None if sinks is None else sinks.float().view(1, num_kv_heads, num_heads // num_kv_heads, 1)
    probs = softmax_with_sinks(scores.masked_fill(~mask, float("-inf")), head_sinks)
    probs = torch.where(mask, probs, 0.0)  # a seq_len 0 row is all NaN: make it zeros
    out = torch.einsum("bkgl,blkd->bkgd", probs, v)
    return out.reshape(batch, num_heads, head_dim).to(q.dtype)


@triton.jit
def _decode_stage1_kernel(
    q, k_cache, v_cache, req_to_token, req_rows, seq_lens, part_out, part_lse, qk_scale, cap,
    stride_q_req, stride_q_head, stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head,
    stride_r2t_row, num_heads,
    GROUP_SIZE: tl.constexpr, HEAD_BLOCKS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_WHILE: tl.constexpr, SOFTCAP: tl.constexpr,
):
    # grid: (request, KV head x HEAD_BLOCKS, split). A program takes up to BLOCK_H
    # query heads of one KV head's group, so each K/V tile is loaded once for all.
    req = tl.program_id(0)
    kv_head = tl.program_id(1) // HEAD_BLOCKS
    split = tl.program_id(2)
    offs_g = (tl.program_id(1) % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_g < GROUP_SIZE
    heads = kv_head * GROUP_SIZE + offs_g
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask_hd = mask_h[:, None] & mask_d[None, :]

    seq_len = tl.load(seq_lens + req).to(tl.int32)
    row = tl.load(req_rows + req).to(tl.int64)
    #   context: | split 0 | split 1 | ... | last non-empty split | empty splits |
    # each split_len long, a multiple of BLOCK_N; empty splits write lse = -inf
    split_len = (seq_len + NUM_SPLITS * BLOCK_N - 1) // (NUM_SPLITS * BLOCK_N) * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(lo + split_len, seq_len)

    q_blk = tl.load(q + req * stride_q_req + heads[:, None] * stride_q_head + offs_d[None, :],
                    mask=mask_hd, other=0.0)  # [BLOCK_H, BLOCK_D]
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)  # see attend_kv_range
    acc, l_i, m_i = attend_kv_range(
        acc, l_i, m_i, q_blk, k_cache + kv_head * stride_kc_head, v_cache + kv_head * stride_vc_head,
        # no window (1 << 30: _attention.NO_WINDOW): a sliding window's decode reads window_context's table
        req_to_token + row * stride_r2t_row, lo, hi, tl.zeros([BLOCK_H], dtype=tl.int32) + (hi - 1), 1 << 30,
        qk_scale, cap,
        stride_kc_slot, stride_vc_slot, offs_d, mask_d, BLOCK_N, IS_FP8, DOT_PRECISION, USE_WHILE, SOFTCAP)

    has_keys = l_i > 0
    l_safe = tl.where(has_keys, l_i, 1.0)
    lse = tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf"))  # log2 domain
    # scratch: part_out [batch, num_heads, NUM_SPLITS, HEAD_DIM], part_lse [batch, num_heads, NUM_SPLITS]
    part = (req * num_heads + heads) * NUM_SPLITS + split  # [BLOCK_H]
    tl.store(part_out + part[:, None] * HEAD_DIM + offs_d[None, :], acc / l_safe[:, None], mask=mask_hd)
    tl.store(part_lse + part, lse, mask=mask_h)


@triton.jit
def _decode_stage2_kernel(
    part_out, part_lse, out, sinks, v_scale, stride_o_req, stride_o_head, num_heads,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    # grid: (row, query head): merges the splits' partial softmaxes (a row is a decode
    # request, or an extend token)
    req = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < NUM_SPLITS
    mask_d = offs_d < HEAD_DIM
    part = (req * num_heads + head) * NUM_SPLITS + offs_s  # [BLOCK_S]
    lse = tl.load(part_lse + part, mask=mask_s, other=float("-inf"))
    has_keys = lse > float("-inf")  # a split that saw no key may not have written part_out
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # seq_len 0: every split empty, weights 0 (not NaN)
    if HAS_SINKS:  # the head's sink joins the denominator, once
        sink = tl.load(sinks + head).to(tl.float32) * LOG2E_JIT
        m = tl.maximum(m, sink)
    w = tl.exp2(lse - m)
    o = tl.load(part_out + part[:, None] * HEAD_DIM + offs_d[None, :],
                mask=(mask_s & has_keys)[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_S, BLOCK_D]
    total = tl.sum(w, 0)
    if HAS_SINKS:
        total += tl.exp2(sink - m)
    res = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0) * v_scale
    tl.store(out + req * stride_o_req + head * stride_o_head + offs_d, res.to(out.dtype.element_ty), mask=mask_d)


def stage1_config(group: int, is_cuda: bool) -> dict[str, int]:
    """Stage-1 tiles: up to 64 query heads of a group per program (tl.dot needs M >= 16).
    NOTE: checked for register spills by sm90 compiles (tests/kernels/test_compile_sm90.py)."""
    block_h = max(16, min(64, triton.next_power_of_2(group)))
    block_n = 32 if is_cuda else 64  # the interpreter prefers fewer, larger blocks
    return dict(BLOCK_H=block_h, BLOCK_N=block_n, num_warps=4, num_stages=2)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                     req_rows: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float, k_scale: float = 1.0,
                     v_scale: float = 1.0, num_kv_splits: int = 8, softcap: float | None = None,
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Triton twin of `decode_attention_ref` (same contract), flash-decoding style.

    Stage 1, grid (batch, num_kv_heads * cdiv(group, BLOCK_H), num_kv_splits):
    each split's partial output and log-sum-exp into fp32 scratch; stage 2, grid
    (batch, num_heads): their merge. CUDA-graph safe: seq_lens are read on the
    device only, and the scratch size depends on shapes alone.
    """
    _check_decode(q, k_cache, v_cache, req_to_token, req_rows, seq_lens, sm_scale, k_scale, v_scale, num_kv_splits,
                  softcap, sinks)
    tr.require_triton("decode_attention")
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty((batch, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    part_out = torch.empty((batch, num_heads, num_kv_splits, head_dim), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((batch, num_heads, num_kv_splits), dtype=torch.float32, device=q.device)
    is_fp8 = k_cache.dtype == torch.uint8
    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs K >= 16
    cfg = stage1_config(group, q.is_cuda)
    head_blocks = triton.cdiv(group, cfg["BLOCK_H"])
    cap, use_cap = softcap_args(softcap)
    _decode_stage1_kernel[(batch, num_kv_heads * head_blocks, num_kv_splits)](
        q, k_cache, v_cache, req_to_token, req_rows, seq_lens, part_out, part_lse,
        sm_scale * (k_scale if is_fp8 else 1.0) * LOG2E, cap,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        req_to_token.stride(0), num_heads,
        GROUP_SIZE=group, HEAD_BLOCKS=head_blocks, HEAD_DIM=head_dim, NUM_SPLITS=num_kv_splits, BLOCK_D=block_d,
        IS_FP8=is_fp8, DOT_PRECISION=dot_precision(q.dtype), USE_WHILE=tr.use_while_loop(q.device), SOFTCAP=use_cap,
        **cfg,
    )
    merge_splits(part_out, part_lse, out, v_scale if is_fp8 else 1.0, sinks)
    return out


def merge_splits(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor, v_scale: float,
                 sinks: torch.Tensor | None = None) -> None:
    """Stage 2: out[r, h] = the softmax-weighted merge of part_out [rows, num_heads, splits,
    head_dim] fp32 by part_lse [rows, num_heads, splits] (log2 domain; -inf: the split saw no
    key), times v_scale; with `sinks` [num_heads] (natural-log logits) each head's sink joins
    the denominator. A row whose splits are all -inf gets zeros. Writes `out` in place."""
    rows, num_heads, num_splits, head_dim = part_out.shape
    _decode_stage2_kernel[(rows, num_heads)](
        part_out, part_lse, out, part_lse if sinks is None else sinks, v_scale, out.stride(0), out.stride(1),
        num_heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits),
        BLOCK_D=triton.next_power_of_2(head_dim), HAS_SINKS=sinks is not None, num_warps=4,
    )
