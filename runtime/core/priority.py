"""Request priorities: the order they give the waiting queue, and which running requests a
waiting one may preempt (SGLang's priority scheduling; Scheduler's mixin below)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixflow.runtime.core.request import Req
from radixflow.runtime.core.schedule_policy import match_key

if TYPE_CHECKING:
    from radixflow.radix import RadixCache
    from radixflow.runtime.config import EngineConfig
    from radixflow.runtime.core.kv_pool import ReqToTokenPool
    from radixflow.runtime.core.scheduler import SchedulerLimits
    from radixflow.runtime.lora.capacity import AdapterAdmission

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PriorityRules:
    """How `Req.priority` ranks requests. Off (the default), every request ranks alike."""

    enabled: bool = False
    low_values_first: bool = False  # vLLM's convention; SGLang's default serves larger values first
    preemption: bool = True
    threshold: int = 10             # a waiting request preempts only past this difference
    default: int = 0                # the priority of a request that gives none

    def rank(self, req: Req) -> int:
        """Smaller is served first; 0 for every request while priorities are off."""
        if not self.enabled:
            return 0
        value = self.default if req.priority is None else req.priority
        return value if self.low_values_first else -value

    def may_preempt(self, waiting: Req, running: Req) -> bool:
        return self.enabled and self.preemption and self.rank(running) - self.rank(waiting) > self.threshold


NO_PRIORITIES = PriorityRules()


DISPLACED = {"type": "abort", "message": "the queue was full and a request of higher priority took this request's place"}


def queue_victim(rules: PriorityRules, waiting: list[Req], req: Req, spared: set[str]) -> Req | None:
    """The waiting request that `req` displaces from a full queue (SGLang's rule): the one ranked
    last (the latest to arrive among equals), when `req` outranks it; None otherwise, or while
    priorities are off. `spared`: rids already chosen by an earlier displacement."""
    if not rules.enabled:
        return None
    candidates = [w for w in waiting if w.rid not in spared]
    if not candidates:
        return None
    victim = max(candidates, key=lambda w: (rules.rank(w), w.times.arrival))
    return victim if rules.rank(victim) > rules.rank(req) else None


def priority_rules(config: EngineConfig) -> PriorityRules:
    """The engine config's priority flags (SGLang's names) as rules."""
    default = config.default_priority_value
    return PriorityRules(config.enable_priority_scheduling, config.schedule_low_priority_values_first,
                         not config.disable_priority_preemption, config.priority_scheduling_preemption_threshold,
                         0 if default is None else default)


class PriorityPreemption:
    """Scheduler's priority preemption (a mixin of Scheduler, which sets the state below and
    provides `_retract`, `_future_decode`, `_reserved_decode`, `_available`, `num_running`).

    A request partway through a chunked prefill that the first-ranked waiting request outranks
    by more than the threshold is retracted first (nothing else is admitted while it chunks; its
    chunks so far stay in the tree). Then, when that request cannot be admitted for want of a
    batch seat or of KV, running requests it outranks by more than the threshold are retracted
    (lowest priority first, then the least advanced) until it fits: their KV goes to the tree and
    they wait again. Nothing is retracted unless what they free would be enough. A plan that
    found nothing to do is not made again until the queue, the tree or the holders change
    (`_queue_changed`).
    """

    limits: SchedulerLimits
    priority: PriorityRules
    adapters: AdapterAdmission
    cache: RadixCache
    req_pool: ReqToTokenPool
    waiting: list[Req]
    running: list[Req]
    prefilling: list[Req]
    admission_paused: bool
    _preemption_idle: bool

    def _preemption_head(self) -> Req | None:
        """The first-ranked waiting request when it outranks a holder enough to preempt it (no
        prefix match), else None; a None is not worked out again until the sets change."""
        rules = self.priority
        if not (rules.enabled and rules.preemption) or self._preemption_idle or not self.waiting \
                or self.admission_paused:
            return None
        head = min(self.waiting, key=rules.rank)
        possible = any(rules.may_preempt(head, r) for r in self.running + self.prefilling)
        self._preemption_idle = not possible
        return head if possible else None

    def _preemption_possible(self) -> bool:
        return self._preemption_head() is not None

    def _preempt_for_priority(self) -> int:
        """Retract what the first-ranked waiting request needs gone to be admitted; how many."""
        head = self._preemption_head()
        if head is None:
            return 0
        chunked = [r for r in self.prefilling if self.priority.may_preempt(head, r)]
        for req in chunked:  # out first: the room the others are judged on counts what it frees
            self._preempt(req)
        victims = self._preemption_victims(head)
        self._preemption_idle = not (chunked or victims)
        for req in victims:
            self._preempt(req)
        return len(chunked) + len(victims)

    def _preempt(self, req: Req) -> None:
        log.debug("preempting %s (priority %s) for a waiting request of higher priority", req.rid, req.priority)
        self._retract(req, reestimate=False)

    def _preemption_victims(self, head: Req) -> list[Req]:
        """The running requests to retract so that `head` fits, or [] when it fits already or
        retracting every request it outranks would not be enough."""
        candidates = [r for r in self.running if self.priority.may_preempt(head, r)]
        if not candidates or not self.adapters.can_admit(head):
            return []
        candidates.sort(key=lambda r: (-self.priority.rank(r), len(r.output_ids)))
        need_seat = self.num_running >= self.limits.max_num_seqs or self.req_pool.num_free_rows == 0
        match = self.cache.match_prefix(match_key(head), head.namespace)
        need = head.seq_len - match.length + self._future_decode(head)
        # Admission locks the matched prefix before judging the fit: its evictable part stops counting.
        shortfall = need + self.cache.num_unlocked_on_path(match.node) - self._available(self._reserved_decode())
        victims: list[Req] = []
        for req in candidates:
            if shortfall <= 0 and (victims or not need_seat):
                break
            victims.append(req)
            shortfall -= self._freed_by_retracting(req)
        return victims if shortfall <= 0 and (victims or not need_seat) else []

    def _freed_by_retracting(self, req: Req) -> int:
        """At least what retracting `req` adds to `_available`: its KV not yet in the tree (freed
        or evictable once inserted), the tree nodes only it locks, and its reserved decode.
        Nodes it shares with another victim are not counted (an underestimate)."""
        owned = req.kv_len - req.tree_len
        return owned + self.cache.num_sole_locked_on_path(req.last_node) + self._future_decode(req)
