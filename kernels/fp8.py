"""fp8 e4m3 KV storage: torch helpers for the references, bit-exact Triton twins for the kernels.

The KV cache keeps fp8 as `torch.uint8` holding float8_e4m3fn bits. A stored value
is `x / scale` rounded to nearest even and saturated to +-448 (the e4m3fn max);
it reads back as `bits -> e4m3fn -> fp32 * scale`. The Triton helpers do the bit
conversion by hand: the interpreter's own fp32 -> fp8 cast rounds wrongly, and
hand conversion also runs on GPUs without native fp8 (sm80).
"""
from __future__ import annotations

import torch

from ._triton import tl, triton

FP8_E4M3_MAX = 448.0


def quantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """[...] float -> [...] uint8: e4m3fn bits of `x / scale`, saturating to +-448."""
    # The divisor as a tensor on x's device: CUDA turns division by a host scalar into
    # multiplication by its reciprocal, which rounds differently from `x / scale` (the kernels'
    # IEEE division) for some inputs. torch.full fills on the device: no host copy, so it also
    # runs inside CUDA graph capture.
    scaled = x.to(torch.float32) / torch.full((), scale, dtype=torch.float32, device=x.device)
    return scaled.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def dequantize_fp8(u8: torch.Tensor, scale: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[...] uint8 e4m3fn bits -> [...] `dtype` value `fp8 * scale` (computed in fp32)."""
    return (u8.view(torch.float8_e4m3fn).to(torch.float32) * scale).to(dtype)


@triton.jit
def fp8_e4m3_to_f32(u):
    """uint8 e4m3fn bits -> fp32, exact (the NaN codes 0x7f/0xff are never written)."""
    b = u.to(tl.int32)
    em = b & 0x7F
    # normal: exponent/mantissa move up into the fp32 fields, bias 7 -> 127
    normal = ((em << 20) + (120 << 23)).to(tl.float32, bitcast=True)
    subnormal = em.to(tl.float32) * 0.001953125  # em * 2^-9
    mag = tl.where(em < 8, subnormal, normal)
    return tl.where(b >= 128, -mag, mag)


@triton.jit
def f32_to_fp8_e4m3(x):
    """fp32 -> uint8 e4m3fn bits, round to nearest even, saturating to +-448."""
    sign = (x.to(tl.int32, bitcast=True) >> 24) & 0x80
    a = tl.minimum(tl.abs(x), 448.0)
    ua = a.to(tl.int32, bitcast=True)
    # normal: round the 20 dropped mantissa bits to nearest even (a carry bumps the
    # exponent, as it should), then rebias the exponent 127 -> 7
    normal = ((ua + 0x7FFFF + ((ua >> 20) & 1)) >> 20) - (120 << 3)
    # below 2^-6 the result is subnormal (a multiple of 2^-9): adding 2^14 makes the
    # fp32 adder do that rounding, and the low bits of the sum are the code
    subnormal = (a + 16384.0).to(tl.int32, bitcast=True) - 0x46800000
    mag = tl.where(a < 0.015625, subnormal, normal)
    return (mag | sign).to(tl.uint8)
