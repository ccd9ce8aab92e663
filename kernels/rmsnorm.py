"""RMSNorm with the residual add fused in: one read of x and residual, one write of each."""
from __future__ import annotations

import torch

from . import _triton as tr
from ._checks import FLOAT_DTYPES, check, check_same_device, check_tensor
from ._triton import tl, triton


def _check_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float) -> None:
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("weight", weight, 1, FLOAT_DTYPES)
    check(weight.shape[0] == x.shape[1], f"weight {tuple(weight.shape)} does not fit x {tuple(x.shape)}")
    if residual is not None:
        check_tensor("residual", residual, 2, FLOAT_DTYPES)
        check(residual.shape == x.shape and residual.dtype == x.dtype,
              f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}")
    check(eps > 0, f"eps must be > 0, got {eps}")
    check_same_device(x=x, residual=residual, weight=weight)


def rmsnorm_ref(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [num_tokens, hidden] → (weight * norm(h), h) with h = x + residual (or x).

    Returns new tensors of x's dtype; the norm runs in fp32, the weight multiplies the
    result cast back to x's dtype (the Llama convention), or, an fp32 weight on a narrower x,
    the fp32 result before it is cast (Gemma's and gpt-oss's). `h` is the next residual.
    """
    _check_rmsnorm(x, residual, weight, eps)
    h = x if residual is None else x + residual
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    if weight.dtype == torch.float32 and x.dtype != torch.float32:
        return (weight * normed).to(x.dtype), h
    return weight.to(x.dtype) * normed.to(x.dtype), h


@triton.jit
def _rmsnorm_kernel(x, residual, weight, out, h_out, stride_x, stride_r, stride_o, stride_h, hidden, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, FP32_PRODUCT: tl.constexpr = False):
    # one program per token row, the whole hidden dim in one block
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    h = tl.load(x + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        h = h + tl.load(residual + row * stride_r + offs, mask=mask, other=0.0)
    tl.store(h_out + row * stride_h + offs, h, mask=mask)
    hf = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / hidden + eps)
    if FP32_PRODUCT:  # an fp32 weight: the product in fp32, rounded once
        w = tl.load(weight + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out + row * stride_o + offs, (w * (hf * rstd)).to(h.dtype), mask=mask)
    else:
        normed = (hf * rstd).to(h.dtype)
        w = tl.load(weight + offs, mask=mask, other=0.0).to(h.dtype)
        tl.store(out + row * stride_o + offs, w * normed, mask=mask)


def rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton twin of `rmsnorm_ref` (same contract): one kernel for the add and the norm."""
    _check_rmsnorm(x, residual, weight, eps)
    tr.require_triton("rmsnorm")
    out, h = torch.empty_like(x), torch.empty_like(x)
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return out, h
    r = x if residual is None else residual
    _rmsnorm_kernel[(num_tokens,)](
        x, r, weight, out, h, x.stride(0), r.stride(0), out.stride(0), h.stride(0), hidden, float(eps),
        HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(hidden), num_warps=4 if hidden <= 4096 else 8,
        FP32_PRODUCT=weight.dtype == torch.float32 and x.dtype != torch.float32)
    return out, h
