"""The set of evictable leaves, ordered least recently used first (a lazy min-heap)."""
from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)

# Rebuild the heap once stale entries outnumber live ones by this factor (plus a floor),
# so a long run of refreshes without evictions cannot grow it without bound.
_STALE_FACTOR = 2
_STALE_FLOOR = 64


class LeafLRU(Generic[T]):
    """A set of items, each with an integer access tick, popped oldest tick first.

    Membership lives in a dict `item -> tick`; the heap holds `(tick, seq, item)` entries and
    may contain stale ones (item removed, or re-added/touched with another tick). An entry is
    live iff its item is a member with exactly that tick. `seq` is unique per push, so items
    are never compared and ties pop in a deterministic order (push order, except that an
    item re-added with its old tick may keep its old place).

    Cost: add O(log n), discard O(1), pop_oldest amortised O(log n).
    """

    def __init__(self) -> None:
        self._ticks: dict[T, int] = {}
        self._heap: list[tuple[int, int, T]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._ticks)

    def __contains__(self, item: object) -> bool:
        return item in self._ticks

    def __iter__(self) -> Iterator[T]:
        return iter(self._ticks)

    def add(self, item: T, tick: int) -> None:
        """Insert `item` with `tick`, or move it to `tick` if already present."""
        if self._ticks.get(item) == tick:
            return
        self._ticks[item] = tick
        self._push(item, tick)

    def discard(self, item: T) -> None:
        """Remove `item` if present; its heap entries become stale."""
        self._ticks.pop(item, None)

    def pop_oldest(self) -> T | None:
        """Remove and return the item with the smallest tick, or None when empty."""
        heap, ticks = self._heap, self._ticks
        while heap:
            tick, _, item = heapq.heappop(heap)
            if ticks.get(item) == tick:
                del ticks[item]
                return item
        return None

    def ticks(self) -> dict[T, int]:
        """A copy of the membership: item -> tick."""
        return dict(self._ticks)

    def clear(self) -> None:
        self._ticks.clear()
        self._heap.clear()

    def check(self) -> None:
        """Assert that every member has a live heap entry."""
        live = {item for tick, _, item in self._heap if self._ticks.get(item) == tick}
        missing = [item for item in self._ticks if item not in live]
        assert not missing, f"LeafLRU: members without a live heap entry: {missing!r}"

    def _push(self, item: T, tick: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (tick, self._seq, item))
        if len(self._heap) > _STALE_FACTOR * len(self._ticks) + _STALE_FLOOR:
            self._compact()

    def _compact(self) -> None:
        entries = []
        for item, tick in self._ticks.items():
            self._seq += 1
            entries.append((tick, self._seq, item))
        # NOTE: a rebuild renumbers seq in dict order, so ties may pop in another (still
        # deterministic) order than before it.
        heapq.heapify(entries)
        self._heap = entries
