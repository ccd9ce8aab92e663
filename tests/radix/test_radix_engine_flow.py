"""The engine's usage pattern (admit, chunked prefill, finish, evict) keeps slot accounting exact."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from radixflow.radix import NullCache, PrefixCache, RadixCache
from radixflow.radix.tree import Node

NUM_SLOTS = 64


class Pool:
    """A free list of slot ids that refuses double frees."""

    def __init__(self, num_slots: int) -> None:
        self.free = set(range(num_slots))

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self.free):
            return None
        return [self.free.pop() for _ in range(n)]

    def release(self, slots: list[int]) -> None:
        assert not self.free.intersection(slots), "double free"
        assert len(set(slots)) == len(slots), "slot freed twice in one call"
        self.free.update(slots)


@dataclass
class Req:
    tokens: list[int]
    namespace: str | None
    slots: list[int] = field(default_factory=list)
    cached_len: int = 0  # slots[:cached_len] belong to the tree, locked via `node`
    node: Node | None = None


def alloc_or_evict(cache: PrefixCache, pool: Pool, n: int) -> list[int] | None:
    if n > len(pool.free):
        cache.evict(n - len(pool.free), pool.release)
    return pool.alloc(n)


def admit(cache: PrefixCache, pool: Pool, req: Req, prefix_len: int) -> bool:
    """Match, lock, and allocate slots up to `prefix_len` tokens (one prefill chunk)."""
    match = cache.match_prefix(req.tokens[:prefix_len], req.namespace, record=True)
    cache.inc_lock_ref(match.node)
    new = alloc_or_evict(cache, pool, prefix_len - match.length)
    if new is None:
        cache.dec_lock_ref(match.node)
        return False
    req.slots, req.cached_len, req.node = match.slots.tolist() + new, match.length, match.node
    return True


def cache_progress(cache: PrefixCache, pool: Pool, req: Req) -> None:
    """Insert what the request computed so far and give up its locks and duplicates."""
    n = cache.insert(req.tokens[:len(req.slots)], req.slots, req.namespace)
    pool.release(req.slots[req.cached_len:n])
    cache.dec_lock_ref(req.node)
    req.slots, req.cached_len, req.node = [], 0, None


def owned_by_running(running: list[Req]) -> int:
    return sum(len(req.slots) - req.cached_len for req in running)


def assert_accounting(cache: PrefixCache, pool: Pool, running: list[Req]) -> None:
    cache.check()
    total = len(pool.free) + cache.evictable_size() + cache.protected_size() + owned_by_running(running)
    assert total == NUM_SLOTS
    held = list(pool.free) + cache.all_slots() + [s for r in running for s in r.slots[r.cached_len:]]
    assert sorted(held) == list(range(NUM_SLOTS))


@pytest.mark.parametrize("make_cache", [RadixCache, NullCache])
def test_random_workload_conserves_slots(make_cache: type[PrefixCache]) -> None:
    rng = random.Random(7)
    cache, pool = make_cache(), Pool(NUM_SLOTS)
    prompts = [[rng.randrange(3) for _ in range(rng.randrange(1, 20))] for _ in range(12)]
    running: list[Req] = []
    chunk = 6
    for _ in range(600):
        if running and rng.random() < 0.5:
            req = running.pop(rng.randrange(len(running)))
            done_len = len(req.slots)
            cache_progress(cache, pool, req)
            if done_len < len(req.tokens):  # chunked prefill: continue with the next chunk
                if admit(cache, pool, req, min(done_len + chunk, len(req.tokens))):
                    running.append(req)
        else:
            base = rng.choice(prompts)
            req = Req(base + [rng.randrange(3) for _ in range(rng.randrange(4))], rng.choice([None, "a"]))
            if admit(cache, pool, req, min(chunk, len(req.tokens))):
                running.append(req)
        assert_accounting(cache, pool, running)
    for req in running:
        cache_progress(cache, pool, req)
    running.clear()
    assert_accounting(cache, pool, running)
    if isinstance(cache, RadixCache):
        assert cache.hit_tokens > 0 and cache.evicted_tokens > 0
    cache.reset(pool.release)
    assert len(pool.free) == NUM_SLOTS
