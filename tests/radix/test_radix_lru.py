"""LeafLRU: oldest tick first, stale heap entries skipped, bounded heap."""
from __future__ import annotations

from radixflow.radix.lru import LeafLRU


def test_pops_oldest_tick_and_skips_stale_entries() -> None:
    lru: LeafLRU[str] = LeafLRU()
    lru.add("a", 1)
    lru.add("b", 2)
    lru.add("c", 2)
    lru.add("a", 5)  # refreshed: its tick-1 entry is stale now
    lru.discard("b")
    lru.add("b", 2)  # re-added with its old tick: the old entry is live again
    lru.check()
    assert len(lru) == 3 and "a" in lru
    assert [lru.pop_oldest() for _ in range(4)] == ["b", "c", "a", None]
    assert len(lru) == 0


def test_compaction_keeps_members_and_order() -> None:
    lru: LeafLRU[int] = LeafLRU()
    for item in range(5):
        lru.add(item, item)
    for tick in range(10, 1_000):
        lru.add(0, tick)  # item 0 keeps getting refreshed
    assert len(lru._heap) <= 2 * 5 + 64 + 1
    lru.check()
    assert [lru.pop_oldest() for _ in range(5)] == [1, 2, 3, 4, 0]
