"""CPU policy of continuous batching: admission, chunked prefill, decode, retraction, release.

The scheduler owns the request queues, the KV free list (through KVPool), the slot table rows
and the prefix cache's locks. It never touches the model: `schedule()` returns a ScheduledBatch,
the engine runs it and appends sampled tokens, then calls `finish_step()` (or `undo_step()` when
the forward failed).

Every request it was given is, at any moment, in exactly one place:

    waiting ──admit──▶ prefilling ──prefill complete──▶ running
       ▲                   │  (a chunked one stays here across steps)  │
       └──── retract / undo ┴──────────────────────────────────────────┘
    any of them ──finish──▶ done (released; the engine takes it with take_finished())

so the one finish path (`_retire`) sees every request, whatever step it was in.
"""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from radixflow.radix import MatchResult, Node, RadixCache
from radixflow.runtime.core.kv_pool import KVPool, ReqToTokenPool, SlotIds
from radixflow.runtime.core.request import Req, Status
from radixflow.runtime.core.schedule_policy import match_key, order_waiting
from radixflow.runtime.core.slot_list import SlotList, append_one_each
from radixflow.runtime.lora.capacity import NO_ADAPTERS, AdapterAdmission

log = logging.getLogger(__name__)

# Admission reserves future decode slots of running requests, scaled by this ratio: it starts
# pessimistic, decays step by step while memory holds, and jumps back after a retraction.
NEW_TOKEN_RATIO_INIT = 0.7
NEW_TOKEN_RATIO_MIN = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001
# The future decode reserved per request counts at most this many tokens (as SGLang's
# CLIP_MAX_NEW_TOKENS): a huge max_new_tokens must not starve admission. Requests that really
# generate that long are retracted if memory runs out.
CLIP_MAX_NEW_TOKENS = 4096
# Faulted steps a request may take part in before it fails (out-of-memory retries).
MAX_STEP_RETRIES = 3
# Smallest fraction of the prefill token budget that out-of-memory retries shrink it to.
MIN_PREFILL_BUDGET_SCALE = 1 / 16
# A waiting request whose new prefix is shared with one admitted this round waits one round
# when the sharing exceeds this many tokens, so it hits the cache instead of recomputing.
IN_BATCH_DEDUP_MIN_TOKENS = 32


@dataclass
class ScheduledBatch:
    """What one step computes: for each request, `extend_lens[i]` new tokens after its
    `prefix_lens[i]` cached ones. `completes[i]`: this step computes the rest of its known
    tokens (its prefill ends here); `sample[i]`: a token is then sampled from its last position.
    `misses[i]`: why the prefill tokens of row i were not cached, reason -> tokens (empty for a
    decode round's rows, and no list at all for a decode step); the counts are for the engine to
    record once the step succeeded.
    `is_decode`: every row adds one token. `is_decode_round`: every row is a running request
    (one new token, or several its grammar's jump-forward appended)."""

    reqs: list[Req]
    prefix_lens: list[int]
    extend_lens: list[int]
    completes: list[bool]
    sample: list[bool]
    is_decode: bool
    misses: list[dict[str, int]] = field(default_factory=list)
    is_decode_round: bool = False
    new_slots: SlotIds | None = None  # a decode step's: each row's one new slot (else None)


@dataclass(frozen=True)
class _Blocked:
    """Why `_admit` did not admit: `need` is the availability (free + evictable - reserved, before
    locking its prefix) at which the request would fit; 0 when it was not memory (the step's
    token budget), which the next step renews anyway."""

    need: int


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
                 cache: RadixCache, adapters: AdapterAdmission = NO_ADAPTERS) -> None:
        self.limits = limits
        self.adapters = adapters  # LoRA slot residency: a request waits for its adapter's slot
        self.kv = kv_pool
        self.req_pool = req_pool
        self.cache = cache
        self.waiting: list[Req] = []
        self.prefilling: list[Req] = []    # admitted, prefill not complete (at most one across steps)
        self.running: list[Req] = []       # prefill complete, decoding
        self.done: list[Req] = []          # finished and released; taken by the engine
        self.new_token_ratio = NEW_TOKEN_RATIO_INIT
        self.prefill_budget_scale = 1.0    # < 1 after an out-of-memory prefill
        self.num_preemptions = 0
        # The head of a memory-blocked queue fits once availability reaches this; until then, or
        # until the queue, the tree or the holders change, admission is not tried (no re-match).
        self._blocked_until: int | None = None

    # -- queues ----------------------------------------------------------------------------

    def add(self, req: Req) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)
        self._blocked_until = None

    def abort(self, rid: str, message: str = "aborted", reason: dict | None = None) -> bool:
        """Finish `rid` with reason abort (or `reason`: a stop string the server side found);
        False if it is unknown or already finished."""
        req = next((r for r in self.waiting + self.holding() if r.rid == rid), None)
        if req is None:
            return False
        self.finish(req, reason or {"type": "abort", "message": message})
        return True

    def finish(self, req: Req, reason: dict) -> None:
        """End `req` now with `reason` (unless it already has one) wherever it is."""
        req.finish(reason)
        if req in self.waiting:
            self.waiting.remove(req)
            self._blocked_until = None
            req.status = Status.FINISHED
            self.done.append(req)
        elif req.status is not Status.FINISHED:
            self._retire(req)

    def finish_all(self, reason: dict) -> None:
        self.finish_where(lambda _: True, reason)

    def finish_where(self, pick: Callable[[Req], bool], reason: dict) -> None:
        """Finish with `reason` every request, waiting or holding, that `pick` picks."""
        for req in [r for r in self.waiting + self.holding() if pick(r)]:
            self.finish(req, reason)

    def take_finished(self) -> list[Req]:
        """Finished requests not yet handed out, each exactly once, in finishing order."""
        done, self.done = self.done, []
        return done

    @property
    def chunked(self) -> Req | None:
        """The request partway through a chunked prefill, between steps."""
        return self.prefilling[0] if self.prefilling else None

    def holding(self) -> list[Req]:
        """Requests that hold a slot-table row, KV slots and a tree lock."""
        return self.running + self.prefilling

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running) + len(self.prefilling)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.prefilling)

    # -- one step --------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch | None:
        """Pick the next step: a prefill batch when something can be admitted, else decode.
        Requests that can never fit are finished here (see `done`)."""
        batch = self._schedule_prefill()
        if batch is None and self.running:
            batch = self._schedule_decode()
        if batch is None and self.prefilling and not self.running:
            # The chunked request cannot grow and nothing else holds KV: it can never fit.
            self.finish(self.prefilling[0], _NO_FIT)
        return batch

    def finish_step(self, batch: ScheduledBatch) -> None:
        """After the engine appended sampled tokens and set finish reasons: cache fresh prefill
        KV, move completed prefills to running, release finished requests (to `done`)."""
        if batch.is_decode:  # nothing to cache or move: release the finished
            for req in batch.reqs:
                if req.finish_reason is not None and req.status is not Status.FINISHED:
                    self._retire(req)
        else:
            self._finish_prefill_step(batch)
        if not self.waiting and not self.prefilling:
            self.prefill_budget_scale = 1.0

    def _finish_prefill_step(self, batch: ScheduledBatch) -> None:
        for req, completes in zip(batch.reqs, batch.completes):
            if req.status is Status.FINISHED:
                continue  # failed and retired already
            if req.is_finished:
                self._retire(req)
                continue
            self._blocked_until = None  # the tree grew: waiting requests may match more
            self._cache_unfinished(req)
            if completes and req in self.prefilling:
                self.prefilling.remove(req)
                self.running.append(req)

    def undo_step(self, batch: ScheduledBatch) -> None:
        """The forward of `batch` failed: free the slots it allocated without caching them
        (their KV was never written), and send requests whose prefill it was part of back to
        the head of the queue. KV committed before the step stays."""
        for req, prefix in zip(batch.reqs, batch.prefix_lens):
            if req.status is not Status.FINISHED:
                self._free_from(req, prefix)
        requeue = [r for r in batch.reqs if r in self.prefilling]
        for req in requeue:
            self._release(req)
            req.status = Status.WAITING
        self.waiting[:0] = requeue
        self._blocked_until = None

    def drop_ahead(self, batch: ScheduledBatch) -> None:
        """Overlap scheduling: `batch` was scheduled before the previous step's tokens were
        appended; its rows whose request finished on that token (not yet released) compute KV
        past the request's end. Free those new slots uncached, before the release hands the
        request's KV to the tree: the forward writing them may still fail."""
        for req, prefix in zip(batch.reqs, batch.prefix_lens):
            if req.is_finished and req.status is not Status.FINISHED:
                self._free_from(req, prefix)

    def _free_from(self, req: Req, prefix: int) -> None:
        """Free req's slots from position `prefix` on, uncached (their KV is not to be kept)."""
        self.kv.free(req.slots[prefix:])
        req.slots.truncate(prefix)

    def shrink_prefill_budget(self) -> None:
        """After an out-of-memory prefill: halve the prefill token budget until the queue drains."""
        self.prefill_budget_scale = max(MIN_PREFILL_BUDGET_SCALE, self.prefill_budget_scale / 2)

    # -- prefill admission -----------------------------------------------------------------

    def _prefill_budget(self) -> tuple[int, int | None]:
        """(token budget of one prefill step, chunk size or None), shrunk after an OOM."""
        chunk = self.limits.chunked_prefill_size if self.limits.chunked_prefill_size > 0 else None
        if self.prefill_budget_scale >= 1.0:
            return self.limits.max_prefill_tokens, chunk
        budget = max(1, int(self.limits.max_prefill_tokens * self.prefill_budget_scale))
        return budget, min(chunk or budget, budget)

    def _schedule_prefill(self) -> ScheduledBatch | None:
        token_budget, chunk = self._prefill_budget()
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
        queue: the batch is full, or the queue is memory-blocked and availability has not reached
        what its head needs."""
        if self.num_running >= self.limits.max_num_seqs:
            return True
        return self._blocked_until is not None and self._available(self._reserved_decode()) < self._blocked_until

    def _admit_waiting(self, batch: ScheduledBatch, token_budget: int, chunk: int | None, reserved: int) -> None:
        """Admit waiting requests into `batch` in policy order, each with the one prefix match
        the ordering took, until one does not fit (remembered when memory is why)."""
        dedup = RadixCache()
        admitted = []
        for req, match in order_waiting(self.waiting, self.limits.policy, self.cache,
                                        self.limits.lpm_fcfs_threshold):
            if self.num_running >= self.limits.max_num_seqs or token_budget <= 0:
                break
            if not self.adapters.can_admit(req):
                continue  # its adapter would exceed the batch's adapter cap: it waits
            key = match_key(req)
            if match is None or match.node.is_evicted:  # fcfs, or evicted for an earlier admission
                match = self.cache.match_prefix(key, req.namespace)
            if self.limits.policy != "fcfs" and admitted:
                shared = dedup.match_prefix(key, req.namespace).length
                if shared - match.length > IN_BATCH_DEDUP_MIN_TOKENS:
                    continue
            n = self._admit(req, key, match, token_budget, chunk, reserved, batch)
            if isinstance(n, _Blocked):
                if n.need > 0 and not admitted:
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
            return _Blocked(self._available(reserved) + 1)
        if not req.prefix_counted:
            self.cache.record_query(len(key), match.length, match.node)
            req.prefix_counted, req.divergent_at = True, diverged_at
        if req.num_retractions == 0 and not req.output_ids:
            req.cached_len = match.length
        req.status = Status.RUNNING
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
        batch.sample.append(completes and req.wants_sample)
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

    # -- decode ----------------------------------------------------------------------------

    def _schedule_decode(self) -> ScheduledBatch | None:
        """One new token per running request; more for one whose grammar appended forced tokens
        (jump-forward), which makes the step an extend step (the model runner still replays the
        one-token rows from its CUDA graphs)."""
        news = self._make_room_for_decode()
        if not self.running:
            return None
        slots = self._alloc(sum(news))
        assert slots is not None, "decode room was made above"
        self.new_token_ratio = max(NEW_TOKEN_RATIO_MIN, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        if len(slots) == len(news):  # the common case, one token each: no per-request arrays
            return self._one_token_each(slots)
        batch = ScheduledBatch([], [], [], [], [], is_decode=False, is_decode_round=True)
        rows, starts, new_slots = [], [], []
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
            batch.misses.append({})
            req.slots.extend(mine)
        self.req_pool.write(rows, starts, new_slots)
        return batch

    def schedule_decode_ahead(self) -> ScheduledBatch | None:
        """Overlap scheduling: the next decode step while the previous step's tokens are still
        on the device (each running request has `seq_len == kv_len`: its last token pending).
        One new slot each, at position kv_len, for the pending token. None, allocating nothing,
        when something prefills, a waiting request could be admitted, or a slot each is not free
        or evictable (the engine then finishes the previous step and schedules as usual:
        admission, retraction). A full batch or a memory-blocked queue goes on overlapping."""
        if self.prefilling or not self.running or (self.waiting and not self._admits_nothing()):
            return None
        if len(self.running) > self.kv.num_free + self.cache.evictable_size():
            return None
        slots = self._alloc(len(self.running))
        assert slots is not None, "the room was checked above"
        self.new_token_ratio = max(NEW_TOKEN_RATIO_MIN, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        return self._one_token_each(slots)

    def _one_token_each(self, slots: SlotIds) -> ScheduledBatch:
        reqs = list(self.running)
        starts = append_one_each([r.slots for r in reqs], slots.tolist())
        self.req_pool.write_one_each([r.row for r in reqs], starts, slots)
        n = len(reqs)
        return ScheduledBatch(reqs, starts, [1] * n, [True] * n, [True] * n, is_decode=True, is_decode_round=True,
                              new_slots=slots)

    def _make_room_for_decode(self) -> list[int]:
        """Retract until every running request can get its new slots: a chunked prefill first
        (it has made the least progress), then the least-advanced running request. A request
        left alone that still cannot get a slot can never fit: it finishes with a reason.
        Returns each running request's count of new tokens."""
        while True:
            news = [len(r.prompt_ids) + len(r.output_ids) - len(r.slots) for r in self.running]
            if sum(news) <= self.kv.num_free + self.cache.evictable_size():
                return news
            if self.prefilling:
                self._retract(self.prefilling[0])
            elif len(self.running) == 1:
                self.finish(self.running[0], _NO_FIT)
            else:
                self._retract(min(self.running, key=lambda r: (len(r.output_ids), -len(r.prompt_ids))))

    def _retract(self, req: Req) -> None:
        log.debug("retracting %s after %d output tokens", req.rid, len(req.output_ids))
        self._release(req)
        req.status = Status.WAITING
        req.num_retractions += 1
        self.num_preemptions += 1
        self.waiting.insert(0, req)
        self.new_token_ratio = NEW_TOKEN_RATIO_INIT

    # -- handing KV to the tree --------------------------------------------------------------

    def _insert_into_cache(self, req: Req) -> tuple[Node, int]:
        """Insert req's KV computed since the tree last took it, below its locked last node:
        O(new tokens), not O(its length). Returns the tree's node for req's tokens and how many
        of them the tree now holds."""
        start = req.tree_len
        result = self.cache.insert_after(req.last_node, req.ids_range(start, req.kv_len), req.slots[start:])
        if result.cached_len:
            # Someone else cached [start, dup_end) meanwhile: ours are duplicates.
            dup_end = start + result.cached_len
            self.kv.free(req.slots[start: dup_end])
            req.slots[start: dup_end] = result.slots
            if req.row is not None:
                self.req_pool.write([req.row], [start], [result.slots])
        return result.node, start + result.held_len

    def _cache_unfinished(self, req: Req) -> None:
        node, held = self._insert_into_cache(req)
        self.cache.inc_lock_ref(node)
        self.cache.dec_lock_ref(req.last_node)
        req.last_node, req.tree_len = node, held

    def _retire(self, req: Req) -> None:
        """The one way out of the scheduler for a request that held KV: release, mark, hand out."""
        self._release(req)
        req.status = Status.FINISHED
        self.done.append(req)

    def _release(self, req: Req) -> None:
        """Give the tree req's computed KV, free what it does not keep, unlock, free the row,
        and take req out of the running and prefilling lists."""
        if req.row is not None:
            _, held = self._insert_into_cache(req)
            self.kv.free(req.slots[held:])
            self.cache.dec_lock_ref(req.last_node)
            self.req_pool.free_row(req.row)
            self._blocked_until = None  # memory and a row were freed
            unloaded = self.adapters.release(req)
            if unloaded is not None:  # the last user of an unloaded adapter: its KV goes now
                self.cache.evict_namespace(unloaded, self.kv.free)
        if req in self.running:
            self.running.remove(req)
        if req in self.prefilling:
            self.prefilling.remove(req)
        req.row, req.last_node, req.slots, req.tree_len = None, None, SlotList(), 0

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
        places = [self.kv.free_slots(), self.cache.all_slots()] + [r.owned_slots().tolist() for r in self.holding()]
        flat = [slot for place in places for slot in place]
        if len(flat) != len(set(flat)) or set(flat) != set(range(1, self.kv.capacity + 1)):
            raise AssertionError(f"KV slots misplaced: {len(flat)} placed, {len(set(flat))} distinct, "
                                 f"{self.kv.capacity} usable")
        rows = [r.row for r in self.holding()]
        if None in rows or len(rows) != len(set(rows)) or len(rows) + self.req_pool.num_free_rows != self.req_pool.num_rows:
            raise AssertionError(f"slot-table rows misplaced: holding {rows}, {self.req_pool.num_free_rows} free")
        if any(r.row is not None or len(r.slots) for r in self.waiting):
            raise AssertionError("a waiting request still holds a row or slots")


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


_NO_FIT = {"type": "abort", "message": "the KV cache is too small for this request to continue"}
