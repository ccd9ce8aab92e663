"""SiLU-and-mul (and GELU-and-mul, GELU's tanh form): act(gate) * up over a fused gate|up projection, in one pass."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _triton as tr
from ._checks import FLOAT_DTYPES, check, check_tensor
from ._triton import tl, triton


def _check_silu_and_mul(x: torch.Tensor) -> None:
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check(x.shape[1] % 2 == 0, f"x [num_tokens, 2 * intermediate] needs an even last dim, got {tuple(x.shape)}")


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, 2 * d] laid out | gate | up | → silu(gate) * up [num_tokens, d], x's dtype."""
    _check_silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, 2 * d] laid out | gate | up | → gelu(gate, tanh form) * up [num_tokens, d], x's dtype."""
    _check_silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


@triton.jit
def _silu_and_mul_kernel(x, out, stride_x, stride_o, d, BLOCK: tl.constexpr, GELU_TANH: tl.constexpr):
    # grid: (token row, block of d)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < d
    gate = tl.load(x + row * stride_x + offs, mask=mask, other=0.0)
    up = tl.load(x + row * stride_x + d + offs, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    # F.silu / F.gelu round their result to the input dtype before the product: so does this
    if GELU_TANH:  # 0.5 g (1 + tanh(z)) = g - g / (1 + exp(2z)), z = sqrt(2/pi) (g + 0.044715 g^3)
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        act = (g - g / (1.0 + tl.exp(2.0 * z))).to(gate.dtype)
    else:
        act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    tl.store(out + row * stride_o + offs, act * up, mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Triton twin of `silu_and_mul_ref` (same contract)."""
    return _act_and_mul(x, gelu_tanh=False)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Triton twin of `gelu_tanh_and_mul_ref` (same contract)."""
    return _act_and_mul(x, gelu_tanh=True)


def _act_and_mul(x: torch.Tensor, gelu_tanh: bool) -> torch.Tensor:
    _check_silu_and_mul(x)
    tr.require_triton("gelu_tanh_and_mul" if gelu_tanh else "silu_and_mul")
    num_tokens, d = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_tokens, d), dtype=x.dtype, device=x.device)
    if num_tokens == 0 or d == 0:
        return out
    block = min(1024, triton.next_power_of_2(d))
    _silu_and_mul_kernel[(num_tokens, triton.cdiv(d, block))](x, out, x.stride(0), out.stride(0), d, BLOCK=block,
                                                             GELU_TANH=gelu_tanh, num_warps=4)
    return out
