"""Rotary position embedding applied in place to q and k, from precomputed cos/sin tables.

Tables use the rotate-half layout (as Llama checkpoints do): for a head vector x of head_dim D,

    x = | x1: dims 0 .. D/2 | x2: dims D/2 .. D |   →   | x1*cos - x2*sin | x2*cos + x1*sin |

with cos/sin of position * inv_freq[i], i < D/2; both halves of a table row are equal.
"""
from __future__ import annotations

import math

import torch

from . import _triton as tr
from ._checks import FLOAT_DTYPES, check, check_index, check_same_device, check_tensor
from ._triton import tl, triton


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None, long: bool = False) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] in fp32, with `linear`, `llama3`, `yarn`, `longrope` or
    `ntk_alpha` (HunYuan) scaling applied (a checkpoint's `rope_scaling` dict; None or another type: unscaled). LongRoPE
    divides each frequency by its `short_factor`, or with `long` by its `long_factor`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    scaling = scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "longrope":
        return inv_freq / torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
    if kind == "ntk_alpha":  # HunYuan: a fixed stretch of the base
        return rope_inv_freq(head_dim, theta * scaling["alpha"] ** (head_dim / (head_dim - 2)))
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "yarn":
        return _yarn_inv_freq(inv_freq, head_dim, theta, scaling)
    if kind != "llama3":
        return inv_freq
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling.get("original_max_position_embeddings", 8192)
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are slowed by `factor`, short ones kept, the band between interpolated
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    if high == low:  # Llama 4's: no band between (transformers' band would be the one wavelength old_len / low)
        return scaled
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(inv_freq: torch.Tensor, head_dim: int, theta: float, scaling: dict) -> torch.Tensor:
    """YaRN: the dimensions that turn fewer than `beta_slow` times over the original context are
    interpolated (divided by `factor`), those that turn more than `beta_fast` times kept, a linear
    ramp between (the bounds floored and ceiled unless `truncate` is false), as transformers computes it."""
    factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def dim_of(rotations: float) -> float:  # the dimension that turns `rotations` times over old_len
        return head_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (kept), 0: interpolate
    return inv_freq / factor * (1 - keep) + inv_freq * keep


def rope_attention_factor(scaling: dict | None) -> float:
    """What YaRN and LongRoPE multiply the cos and sin tables by (so q.k by its square):
    `attention_factor`, else YaRN's 0.1 ln(factor) + 1 (with `mscale` and `mscale_all_dim`: the
    ratio of their two such terms) or LongRoPE's below; 1 for the other scalings."""
    scaling = scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in ("yarn", "longrope"):
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = scaling["factor"]
    if kind == "longrope":  # sqrt(1 + ln(factor) / ln(original context)), both tables alike
        old_len = scaling["original_max_position_embeddings"]
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old_len))

    def mscale(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(scaling["mscale"]) / mscale(scaling["mscale_all_dim"])
    return mscale()


def rope_cos_sin(inv_freq: torch.Tensor, max_len: int, device: torch.device,
                 attention_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [max_len, head_dim] fp32 for positions [0, max_len) (halves repeated),
    times `attention_factor` (rope_attention_factor)."""
    freqs = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv_freq.to(device))
    emb = torch.cat([freqs, freqs], dim=-1)
    if attention_factor == 1.0:
        return emb.cos(), emb.sin()
    return emb.cos() * attention_factor, emb.sin() * attention_factor


def _check_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> None:
    check_tensor("q", q, 3, FLOAT_DTYPES)
    check_tensor("k", k, 3, FLOAT_DTYPES)
    check(q.shape[0] == k.shape[0] and q.shape[2] == k.shape[2] and q.dtype == k.dtype,
          f"q {tuple(q.shape)} {q.dtype} and k {tuple(k.shape)} {k.dtype} need one token count, head_dim, dtype")
    check(q.shape[2] % 2 == 0, f"head_dim must be even, got {q.shape[2]}")
    check_index("positions", positions, q.shape[0])
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t, 2, (torch.float32,))
        check(t.shape[1] == q.shape[2], f"{name} [max_len, head_dim] {tuple(t.shape)} does not fit q {tuple(q.shape)}")
    check_same_device(q=q, k=k, positions=positions, cos=cos, sin=sin)


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos[:, None, :] + rotated.float() * sin[:, None, :]).to(x.dtype)


def rope_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> None:
    """Rotate q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim] in place
    (views into a fused qkv projection are fine) at `positions` [num_tokens]; fp32 math."""
    _check_rope(q, k, positions, cos, sin)
    c, s = cos.index_select(0, positions.long()), sin.index_select(0, positions.long())  # [num_tokens, head_dim]
    q.copy_(_rotate_ref(q, c, s))
    k.copy_(_rotate_ref(k, c, s))


@triton.jit
def _rope_kernel(q, k, positions, cos, sin, stride_q_tok, stride_q_head, stride_k_tok, stride_k_head,
                 stride_cos, stride_sin, num_q_heads, half, BLOCK: tl.constexpr):
    # grid: (token, q heads then k heads); one head vector per program
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if head < num_q_heads:
        base = q + tok * stride_q_tok + head * stride_q_head
    else:
        base = k + tok * stride_k_tok + (head - num_q_heads) * stride_k_head
    pos = tl.load(positions + tok).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < half
    c = tl.load(cos + pos * stride_cos + offs, mask=mask, other=0.0)
    s = tl.load(sin + pos * stride_sin + offs, mask=mask, other=0.0)
    x1 = tl.load(base + offs, mask=mask, other=0.0)
    x2 = tl.load(base + half + offs, mask=mask, other=0.0)
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(base + offs, (f1 * c - f2 * s).to(x1.dtype), mask=mask)
    tl.store(base + half + offs, (f2 * c + f1 * s).to(x1.dtype), mask=mask)


def rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Triton twin of `rope_ref` (same contract): q and k in one launch, in place."""
    _check_rope(q, k, positions, cos, sin)
    tr.require_triton("rope")
    num_tokens, num_heads, head_dim = q.shape
    if num_tokens == 0:
        return
    half = head_dim // 2
    _rope_kernel[(num_tokens, num_heads + k.shape[1])](
        q, k, positions, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        num_heads, half, BLOCK=triton.next_power_of_2(half), num_warps=1)
