"""NullCache: the disabled cache never hits, never keeps a slot, still counts queries."""
from __future__ import annotations

import pytest

from radixflow.radix import NullCache


def test_match_is_empty_and_only_counts_queries_when_recorded() -> None:
    cache = NullCache()
    match = cache.match_prefix([1, 2, 3])
    assert (match.slots.tolist(), match.length) == ([], 0)
    assert cache.query_tokens == 0
    cache.match_prefix([1, 2, 3], "lora", record=True)
    assert (cache.query_tokens, cache.hit_tokens) == (3, 0)


def test_insert_hands_every_slot_back_as_a_duplicate() -> None:
    cache = NullCache()
    assert cache.insert([1, 2, 3], [10, 11, 12]) == 3
    assert cache.insert([], []) == 0
    assert cache.all_slots() == [] and cache.total_size() == 0
    with pytest.raises(ValueError):
        cache.insert([1], [])


def test_locks_evict_reset_are_no_ops() -> None:
    cache = NullCache()
    node = cache.match_prefix([1]).node
    assert cache.inc_lock_ref(node) == 0 and cache.dec_lock_ref(node) == 0
    assert cache.dec_lock_ref(node) == 0  # no underflow: nothing is counted
    assert cache.num_unlocked_on_path(node) == cache.num_sole_locked_on_path(node) == 0
    freed: list[list[int]] = []
    assert cache.evict(100, freed.append) == 0 and freed == []
    cache.reset(freed.append)
    assert freed == []
    assert (cache.evictable_size(), cache.protected_size(), cache.num_nodes()) == (0, 0, 0)
    assert cache.evicted_tokens == 0
    cache.check()
    assert "disabled" in cache.pretty()
