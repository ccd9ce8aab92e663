"""Hypothesis state machine: RadixCache against a brute-force token-level model."""
from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixflow.radix import RadixCache
from radixflow.radix.tree import Node

Prefix = tuple[str | None, tuple[int, ...]]  # (namespace, tokens)

# A tiny alphabet and short keys make prefixes collide, split and diverge constantly.
keys = st.lists(st.integers(0, 2), max_size=8)
namespaces = st.sampled_from([None, "lora-a"])


class Model:
    """Every cached prefix (token granular): its slot id and last access tick.

    The set of prefixes is closed under taking prefixes, like the tree.
    """

    def __init__(self) -> None:
        self.slot: dict[Prefix, int] = {}
        self.tick: dict[Prefix, int] = {}
        self.locks: Counter[Prefix] = Counter()
        self.now = 0

    def cached_len(self, ns: str | None, key: list[int]) -> int:
        n = 0
        while n < len(key) and (ns, tuple(key[:n + 1])) in self.slot:
            n += 1
        return n

    def touch(self, ns: str | None, key: list[int], n: int) -> None:
        self.now += 1
        for i in range(1, n + 1):
            self.tick[(ns, tuple(key[:i]))] = self.now

    def unlocked_leaves(self) -> list[Prefix]:
        """Cached prefixes that no cached prefix extends and no lock covers."""
        parents = {(ns, tokens[:-1]) for ns, tokens in self.slot}
        return [p for p in self.slot if self.locks[p] == 0 and p not in parents]


class RadixMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache = RadixCache()
        self.model = Model()
        self.next_slot = 0
        self.freed: list[int] = []  # duplicates handed back by insert, and evicted slots
        self.handles: list[tuple[Node, str | None, tuple[int, ...]]] = []

    @rule(key=keys, ns=namespaces)
    def insert(self, key: list[int], ns: str | None) -> None:
        values = list(range(self.next_slot, self.next_slot + len(key)))
        self.next_slot += len(key)
        expected = self.model.cached_len(ns, key)
        n = self.cache.insert(key, values, ns)
        assert n == expected
        self.freed.extend(values[:n])
        for i in range(n, len(key)):
            self.model.slot[(ns, tuple(key[:i + 1]))] = values[i]
        self.model.touch(ns, key, len(key))

    @rule(key=keys, ns=namespaces, record=st.booleans())
    def match(self, key: list[int], ns: str | None, record: bool) -> None:
        hits, queries = self.cache.hit_tokens, self.cache.query_tokens
        match = self.cache.match_prefix(key, ns, record=record)
        n = self.model.cached_len(ns, key)
        assert match.length == n
        assert match.slots.tolist() == [self.model.slot[(ns, tuple(key[:i + 1]))] for i in range(n)]
        assert n == 0 or match.node.key[-1] == key[n - 1]
        delta = (len(key), n) if record else (0, 0)
        assert (self.cache.query_tokens - queries, self.cache.hit_tokens - hits) == delta
        self.model.touch(ns, key, n)

    @rule(key=keys, ns=namespaces)
    def lock(self, key: list[int], ns: str | None) -> None:
        match = self.cache.match_prefix(key, ns)
        self.model.touch(ns, key, match.length)
        self.cache.inc_lock_ref(match.node)
        locked = tuple(key[:match.length])
        self.handles.append((match.node, ns, locked))
        for i in range(1, len(locked) + 1):
            self.model.locks[(ns, locked[:i])] += 1

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.handles) - 1))
        node, ns, locked = self.handles.pop(index)
        self.cache.dec_lock_ref(node)
        for i in range(1, len(locked) + 1):
            self.model.locks[(ns, locked[:i])] -= 1

    @rule(num_tokens=st.integers(0, 12))
    def evict(self, num_tokens: int) -> None:
        calls: list[list[int]] = []
        candidates_before = self.model.unlocked_leaves()
        freed_count = self.cache.evict(num_tokens, calls.append)
        evicted = [slot for call in calls for slot in call]
        assert len(calls) <= 1 and freed_count == len(evicted)
        remaining = self.model_after_evict(evicted)
        assert freed_count >= num_tokens or not remaining, "stopped while leaves were evictable"
        assert freed_count == 0 or (num_tokens > 0 and candidates_before)
        self.freed.extend(evicted)

    def model_after_evict(self, evicted: list[int]) -> list[Prefix]:
        """Drop evicted prefixes from the model, checking that eviction was legal and
        least recently used first; return the unlocked leaves that remain."""
        by_slot = {slot: p for p, slot in self.model.slot.items()}
        gone = [by_slot[slot] for slot in evicted]
        assert all(self.model.locks[p] == 0 for p in gone), "a locked prefix was evicted"
        for p in gone:
            del self.model.slot[p]
        remaining = self.model.unlocked_leaves()
        # Whole subtrees went: no surviving prefix extends an evicted one.
        for ns, tokens in gone:
            assert not any(q[0] == ns and q[1][:len(tokens)] == tokens for q in self.model.slot)
        if gone and remaining:
            newest_gone = max(self.model.tick[p] for p in gone)
            assert newest_gone <= min(self.model.tick[p] for p in remaining), "not LRU order"
        for p in gone:
            del self.model.tick[p]
        return remaining

    @precondition(lambda self: not self.handles)
    @rule()
    def reset(self) -> None:
        calls: list[list[int]] = []
        self.cache.reset(calls.append)
        self.freed.extend(slot for call in calls for slot in call)
        self.model.slot.clear()
        self.model.tick.clear()

    @invariant()
    def tree_is_consistent(self) -> None:
        self.cache.check()
        model = self.model
        assert sorted(self.cache.all_slots()) == sorted(model.slot.values())
        protected = sum(1 for p in model.slot if model.locks[p] > 0)
        assert self.cache.protected_size() == protected
        assert self.cache.evictable_size() == len(model.slot) - protected
        # Every slot ever handed to insert is in exactly one place.
        assert sorted(self.cache.all_slots() + self.freed) == list(range(self.next_slot))


RadixMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
test_radix_cache_matches_model = RadixMachine.TestCase
