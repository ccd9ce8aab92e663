"""Prefill admission: which waiting requests join a prefill step, and the KV each is given."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from radixflow.radix import MatchResult, RadixCache
from radixflow.runtime.core.kv_pool import KVPool, ReqToTokenPool, SlotIds
from radixflow.runtime.core.priority import PriorityRules
from radixflow.runtime.core.request import Req, Status
from radixflow.runtime.core.schedule_policy import match_key, order_waiting
from radixflow.runtime.core.scheduled_batch import ScheduledBatch
from radixflow.runtime.core.slot_list import SlotList
from radixflow.runtime.lora.capacity import AdapterAdmission

if TYPE_CHECKING:
    from radixflow.runtime.core.scheduler import SchedulerLimits

# The future decode reserved per request counts at most this many tokens (as SGLang's
# CLIP_MAX_NEW_TOKENS): a huge max_new_tokens must not starve admission. Requests that really
# generate that long are retracted if memory runs out.
CLIP_MAX_NEW_TOKENS = 4096
# A waiting request whose new prefix is shared with one admitted this round waits one round
# when the sharing exceeds this many tokens, so it hits the cache instead of recomputing.
IN_BATCH_DEDUP_MIN_TOKENS = 32


NO_FIT = {"type": "abort", "message": "the KV cache is too small for this request to continue"}


@dataclass(frozen=True)
class _Blocked:
    """Why `_admit` did not admit: `need` is the availability (free + evictable - reserved, before
    locking its prefix) at which the request would fit; 0 when it was not memory (the step's
    token budget), which the next step renews anyway. `never`: it did not fit while nothing else
    held KV, so it never will."""

    need: int
    never: bool = False


class Admission:
    """Scheduler's prefill admission (a mixin of Scheduler, which sets the state below and
    provides `holding()`, `chunked` and `num_running`)."""

    limits: SchedulerLimits
    priority: PriorityRules
    adapters: AdapterAdmission
    kv: KVPool
    req_pool: ReqToTokenPool
    cache: RadixCache
    waiting: list[Req]
    prefilling: list[Req]
    finish: Callable[[Req, dict], None]
    new_token_ratio: float
    prefill_budget_scale: float
    admission_paused: bool
    weight_version: str
    _blocked_until: int | None

    # -- prefill admission -----------------------------------------------------------------

    def _prefill_budget(self) -> tuple[int, int | None]:
        """(token budget of one prefill step, chunk size or None), shrunk after an OOM."""
        chunk = self.limits.chunked_prefill_size if self.limits.chunked_prefill_size > 0 else None
        if self.prefill_budget_scale >= 1.0:
            return self.limits.max_prefill_tokens, chunk
        budget = max(1, int(self.limits.max_prefill_tokens * self.prefill_budget_scale))
        return budget, min(chunk or budget, budget)

    def _schedule_prefill(self, reserved_tokens: int = 0) -> ScheduledBatch | None:
        """A prefill batch of what can be admitted (None: nothing); `reserved_tokens` of the
        step's token budget are taken already (a mixed step's decode rows), at most half of it:
        a large running batch must not cut prompts into chunks of a few tokens."""
        token_budget, chunk = self._prefill_budget()
        token_budget = max(token_budget - reserved_tokens, (token_budget + 1) // 2)
        batch = ScheduledBatch([], [], [], [], [], is_decode=False)
        if self.chunked is not None:
            req = self.chunked
            n = min(req.seq_len - req.kv_len, token_budget, chunk or token_budget)
            if not self._grow(req, n, batch, {"chunk": n}):
                return None
            token_budget -= n
            if req.kv_len < req.seq_len:
                return batch  # still chunking: nothing else joins
        if not self.waiting or self._admits_nothing():
            # Skip ordering the queue (a prefix match per waiting request), which would
            # otherwise run on every decode step of a full or memory-blocked batch.
            return batch if batch.reqs else None
        self._blocked_until = None
        self._admit_waiting(batch, token_budget, chunk, self._reserved_decode())
        return batch if batch.reqs else None

    def _admits_nothing(self) -> bool:
        """Whether admission would take no waiting request now, known without ordering the
        queue: admission is paused, the batch is full, or the queue is memory-blocked and
        availability has not reached what its head needs."""
        if self.admission_paused or self.num_running >= self.limits.max_num_seqs:
            return True
        return self._blocked_until is not None and self._available(self._reserved_decode()) < self._blocked_until

    def _admit_waiting(self, batch: ScheduledBatch, token_budget: int, chunk: int | None, reserved: int) -> None:
        """Admit waiting requests into `batch` in policy order, each with the one prefix match
        the ordering took, until one does not fit (remembered when memory is why)."""
        dedup = RadixCache()
        admitted = []
        for req, key, match in order_waiting(self.waiting, self.limits.policy, self.cache,
                                             self.limits.lpm_fcfs_threshold, self.priority):
            if self.num_running >= self.limits.max_num_seqs or token_budget <= 0:
                break
            if not self.adapters.can_admit(req):
                continue  # its adapter would exceed the batch's adapter cap: it waits
            if key is None:
                key = match_key(req)
            if match is None or match.node.is_evicted:  # fcfs, or evicted for an earlier admission
                match = self.cache.match_prefix(key, req.namespace)
            if self.limits.policy != "fcfs" and admitted:
                shared = dedup.match_prefix(key, req.namespace).length
                if shared - match.length > IN_BATCH_DEDUP_MIN_TOKENS:
                    continue
            n = self._admit(req, key, match, token_budget, chunk, reserved, batch)
            if isinstance(n, _Blocked):
                if n.never:
                    self.finish(req, NO_FIT)
                elif n.need > 0 and not admitted:
                    self._blocked_until = n.need
                break
            admitted.append(req)
            dedup.insert(key, np.arange(len(key), dtype=np.int32), req.namespace)
            reserved += self._future_decode(req)
            token_budget -= n
            if req.kv_len < req.seq_len:
                break  # chunked: it is the last of this batch
        for req in admitted:
            self.waiting.remove(req)

    def _admit(self, req: Req, key: tuple[int, ...], match: MatchResult, token_budget: int, chunk: int | None,
               reserved: int, batch: ScheduledBatch) -> int | _Blocked:
        """Give `req` a table row, its cached prefix `match` (locked) and slots for its first
        part, and add it to `batch`; returns how many tokens it extends, or why it does not fit.
        Costs O(new tokens) in Python whatever the prefix: the prefix's slot ids are one array.

        The fit is judged after locking the prefix, whose slots then stop being evictable:
        the whole uncached part plus the request's future decode must fit in what stays free
        or evictable once running requests' reserved decode is set aside.
        """
        if self.req_pool.num_free_rows == 0:
            return _Blocked(sys.maxsize)  # until a row is freed (a release resets the block)
        extend = req.seq_len - match.length
        n = extend
        if n > token_budget:
            if chunk is None and batch.reqs:
                return _Blocked(0)
            n = min(token_budget, chunk) if chunk is not None else n
        elif chunk is not None and n > chunk:
            n = chunk
        moved = self.cache.inc_lock_ref(match.node)
        need = extend + self._future_decode(req)
        if (self.holding() or batch.reqs) and need > self._available(reserved):
            self.cache.dec_lock_ref(match.node)
            return _Blocked(need + moved)
        req.row, req.last_node = self.req_pool.alloc_row(), match.node
        req.slots, req.tree_len = SlotList(match.slots), match.length
        self.req_pool.write([req.row], [0], [match.slots])
        runs, diverged_at = self.cache.explain_miss(key, req.namespace, match)
        if not self._grow(req, n, batch, _first_chunk(runs, req.seq_len - len(key), n)):
            self.cache.dec_lock_ref(match.node)
            self.req_pool.free_row(req.row)
            req.row, req.last_node, req.slots, req.tree_len = None, None, SlotList(), 0
            # Alone, every slot but its prefix's was free or evictable: it holds more tokens than
            # the pool (a jump-forward grew it past the pool before it was retracted).
            return _Blocked(self._available(reserved) + 1, never=not self.holding() and not batch.reqs)
        if not req.prefix_counted:
            self.cache.record_query(len(key), match.length, match.node)
            req.prefix_counted, req.divergent_at = True, diverged_at
        if req.num_retractions == 0 and not req.output_ids:
            req.cached_len = match.length
        req.status = Status.RUNNING
        req.weight_version = self.weight_version
        if req.times.scheduled is None:
            req.times.scheduled = time.monotonic()
        self.prefilling.append(req)
        self.adapters.acquire(req)
        return n

    def _grow(self, req: Req, n: int, batch: ScheduledBatch, misses: dict[str, int]) -> bool:
        """Allocate `n` slots after req's KV, write them to its row and add it to `batch`
        (a prefill row: `misses` says why its tokens were not cached)."""
        slots = self._alloc(n)
        if slots is None:
            return False
        start = req.kv_len
        self.req_pool.write([req.row], [start], [slots])
        req.slots.extend(slots)
        batch.reqs.append(req)
        batch.prefix_lens.append(start)
        batch.extend_lens.append(n)
        completes = start + n == req.seq_len
        batch.completes.append(completes)
        batch.sample.append(completes and req.wants_last_row)
        batch.misses.append(misses)
        return True

    def _alloc(self, n: int) -> SlotIds | None:
        if n > self.kv.num_free:
            self.cache.evict(n - self.kv.num_free, self.kv.free)
        return self.kv.alloc(n)

    def _future_decode(self, req: Req) -> int:
        remaining = max(req.sampling.max_new_tokens - len(req.output_ids), 0)
        remaining = min(remaining, self.limits.max_context_len - req.seq_len, CLIP_MAX_NEW_TOKENS)
        return int(remaining * self.new_token_ratio)

    def _reserved_decode(self) -> int:
        return sum(self._future_decode(r) for r in self.holding())

    def _available(self, reserved: int) -> int:
        """Slots admission may hand out: free or evictable, minus running requests' future decode."""
        return self.kv.num_free + self.cache.evictable_size() - reserved


def _first_chunk(runs: list[tuple[str, int]], logits_tail: int, n: int) -> dict[str, int]:
    """Reasons of the first `n` tokens of an admission: the tree's runs, then the prompt tail
    kept out of the match for its logits (`logits`). Later chunks count as `chunk`."""
    out: dict[str, int] = {}
    for reason, count in (*runs, ("logits", logits_tail)):
        take = min(count, n)
        if take > 0:
            out[reason] = out.get(reason, 0) + take
            n -= take
    return out
