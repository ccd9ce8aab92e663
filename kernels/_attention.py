"""Triton pieces shared by extend and decode attention: the online-softmax loop over slot-table KV."""
from __future__ import annotations

import math

import torch

from ._triton import tl, triton
from .fp8 import dequantize_fp8, fp8_e4m3_to_f32

LOG2E = 1.0 / math.log(2.0)
LOG2E_JIT = tl.constexpr(LOG2E) if tl is not None else LOG2E  # the same, as jit code reads a global
# The `window` of attention without a sliding window: more positions than any context has.
NO_WINDOW = 1 << 30


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 models get IEEE fp32 dots (no silent tf32); half types ignore the setting."""
    return "ieee" if dtype == torch.float32 else "tf32"


@triton.jit
def _attend_block(
    acc, l_i, m_i, q, k_base, v_base, slot_row, start, hi, row_limit, window, qk_scale, cap,
    stride_k_slot, stride_v_slot, offs_d, mask_d,
    BLOCK_N: tl.constexpr, IS_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr, SOFTCAP: tl.constexpr,
):
    """Fold context positions [start, start + BLOCK_N) ∩ [.., hi) into one row block.

    q [ROWS, BLOCK_D]; acc [ROWS, BLOCK_D] fp32; l_i, m_i [ROWS] fp32 (log2 domain);
    row r sees positions in (row_limit[r] - window, row_limit[r]] (a sliding window of `window`
    keys; NO_WINDOW: all before it). SOFTCAP: each score s (log2 units) soft-capped to
    cap * tanh(s / cap), `cap` in log2 units too (Gemma 2). slot_row points at the request's
    req_to_token row; k_base/v_base at the KV head inside slot 0.
    """
    offs_n = start + tl.arange(0, BLOCK_N)
    mask_n = offs_n < hi
    slot = tl.load(slot_row + offs_n, mask=mask_n, other=0).to(tl.int64)
    # masked loads read 0, never the padding slot's bytes (which may hold NaN)
    k_t = tl.load(k_base + slot[None, :] * stride_k_slot + offs_d[:, None],
                  mask=mask_d[:, None] & mask_n[None, :], other=0)  # [BLOCK_D, BLOCK_N]
    v = tl.load(v_base + slot[:, None] * stride_v_slot + offs_d[None, :],
                mask=mask_n[:, None] & mask_d[None, :], other=0)  # [BLOCK_N, BLOCK_D]
    if IS_FP8:
        # e4m3 -> fp16/bf16/fp32 is exact; the scales are folded into qk_scale and the output
        k_t = fp8_e4m3_to_f32(k_t).to(q.dtype)
        v = fp8_e4m3_to_f32(v).to(q.dtype)
    qk = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale  # [ROWS, BLOCK_N]
    if SOFTCAP:  # cap * tanh(qk / cap), tanh(x) = 1 - 2 / (exp(2x) + 1) (exp overflowing to inf gives 1)
        qk = cap - 2.0 * cap / (tl.exp(2.0 * qk / cap) + 1.0)
    visible = (mask_n[None, :] & (offs_n[None, :] <= row_limit[:, None])
               & (offs_n[None, :] > row_limit[:, None] - window))
    qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def attend_kv_range(
    acc, l_i, m_i, q, k_base, v_base, slot_row, lo, hi, row_limit, window, qk_scale, cap,
    stride_k_slot, stride_v_slot, offs_d, mask_d,
    BLOCK_N: tl.constexpr, IS_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_WHILE: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Online softmax of q against context positions [lo, hi), each row within its window
    (see _attend_block); returns (acc, l_i, m_i).

    Start from acc = 0, l_i = 0, m_i = -1e30: a finite running max, so a row whose
    keys are all masked so far gets exp2(-inf - m) = 0 weights, not exp2(-inf + inf) = NaN.
    """
    if USE_WHILE:
        start = lo
        while start < hi:
            acc, l_i, m_i = _attend_block(
                acc, l_i, m_i, q, k_base, v_base, slot_row, start, hi, row_limit, window, qk_scale, cap,
                stride_k_slot, stride_v_slot, offs_d, mask_d, BLOCK_N, IS_FP8, DOT_PRECISION, SOFTCAP)
            start += BLOCK_N
    else:
        for start in tl.range(lo, hi, BLOCK_N):
            acc, l_i, m_i = _attend_block(
                acc, l_i, m_i, q, k_base, v_base, slot_row, start, hi, row_limit, window, qk_scale, cap,
                stride_k_slot, stride_v_slot, offs_d, mask_d, BLOCK_N, IS_FP8, DOT_PRECISION, SOFTCAP)
    return acc, l_i, m_i


def softcap_scores(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Attention scores soft-capped in place to softcap * tanh(scores / softcap) (Gemma 2's
    attn_logit_softcapping); unchanged for None."""
    return scores if softcap is None else scores.div_(softcap).tanh_().mul_(softcap)


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """softmax(scores) over the last dim; with `sinks` (one logit per row, broadcast to
    scores[..., :1]: gpt-oss's per-head attention sinks) each row's denominator also holds
    exp(sink), a key that carries no value, so a row's weights sum to less than 1. A row whose
    scores are all -inf gets zeros with a sink (NaN without, as softmax gives)."""
    if sinks is None:
        return scores.softmax(dim=-1)
    sink = sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)
    return torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]


def sink_scale(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """The factor an attention output normalized over its keys (log-sum-exp `lse`, natural log)
    takes once a sink joins the denominator: e^lse / (e^lse + e^sink) = sigmoid(lse - sink)
    (0 where lse is -inf: no keys)."""
    return torch.sigmoid(lse - sinks.to(lse.dtype))


def softcap_args(softcap: float | None) -> tuple[float, bool]:
    """The kernels' (cap, SOFTCAP): the cap in their log2 score units."""
    return (1.0, False) if softcap is None else (softcap * LOG2E, True)


def gather_kv(cache: torch.Tensor, slots: torch.Tensor, scale: float) -> torch.Tensor:
    """cache[slots] in fp32, fp8 dequantized with `scale` (other dtypes ignore it)."""
    rows = cache[slots.long()]
    return dequantize_fp8(rows, scale) if cache.dtype == torch.uint8 else rows.to(torch.float32)
