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

so the one finish path (`_retire`) sees every request, whatever step it was in. Prefill admission
is in admission.py, the slot accounting checks in slot_accounting.py and LongRoPE's switch to
the long factors in long_rope_switch.py (mixins of Scheduler).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from radixflow.radix import Node, RadixCache
from radixflow.runtime.core.admission import NO_FIT, Admission
from radixflow.runtime.core.kv_pool import KVPool, ReqToTokenPool, SlotIds
from radixflow.runtime.core.long_rope_switch import LongRopeSwitch
from radixflow.runtime.core.priority import NO_PRIORITIES, PriorityPreemption, PriorityRules
from radixflow.runtime.core.request import Req, Status, adapter_namespaces
from radixflow.runtime.core.scheduled_batch import ScheduledBatch, mixed
from radixflow.runtime.core.slot_accounting import SlotAccounting
from radixflow.runtime.core.slot_list import SlotList, append_one_each
from radixflow.runtime.core.speculative import Drafter
from radixflow.runtime.lora.capacity import NO_ADAPTERS, AdapterAdmission

log = logging.getLogger(__name__)

# Admission reserves future decode slots of running requests, scaled by this ratio: it starts
# pessimistic, decays step by step while memory holds, and jumps back after a retraction.
NEW_TOKEN_RATIO_INIT = 0.7
NEW_TOKEN_RATIO_MIN = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001
# Faulted steps a request may take part in before it fails (out-of-memory retries).
MAX_STEP_RETRIES = 3
# Smallest fraction of the prefill token budget that out-of-memory retries shrink it to.
MIN_PREFILL_BUDGET_SCALE = 1 / 16


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_prefill_tokens: int
    chunked_prefill_size: int      # <= 0: never chunk
    max_context_len: int
    policy: str
    lpm_fcfs_threshold: int
    mixed: bool = False            # a prefill step also decodes the running requests


class Scheduler(Admission, SlotAccounting, LongRopeSwitch, PriorityPreemption):
    def __init__(self, limits: SchedulerLimits, kv_pool: KVPool, req_pool: ReqToTokenPool,
                 cache: RadixCache, adapters: AdapterAdmission = NO_ADAPTERS,
                 long_rope_len: int | None = None, priority: PriorityRules = NO_PRIORITIES) -> None:
        self.limits = limits
        self.priority = priority  # how requests' priorities order the queue and preempt (priority.py)
        # LongRoPE (ModelArgs.long_rope_len): a sequence longer than this is rotated wholly with the
        # long factors, so one that grows past it is computed again (`_restart_past_short_rope`)
        self.long_rope_len = long_rope_len
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
        # A priority preemption plan found nothing to retract; not planned again until then either.
        self._preemption_idle = False
        self.drafter: Drafter | None = None  # speculative decoding's (runtime/core/speculative.py)
        # True while the engine waits for the running requests to end (a weight update): nothing
        # waiting is admitted, what runs goes on (EngineLoop.call_when_idle)
        self.admission_paused = False
        self.weight_version = "default"  # the name of the weights served (Engine.update_weights_from_disk)

    # -- queues ----------------------------------------------------------------------------

    def add(self, req: Req) -> None:
        req.status = Status.WAITING
        self._pick_rope(req)
        self.waiting.append(req)
        self._queue_changed()

    def abort(self, rid: str, message: str = "aborted", reason: dict | None = None) -> bool:
        """Finish `rid` (or each part of the n > 1 request submitted as `rid`) with reason abort
        (or `reason`: a stop string the server side found); False if none is in flight."""
        reqs = [r for r in self.waiting + self.holding() if r.rid == rid or r.group == rid]
        for req in reqs:
            self.finish(req, reason or {"type": "abort", "message": message})
        return bool(reqs)

    def finish(self, req: Req, reason: dict) -> None:
        """End `req` now with `reason` (unless it already has one) wherever it is."""
        req.finish(reason)
        if req in self.waiting:
            self.waiting.remove(req)
            self._queue_changed()
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

    def _queue_changed(self) -> None:
        """The queue, the tree or the holders changed: admission and priority preemption are
        worth trying again (each had remembered that it could do nothing)."""
        self._blocked_until = None
        self._preemption_idle = False

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.prefilling)

    # -- one step --------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch | None:
        """Pick the next step: a prefill batch when something can be admitted (with the running
        requests' decode rows when mixing), else decode. Requests that can never fit are
        finished here (see `done`)."""
        self._restart_past_short_rope()
        self._preempt_for_priority()
        if self.limits.mixed and self.running and (self.prefilling or self.waiting and not self._admits_nothing()):
            batch = self._schedule_mixed()
            if batch is not None:
                return batch
        batch = self._schedule_prefill()
        if batch is None and self.running:
            batch = self._schedule_decode()
        if batch is None and self.prefilling and not self.running:
            # The chunked request cannot grow and nothing else holds KV: it can never fit.
            self.finish(self.prefilling[0], NO_FIT)
        return batch

    def _schedule_mixed(self) -> ScheduledBatch | None:
        """A mixed step: every running request's decode tokens first, then what prefill admits
        in what is left (its token budget less the decode tokens, down to half of it). None,
        allocating nothing, when the decode rows need a retraction to fit: the step is then
        scheduled as unmixed."""
        _, need = self._decode_need()
        if need > self.kv.num_free + self.cache.evictable_size():
            return None
        decode = self._schedule_decode(speculate=False)  # retracts nothing: the room is there
        assert decode is not None
        prefill = self._schedule_prefill(reserved_tokens=need)
        return decode if prefill is None else mixed(prefill, decode)

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
        split = len(batch.reqs) - batch.num_decode_rows
        for req in batch.reqs[split:]:  # a mixed step's decode rows: as in a decode step
            if req.finish_reason is not None and req.status is not Status.FINISHED:
                self._retire(req)
        for req, completes in zip(batch.reqs[:split], batch.completes):
            if req.status is Status.FINISHED:
                continue  # failed and retired already
            if req.is_finished:
                self._retire(req)
                continue
            self._queue_changed()  # the tree grew: waiting requests may match more
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
                self.free_from(req, prefix)
        requeue = [r for r in batch.reqs if r in self.prefilling]
        for req in requeue:
            self._release(req)
            req.status = Status.WAITING
        self.waiting[:0] = requeue
        self._queue_changed()

    def drop_ahead(self, batch: ScheduledBatch) -> None:
        """Overlap scheduling: `batch` was scheduled before the previous step's tokens were
        appended; its rows whose request finished on that token (not yet released) compute KV
        past the request's end. Free those new slots uncached, before the release hands the
        request's KV to the tree: the forward writing them may still fail."""
        for req, prefix in zip(batch.reqs, batch.prefix_lens):
            if req.is_finished and req.status is not Status.FINISHED:
                self.free_from(req, prefix)

    def free_from(self, req: Req, prefix: int) -> None:
        """Free req's slots from position `prefix` on, uncached (their KV is not to be kept)."""
        self.kv.free(req.slots[prefix:])
        req.slots.truncate(prefix)

    def shrink_prefill_budget(self) -> None:
        """After an out-of-memory prefill: halve the prefill token budget until the queue drains."""
        self.prefill_budget_scale = max(MIN_PREFILL_BUDGET_SCALE, self.prefill_budget_scale / 2)

    # -- decode ----------------------------------------------------------------------------

    def _schedule_decode(self, speculate: bool = True) -> ScheduledBatch | None:
        """One new token per running request; more for one whose grammar appended forced tokens
        (jump-forward), or with drafts to verify, which makes the step an extend step (the model
        runner still replays the one-token rows from its CUDA graphs)."""
        news = self._make_room_for_decode()
        if not self.running:
            return None
        if speculate and self.drafter is not None:
            news = self._add_drafts(news)
        slots = self._alloc(len(self.running) if news is None else sum(news))
        assert slots is not None, "decode room was made above"
        self.new_token_ratio = max(NEW_TOKEN_RATIO_MIN, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        if news is None or len(slots) == len(news):  # the common case, one token each: no per-request arrays
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
        if self._preemption_possible():
            return None  # `schedule` preempts (or learns it cannot)
        if self._crosses_next_step():
            return None  # a pending token passes the short factors' context: `schedule` restarts its request
        if len(self.running) > self.kv.num_free + self.cache.evictable_size():
            return None
        slots = self._alloc(len(self.running))
        assert slots is not None, "the room was checked above"
        self.new_token_ratio = max(NEW_TOKEN_RATIO_MIN, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        return self._one_token_each(slots)

    def _one_token_each(self, slots: SlotIds) -> ScheduledBatch:
        reqs = list(self.running)
        starts, rows = append_one_each(reqs, slots.tolist())
        self.req_pool.write_one_each(rows, starts, slots)
        n = len(reqs)
        return ScheduledBatch(reqs, starts, [1] * n, [True] * n, [True] * n, is_decode=True, is_decode_round=True,
                              new_slots=slots, rows=rows)

    def _make_room_for_decode(self) -> list[int]:
        """Retract until every running request can get its new slots: a chunked prefill first
        (it has made the least progress), then the least-advanced running request. A request
        left alone that still cannot get a slot can never fit: it finishes with a reason.
        Returns each running request's count of new tokens, or None for one each: only a
        grammar's jump-forward appends more than the one sampled token (`check_slots`)."""
        while True:
            news, need = self._decode_need()
            if need <= self.kv.num_free + self.cache.evictable_size():
                return news
            if self.prefilling:
                self._retract(self.prefilling[0])
            elif len(self.running) == 1:
                self.finish(self.running[0], NO_FIT)
            else:  # the lowest priority first (all alike while priorities are off)
                rank = self.priority.rank
                self._retract(min(self.running, key=lambda r: (-rank(r), len(r.output_ids), -len(r.prompt_ids))))

    def _add_drafts(self, news: list[int] | None) -> list[int] | None:
        """Ask the drafter for drafts within the free and evictable slots left after the decode
        rows' own; a request's drafts go after its output ids until the step's forward ran."""
        need = len(self.running) if news is None else sum(news)
        drafts = self.drafter.propose(self.running, self.kv.num_free + self.cache.evictable_size() - need)
        if not drafts or not any(drafts):
            return news
        news = [1] * len(self.running) if news is None else news
        for i, (req, mine) in enumerate(zip(self.running, drafts)):
            mine = self._drafts_within_rope(req, mine)
            if mine:
                req.drafts = mine
                req.output_ids.extend(mine)
                news[i] += len(mine)
        return news

    def _decode_need(self) -> tuple[list[int] | None, int]:
        """Each running request's count of new tokens (None: one each) and their sum."""
        if any(r.grammar is not None for r in self.running):
            news = [len(r.prompt_ids) + len(r.output_ids) - len(r.slots) for r in self.running]
            return news, sum(news)
        return None, len(self.running)

    def retract_all(self) -> int:
        """Send every request holding KV back to the head of the queue, in the order they hold
        it (their computed KV to the tree, so readmission finds it cached); not preemptions.
        How many."""
        holding = self.holding()
        for req in reversed(holding):
            self._retract(req, preempted=False)
        return len(holding)

    def _retract(self, req: Req, preempted: bool = True, reestimate: bool = True) -> None:
        """Send `req` back to the head of the queue, its computed KV to the tree. `preempted`:
        counted as a preemption; `reestimate`: memory ran short, so admission reserves future
        decode pessimistically again (not so for a priority preemption)."""
        log.debug("retracting %s after %d output tokens", req.rid, len(req.output_ids))
        self._release(req)
        req.status = Status.WAITING
        req.num_retractions += 1
        self.num_preemptions += preempted
        self._pick_rope(req)
        self.waiting.insert(0, req)
        if reestimate:
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
            self._queue_changed()  # memory and a row were freed
            unloaded = self.adapters.release(req)
            if unloaded is not None:  # the last user of an unloaded adapter: its KV goes now
                for namespace in adapter_namespaces(unloaded):
                    self.cache.evict_namespace(namespace, self.kv.free)
        if req in self.running:
            self.running.remove(req)
        if req in self.prefilling:
            self.prefilling.remove(req)
        req.row, req.last_node, req.slots, req.tree_len = None, None, SlotList(), 0

