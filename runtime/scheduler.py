"""CPU policy of continuous batching: admission, chunked prefill, decode, retraction, release.

The scheduler owns the waiting and running queues, the KV free list (through KVPool), the slot
table rows and the prefix cache's locks. It never touches the model: `schedule()` returns a
ScheduledBatch, the engine runs it and appends sampled tokens, then calls `finish_step()`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from radixflow.radix import RadixCache
from radixflow.runtime.kv_pool import KVPool, ReqToTokenPool
from radixflow.runtime.request import Req, Status
from radixflow.runtime.schedule_policy import match_key, order_waiting

log = logging.getLogger(__name__)

# Admission reserves future decode slots of running requests, scaled by this ratio: it starts
# pessimistic, decays step by step while memory holds, and jumps back after a retraction.
NEW_TOKEN_RATIO_INIT = 0.7
NEW_TOKEN_RATIO_MIN = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001
# A waiting request whose new prefix is shared with one admitted this round waits one round
# when the sharing exceeds this many tokens, so it hits the cache instead of recomputing.
IN_BATCH_DEDUP_MIN_TOKENS = 32


@dataclass
class ScheduledBatch:
    """What one step computes: for each request, `extend_lens[i]` new tokens after its
    `prefix_lens[i]` cached ones. `completes[i]`: this step computes the rest of its known
    tokens (its prefill ends here); `sample[i]`: a token is then sampled from its last position."""

    reqs: list[Req]
    prefix_lens: list[int]
    extend_lens: list[int]
    completes: list[bool]
    sample: list[bool]
    is_decode: bool


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_prefill_tokens: int
    chunked_prefill_size: int      # <= 0: never chunk
    max_context_len: int
    policy: str
    lpm_fcfs_threshold: int


class Scheduler:
    def __init__(self, limits: SchedulerLimits, kv_pool: KVPool, req_pool: ReqToTokenPool,
                 cache: RadixCache) -> None:
        self.limits = limits
        self.kv = kv_pool
        self.req_pool = req_pool
        self.cache = cache
        self.waiting: list[Req] = []
        self.running: list[Req] = []       # prefill complete, decoding
        self.chunked: Req | None = None    # partway through a chunked prefill
        self.new_token_ratio = NEW_TOKEN_RATIO_INIT
        self.num_preemptions = 0

    # -- queues ----------------------------------------------------------------------------

    def add(self, req: Req) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)

    def abort(self, rid: str) -> Req | None:
        """Finish `rid` with reason abort and give back all it holds; None if unknown."""
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                req.finish({"type": "abort", "message": "aborted"})
                req.status = Status.FINISHED
                return req
        for req in self.holding():
            if req.rid == rid:
                req.finish({"type": "abort", "message": "aborted"})
                self._release(req)
                return req
        return None

    def holding(self) -> list[Req]:
        return self.running + ([self.chunked] if self.chunked is not None else [])

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.holding())

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked)

    # -- one step --------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch | None:
        """Pick the next step: a prefill batch when something can be admitted, else decode."""
        batch = self._schedule_prefill()
        if batch is None and self.running:
            batch = self._schedule_decode()
        return batch

    def finish_step(self, batch: ScheduledBatch) -> list[Req]:
        """After the engine appended sampled tokens and set finish reasons: cache fresh prefill
        KV, move completed prefills to running, release finished requests. Returns finished."""
        finished = []
        for req, completes in zip(batch.reqs, batch.completes):
            if req.is_finished:
                self._release(req)
                finished.append(req)
                continue
            if not batch.is_decode:
                self._cache_unfinished(req)
                if req is self.chunked and completes:
                    self.chunked = None
                if req is not self.chunked and req not in self.running:
                    self.running.append(req)
        return finished

    # -- prefill admission -----------------------------------------------------------------

    def _schedule_prefill(self) -> ScheduledBatch | None:
        token_budget = self.limits.max_prefill_tokens
        chunk = self.limits.chunked_prefill_size if self.limits.chunked_prefill_size > 0 else None
        batch = ScheduledBatch([], [], [], [], [], is_decode=False)
        if self.chunked is not None:
            req = self.chunked
            n = min(len(req.all_ids) - req.kv_len, token_budget, chunk or token_budget)
            if not self._grow(req, n, batch):
                return None
            token_budget -= n
            if req.kv_len < len(req.all_ids):
                return batch  # still chunking: nothing else joins
        if not self.waiting or self.num_running >= self.limits.max_num_seqs:
            # Nothing could be admitted: skip ordering the queue (a prefix match per waiting
            # request), which would otherwise run on every decode step of a full batch.
            return batch if batch.reqs else None
        available = self.kv.num_free + self.cache.evictable_size() - self._reserved_decode()
        dedup = RadixCache()
        admitted = []
        for req in order_waiting(self.waiting, self.limits.policy, self.cache, self.limits.lpm_fcfs_threshold):
            if self.num_running + len(admitted) >= self.limits.max_num_seqs or token_budget <= 0:
                break
            key = match_key(req)
            match = self.cache.match_prefix(key, req.namespace)
            if self.limits.policy != "fcfs" and admitted:
                shared = dedup.match_prefix(key, req.namespace).length
                if shared - match.length > IN_BATCH_DEDUP_MIN_TOKENS:
                    continue
            extend = len(req.all_ids) - match.length
            reserve = self._future_decode(req)
            if self.num_running + len(admitted) > 0 and extend + reserve > available:
                break
            n = extend
            if n > token_budget:
                if chunk is None and batch.reqs:
                    break
                n = min(token_budget, chunk) if chunk is not None else n
            elif chunk is not None and n > chunk:
                n = chunk
            if not self._admit(req, key, n, batch):
                break
            admitted.append(req)
            dedup.insert(key, list(range(len(key))), req.namespace)
            available -= n + reserve
            token_budget -= n
            if req is self.chunked:
                break
        for req in admitted:
            self.waiting.remove(req)
        return batch if batch.reqs else None

    def _admit(self, req: Req, key: list[int], n: int, batch: ScheduledBatch) -> bool:
        """Give `req` a table row, its cached prefix and `n` new slots; add it to `batch`."""
        row = self.req_pool.alloc_row()
        if row is None:
            return False
        match = self.cache.match_prefix(key, req.namespace, record=True)
        self.cache.inc_lock_ref(match.node)
        req.row, req.last_node = row, match.node
        req.slots, req.tree_len = list(match.slots), match.length
        if req.num_retractions == 0 and not req.output_ids:
            req.cached_len = match.length
        self.req_pool.write([row], [0], [req.slots])
        if not self._grow(req, n, batch):
            self.cache.dec_lock_ref(match.node)
            self.req_pool.free_row(row)
            req.row, req.last_node, req.slots, req.tree_len = None, None, [], 0
            return False
        req.status = Status.RUNNING
        if req.times.scheduled is None:
            req.times.scheduled = time.monotonic()
        if n < len(req.all_ids) - match.length:
            self.chunked = req
        return True

    def _grow(self, req: Req, n: int, batch: ScheduledBatch) -> bool:
        """Allocate `n` slots after req's KV, write them to its row and add it to `batch`."""
        slots = self._alloc(n)
        if slots is None:
            return False
        start = req.kv_len
        self.req_pool.write([req.row], [start], [slots])
        req.slots.extend(slots)
        batch.reqs.append(req)
        batch.prefix_lens.append(start)
        batch.extend_lens.append(n)
        completes = start + n == len(req.all_ids)
        batch.completes.append(completes)
        batch.sample.append(completes and req.wants_sample)
        return True

    def _alloc(self, n: int) -> list[int] | None:
        if n > self.kv.num_free:
            self.cache.evict(n - self.kv.num_free, self.kv.free)
        return self.kv.alloc(n)

    def _future_decode(self, req: Req) -> int:
        remaining = max(req.sampling.max_new_tokens - len(req.output_ids), 0)
        remaining = min(remaining, self.limits.max_context_len - len(req.all_ids))
        return int(remaining * self.new_token_ratio)

    def _reserved_decode(self) -> int:
        return sum(self._future_decode(r) for r in self.holding())

    # -- decode ----------------------------------------------------------------------------

    def _schedule_decode(self) -> ScheduledBatch:
        """One new token per running request; more for one whose grammar appended forced tokens
        (jump-forward), which turns the step into an extend step for the whole batch."""
        self._make_room_for_decode()
        news = [r.seq_len - r.kv_len for r in self.running]
        batch = ScheduledBatch([], [], [], [], [], is_decode=all(n == 1 for n in news))
        rows, starts, new_slots = [], [], []
        slots = self._alloc(sum(news))
        assert slots is not None, "decode room was made above"
        pos = 0
        for req, n in zip(self.running, news):
            mine, pos = slots[pos: pos + n], pos + n
            rows.append(req.row)
            starts.append(req.kv_len)
            new_slots.append(mine)
            batch.reqs.append(req)
            batch.prefix_lens.append(req.kv_len)
            batch.extend_lens.append(n)
            batch.completes.append(True)
            batch.sample.append(True)
            req.slots.extend(mine)
        self.req_pool.write(rows, starts, new_slots)
        self.new_token_ratio = max(NEW_TOKEN_RATIO_MIN, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        return batch

    def _make_room_for_decode(self) -> None:
        """Retract the least-advanced requests until every running one can get a slot."""
        while sum(r.seq_len - r.kv_len for r in self.running) > self.kv.num_free + self.cache.evictable_size():
            if len(self.running) == 1:
                req = self.running[0]
                req.finish({"type": "abort", "message": "KV cache too small for this request"})
                self._release(req)
                return
            victim = min(self.running, key=lambda r: (len(r.output_ids), -len(r.prompt_ids)))
            self._retract(victim)

    def _retract(self, req: Req) -> None:
        log.debug("retracting %s after %d output tokens", req.rid, len(req.output_ids))
        self._release(req)
        req.status = Status.WAITING
        req.num_retractions += 1
        self.num_preemptions += 1
        self.waiting.insert(0, req)
        self.new_token_ratio = NEW_TOKEN_RATIO_INIT

    # -- handing KV to the tree --------------------------------------------------------------

    def _insert_into_cache(self, req: Req) -> tuple[object, int]:
        """Insert req's computed KV; free what the tree already held. Returns the tree's node
        for req's tokens and how many of them the tree now holds."""
        key = req.all_ids[: req.kv_len]
        present = self.cache.insert(key, req.slots, req.namespace)
        match = self.cache.match_prefix(key, req.namespace)
        dup_end = min(present, match.length)
        if dup_end > req.tree_len:
            # Someone else cached [tree_len, dup_end) meanwhile: ours are duplicates.
            self.kv.free(req.slots[req.tree_len: dup_end])
            req.slots[req.tree_len: dup_end] = match.slots[req.tree_len: dup_end]
            if req.row is not None:
                self.req_pool.write([req.row], [req.tree_len], [req.slots[req.tree_len: dup_end]])
        return match.node, match.length

    def _cache_unfinished(self, req: Req) -> None:
        node, held = self._insert_into_cache(req)
        self.cache.inc_lock_ref(node)
        self.cache.dec_lock_ref(req.last_node)
        req.last_node, req.tree_len = node, held

    def _release(self, req: Req) -> None:
        """Give the tree req's KV, free what it does not keep, unlock, free the row."""
        if req.row is not None:
            _, held = self._insert_into_cache(req)
            self.kv.free(req.slots[held:])
            self.cache.dec_lock_ref(req.last_node)
            self.req_pool.free_row(req.row)
        if req in self.running:
            self.running.remove(req)
        if req is self.chunked:
            self.chunked = None
        req.row, req.last_node, req.slots, req.tree_len = None, None, [], 0
        req.status = Status.FINISHED if req.is_finished else req.status

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
