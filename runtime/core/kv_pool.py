"""Token-granular KV memory: per-layer K/V pools with a free list, and the request→slot table."""
from __future__ import annotations

import math

import numpy as np
import torch

from radixflow.kernels.fp8 import FP8_E4M3_MAX
from radixflow.runtime.core.upload import upload

FP8_DTYPE_NAME = "fp8_e4m3"
SlotIds = np.ndarray  # [n] int32


def fp8_scale_for(x: torch.Tensor) -> float:
    """The per-tensor e4m3 scale that maps x's largest magnitude to 448; 1.0 for an all-zero
    (or non-finite) x, which no scale would help."""
    amax = float(x.detach().abs().amax()) if x.numel() else 0.0
    return amax / FP8_E4M3_MAX if math.isfinite(amax) and amax > 0 else 1.0


class KVPool:
    """Per-layer K and V tensors `[num_slots, num_kv_heads, head_dim]`, allocated once.

    Slot 0 is a padding dummy that is never handed out, so `num_slots - 1` slots are usable.
    With the fp8 cache the tensors are uint8 holding e4m3 bits, read with per-layer scales.
    The free list is an int32 stack on the host (`_free[:_num_free]`, top last): alloc and free
    are one array copy each, whatever their size. Runs are pushed reversed and taken reversed, so
    a fresh pool hands out ascending runs and a freed run comes back in its order: a long
    prefill's slots are then one run, which CPU attention reads as a view (kernels/torch_attention.py).
    The scheduler (CPU) owns it; kernels only see slot ids. `shared_kv` (latent attention, whose
    values are its keys: model.LatentAttention): each layer's V tensor is its K tensor, stored once.
    """

    def __init__(self, num_slots: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, fp8: bool = False, shared_kv: bool = False) -> None:
        if num_slots < 2:
            raise ValueError(f"KV pool needs at least 2 slots, got {num_slots}")
        self.num_slots = num_slots
        self.is_fp8 = fp8
        store = torch.uint8 if fp8 else dtype
        shape = (num_slots, num_kv_heads, head_dim)
        self.k_caches = [torch.zeros(shape, dtype=store, device=device) for _ in range(num_layers)]
        self.shared_kv = shared_kv
        self.v_caches = self.k_caches if shared_kv else [torch.zeros(shape, dtype=store, device=device)
                                                         for _ in range(num_layers)]
        # Per-layer dequantization scales: a stored e4m3 value x reads back as x * scale. fp8
        # pools start uncalibrated: set_scales (a checkpoint's) or calibrate (the first
        # prefill's K/V) fixes a layer's scales before any of its K/V is stored.
        self.k_scales = [1.0] * num_layers
        self.v_scales = [1.0] * num_layers
        self._uncalibrated = set(range(num_layers)) if fp8 else set()
        self._free = np.arange(num_slots - 1, 0, -1, dtype=np.int32)
        self._num_free = num_slots - 1

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
        if self.shared_kv:  # one tensor read both ways: one scale, the larger (it keeps both in range)
            self.k_scales = self.v_scales = [max(k, v) for k, v in zip(self.k_scales, self.v_scales)]
        self._uncalibrated.clear()

    def reset_scales(self) -> None:
        """Uncalibrated again (an fp8 pool): the next prefill of each layer fixes its scales.
        Only while no KV is stored (the weights it came from were replaced)."""
        if self.is_fp8:
            num_layers = len(self.k_caches)
            self.k_scales, self.v_scales = [1.0] * num_layers, [1.0] * num_layers
            self._uncalibrated = set(range(num_layers))

    def calibrate(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Fix `layer`'s scales from the K and V [num_tokens, num_kv_heads, head_dim] about to
        be stored first: amax / 448, so they use e4m3's whole range (one host sync per layer)."""
        self.k_scales[layer] = fp8_scale_for(k)
        self.v_scales[layer] = fp8_scale_for(v)
        self._uncalibrated.discard(layer)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                        fp8: bool, shared_kv: bool = False) -> int:
        elem = 1 if fp8 else torch.empty((), dtype=dtype).element_size()
        return (1 if shared_kv else 2) * num_layers * num_kv_heads * head_dim * elem

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def capacity(self) -> int:
        """Usable slots (the dummy excluded)."""
        return self.num_slots - 1

    def alloc(self, n: int) -> SlotIds | None:
        """Take `n` free slots (a fresh int32 array), or None (and take nothing) when fewer are free."""
        if n > self._num_free:
            return None
        self._num_free -= n
        return self._free[self._num_free: self._num_free + n][::-1].copy()

    def free(self, slots: SlotIds | list[int]) -> None:
        """Give `slots` back. Raises ValueError when that would exceed the capacity (a double free)."""
        n = len(slots)
        if self._num_free + n > len(self._free):
            raise ValueError(f"freeing {n} slots with {self._num_free} of {len(self._free)} free: a double free")
        self._free[self._num_free: self._num_free + n] = np.asarray(slots, dtype=np.int32)[::-1]
        self._num_free += n

    def free_slots(self) -> np.ndarray:
        """The free slot ids (a copy, int32, in no particular order)."""
        return self._free[: self._num_free].copy()


class ReqToTokenPool:
    """The slot table `[max_running, max_context_len]` int32: row r lists request r's KV slots.

    Kernels read it on the device; the scheduler writes each request's new slots into its row.
    """

    def __init__(self, max_running: int, max_context_len: int, device: torch.device) -> None:
        self.table = torch.zeros((max_running, max_context_len), dtype=torch.int32, device=device)
        # On the host the table is written through a numpy view of the same memory (cheaper
        # than a torch indexing op per write).
        self._host = self.table.numpy() if self.table.device.type == "cpu" else None
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

    def write_one_each(self, rows: list[int], cols: list[int], slots: SlotIds) -> None:
        """Write `slots[i]` at (`rows[i]`, `cols[i]`): a decode step's one new slot per request."""
        n = len(rows)
        if self._host is not None:  # arrays first: numpy indexes with lists of ints far slower
            self._host[np.fromiter(rows, np.intp, n), np.fromiter(cols, np.intp, n)] = slots
            return
        rows_t, cols_t, slots_t = upload([rows, cols, slots], self.table.device)
        self.table.index_put_((rows_t, cols_t), slots_t.to(torch.int32))

    def write(self, rows: list[int], starts: list[int], slots: list[SlotIds] | list[list[int]]) -> None:
        """Write `slots[i]` into row `rows[i]` from column `starts[i]`, as one indexed copy built
        with array ops (no Python per slot): a 100K-token cached prefix costs one copy."""
        lens = np.array([len(s) for s in slots], dtype=np.int64)
        total = int(lens.sum())
        if total == 0:
            return
        vals = np.concatenate([np.asarray(s, dtype=np.int32) for s in slots])
        if len(rows) == 1:  # one run: a slice copy
            if self._host is not None:
                self._host[rows[0], starts[0]: starts[0] + total] = vals
            else:
                self.table[rows[0], starts[0]: starts[0] + total] = upload([vals], self.table.device)[0]
            return
        # column of flat item k (in row i): starts[i] + (k - first item of row i)
        firsts = np.cumsum(lens) - lens
        cols = np.arange(total, dtype=np.int64) + np.repeat(np.asarray(starts, dtype=np.int64) - firsts, lens)
        flat_rows = np.repeat(np.asarray(rows, dtype=np.int64), lens)
        if self._host is not None:
            self._host[flat_rows, cols] = vals
            return
        rows_t, cols_t, vals_t = upload([flat_rows, cols, vals], self.table.device)
        self.table.index_put_((rows_t, cols_t), vals_t.to(torch.int32))
