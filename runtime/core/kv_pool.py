"""Token-granular KV memory: per-layer K/V pools with a free list, and the request→slot table."""
from __future__ import annotations

import math

import torch

from radixflow.kernels.fp8 import FP8_E4M3_MAX

FP8_DTYPE_NAME = "fp8_e4m3"


def fp8_scale_for(x: torch.Tensor) -> float:
    """The per-tensor e4m3 scale that maps x's largest magnitude to 448; 1.0 for an all-zero
    (or non-finite) x, which no scale would help."""
    amax = float(x.detach().abs().amax()) if x.numel() else 0.0
    return amax / FP8_E4M3_MAX if math.isfinite(amax) and amax > 0 else 1.0


class KVPool:
    """Per-layer K and V tensors `[num_slots, num_kv_heads, head_dim]`, allocated once.

    Slot 0 is a padding dummy that is never handed out, so `num_slots - 1` slots are usable.
    With the fp8 cache the tensors are uint8 holding e4m3 bits, read with per-layer scales.
    The free list is plain Python ints: the scheduler (CPU) owns it; kernels only see slot ids.
    """

    def __init__(self, num_slots: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, fp8: bool = False) -> None:
        if num_slots < 2:
            raise ValueError(f"KV pool needs at least 2 slots, got {num_slots}")
        self.num_slots = num_slots
        self.is_fp8 = fp8
        store = torch.uint8 if fp8 else dtype
        shape = (num_slots, num_kv_heads, head_dim)
        self.k_caches = [torch.zeros(shape, dtype=store, device=device) for _ in range(num_layers)]
        self.v_caches = [torch.zeros(shape, dtype=store, device=device) for _ in range(num_layers)]
        # Per-layer dequantization scales: a stored e4m3 value x reads back as x * scale. fp8
        # pools start uncalibrated: set_scales (a checkpoint's) or calibrate (the first
        # prefill's K/V) fixes a layer's scales before any of its K/V is stored.
        self.k_scales = [1.0] * num_layers
        self.v_scales = [1.0] * num_layers
        self._uncalibrated = set(range(num_layers)) if fp8 else set()
        self._free: list[int] = list(range(num_slots - 1, 0, -1))

    @property
    def scales_final(self) -> bool:
        """Every layer's scales are fixed (always, for a non-fp8 pool)."""
        return not self._uncalibrated

    def needs_calibration(self, layer: int) -> bool:
        return layer in self._uncalibrated

    def set_scales(self, k_scales: list[float], v_scales: list[float]) -> None:
        """Fix every layer's scales (e.g. a checkpoint's `k_scale` / `v_scale`)."""
        num_layers = len(self.k_caches)
        if len(k_scales) != num_layers or len(v_scales) != num_layers:
            raise ValueError(f"need {num_layers} k and v scales, got {len(k_scales)} and {len(v_scales)}")
        for scale in (*k_scales, *v_scales):
            if not (math.isfinite(scale) and scale > 0):
                raise ValueError(f"KV scales must be positive and finite, got {scale!r}")
        self.k_scales, self.v_scales = [float(s) for s in k_scales], [float(s) for s in v_scales]
        self._uncalibrated.clear()

    def calibrate(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Fix `layer`'s scales from the K and V [num_tokens, num_kv_heads, head_dim] about to
        be stored first: amax / 448, so they use e4m3's whole range (one host sync per layer)."""
        self.k_scales[layer] = fp8_scale_for(k)
        self.v_scales[layer] = fp8_scale_for(v)
        self._uncalibrated.discard(layer)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                        fp8: bool) -> int:
        elem = 1 if fp8 else torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * elem

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def capacity(self) -> int:
        """Usable slots (the dummy excluded)."""
        return self.num_slots - 1

    def alloc(self, n: int) -> list[int] | None:
        """Take `n` free slots, or None (and take nothing) when fewer are free."""
        if n > len(self._free):
            return None
        if n == 0:
            return []
        out = self._free[-n:]
        del self._free[-n:]
        return out

    def free(self, slots: list[int]) -> None:
        self._free.extend(slots)

    def free_slots(self) -> list[int]:
        return list(self._free)


class ReqToTokenPool:
    """The slot table `[max_running, max_context_len]` int32: row r lists request r's KV slots.

    Kernels read it on the device; the scheduler writes each request's new slots into its row.
    """

    def __init__(self, max_running: int, max_context_len: int, device: torch.device) -> None:
        self.table = torch.zeros((max_running, max_context_len), dtype=torch.int32, device=device)
        self._free_rows = list(range(max_running - 1, -1, -1))

    @property
    def num_rows(self) -> int:
        return self.table.shape[0]

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, rows: list[int], starts: list[int], slots: list[list[int]]) -> None:
        """Write `slots[i]` into row `rows[i]` from column `starts[i]`, as one indexed copy."""
        flat_rows, flat_cols, flat_vals = [], [], []
        for row, start, s in zip(rows, starts, slots):
            flat_rows.extend([row] * len(s))
            flat_cols.extend(range(start, start + len(s)))
            flat_vals.extend(s)
        if not flat_vals:
            return
        device = self.table.device
        idx = (torch.tensor(flat_rows, device=device), torch.tensor(flat_cols, device=device))
        self.table.index_put_(idx, torch.tensor(flat_vals, dtype=torch.int32, device=device))
