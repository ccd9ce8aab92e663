"""SlotList: a request's KV slot ids in token order, an int32 buffer that grows by doubling."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

SlotIds = np.ndarray  # [n] int32


class SlotList:
    """The slot ids of a request's computed KV, `[kv_len]` int32.

    Taking a cached prefix is one copy of the tree's array, a decode step appends one id in
    O(1) amortized, and slices are numpy views (valid until the list next changes; copy to
    keep). Only the engine thread touches it.
    """

    __slots__ = ("_buf", "_items", "_len")

    def __init__(self, slots: Sequence[int] | SlotIds = ()) -> None:
        arr = np.asarray(slots, dtype=np.int32)
        self._set_buf(np.empty(max(16, 2 * len(arr)), dtype=np.int32))
        self._buf[: len(arr)] = arr
        self._len = len(arr)

    def _set_buf(self, buf: np.ndarray) -> None:
        self._buf = buf
        self._items = memoryview(buf)  # one id set through it: half the cost of the array's

    def __len__(self) -> int:
        return self._len

    def array(self) -> SlotIds:
        """A view of all ids."""
        return self._buf[: self._len]

    def __getitem__(self, index: int | slice) -> int | SlotIds:
        if isinstance(index, slice):
            return self._buf[: self._len][index]
        if not -self._len <= index < self._len:
            raise IndexError(f"slot index {index} out of range for {self._len} slots")
        return int(self._buf[index % self._len])

    def __setitem__(self, index: slice, values: Sequence[int] | SlotIds) -> None:
        """Replace a run of ids in place (same length: the list never grows this way)."""
        view = self._buf[: self._len][index]
        if len(view) != len(values):
            raise ValueError(f"replacing {len(view)} slot ids with {len(values)}")
        view[:] = values

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def tolist(self) -> list[int]:
        return self._buf[: self._len].tolist()

    def append(self, slot: int) -> None:
        if self._len == len(self._buf):
            self._grow()
        self._items[self._len] = slot
        self._len += 1

    def _grow(self) -> None:
        self._set_buf(np.concatenate([self._buf, np.empty(len(self._buf), dtype=np.int32)]))

    def extend(self, values: Sequence[int] | SlotIds) -> None:
        arr = np.asarray(values, dtype=np.int32)
        end = self._len + len(arr)
        if end > len(self._buf):
            grown = np.empty(max(2 * len(self._buf), end), dtype=np.int32)
            grown[: self._len] = self._buf[: self._len]
            self._set_buf(grown)
        self._buf[self._len: end] = arr
        self._len = end

    def truncate(self, length: int) -> None:
        """Keep the first `length` ids."""
        self._len = min(self._len, max(0, length))

    def __repr__(self) -> str:
        return f"SlotList({self.tolist()!r})" if self._len <= 16 else f"SlotList(<{self._len} slots>)"


def append_one_each(reqs: list, slots: list[int]) -> tuple[list[int], list[int]]:
    """Append `slots[i]` to `reqs[i].slots` (a decode step's new slot per request: a SlotList
    each); returns each list's length before, and each request's slot-table `row`. The engine's
    per-step loop: no method call per request."""
    starts, rows = [], []
    for req, slot in zip(reqs, slots):
        sl = req.slots
        rows.append(req.row)
        n = sl._len
        items = sl._items
        if n == len(items):
            sl._grow()
            items = sl._items
        items[n] = slot
        sl._len = n + 1
        starts.append(n)
    return starts, rows
