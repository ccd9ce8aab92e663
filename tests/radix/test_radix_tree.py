"""Unit tests for RadixCache: split, insert results, locks, LRU eviction, namespaces."""
from __future__ import annotations

import numpy as np
import pytest

from radixflow.radix import NullCache, PrefixCache, RadixCache


def slots_for(key: list[int], base: int) -> list[int]:
    return [base + i for i in range(len(key))]


@pytest.fixture
def cache() -> RadixCache:
    return RadixCache()


def test_insert_returns_the_length_already_cached(cache: RadixCache) -> None:
    assert cache.insert([1, 2, 3, 4], [10, 11, 12, 13]) == 0
    assert cache.insert([1, 2, 3, 4], [20, 21, 22, 23]) == 4
    assert cache.insert([1, 2, 3, 4, 5], [30, 31, 32, 33, 34]) == 4
    assert cache.insert([1, 2, 9], [40, 41, 42]) == 2
    assert cache.insert([7], [50]) == 0
    assert cache.insert([], []) == 0
    cache.check()
    # The tree kept its first slots for every cached position, plus the new tails.
    assert sorted(cache.all_slots()) == [10, 11, 12, 13, 34, 42, 50]
    assert cache.total_size() == 7


def test_insert_rejects_mismatched_lengths(cache: RadixCache) -> None:
    with pytest.raises(ValueError, match="3 tokens but values has 2"):
        cache.insert([1, 2, 3], [1, 2])
    assert cache.total_size() == 0


def test_match_returns_slots_of_longest_prefix(cache: RadixCache) -> None:
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    cache.insert([1, 2, 5], [20, 21, 22])
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).slots.tolist() == [10, 11, 12, 13]
    assert cache.match_prefix([1, 2, 5]).slots.tolist() == [10, 11, 22]
    assert cache.match_prefix((1, 2, 7)).slots.tolist() == [10, 11]
    empty = cache.match_prefix([9, 1])
    assert (empty.slots.tolist(), empty.length) == ([], 0) and empty.node.is_root
    assert cache.match_prefix([]).length == 0
    cache.check()


def test_match_inside_a_node_splits_it_and_returns_exact_node(cache: RadixCache) -> None:
    cache.insert([1, 2, 3, 4, 5, 6], slots_for([0] * 6, 100))
    assert cache.num_nodes() == 1
    match = cache.match_prefix([1, 2, 3, 9])
    assert (match.slots.tolist(), match.length) == ([100, 101, 102], 3)
    assert match.node.key == (1, 2, 3) and match.node.value.tolist() == [100, 101, 102]
    assert cache.num_nodes() == 2
    (tail,) = match.node.children.values()
    assert tail.key == (4, 5, 6) and tail.parent is match.node
    # A key that ends inside a node splits it too.
    assert cache.match_prefix([1, 2]).node.key == (1, 2)
    assert cache.num_nodes() == 3
    cache.check()


def test_insert_splits_on_partial_match_and_keys_children_by_first_token(cache: RadixCache) -> None:
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    cache.insert([1, 2, 8, 9], [20, 21, 22, 23])
    head = cache.match_prefix([1, 2]).node
    assert head.key == (1, 2)
    assert sorted(head.children) == [3, 8]
    assert head.children[8].key == (8, 9) and head.children[8].value.tolist() == [22, 23]
    # Inserting a key that ends inside a node splits it as well.
    assert cache.insert([1, 2, 3], [30, 31, 32]) == 3
    assert cache.match_prefix([1, 2, 3]).node.key == (3,)
    cache.check()


def test_record_counts_query_and_hit_tokens(cache: RadixCache) -> None:
    cache.insert([1, 2, 3], [10, 11, 12])
    cache.match_prefix([1, 2, 3, 4, 5])
    assert (cache.query_tokens, cache.hit_tokens) == (0, 0)
    cache.match_prefix([1, 2, 3, 4, 5], record=True)
    cache.match_prefix([1, 9], record=True)
    assert (cache.query_tokens, cache.hit_tokens) == (7, 4)


def test_lock_protects_the_whole_path_and_moves_sizes(cache: RadixCache) -> None:
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    cache.insert([1, 2, 5, 6], [20, 21, 22, 23])
    node = cache.match_prefix([1, 2, 3, 4]).node
    assert cache.inc_lock_ref(node) == 4
    assert (cache.evictable_size(), cache.protected_size()) == (2, 4)
    assert cache.inc_lock_ref(node) == 0  # second lock: nothing new moves
    assert node.lock_ref == 2 and node.parent.lock_ref == 2
    assert cache.dec_lock_ref(node) == 0
    assert cache.dec_lock_ref(node) == 4
    assert (cache.evictable_size(), cache.protected_size()) == (6, 0)
    cache.check()
    with pytest.raises(RuntimeError, match="unlocked node"):
        cache.dec_lock_ref(node)


def test_path_counts_say_what_a_lock_or_an_unlock_would_move(cache: RadixCache) -> None:
    """num_unlocked_on_path: what inc_lock_ref would move; num_sole_locked_on_path: what one
    dec_lock_ref would free. Both change nothing."""
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    cache.insert([1, 2, 5, 6, 7], [20, 21, 22, 23, 24])
    a, b = cache.match_prefix([1, 2, 3, 4]).node, cache.match_prefix([1, 2, 5, 6, 7]).node
    assert cache.num_unlocked_on_path(a) == 4 and cache.num_sole_locked_on_path(a) == 0
    cache.inc_lock_ref(a)
    assert cache.num_unlocked_on_path(a) == 0 and cache.num_sole_locked_on_path(a) == 4
    assert cache.num_unlocked_on_path(b) == 3  # [1, 2] is locked through a
    cache.inc_lock_ref(b)
    assert cache.num_sole_locked_on_path(a) == 2 and cache.num_sole_locked_on_path(b) == 3  # [1, 2] shared
    cache.inc_lock_ref(a)
    assert cache.num_sole_locked_on_path(a) == 0
    assert (cache.evictable_size(), cache.protected_size()) == (0, 7)
    cache.dec_lock_ref(a)
    assert cache.num_sole_locked_on_path(a) == 2
    assert cache.dec_lock_ref(a) == 2
    assert cache.num_sole_locked_on_path(b) == 5  # b alone holds [1, 2] now
    root = cache.match_prefix([9]).node
    assert cache.num_unlocked_on_path(root) == cache.num_sole_locked_on_path(root) == 0
    cache.check()


def test_lock_handle_survives_a_later_split(cache: RadixCache) -> None:
    cache.insert([1, 2, 3, 4, 5], [10, 11, 12, 13, 14])
    handle = cache.match_prefix([1, 2, 3, 4, 5]).node
    cache.inc_lock_ref(handle)
    cache.match_prefix([1, 2])  # splits the locked node: the handle keeps the tail
    assert handle.key == (3, 4, 5) and handle.parent.lock_ref == 1
    cache.check()
    assert cache.protected_size() == 5
    cache.dec_lock_ref(handle)
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)
    cache.check()


def test_root_lock_ops_are_no_ops(cache: RadixCache) -> None:
    root = cache.match_prefix([1, 2]).node
    assert cache.inc_lock_ref(root) == 0 and cache.dec_lock_ref(root) == 0
    assert root.lock_ref == 0
    cache.check()


def test_evict_frees_least_recently_used_leaves_first(cache: RadixCache) -> None:
    cache.insert([1, 1], [10, 11])
    cache.insert([2, 2], [20, 21])
    cache.insert([3, 3], [30, 31])
    cache.match_prefix([1, 1])  # [1, 1] is now the most recently used
    freed: list[list[int]] = []
    assert cache.evict(1, lambda slots: freed.append(slots.tolist())) == 2
    assert freed == [[20, 21]]
    assert cache.evict(3, lambda slots: freed.append(slots.tolist())) == 4
    assert freed[1] == [30, 31, 10, 11]
    assert cache.evicted_tokens == 6 and cache.total_size() == 0
    cache.check()


def test_evict_exposes_parents_once_their_children_are_gone(cache: RadixCache) -> None:
    cache.insert([1, 2, 3], [10, 11, 12])
    cache.insert([1, 2, 4], [20, 21, 22])
    cache.insert([5], [50])
    freed: list[int] = []
    assert cache.evict(100, freed.extend) == 5
    assert sorted(freed) == [10, 11, 12, 22, 50]
    assert cache.num_nodes() == 0
    cache.check()


def test_evict_never_touches_locked_paths(cache: RadixCache) -> None:
    cache.insert([1, 2, 3], [10, 11, 12])
    cache.insert([1, 2, 4], [20, 21, 22])
    cache.insert([7, 8], [70, 71])
    locked = cache.match_prefix([1, 2, 3]).node
    cache.inc_lock_ref(locked)
    freed: list[int] = []
    assert cache.evict(100, freed.extend) == 3
    assert sorted(freed) == [22, 70, 71]
    assert cache.match_prefix([1, 2, 3]).slots.tolist() == [10, 11, 12]
    assert cache.evictable_size() == 0 and cache.protected_size() == 3
    cache.check()
    assert cache.evict(1, freed.extend) == 0
    cache.dec_lock_ref(locked)
    assert cache.evict(1, freed.extend) == 1  # the leaf [3] alone is enough
    cache.check()


def test_evict_calls_free_fn_once_and_not_when_nothing_is_freed(cache: RadixCache) -> None:
    calls: list[list[int]] = []
    assert cache.evict(10, calls.append) == 0
    cache.insert([1], [10])
    cache.insert([2], [20])
    assert cache.evict(0, calls.append) == 0
    assert calls == []
    assert cache.evict(2, calls.append) == 2
    assert len(calls) == 1 and sorted(calls[0]) == [10, 20]


def test_lock_on_an_evicted_node_is_refused(cache: RadixCache) -> None:
    cache.insert([1, 2], [10, 11])
    node = cache.match_prefix([1, 2]).node
    cache.evict(2, lambda slots: None)
    assert node.is_evicted
    with pytest.raises(RuntimeError, match="evicted"):
        cache.inc_lock_ref(node)


def test_namespaces_never_share_prefixes(cache: RadixCache) -> None:
    assert cache.insert([1, 2, 3], [10, 11, 12]) == 0
    assert cache.insert([1, 2, 3], [20, 21, 22], namespace="lora-a") == 0
    assert cache.match_prefix([1, 2, 3]).slots.tolist() == [10, 11, 12]
    assert cache.match_prefix([1, 2, 3], "lora-a").slots.tolist() == [20, 21, 22]
    assert cache.match_prefix([1, 2, 3], "lora-b").length == 0
    assert cache.total_size() == 6
    cache.check()
    assert "namespace='lora-a'" in cache.pretty()


def test_eviction_is_global_lru_across_namespaces(cache: RadixCache) -> None:
    cache.insert([1], [10], "a")
    cache.insert([1], [20])
    cache.insert([1], [30], "b")
    cache.match_prefix([1], "a")
    freed: list[list[int]] = []
    for _ in range(3):
        cache.evict(1, lambda slots: freed.append(slots.tolist()))
    assert freed == [[20], [30], [10]]


def test_reset_frees_everything_and_keeps_counters(cache: RadixCache) -> None:
    cache.insert([1, 2], [10, 11])
    cache.insert([3], [30], "a")
    cache.match_prefix([1, 2], record=True)
    cache.evict(1, lambda slots: None)
    freed: list[int] = []
    cache.reset(freed.extend)
    assert sorted(freed) == [10, 11]
    assert (cache.total_size(), cache.num_nodes(), cache.all_slots()) == (0, 0, [])
    assert (cache.hit_tokens, cache.query_tokens, cache.evicted_tokens) == (2, 2, 1)
    cache.check()
    assert cache.match_prefix([1, 2]).length == 0


def test_reset_refuses_while_locked(cache: RadixCache) -> None:
    cache.insert([1, 2], [10, 11])
    cache.inc_lock_ref(cache.match_prefix([1, 2]).node)
    with pytest.raises(RuntimeError, match="locked"):
        cache.reset()
    assert cache.total_size() == 2


def test_check_reports_corruption(cache: RadixCache) -> None:
    cache.insert([1, 2, 3], [10, 11, 12])
    cache.insert([1, 2, 4], [20, 21, 22])
    cache.check()
    leaf = cache.match_prefix([1, 2, 4]).node
    leaf.value = np.array([10], dtype=np.int32)  # slot 10 is already held by the [1, 2] node
    with pytest.raises(AssertionError, match="slot ids held twice"):
        cache.check()
    leaf.value = np.array([22], dtype=np.int32)
    leaf.lock_ref = 1  # locked without going through inc_lock_ref
    with pytest.raises(AssertionError):
        cache.check()


def test_pretty_truncates_long_keys(cache: RadixCache) -> None:
    cache.insert(list(range(20)), list(range(100, 120)))
    text = cache.pretty(max_tokens_per_node=4)
    assert "[0 1 2 3 …] len=20 lock=0" in text
    assert RadixCache().pretty() == "(empty)"


def test_refreshes_without_evictions_keep_the_lru_heap_bounded(cache: RadixCache) -> None:
    for i in range(10):
        cache.insert([i, i], [2 * i, 2 * i + 1])
    for _ in range(2_000):
        cache.match_prefix([3, 3])
    assert len(cache._leaves._heap) <= 2 * 10 + 64 + 1
    cache.check()
    freed: list[list[int]] = []
    cache.evict(1, lambda slots: freed.append(slots.tolist()))
    assert freed == [[0, 1]]


def test_deep_chains_need_no_recursion(cache: RadixCache) -> None:
    # An agent conversation: each turn extends the previous one by one token.
    depth = 1_000
    key: list[int] = []
    for turn in range(depth):
        key.append(turn % 7)
        assert cache.insert(key, list(range(len(key)))[:-1] + [turn]) == turn
    assert cache.num_nodes() == depth
    cache.check()
    assert len(cache.pretty().splitlines()) == depth + 1
    assert cache.evict(depth, lambda slots: None) == depth
    cache.check()


def test_both_caches_satisfy_the_protocol() -> None:
    assert isinstance(RadixCache(), PrefixCache)
    assert isinstance(NullCache(), PrefixCache)


def test_eviction_log_explains_evicted_runs_and_stays_bounded():
    from radixflow.radix.eviction_log import EvictionLog

    cache = RadixCache()
    cache.insert([1, 2, 3, 4, 5, 6], [11, 12, 13, 14, 15, 16])
    cache.insert([1, 2, 3, 9, 9], [11, 12, 13, 21, 22])
    freed: list[int] = []
    cache.evict(100, freed.extend)  # both leaves, then their parent
    assert sorted(freed) == [11, 12, 13, 14, 15, 16, 21, 22]
    empty = cache.match_prefix([1, 2, 3, 4, 5, 6, 7])
    runs, diverged = cache.explain_miss([1, 2, 3, 4, 5, 6, 7], None, empty)
    assert runs == [("evicted", 6), ("cold", 1)] and diverged is None
    runs, _ = cache.explain_miss([1, 2, 3, 9, 8], None, cache.match_prefix([1, 2, 3, 9, 8]))
    assert runs == [("evicted", 4), ("cold", 1)]
    assert cache.lifetime.count == 8  # token-weighted
    log = EvictionLog(max_tokens=5)
    log.record(None, 0, (1, 2, 3))
    log.record(None, 3, (4, 5, 6))
    assert log.num_tokens == 3 and log.evicted_len(None, (1, 2, 3, 4), 0) == 0
    assert log.evicted_len(None, (1, 2, 3, 4, 5, 6), 3) == 3


def test_explain_miss_divergent_and_namespace():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], [11, 12, 13, 14])
    cache.insert([7, 8, 9], [31, 32, 33], namespace="adapter")
    m = cache.match_prefix([1, 2, 5, 6])
    assert cache.explain_miss([1, 2, 5, 6], None, m) == ([("divergent", 2)], 2)
    m = cache.match_prefix([7, 8, 9, 10])
    assert cache.explain_miss([7, 8, 9, 10], None, m) == ([("namespace", 3), ("cold", 1)], None)
    m = cache.match_prefix([5, 5])
    assert cache.explain_miss([5, 5], None, m) == ([("cold", 2)], None)


def test_slot_ids_are_int32_arrays_a_match_owns_its_copy(cache: RadixCache) -> None:
    cache.insert([1, 2, 3], [10, 11, 12])
    cache.insert([1, 2, 3, 4, 5], [10, 11, 12, 13, 14])
    match = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert match.slots.dtype == np.int32 and match.slots.tolist() == [10, 11, 12, 13, 14]
    match.slots[0] = 99  # the caller's copy: the tree is not changed
    assert cache.match_prefix([1, 2]).slots.tolist() == [10, 11]
    values = np.array([20, 21], dtype=np.int32)
    cache.insert([7, 8], values)
    values[0] = 98  # neither is the tree tied to the caller's array
    assert cache.match_prefix([7, 8]).slots.tolist() == [20, 21]
    cache.check()


def test_insert_after_a_locked_node_extends_its_path(cache: RadixCache) -> None:
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    match = cache.match_prefix([1, 2, 3])
    cache.inc_lock_ref(match.node)
    result = cache.insert_after(match.node, [4, 5, 6], [30, 31, 32])
    # [4] was cached already (slot 13; the caller's 30 is a duplicate), [5, 6] are new.
    assert (result.cached_len, result.slots.tolist(), result.held_len) == (1, [13], 3)
    assert result.node.key == (5, 6) and result.node.value.tolist() == [31, 32]
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).node is result.node
    cache.inc_lock_ref(result.node)
    cache.dec_lock_ref(match.node)
    cache.check()  # ancestors were touched too: no child is newer than its parent
    again = cache.insert_after(result.node, [], [])
    assert (again.cached_len, again.node, again.held_len) == (0, result.node, 0)
    cache.dec_lock_ref(result.node)
    cache.evict(100, lambda slots: None)
    with pytest.raises(RuntimeError, match="evicted"):
        cache.insert_after(result.node, [7], [40])


def test_a_long_node_is_split_at_the_divergence(cache: RadixCache) -> None:
    key = list(range(50_000))
    cache.insert(key, key)
    for at in (0, 1, 777, 49_999):
        probe = key[:at] + [-1]
        assert cache.match_prefix(probe).length == at
    cache.check()


def test_null_cache_insert_after_keeps_nothing() -> None:
    cache = NullCache()
    root = cache.match_prefix([1, 2]).node
    result = cache.insert_after(root, [1, 2], [5, 6])
    assert (result.cached_len, result.held_len, result.node) == (0, 0, root)
