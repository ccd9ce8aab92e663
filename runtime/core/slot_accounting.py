"""The scheduler's KV slot accounting invariants, checked on demand (tests, `check_invariants`)."""
from __future__ import annotations

import numpy as np

from radixflow.radix import RadixCache
from radixflow.runtime.core.kv_pool import KVPool, ReqToTokenPool
from radixflow.runtime.core.request import Req


class SlotAccounting:
    """Scheduler's accounting checks (a mixin of Scheduler, which sets the state below and
    provides `holding()`)."""

    kv: KVPool
    req_pool: ReqToTokenPool
    cache: RadixCache
    waiting: list[Req]
    running: list[Req]

    # -- accounting ----------------------------------------------------------------------------

    def owned_by_running(self) -> int:
        return sum(len(r.slots) - r.tree_len for r in self.holding())

    def check_accounting(self) -> None:
        """free + evictable + locked-in-tree + owned-by-running == usable slots."""
        total = (self.kv.num_free + self.cache.evictable_size() + self.cache.protected_size()
                 + self.owned_by_running())
        if total != self.kv.capacity:
            raise AssertionError(
                f"KV accounting broken: free {self.kv.num_free} + evictable {self.cache.evictable_size()}"
                f" + locked {self.cache.protected_size()} + running {self.owned_by_running()}"
                f" = {total} != {self.kv.capacity}")

    def check_slots(self) -> None:
        """Stronger than check_accounting (O(pool)): every usable slot is in exactly one place,
        free, in the tree, or owned by one holding request; requests hold rows of their own."""
        places = [self.kv.free_slots(), self.cache.all_slots(), *(r.owned_slots() for r in self.holding())]
        flat = np.sort(np.concatenate([np.asarray(place, dtype=np.int64) for place in places]))
        # exactly once each: sorted, they are 1, 2, ..., capacity
        if not np.array_equal(flat, np.arange(1, self.kv.capacity + 1)):
            raise AssertionError(f"KV slots misplaced: {len(flat)} placed, {len(np.unique(flat))} distinct, "
                                 f"{self.kv.capacity} usable")
        rows = [r.row for r in self.holding()]
        if None in rows or len(rows) != len(set(rows)) or len(rows) + self.req_pool.num_free_rows != self.req_pool.num_rows:
            raise AssertionError(f"slot-table rows misplaced: holding {rows}, {self.req_pool.num_free_rows} free")
        if any(r.row is not None or len(r.slots) for r in self.waiting):
            raise AssertionError("a waiting request still holds a row or slots")
        pending = {r.rid: r.seq_len - r.kv_len for r in self.running if r.grammar is None}
        if any(n not in (0, 1) for n in pending.values()):  # 0: its token still on the device (overlap)
            raise AssertionError(f"running requests without a grammar with other than one token to extend: {pending}")
