"""The engine thread: one thread owns the scheduler, the step runner and every request in flight.

    callers (any thread) ── submit / call / post ──▶ inbox ──▶ engine thread: apply, step, hand out
                                                                     │
    waiters ◀── notify / publish (events, loops' channels) ◀─────────┘ finished: `hand_out`

Every submitted request is answered exactly once, through `_account`, with a finish reason:
`stop`, `length`, `abort` (with a message: a client abort, a request that outgrew the KV cache,
shutdown) or `error` (with a message: a fault of its own or of its step). If the thread dies
anyway, every waiter is failed at once and new work is refused (EngineDeadError).
"""
from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from radixflow.runtime.config import EngineConfig
from radixflow.runtime.core.model_runner import ModelRunner
from radixflow.runtime.core.output import finalize_text
from radixflow.runtime.core.priority import DISPLACED, queue_victim
from radixflow.runtime.core.publish import OutputSink, publish
from radixflow.runtime.core.request import Req, adapter_namespaces
from radixflow.runtime.core.scheduler import Scheduler
from radixflow.runtime.core.step import StepRunner, error_reason, notify
from radixflow.runtime.errors import EngineClosedError, EngineDeadError, QueueFullError
from radixflow.runtime.lora.request_counts import AdapterRequestCounts
from radixflow.runtime.lora.service import LoraService
from radixflow.runtime.slo import SLOs, Goodput
from radixflow.runtime.stats import EngineStats, RequestTiming

log = logging.getLogger(__name__)

SHUTDOWN_REASON = {"type": "abort", "message": "the engine shut down"}
PAUSE_REASON = {"type": "abort", "message": "aborted: generation paused"}
PAUSE_MODES = ("abort", "retract", "in_place")


class EngineLoop:
    """Runs the engine thread (started on construction). Callers only hand work over: `submit`
    a request, `call` a function on the thread and wait for its value, `post` an abort or a
    namespace to drop; `stop` ends the thread after aborting what is in flight."""

    def __init__(self, config: EngineConfig, runner: ModelRunner, scheduler: Scheduler, step: StepRunner,
                 loras: LoraService | None, by_adapter: AdapterRequestCounts | None) -> None:
        self.config, self.runner, self.scheduler, self.step = config, runner, scheduler, step
        self.loras, self.by_adapter = loras, by_adapter
        self.inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.active: set[str] = set()  # rids submitted and not yet finished
        # the n > 1 request rids (Req.group) of those, with how many: `abort(rid)` ends a group's
        # members, so a group's rid is in use as long as one of them is
        self.groups: dict[str, int] = {}
        self.lock = threading.Lock()   # guards `active`, `groups`, `displacing` and the stopped state
        self.displacing: set[str] = set()  # waiting rids a request of higher priority is displacing
        self.finish_listeners: list[Callable[[RequestTiming], None]] = []
        self.recent_timings: deque[RequestTiming] = deque(maxlen=10000)
        self.invariant_violations: list[str] = []  # with check_invariants: what broke, per step
        self.stats = EngineStats(kv_slots_total=runner.kv_pool.capacity,
                                 by_lora=None if by_adapter is None else by_adapter.snapshot())
        self._goodput = Goodput(SLOs.from_ms(config.slo_ttft_ms, config.slo_itl_ms, config.slo_e2e_ms))
        self._finished_counts: dict[str, int] = {}
        self._finished_prompt_tokens = 0
        self._num_listener_errors = 0
        self._closed = False
        self._dead: BaseException | None = None
        self._fresh = False  # stats refreshed as this step's outputs were posted
        self._idle_calls: list[_Call] = []  # call_when_idle's, waiting for the running requests to end
        self.paused: str | None = None  # pause_generation's mode until continue_generation
        step.before_publish = self._refresh_before_publish
        self._thread = threading.Thread(target=self._run, name="radixflow-engine", daemon=True)
        self._thread.start()

    # -- callers' side ----------------------------------------------------------------------------

    def submit(self, req: Req) -> None:
        """Queue `req`; ValueError for a rid in flight (as a request's or a group's), QueueFullError
        past the in-flight cap unless, with priority scheduling, it outranks a waiting request,
        which it displaces (that one ends with reason abort, unless admitted meanwhile)."""
        limit = self.config.max_queued_requests + self.config.max_num_seqs
        with self.lock:
            self._refuse_if_stopped()
            if req.rid in self.active or req.rid in self.groups:
                raise ValueError(f"request id {req.rid!r} is already in use")
            if req.group in self.active:
                raise ValueError(f"request id {req.group!r} is already in use")
            if len(self.active) >= limit:
                # NOTE: a copy of the engine thread's queue, read whole under the GIL.
                victim = queue_victim(self.scheduler.priority, list(self.scheduler.waiting), req, self.displacing)
                if victim is None:
                    raise QueueFullError(f"{len(self.active)} requests are in flight (max_num_seqs + "
                                         f"max_queued_requests = {limit}); retry later")
                self.displacing.add(victim.rid)
                self.inbox.put(("displace", victim))
            self.active.add(req.rid)
            if req.group is not None:
                self.groups[req.group] = self.groups.get(req.group, 0) + 1
            self.inbox.put(("add", req))

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the engine thread between steps (none in flight); its value or error."""
        call = _Call(fn)
        with self.lock:
            self._refuse_if_stopped()
            self.inbox.put(("call", call))
        return call.result()

    def call_when_idle(self, fn: Callable[[], Any], abort_reason: dict | None = None) -> Any:
        """Run `fn` on the engine thread once no request holds KV; its value or error. Until then
        nothing waiting is admitted (it stays queued) while the running requests go on to their
        ends; admission resumes after `fn`. `abort_reason`: first finish every request in flight
        with it (the waiting ones too), so `fn` runs at once."""
        call = _Call(fn)
        with self.lock:
            self._refuse_if_stopped()
            self.inbox.put(("when_idle", (call, abort_reason)))
        return call.result()

    def post(self, kind: str, payload: Any) -> None:
        """Queue without waiting: ("abort", (rid, reason)), ("abort_sink", (sink, reason)) or
        ("drop", namespace)."""
        self.inbox.put((kind, payload))

    def stop(self) -> None:
        """Abort everything in flight and end the thread. Idempotent; later calls and submits
        raise EngineClosedError."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            self.inbox.put(("stop", None))
        self._thread.join(timeout=30)

    @property
    def is_healthy(self) -> bool:
        """False once the thread died or stopped."""
        return self._dead is None and not self._closed and self._thread.is_alive()

    def _refuse_if_stopped(self) -> None:
        """Raise when no more work is taken (call with `lock` held)."""
        if self._dead is not None:
            raise EngineDeadError(f"the engine loop died: {self._dead!r}")
        if self._closed:
            raise EngineClosedError("the engine is shut down")

    # -- engine thread: requests between steps --------------------------------------------------

    def finish_all(self, reason: dict) -> None:
        """Finish every request in flight with `reason`."""
        self.scheduler.finish_all(reason)
        self.hand_out()

    def hand_out(self) -> bool:
        """Answer the requests that finished, the stats refreshed first (a caller woken by its
        request reads stats that count it as done). Whether there were any."""
        reqs = [req for req in self.scheduler.take_finished() if self._account(req)]
        if not reqs:
            return False
        self._refresh_stats()
        for req in reqs:
            notify(req, True)
            publish([req])
        return True

    def drop_namespace(self, namespace: str) -> None:
        """Free the cached KV and adapter slot of a LoRA namespace no name refers to. A no-op when
        a name was loaded with that content again meanwhile."""
        assert self.loras is not None
        if self.loras.registry.is_loaded(namespace):
            return
        for ns in adapter_namespaces(namespace):  # and its LongRoPE long sequences' KV
            self.scheduler.cache.evict_namespace(ns, self.runner.kv_pool.free)
        self.loras.capacity.forget(namespace)

    def check_invariants_now(self) -> None:
        """Raise AssertionError when the KV slot accounting (and with check_invariants, the slot
        tables and the cache) is broken."""
        self.scheduler.check_accounting()
        if self.config.check_invariants:
            self.scheduler.check_slots()
            self.scheduler.cache.check()

    # -- engine thread: the loop ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
            self._close_out()
        except BaseException as exc:  # noqa: BLE001 - the thread's last word: fail everyone, then end
            log.critical("the engine loop died; failing every request in flight", exc_info=exc)
            self._die(exc)

    def _serve(self) -> None:
        """Step while there is work; return when asked to stop."""
        while True:
            if not self._drain_inbox(block=not self._can_step()):
                return
            if not self._can_step():
                continue
            self._fresh = False
            try:
                stepped = self.step.run_one()
            except Exception as exc:  # a scheduling bug: fail what is in flight, keep serving
                log.exception("engine step failed outside its fault isolation; failing all requests")
                self.step.discard()
                self.scheduler.finish_all(error_reason(exc))
                stepped = True
            refreshed = self.hand_out() or self._fresh
            self._run_idle_calls()
            if self.config.check_invariants:
                self._check_invariants()
                refreshed = False  # its violations count
            if not refreshed:
                self._refresh_stats()
            if not stepped:
                self._drain_inbox(block=True, timeout=0.005)

    def _can_step(self) -> bool:
        """Whether a step may be scheduled: not paused in place, and while admission is paused
        only for what holds KV already (the queue waits without the loop polling it)."""
        s = self.scheduler
        if self.paused == "in_place":
            return False
        return bool(s.running or s.prefilling) if s.admission_paused else s.has_work()

    def _drain_inbox(self, block: bool, timeout: float | None = None) -> bool:
        """Apply queued commands; False once asked to stop."""
        try:
            item = self.inbox.get(block=block, timeout=timeout)
        except queue.Empty:
            return True
        while True:
            kind, payload = item
            if kind == "stop":
                return False
            if kind == "add":
                self.scheduler.add(payload)
            else:  # it changes or reads requests between steps: none may be in flight
                self.step.drain()
                self.hand_out()  # what the drained step finished: no step may follow to answer them
                self._apply(kind, payload)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                self._refresh_stats()
                return True

    def _apply(self, kind: str, payload: Any) -> None:
        if kind == "abort":
            self.scheduler.abort(payload[0], reason=payload[1])
            self.hand_out()
        elif kind == "abort_sink":
            sink, reason = payload
            self._abort_sink(sink, reason)
        elif kind == "call":
            payload.run()
        elif kind == "drop":
            self.drop_namespace(payload)
        elif kind == "when_idle":
            self._add_idle_call(*payload)
        elif kind == "displace":
            self._displace(payload)
        self._run_idle_calls()  # an abort (or a call) may have ended the last request an update waits for

    def _add_idle_call(self, call: _Call, abort_reason: dict | None) -> None:
        if abort_reason is not None:
            self.finish_all(abort_reason)
        if self.paused == "in_place" and self.scheduler.num_running:
            call.fail(ValueError(f"generation is paused in place with {self.scheduler.num_running} requests "
                                 "holding KV, which would wait for ever: continue_generation first, or pause "
                                 "with mode abort or retract"))
            return
        self._idle_calls.append(call)
        self._set_admission()

    def _run_idle_calls(self) -> None:
        """Run call_when_idle's calls once no request holds KV, then admit again (unless paused)."""
        if not self._idle_calls or self.scheduler.num_running:
            return
        self.step.drain()
        calls, self._idle_calls = self._idle_calls, []
        for call in calls:
            call.run()
        self._set_admission()

    def _set_admission(self) -> None:
        """The scheduler admits nothing while generation is paused or an update waits."""
        self.scheduler.admission_paused = self.paused is not None or bool(self._idle_calls)

    # -- engine thread: pausing -------------------------------------------------------------------

    def pause(self, mode: str) -> None:
        """Stop generating until `resume` (SGLang's pause_generation). `abort`: every request in
        flight ends (finish_reason abort); `retract`: the running go back to the queue's head,
        their KV to the prefix cache; `in_place`: no step runs, the running keep their KV.
        Requests submitted meanwhile wait in the queue. Pausing again changes the mode."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
        if mode == "in_place" and self._idle_calls:
            raise ValueError("a weight update is waiting for the running requests to end: pausing them in place "
                             "would hold it for ever (pause with mode abort or retract)")
        if mode == "abort":
            self.finish_all(PAUSE_REASON)
        elif mode == "retract":
            self.scheduler.retract_all()
        self.paused = mode
        self._set_admission()
        self._run_idle_calls()

    def resume(self) -> None:
        """Generate again after `pause` (a no-op when not paused)."""
        self.paused = None
        self._set_admission()

    def _abort_sink(self, sink: OutputSink, reason: dict) -> None:
        self.scheduler.finish_where(lambda r: r.sink is sink, reason)
        self.hand_out()

    def _close_out(self) -> None:
        """After a stop: abort what the scheduler holds and whatever is still queued."""
        self.step.drain()
        self.step.close()
        self.finish_all(SHUTDOWN_REASON)
        for call in self._idle_calls:
            call.fail(EngineClosedError("the engine is shut down"))
        for req in self._drain_queued(EngineClosedError("the engine is shut down")):
            req.finish(SHUTDOWN_REASON)
            self._answer(req)
        self._refresh_stats()

    def _die(self, exc: BaseException) -> None:
        """The loop cannot go on: answer every request and call in flight with an error.
        Engine state may be inconsistent here, so KV is not given back."""
        with self.lock:
            self._dead = exc
        self.step.close(wait=False)
        reason = {"type": "error", "message": f"the engine loop died: {exc!r}"}
        reqs = list(self.scheduler.waiting) + self.scheduler.holding() + self.scheduler.done
        reqs += self._drain_queued(EngineDeadError(reason["message"]))
        for call in self._idle_calls:
            call.fail(EngineDeadError(reason["message"]))
        for req in reqs:
            req.finish(reason)
            self._answer(req)

    def _drain_queued(self, error: Exception) -> list[Req]:
        """Empty the inbox once the loop stops serving: calls fail with `error`; returns the
        requests that were queued but never added."""
        queued = []
        while True:
            try:
                kind, payload = self.inbox.get_nowait()
            except queue.Empty:
                return queued
            if kind == "add":
                queued.append(payload)
            elif kind == "call":
                payload.fail(error)
            elif kind == "when_idle":
                payload[0].fail(error)

    def _displace(self, req: Req) -> None:
        """End waiting `req` for a request of higher priority that took its place in a full
        queue; nothing if it was admitted (or ended) meanwhile."""
        with self.lock:
            self.displacing.discard(req.rid)
        if req in self.scheduler.waiting:
            self.scheduler.finish(req, DISPLACED)
            self.hand_out()

    def _check_invariants(self) -> None:
        try:
            self.check_invariants_now()
        except AssertionError as exc:
            log.error("engine invariant violated after step %d: %s", self.step.num_steps, exc)
            self.invariant_violations.append(str(exc))

    # -- engine thread: the way out ---------------------------------------------------------------

    def _answer(self, req: Req) -> None:
        """Account for one finished request and wake its waiter (outside hand_out)."""
        if self._account(req):
            notify(req, True)
            publish([req])

    def _account(self, req: Req) -> bool:
        """The one way out: every request passes here exactly once (False for a second time,
        which is an invariant violation). Its final text, timing and counters; a failure here
        is logged and the request is still answered."""
        try:
            finalize_text(req)
        except Exception as exc:  # its detokenizer failed on the held-back tail
            log.error("request %s: final detokenization failed", req.rid, exc_info=exc)
            req.finish_reason = error_reason(exc)
        with self.lock:
            if req.rid not in self.active:
                self.invariant_violations.append(f"request {req.rid!r} finished more than once")
                log.error("request %s finished more than once", req.rid)
                return False
            self.active.discard(req.rid)
            if req.group is not None:
                left = self.groups.pop(req.group) - 1
                if left:
                    self.groups[req.group] = left
        try:
            self._record(req)
        except Exception:  # noqa: BLE001 - a bookkeeping bug must not leave its caller waiting
            self._num_listener_errors += 1
            log.exception("request %s: finish bookkeeping failed", req.rid)
        return True

    def _record(self, req: Req) -> None:
        timing = self._timing(req)
        self.recent_timings.append(timing)
        good, missed = self._goodput.observe(timing)
        if self.by_adapter is not None:
            self.by_adapter.finished(timing, good, missed)
        for fn in self.finish_listeners:
            try:
                fn(timing)
            except Exception:  # the listener's bug: log it, keep serving
                self._num_listener_errors += 1
                log.exception("finish listener %r failed for request %s", fn, req.rid)

    def _timing(self, req: Req) -> RequestTiming:
        """A finished request's timing record; counts it by finish reason."""
        t = req.times
        reason = (req.finish_reason or {}).get("type", "abort")
        self._finished_counts[reason] = self._finished_counts.get(reason, 0) + 1
        self._finished_prompt_tokens += len(req.prompt_ids)
        return RequestTiming(req.rid, t.arrival, t.scheduled, t.first_token, t.finished or t.arrival,
                             tuple(t.tokens), len(req.prompt_ids), len(req.output_ids), req.cached_len, reason,
                             tuple(req.miss_tokens.items()), req.divergent_at, req.session_id,
                             None if self.loras is None else req.lora_name or "")

    def _refresh_before_publish(self) -> None:
        self._refresh_stats()
        self._fresh = True

    def _refresh_stats(self) -> None:
        s, pool, cache, g, step = self.scheduler, self.runner.kv_pool, self.scheduler.cache, self._goodput, self.step
        self.stats = EngineStats(
            num_running=s.num_running, num_waiting=s.num_waiting,
            kv_slots_used=pool.capacity - pool.num_free - cache.evictable_size(),
            kv_slots_total=pool.capacity, num_preemptions=s.num_preemptions,
            prefix_hit_tokens=cache.hit_tokens, prefix_query_tokens=cache.query_tokens,
            prefill_tokens_computed=step.prefill_tokens, prompt_tokens=self._finished_prompt_tokens,
            generated_tokens=step.generated_tokens,
            num_steps=step.num_steps, num_mixed_steps=step.num_mixed_steps,
            spec_draft_tokens=step.num_draft_tokens, spec_accepted_tokens=step.num_accepted_drafts,
            num_finished=sum(self._finished_counts.values()),
            finish_counts=dict(self._finished_counts),
            invariant_violations=len(self.invariant_violations), listener_errors=self._num_listener_errors,
            failed_steps=step.num_failed_steps, miss_tokens=dict(step.miss_tokens),
            evicted_tokens=cache.evicted_tokens, kv_lifetime=cache.lifetime.snapshot(),
            reuse_gap=cache.reuse_gap.snapshot(), good_requests=g.good_requests,
            admission_paused=s.admission_paused, weight_updates=self.runner.num_weight_updates,
            slo_violations=dict(g.violations), num_sessions=g.num_sessions, num_bad_sessions=g.num_bad_sessions,
            **({} if self.loras is None else self.loras.stats()),
            by_lora=None if self.by_adapter is None else self.by_adapter.snapshot())


class _Call:
    """A function to run on the engine thread, and its caller waiting for the outcome."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._value = self.fn()
        except Exception as exc:  # handed back to the calling thread
            self._error = exc
        self._done.set()

    def fail(self, exc: BaseException) -> None:
        self._error = exc
        self._done.set()

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value
