"""SGMV-style LoRA kernels: per segment of rows sharing one adapter slot, shrink x @ A then expand += . @ B.

Segments are contiguous row ranges of the flat token batch (one per request); a segment whose
slot is -1 (the base model) is skipped. Both ops take the same segment description:

    seg_starts [num_segs]  first row      seg_lens [num_segs]  rows      seg_slots [num_segs]  slot or -1
    max_seg_len: an upper bound of seg_lens (host int: it sizes the grid; a CUDA graph passes 1)

    lora_shrink: x [T, K] , a [S, K, N]       → out [T, N] (x's dtype; rows of base segments are 0)
    lora_expand: y [T, O] += xa [T, N] @ b[slot] [N, O], in place; returns y
"""
from __future__ import annotations

import torch

from . import _triton as tr
from ._attention import dot_precision
from ._checks import FLOAT_DTYPES, check, check_index, check_same_device, check_tensor
from ._triton import tl, triton

BLOCK_M = 16  # rows per program: tl.dot needs M >= 16; decode segments are 1 row


def _check_segments(num_rows: int, seg_starts: torch.Tensor, seg_lens: torch.Tensor, seg_slots: torch.Tensor,
                    max_seg_len: int, num_slots: int) -> None:
    check_index("seg_lens", seg_lens, seg_lens.shape[0] if isinstance(seg_lens, torch.Tensor) else -1)
    n = seg_lens.shape[0]
    check_index("seg_starts", seg_starts, n)
    check_index("seg_slots", seg_slots, n)
    check(isinstance(max_seg_len, int) and max_seg_len >= 0, f"max_seg_len must be an int >= 0, got {max_seg_len!r}")
    check(num_slots >= 1, "the slot weights need at least one slot")
    del num_rows  # bounds are the caller's contract (reading them back would sync the device)


def _check_shrink(x: torch.Tensor, a: torch.Tensor, *segs) -> None:
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("a", a, 3, (x.dtype,))
    check(a.shape[1] == x.shape[1], f"a [slots, K, N] must have K = x's {x.shape[1]}, got {tuple(a.shape)}")
    check(a.is_contiguous(), "a must be contiguous")
    check_same_device(x=x, a=a, seg_starts=segs[0], seg_lens=segs[1], seg_slots=segs[2])
    _check_segments(x.shape[0], *segs, a.shape[0])


def _check_expand(y: torch.Tensor, xa: torch.Tensor, b: torch.Tensor, *segs) -> None:
    check_tensor("y", y, 2, FLOAT_DTYPES)
    check_tensor("xa", xa, 2, (y.dtype,))
    check_tensor("b", b, 3, (y.dtype,))
    check(xa.shape[0] == y.shape[0], f"xa has {xa.shape[0]} rows, y {y.shape[0]}")
    check(b.shape[1] == xa.shape[1] and b.shape[2] == y.shape[1],
          f"b [slots, N, O] must be [*, {xa.shape[1]}, {y.shape[1]}], got {tuple(b.shape)}")
    check(b.is_contiguous(), "b must be contiguous")
    check_same_device(y=y, xa=xa, b=b, seg_starts=segs[0], seg_lens=segs[1], seg_slots=segs[2])
    _check_segments(y.shape[0], *segs, b.shape[0])


def _segments(seg_starts: torch.Tensor, seg_lens: torch.Tensor, seg_slots: torch.Tensor):
    for start, n, slot in zip(seg_starts.tolist(), seg_lens.tolist(), seg_slots.tolist()):
        if slot >= 0 and n > 0:
            yield start, n, slot


def lora_shrink_ref(x: torch.Tensor, a: torch.Tensor, seg_starts: torch.Tensor, seg_lens: torch.Tensor,
                    seg_slots: torch.Tensor, max_seg_len: int) -> torch.Tensor:
    """out [T, N]: rows of segment i = x[rows] @ a[seg_slots[i]] in fp32, zeros for base segments."""
    _check_shrink(x, a, seg_starts, seg_lens, seg_slots, max_seg_len)
    out = torch.zeros((x.shape[0], a.shape[2]), dtype=x.dtype, device=x.device)
    for start, n, slot in _segments(seg_starts, seg_lens, seg_slots):
        out[start:start + n] = (x[start:start + n].float() @ a[slot].float()).to(x.dtype)
    return out


def lora_expand_ref(y: torch.Tensor, xa: torch.Tensor, b: torch.Tensor, seg_starts: torch.Tensor,
                    seg_lens: torch.Tensor, seg_slots: torch.Tensor, max_seg_len: int) -> torch.Tensor:
    """y[rows] += xa[rows] @ b[seg_slots[i]] per adapter segment, in fp32; in place, returns y."""
    _check_expand(y, xa, b, seg_starts, seg_lens, seg_slots, max_seg_len)
    for start, n, slot in _segments(seg_starts, seg_lens, seg_slots):
        y[start:start + n] = (y[start:start + n].float() + xa[start:start + n].float() @ b[slot].float()).to(y.dtype)
    return y


@triton.jit
def _sgmv_kernel(x, w, y, seg_starts, seg_lens, seg_slots, K, N, stride_x, stride_ws, stride_wk, stride_y,
                 ACCUMULATE: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # grid: (segment, block of its rows, block of N); y[rows, n-block] (+)= x[rows] @ w[slot]
    seg = tl.program_id(0)
    slot = tl.load(seg_slots + seg).to(tl.int64)
    seg_len = tl.load(seg_lens + seg)
    m0 = tl.program_id(1) * BLOCK_M
    if (slot < 0) | (m0 >= seg_len):
        return
    start = tl.load(seg_starts + seg).to(tl.int64)
    rm = m0 + tl.arange(0, BLOCK_M)
    rn = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_mask, n_mask = rm < seg_len, rn < N
    rows = start + rm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k_mask = kk < K
        xt = tl.load(x + rows[:, None] * stride_x + kk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        wt = tl.load(w + slot * stride_ws + kk[:, None] * stride_wk + rn[None, :],
                     mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc += tl.dot(xt, wt, input_precision=DOT_PRECISION)
    out_ptrs = y + rows[:, None] * stride_y + rn[None, :]
    out_mask = m_mask[:, None] & n_mask[None, :]
    if ACCUMULATE:
        acc += tl.load(out_ptrs, mask=out_mask, other=0.0).to(tl.float32)
    tl.store(out_ptrs, acc.to(y.dtype.element_ty), mask=out_mask)


def _launch(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, segs: tuple, max_seg_len: int,
            accumulate: bool) -> None:
    seg_starts, seg_lens, seg_slots = segs
    num_segs, k, n = seg_lens.shape[0], w.shape[1], w.shape[2]
    if num_segs == 0 or max_seg_len == 0 or n == 0 or x.shape[0] == 0:
        return
    block_n = max(16, min(64, triton.next_power_of_2(n)))
    block_k = max(16, min(64, triton.next_power_of_2(k)))
    grid = (num_segs, triton.cdiv(max_seg_len, BLOCK_M), triton.cdiv(n, block_n))
    _sgmv_kernel[grid](x, w, y, seg_starts, seg_lens, seg_slots, k, n, x.stride(0), w.stride(0), w.stride(1),
                       y.stride(0), ACCUMULATE=accumulate, DOT_PRECISION=dot_precision(x.dtype), BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k,
                       num_warps=4)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, seg_starts: torch.Tensor, seg_lens: torch.Tensor,
                seg_slots: torch.Tensor, max_seg_len: int) -> torch.Tensor:
    """Triton twin of `lora_shrink_ref` (same contract)."""
    _check_shrink(x, a, seg_starts, seg_lens, seg_slots, max_seg_len)
    tr.require_triton("lora_shrink")
    out = torch.zeros((x.shape[0], a.shape[2]), dtype=x.dtype, device=x.device)
    _launch(x, a, out, (seg_starts, seg_lens, seg_slots), max_seg_len, accumulate=False)
    return out


def lora_expand(y: torch.Tensor, xa: torch.Tensor, b: torch.Tensor, seg_starts: torch.Tensor,
                seg_lens: torch.Tensor, seg_slots: torch.Tensor, max_seg_len: int) -> torch.Tensor:
    """Triton twin of `lora_expand_ref` (same contract)."""
    _check_expand(y, xa, b, seg_starts, seg_lens, seg_slots, max_seg_len)
    tr.require_triton("lora_expand")
    _launch(xa, b, y, (seg_starts, seg_lens, seg_slots), max_seg_len, accumulate=True)
    return y
