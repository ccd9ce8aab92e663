"""LongRoPE's switch (Phi-3.5, Phi-3 128K): a sequence is rotated with the short factors while it is
at most `long_rope_len` tokens long and wholly with the long ones past it, as transformers' Phi-3
generates (its generate drops the cache there). A mixin of Scheduler."""
from __future__ import annotations

import logging

from radixflow.runtime.core.request import Req, Status, long_rope_namespace

log = logging.getLogger(__name__)


class LongRopeSwitch:
    """The scheduler's part of LongRoPE (Scheduler sets the state below and provides `_release`).
    `long_rope_len` None: the model has no LongRoPE and every method here does nothing."""

    long_rope_len: int | None
    waiting: list[Req]
    running: list[Req]

    def _pick_rope(self, req: Req) -> None:
        """A waiting request longer than the short factors' context takes the long ones, and its KV
        their namespace. Only while it holds no KV."""
        if self.long_rope_len is not None and not req.long_rope and req.seq_len > self.long_rope_len:
            req.long_rope, req.namespace = True, long_rope_namespace(req.namespace)

    def _restart_past_short_rope(self) -> None:
        """A running request whose next token would sit past the short factors' context is computed
        again from its first token with the long factors (its short KV stays cached for others).
        Not a preemption: it goes back to the queue's head, and its tokens so far stay."""
        if self.long_rope_len is None:
            return
        for req in [r for r in self.running if not r.long_rope and r.seq_len > self.long_rope_len]:
            log.debug("%s passes %d tokens: computed again with LongRoPE's long factors", req.rid,
                      self.long_rope_len)
            self._release(req)  # type: ignore[attr-defined]
            req.status = Status.WAITING
            self._pick_rope(req)
            self.waiting.insert(0, req)

    def _crosses_next_step(self) -> bool:
        """Overlap scheduling: whether a running request's pending token (at position kv_len) passes
        the short factors' context (the step is then scheduled as usual, which restarts it)."""
        return self.long_rope_len is not None and any(
            not r.long_rope and r.kv_len >= self.long_rope_len for r in self.running)

    def _drafts_within_rope(self, req: Req, drafts: list[int]) -> list[int]:
        """`drafts` of `req` cut so that a short sequence's verify rows stay inside the short context
        (no logits past it under the short factors)."""
        if self.long_rope_len is None or req.long_rope:
            return drafts
        return drafts[:max(0, self.long_rope_len - 1 - req.kv_len)]
