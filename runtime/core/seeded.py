"""Counter-based uniforms for seeded requests: draw n of seed s is a pure function of (s, n).

A batch of seeded rows gets its uniforms in one vectorized hash (splitmix64 finalizer) instead of
one generator call per row, and a request's draws never depend on what else is in the batch.
"""
from __future__ import annotations

import torch

_GOLDEN = -7046029254386353131   # 0x9E3779B97F4A7C15 as int64
_MIX1 = -4658895280553007687     # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685     # 0x94D049BB133111EB


def _as_int64(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic: mask the sign extension off)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def counter_uniforms(seeds: list[int], counters: list[int], device: torch.device) -> torch.Tensor:
    """Uniforms in [0, 1) float32 [n]: u[i] = hash(seeds[i], counters[i]).

    NOTE: int64 products wrap around (two's complement) on CPU and CUDA alike, which the hash
    relies on; float32 gets the hash's top 24 bits, so u < 1 exactly.
    """
    s = torch.tensor([_as_int64(x) for x in seeds], dtype=torch.int64, device=device)
    c = torch.tensor([_as_int64(x) for x in counters], dtype=torch.int64, device=device)
    x = s * _GOLDEN + (c + 1) * _MIX2
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    x = x ^ _shr(x, 31)
    return _shr(x, 40).to(torch.float32) * (1.0 / (1 << 24))
