"""Scatter new tokens' K/V into the token-granular KV pool (optionally as fp8 e4m3)."""
from __future__ import annotations

import torch

from . import _triton as tr
from ._checks import FLOAT_DTYPES, check, check_index, check_kv_cache, check_same_device, check_scales, check_tensor
from ._triton import tl, triton
from .fp8 import f32_to_fp8_e4m3, quantize_fp8


def _check_store(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                 k: torch.Tensor, v: torch.Tensor, k_scale: float, v_scale: float) -> None:
    check_tensor("k", k, 3, FLOAT_DTYPES)
    check_tensor("v", v, 3, FLOAT_DTYPES)
    check(k.shape == v.shape, f"k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape")
    check_kv_cache(k_cache, v_cache, FLOAT_DTYPES + (torch.uint8,))
    check(k.shape[1:] == k_cache.shape[1:],
          f"k [num_tokens, num_kv_heads, head_dim] {tuple(k.shape)} does not match k_cache {tuple(k_cache.shape)}")
    check_index("slots", slots, k.shape[0])
    check_scales(k_scale, v_scale)
    check_same_device(k_cache=k_cache, v_cache=v_cache, slots=slots, k=k, v=v)


def store_kv_ref(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Write `k`, `v` [num_tokens, num_kv_heads, head_dim] at `slots` [num_tokens] of the caches.

    Mutates the caches [num_slots, num_kv_heads, head_dim] in place. A uint8 cache
    stores fp8 e4m3 bits of `x / scale`; any other cache a plain cast (scales unused).
    Duplicate slots leave one of the writers' values.
    """
    _check_store(k_cache, v_cache, slots, k, v, k_scale, v_scale)
    idx = slots.long()
    for cache, x, scale in ((k_cache, k, k_scale), (v_cache, v, v_scale)):
        cache[idx] = quantize_fp8(x, scale) if cache.dtype == torch.uint8 else x.to(cache.dtype)


@triton.jit
def _store_kv_kernel(
    k_cache, v_cache, slots, k, v, k_scale, v_scale,
    stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head,
    stride_k_tok, stride_k_head, stride_v_tok, stride_v_head,
    num_kv_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, IS_FP8: tl.constexpr,
):
    # one program per token: all its heads at once, [BLOCK_H, BLOCK_D]
    tok = tl.program_id(0)
    slot = tl.load(slots + tok).to(tl.int64)  # int64: slot * stride can pass 2^31
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h < num_kv_heads)[:, None] & (offs_d < head_dim)[None, :]
    kx = tl.load(k + tok * stride_k_tok + offs_h[:, None] * stride_k_head + offs_d[None, :], mask=mask)
    vx = tl.load(v + tok * stride_v_tok + offs_h[:, None] * stride_v_head + offs_d[None, :], mask=mask)
    if IS_FP8:
        # div_rn: IEEE division, so the bits match the reference's x / scale exactly
        kx = f32_to_fp8_e4m3(tl.math.div_rn(kx.to(tl.float32), k_scale))
        vx = f32_to_fp8_e4m3(tl.math.div_rn(vx.to(tl.float32), v_scale))
    kc = k_cache + slot * stride_kc_slot + offs_h[:, None] * stride_kc_head + offs_d[None, :]
    vc = v_cache + slot * stride_vc_slot + offs_h[:, None] * stride_vc_head + offs_d[None, :]
    tl.store(kc, kx.to(k_cache.dtype.element_ty), mask=mask)
    tl.store(vc, vx.to(v_cache.dtype.element_ty), mask=mask)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Triton twin of `store_kv_ref` (same contract); no host sync, CUDA-graph safe."""
    _check_store(k_cache, v_cache, slots, k, v, k_scale, v_scale)
    tr.require_triton("store_kv")
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        k_cache, v_cache, slots, k, v, float(k_scale), float(v_scale),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        num_kv_heads, head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        IS_FP8=k_cache.dtype == torch.uint8, num_warps=4,
    )
