"""Argument checks shared by the kernel launchers and references: ValueError before any launch."""
from __future__ import annotations

import math

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
MAX_HEAD_DIM = 576  # latent attention's one head: DeepSeek's 512-dim latent and 64 rotated dims


def check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def check_tensor(name: str, t: object, ndim: int, dtypes: tuple[torch.dtype, ...]) -> None:
    """`t` is a tensor of `ndim` dims and one of `dtypes`, unit stride in its last dim."""
    check(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}")
    assert isinstance(t, torch.Tensor)
    check(t.dim() == ndim, f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    check(t.dtype in dtypes, f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    check(t.shape[-1] <= 1 or t.stride(-1) == 1, f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def check_index(name: str, t: object, length: int) -> None:
    """`t` is a contiguous 1-D int32/int64 tensor of `length` entries."""
    check_tensor(name, t, 1, INDEX_DTYPES)
    assert isinstance(t, torch.Tensor)
    check(t.shape[0] == length, f"{name} must have {length} entries, got {t.shape[0]}")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    check(len(set(devices.values())) <= 1, f"tensors must share one device, got {devices}")


def check_kv_cache(k_cache: object, v_cache: object, dtypes: tuple[torch.dtype, ...]) -> None:
    """Caches are [num_slots, num_kv_heads, head_dim] of one of `dtypes` (uint8: fp8 e4m3 bits)."""
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, cache, 3, dtypes)
    assert isinstance(k_cache, torch.Tensor) and isinstance(v_cache, torch.Tensor)
    check(k_cache.shape == v_cache.shape,
          f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have one shape")
    check(k_cache.dtype == v_cache.dtype,
          f"k_cache ({k_cache.dtype}) and v_cache ({v_cache.dtype}) must have one dtype")


def check_attention(q: object, k_cache: object, v_cache: object, req_to_token: object, sm_scale: float,
                    softcap: float | None = None) -> None:
    """q [num_rows, num_heads, head_dim] against caches [num_slots, num_kv_heads, head_dim]; a
    score soft-cap None or positive."""
    check_tensor("q", q, 3, FLOAT_DTYPES)
    assert isinstance(q, torch.Tensor)
    check_kv_cache(k_cache, v_cache, (q.dtype, torch.uint8))
    assert isinstance(k_cache, torch.Tensor)
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[1]
    check(k_cache.shape[2] == head_dim, f"k_cache head_dim {k_cache.shape[2]} must equal q head_dim {head_dim}")
    check(1 <= head_dim <= MAX_HEAD_DIM, f"head_dim must be in [1, {MAX_HEAD_DIM}], got {head_dim}")
    check(num_kv_heads >= 1 and num_heads % num_kv_heads == 0,
          f"q num_heads {num_heads} must be a multiple of the caches' num_kv_heads {num_kv_heads}")
    check_tensor("req_to_token", req_to_token, 2, INDEX_DTYPES)
    check(isinstance(sm_scale, (int, float)) and sm_scale > 0, f"sm_scale must be a positive float, got {sm_scale!r}")
    check(softcap is None or (isinstance(softcap, (int, float)) and not isinstance(softcap, bool)
                              and 0 < softcap < math.inf), f"softcap must be None or a positive float, got {softcap!r}")


def check_sinks(sinks: object, q: torch.Tensor) -> None:
    """Attention sinks: None, or one float logit per query head, on q's device."""
    if sinks is None:
        return
    check_tensor("sinks", sinks, 1, FLOAT_DTYPES)
    assert isinstance(sinks, torch.Tensor)
    check(sinks.shape[0] == q.shape[1], f"sinks must hold one logit per query head ({q.shape[1]}), "
          f"got {sinks.shape[0]}")
    check(sinks.device == q.device, f"sinks must be on q's device {q.device}, got {sinks.device}")


def check_scales(k_scale: float, v_scale: float) -> None:
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        ok = isinstance(scale, (int, float)) and 0 < scale < float("inf")
        check(ok, f"{name} must be a positive finite float, got {scale!r}")
