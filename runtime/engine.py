"""The Engine: public API, request intake, and the loop thread that steps the scheduler.

Callers on any thread (or asyncio loop) submit requests; one background thread owns every
piece of engine state (scheduler, pools, cache, requests) and runs steps. Results travel back
through per-request callbacks that only hand data over (threading.Event or
`loop.call_soon_threadsafe`); no caller ever touches engine state directly.

Every submitted request is answered exactly once, through `_on_finished`, with a finish reason:
`stop`, `length`, `abort` (with a message: a client abort, a request that outgrew the KV cache,
shutdown) or `error` (with a message: a fault of its own or of its step). If the loop thread
dies anyway, every waiter is failed at once and the engine refuses new work (EngineDeadError).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import torch

from radixflow.radix import NullCache, RadixCache
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.grammar.compiler import GrammarCompiler
from radixflow.runtime.core.faults import NO_FAULTS, FaultInjector
from radixflow.runtime.model.model_path import resolve_model_path
from radixflow.runtime.core.model_runner import ModelRunner
from radixflow.runtime.core.output import finalize_text
from radixflow.runtime.core.request import LogprobOptions, Req, new_rid
from radixflow.runtime.result import make_result
from radixflow.runtime.core.publish import OutputSink, StreamCursor, publish
from radixflow.runtime.output_channel import ChannelsByLoop
from radixflow.runtime.stream_chunks import StreamChunks
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.core.scheduler import Scheduler, SchedulerLimits
from radixflow.runtime.lora.capacity import NO_ADAPTERS
from radixflow.runtime.lora.request_counts import AdapterRequestCounts
from radixflow.runtime.lora.service import LoraService, check_lora_request
from radixflow.runtime.slo import SLOs, Goodput
from radixflow.runtime.stats import EngineStats, RequestTiming
from radixflow.runtime.core.step import StepRunner, error_reason, notify
from radixflow.runtime.errors import EngineClosedError, EngineDeadError, QueueFullError
from radixflow.runtime.request_inputs import InputIds, Prompt, check_prompt, normalize_inputs, stream_inputs
from radixflow.runtime.text.output_text import OutputText
from radixflow.runtime.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_SHUTDOWN = {"type": "abort", "message": "the engine shut down"}


class Engine:
    """An LLM engine with a persistent radix prefix cache and continuous batching.

    `Engine()` serves the default model (SmolLM2-135M-Instruct); `Engine(path, **config)` a Hugging
    Face directory or a GGUF file, config names as in EngineConfig. Use as a context manager or call `shutdown()`.
    Grammars (`regex`, `json_schema`, `choices`) compile in the caller's thread before a request
    is submitted (cached; a failure or timeout raises ValueError), never on the engine loop.
    """

    supports_grammar = True  # the HTTP server enables response_format / regex / json_schema

    def __init__(self, model: str | None = None, **config: Any) -> None:
        self.config = EngineConfig.from_kwargs(model=model, **config)
        self.model_path = resolve_model_path(model)
        self.tokenizer = Tokenizer.from_pretrained(self.model_path, self.config.chat_template)
        self.runner = ModelRunner(self.config, self.model_path)
        self.max_context_len = self.runner.shape.max_context_len
        cache = NullCache() if self.config.disable_radix_cache else RadixCache()
        limits = SchedulerLimits(
            max_num_seqs=self.config.max_num_seqs, max_prefill_tokens=self.config.max_prefill_tokens,
            chunked_prefill_size=self.config.chunked_prefill_size, max_context_len=self.max_context_len,
            policy=self.config.schedule_policy, lpm_fcfs_threshold=self.config.lpm_fcfs_threshold)
        slots = self.runner.lora_slots
        self.loras = None if slots is None else LoraService(self.config, self.runner.args, slots)
        self.scheduler = Scheduler(limits, self.runner.kv_pool, self.runner.req_pool, cache,
                                   NO_ADAPTERS if self.loras is None else self.loras.capacity)
        self.eos_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(self.runner.args.eos_token_ids)
        self.grammar = GrammarCompiler(self.tokenizer, self.runner.args.vocab_size, self.eos_ids,
                                       self.config.grammar_backend, self.config.grammar_timeout_s,
                                       self.config.jump_forward)
        self._step = StepRunner(self.runner, self.scheduler, self.eos_ids, self.max_context_len,
                                torch.Generator(self.runner.device).manual_seed(self.config.seed),
                                overlap=self.config.enable_overlap)
        # with LoRA: per-request counters by adapter too, for series labelled lora_name
        self._by_adapter = None if self.loras is None else AdapterRequestCounts()
        self._step.by_adapter = self._by_adapter
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._active: set[str] = set()
        self._active_lock = threading.Lock()
        self._finish_listeners: list[Callable[[RequestTiming], None]] = []
        self._channels = ChannelsByLoop()
        self.recent_timings: deque[RequestTiming] = deque(maxlen=10000)
        self._stats = EngineStats(kv_slots_total=self.runner.kv_pool.capacity,
                                  by_lora=None if self._by_adapter is None else self._by_adapter.snapshot())
        self._goodput = Goodput(SLOs.from_ms(self.config.slo_ttft_ms, self.config.slo_itl_ms, self.config.slo_e2e_ms))
        self._finished_counts: dict[str, int] = {}
        self._finished_prompt_tokens = 0
        self._closed = False
        self._dead: BaseException | None = None
        self.invariant_violations: list[str] = []  # with check_invariants: what broke, per step
        self._num_listener_errors = 0
        self._thread = threading.Thread(target=self._loop, name="radixflow-engine", daemon=True)
        self._thread.start()

    # -- public API -------------------------------------------------------------------------

    def generate(self, prompt: Prompt = None, sampling_params: dict | list[dict] | SamplingParams | None = None,
                 input_ids: InputIds = None, *, return_logprob: bool = False,
                 logprob_start_len: int | None = None, top_logprobs_num: int = 0,
                 return_text_in_logprobs: bool = False, rid: str | list[str] | None = None,
                 lora_path: str | None = None, session_id: str | None = None,
                 lora: str | None = None) -> dict | list[dict]:
        """Generate for one prompt (→ one result) or a list (→ a list, in order).

        Results are shaped like SGLang's native /generate response. With n > 1 each prompt
        gives n results (a list for one prompt) after one shared prefill. `lora`: an adapter
        name (`lora_path`, as SGLang's: a name, or a path under lora_dir).
        """
        lora_path = lora if lora is not None else lora_path
        prompts, is_batch = self._normalize_inputs(prompt, input_ids)
        if isinstance(sampling_params, list):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"got {len(sampling_params)} sampling_params for {len(prompts)} prompts")
            sps = [SamplingParams.from_dict(p) for p in sampling_params]
        else:
            sps = [SamplingParams.from_dict(sampling_params)] * len(prompts)
        opts = LogprobOptions(return_logprob, logprob_start_len, top_logprobs_num)
        rids = self._normalize_rids(rid, len(prompts))
        for ids, sp in zip(prompts, sps):
            self.validate_prompt(ids, sp)
        for sp in sps:  # every grammar compiles (or fails) before anything is submitted
            self.grammar.compile(sp)
        groups = [self._make_group(ids, sp, opts, r, lora_path, session_id, checked=True)
                  for ids, sp, r in zip(prompts, sps, rids)]
        for group in groups:
            for _, ev in group:
                ev.wait()
        decode = self._decode_token if return_text_in_logprobs else None
        out = []
        for group, sp in zip(groups, sps):
            res = [make_result(q, decode, return_text_in_logprobs) for q, _ in group]
            out.append(res[0] if sp.n == 1 else res)
        return out if is_batch else out[0]

    async def generate_stream(self, prompt: str | None = None,
                              sampling_params: dict | SamplingParams | None = None,
                              input_ids: list[int] | None = None, *, return_logprob: bool = False,
                              logprob_start_len: int | None = None, top_logprobs_num: int = 0,
                              return_text_in_logprobs: bool = False, rid: str | None = None,
                              lora_path: str | None = None, session_id: str | None = None,
                              lora: str | None = None) -> AsyncIterator[dict]:
        """Yield SGLang-style stream chunks: cumulative `text` and `output_ids`; logprob lists
        hold only the entries new since the previous chunk. Closing the iterator early (a
        client gone away) aborts the request."""
        ids, sp = stream_inputs(self.tokenizer, prompt, input_ids, sampling_params)
        lora_path = lora if lora is not None else lora_path
        loop = asyncio.get_running_loop()
        opts = LogprobOptions(return_logprob, logprob_start_len, top_logprobs_num)
        channel = self._channels.get(loop)
        start = functools.partial(self.start_stream, ids, sp, opts, self._normalize_rids(rid, 1)[0],
                                  lora_path, session_id, channel)
        # A grammar compiles in a worker thread: the event loop must not wait for it.
        req = await loop.run_in_executor(None, start) if sp.is_constrained else start()
        chunks = StreamChunks(req.rid, len(req.prompt_ids), opts,
                              self._decode_token if return_text_in_logprobs else None, return_text_in_logprobs,
                              sp.stream_interval or self.config.stream_interval)
        # Opened after the submit succeeded (a rid in use must not take another stream's queue),
        # before this coroutine yields: outputs are delivered on this loop's thread only.
        outputs = channel.open(req.rid)
        done = False
        try:
            while not done:
                batch = await outputs.take()  # fell behind: one chunk for all that arrived
                done = batch[-1].finish_reason is not None
                chunk = chunks.add(batch)
                if chunk is not None:
                    yield chunk
        finally:
            channel.close(req.rid)
            if not done:
                self.abort(req.rid)

    def start_stream(self, ids: list[int], sp: SamplingParams, opts: LogprobOptions, rid: str | None,
                     lora: str | None, session_id: str | None, sink: OutputSink, with_text: bool = True) -> Req:
        """Submit one request whose outputs go to `sink` (one StepOutput per step, posted on the
        engine thread); returns it. Raises what validation or a full queue raises; a grammar
        compiles here, so call it off any event loop when `sp.is_constrained`. `with_text=False`:
        its outputs carry token ids only (no detokenizing, no stop strings: the caller's)."""
        req = self._make_req(ids, sp, opts, rid, lora, None, with_text=with_text)
        req.sink, req.cursor, req.session_id = sink, StreamCursor(), session_id
        self._submit(req)
        return req

    def _decode_token(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def abort(self, rid: str, reason: dict | None = None) -> None:
        """Finish `rid` with reason abort (or `reason`) and free all it holds (no-op if
        unknown/finished)."""
        self._inbox.put(("abort", (rid, reason)))

    def abort_sink(self, sink: OutputSink, reason: dict) -> None:
        """Finish with `reason` every request in flight whose outputs go to `sink` (its consumer
        is gone)."""
        self._inbox.put(("abort_sink", (sink, reason)))

    def abort_all(self) -> None:
        """Finish every request in flight with reason abort (returns once done)."""
        def abort() -> None:
            self.scheduler.finish_all({"type": "abort", "message": "aborted"})
            self._hand_out()
        self._call_on_loop(abort)

    def flush_cache(self) -> bool:
        """Drop every unlocked prefix-cache entry. Returns True once done."""
        return bool(self._call_on_loop(self._flush))

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Load (or replace) adapter `name` from a PEFT directory; ValueError with the cause.
        Replacing a name's weights drops the KV cached for the old ones."""
        check_lora_request(self.loras, name)
        assert self.loras is not None
        self._drop_adapter_kv(self.loras.registry.load(name, path)[1])

    def unload_lora_adapter(self, name: str) -> None:
        """Forget adapter `name`; its cached KV is freed (unless another name has equal weights)."""
        check_lora_request(self.loras, name)
        assert self.loras is not None
        self._drop_adapter_kv(self.loras.registry.unload(name))

    def lora_adapters(self) -> dict[str, str]:
        """name -> path of the loaded adapters (empty without LoRA)."""
        return {} if self.loras is None else self.loras.registry.names()

    def _drop_adapter_kv(self, namespace: str | None) -> None:
        """Free the KV and slot of a namespace no name refers to; returns once done. What running
        requests hold goes when the last of them ends (AdapterCapacity.release)."""
        if namespace is not None:
            self._call_on_loop(lambda: self._drop_namespace(namespace))

    def _drop_namespace(self, namespace: str) -> None:
        """Engine thread. A no-op when a name was loaded with that content again meanwhile."""
        assert self.loras is not None
        if self.loras.registry.is_loaded(namespace):
            return
        self.scheduler.cache.evict_namespace(namespace, self.runner.kv_pool.free)
        self.loras.capacity.forget(namespace)

    def stats(self) -> EngineStats:
        return self._stats

    def add_finish_listener(self, fn: Callable[[RequestTiming], None]) -> None:
        """`fn(timing)` runs on the engine thread after each request finishes: keep it cheap."""
        self._finish_listeners.append(fn)

    def check_accounting(self) -> None:
        """Verify the KV slot accounting invariants (runs on the engine thread)."""
        self._call_on_loop(self._check_invariants_now)

    @property
    def is_healthy(self) -> bool:
        """False once the loop thread died or the engine shut down."""
        return self._dead is None and not self._closed and self._thread.is_alive()

    def set_fault_injector(self, injector: FaultInjector | None) -> None:
        """Test-only: make chosen step points raise (runtime/core/faults.py); None removes it."""
        def install() -> None:
            self._step.faults = injector or NO_FAULTS
        self._call_on_loop(install)

    def shutdown(self) -> None:
        """Abort everything in flight, wake every waiter, stop the loop. Idempotent; calls
        after it raise EngineClosedError."""
        with self._active_lock:
            if self._closed:
                return
            self._closed = True
            self._inbox.put(("stop", None))
        self._thread.join(timeout=30)
        self.grammar.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- request construction (caller threads) -----------------------------------------------

    def _normalize_inputs(self, prompt: Prompt, input_ids: InputIds) -> tuple[list[list[int]], bool]:
        return normalize_inputs(self.tokenizer, prompt, input_ids)

    @staticmethod
    def _normalize_rids(rid: str | list[str] | None, n: int) -> list[str | None]:
        if rid is None:
            return [None] * n
        rids = [rid] if isinstance(rid, str) else list(rid)
        if len(rids) != n:
            raise ValueError(f"got {len(rids)} rids for {n} prompts")
        return rids

    def validate_prompt(self, ids: list[int], sp: SamplingParams) -> None:
        """ValueError with the reason when a prompt can never be served."""
        check_prompt(ids, sp, self.runner.args.vocab_size, self.max_context_len, self.runner.kv_pool.capacity)

    def _make_req(self, ids: list[int], sp: SamplingParams, opts: LogprobOptions, rid: str | None,
                  lora_path: str | None, on_output: Callable[[Req, bool], None] | None,
                  checked: bool = False, with_text: bool = True) -> Req:
        """`checked`: the caller already ran validate_prompt(ids, sp) (an O(prompt) scan);
        `with_text=False`: tokens only, its text and stop strings are the caller's."""
        if not checked:
            self.validate_prompt(ids, sp)
        check_lora_request(self.loras, lora_path)
        opts.validate(len(ids), self.runner.args.vocab_size)
        req = Req(rid=rid or new_rid(), prompt_ids=ids, sampling=sp, logprob=opts, on_output=on_output)
        if self.loras is not None and lora_path is not None:
            orphan = self.loras.attach(req, lora_path)
            if orphan is not None:  # its file changed on disk: drop the old content's KV (no waiting here)
                self._inbox.put(("drop", orphan))
        if with_text:
            req.output_text = OutputText(self.tokenizer, sp, ids)
        if sp.seed is not None:
            req.generator = torch.Generator(self.runner.device).manual_seed(sp.seed)
        req.grammar = self.grammar.new_state(sp, opts.return_logprob)
        return req

    def _make_group(self, ids: list[int], sp: SamplingParams, opts: LogprobOptions, rid: str | None,
                    lora_path: str | None, session_id: str | None = None,
                    checked: bool = False) -> list[tuple[Req, threading.Event]]:
        """One request, or for n > 1 a prefill-only request first and then n that hit it."""
        if sp.n > 1:
            warm = SamplingParams.from_dict({"max_new_tokens": 0})
            (_, ev), = self._make_group(ids, warm, LogprobOptions(), None, lora_path)
            ev.wait()
        group = []
        for i in range(sp.n):
            child_sp = sp if sp.n == 1 else SamplingParams.from_dict(
                {**{f: getattr(sp, f) for f in sp.__struct_fields__}, "n": 1,
                 "seed": None if sp.seed is None else sp.seed + i})
            child_rid = rid if sp.n == 1 or rid is None else f"{rid}-{i}"
            ev = threading.Event()
            req = self._make_req(ids, child_sp, opts, child_rid, lora_path,
                                 lambda _r, finished, ev=ev: ev.set() if finished else None, checked=checked)
            req.session_id = session_id
            self._submit(req)
            group.append((req, ev))
        return group

    def _refuse_if_stopped(self) -> None:
        """Raise when the engine takes no more work (call with `_active_lock` held)."""
        if self._dead is not None:
            raise EngineDeadError(f"the engine loop died: {self._dead!r}")
        if self._closed:
            raise EngineClosedError("the engine is shut down")

    def _submit(self, req: Req) -> None:
        limit = self.config.max_queued_requests + self.config.max_num_seqs
        with self._active_lock:
            self._refuse_if_stopped()
            if req.rid in self._active:
                raise ValueError(f"request id {req.rid!r} is already in use")
            if len(self._active) >= limit:
                raise QueueFullError(f"{len(self._active)} requests are in flight (max_num_seqs + "
                                     f"max_queued_requests = {limit}); retry later")
            self._active.add(req.rid)
            self._inbox.put(("add", req))

    def _call_on_loop(self, fn: Callable[[], Any]) -> Any:
        call = _Call(fn)
        with self._active_lock:
            self._refuse_if_stopped()
            self._inbox.put(("call", call))
        return call.result()

    # -- the loop thread --------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._serve()
            self._close_out()
        except BaseException as exc:  # noqa: BLE001 - the thread's last word: fail everyone, then end
            log.critical("the engine loop died; failing every request in flight", exc_info=exc)
            self._die(exc)

    def _serve(self) -> None:
        """Step while there is work; return when asked to stop."""
        while True:
            if not self._drain_inbox(block=not self.scheduler.has_work()):
                return
            if not self.scheduler.has_work():
                continue
            try:
                stepped = self._step.run_one()
            except Exception as exc:  # a scheduling bug: fail what is in flight, keep serving
                log.exception("engine step failed outside its fault isolation; failing all requests")
                self._step.discard()
                self.scheduler.finish_all(error_reason(exc))
                stepped = True
            self._hand_out()
            if self.config.check_invariants:
                self._check_invariants()
            self._refresh_stats()
            if not stepped:
                self._drain_inbox(block=True, timeout=0.005)

    def _close_out(self) -> None:
        """After a stop: abort what the scheduler holds and whatever is still queued."""
        self._step.drain()
        self._step.close()
        self.scheduler.finish_all(_SHUTDOWN)
        self._hand_out()
        for req in self._drain_queued(EngineClosedError("the engine is shut down")):
            req.finish(_SHUTDOWN)
            self._on_finished(req)
        self._refresh_stats()

    def _die(self, exc: BaseException) -> None:
        """The loop cannot go on: answer every request and call in flight with an error.
        Engine state may be inconsistent here, so KV is not given back."""
        with self._active_lock:
            self._dead = exc
        self._step.close(wait=False)
        reason = {"type": "error", "message": f"the engine loop died: {exc!r}"}
        reqs = list(self.scheduler.waiting) + self.scheduler.holding() + self.scheduler.done
        reqs += self._drain_queued(EngineDeadError(reason["message"]))
        for req in reqs:
            req.finish(reason)
            self._on_finished(req)

    def _drain_queued(self, error: Exception) -> list[Req]:
        """Empty the inbox once the loop stops serving: calls fail with `error`; returns the
        requests that were queued but never added."""
        queued = []
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return queued
            if kind == "add":
                queued.append(payload)
            elif kind == "call":
                payload.fail(error)

    def _hand_out(self) -> None:
        for req in self.scheduler.take_finished():
            self._on_finished(req)

    def _check_invariants(self) -> None:
        try:
            self._check_invariants_now()
        except AssertionError as exc:
            log.error("engine invariant violated after step %d: %s", self._step.num_steps, exc)
            self.invariant_violations.append(str(exc))

    def _check_invariants_now(self) -> None:
        self.scheduler.check_accounting()
        if self.config.check_invariants:
            self.scheduler.check_slots()
            self.scheduler.cache.check()

    def _drain_inbox(self, block: bool, timeout: float | None = None) -> bool:
        """Apply queued commands; False once asked to stop."""
        try:
            item = self._inbox.get(block=block, timeout=timeout)
        except queue.Empty:
            return True
        while True:
            kind, payload = item
            if kind == "stop":
                return False
            if kind != "add":  # it changes or reads requests between steps: none may be in flight
                self._step.drain()
            if kind == "add":
                self.scheduler.add(payload)
            elif kind == "abort":
                self.scheduler.abort(payload[0], reason=payload[1])
                self._hand_out()
            elif kind == "abort_sink":
                sink, reason = payload
                self.scheduler.finish_where(lambda r: r.sink is sink, reason)
                self._hand_out()
            elif kind == "call":
                payload.run()
            elif kind == "drop":
                self._drop_namespace(payload)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                self._refresh_stats()
                return True

    def _flush(self) -> bool:
        cache = self.scheduler.cache
        cache.evict(cache.evictable_size(), self.runner.kv_pool.free)
        return True

    def _on_finished(self, req: Req) -> None:
        """The one way out: every request passes here exactly once."""
        try:
            finalize_text(req)
        except Exception as exc:  # its detokenizer failed on the held-back tail
            log.error("request %s: final detokenization failed", req.rid, exc_info=exc)
            req.finish_reason = error_reason(exc)
        with self._active_lock:
            if req.rid not in self._active:
                self.invariant_violations.append(f"request {req.rid!r} finished more than once")
                log.error("request %s finished more than once", req.rid)
                return
            self._active.discard(req.rid)
        t = req.times
        reason = (req.finish_reason or {}).get("type", "abort")
        self._finished_counts[reason] = self._finished_counts.get(reason, 0) + 1
        self._finished_prompt_tokens += len(req.prompt_ids)
        timing = RequestTiming(req.rid, t.arrival, t.scheduled, t.first_token, t.finished or t.arrival,
                               tuple(t.tokens), len(req.prompt_ids), len(req.output_ids), req.cached_len, reason,
                               tuple(req.miss_tokens.items()), req.divergent_at, req.session_id,
                               None if self.loras is None else req.lora_name or "")
        self.recent_timings.append(timing)
        good, missed = self._goodput.observe(timing)
        if self._by_adapter is not None:
            self._by_adapter.finished(timing, good, missed)
        for fn in self._finish_listeners:
            try:
                fn(timing)
            except Exception:  # the listener's bug: log it, keep serving
                self._num_listener_errors += 1
                log.exception("finish listener %r failed for request %s", fn, req.rid)
        notify(req, True)
        publish([req])

    def _refresh_stats(self) -> None:
        s, pool, cache, g = self.scheduler, self.runner.kv_pool, self.scheduler.cache, self._goodput
        self._stats = EngineStats(
            num_running=s.num_running, num_waiting=s.num_waiting,
            kv_slots_used=pool.capacity - pool.num_free - cache.evictable_size(),
            kv_slots_total=pool.capacity, num_preemptions=s.num_preemptions,
            prefix_hit_tokens=cache.hit_tokens, prefix_query_tokens=cache.query_tokens,
            prefill_tokens_computed=self._step.prefill_tokens, prompt_tokens=self._finished_prompt_tokens,
            generated_tokens=self._step.generated_tokens,
            num_steps=self._step.num_steps, num_finished=sum(self._finished_counts.values()),
            finish_counts=dict(self._finished_counts),
            invariant_violations=len(self.invariant_violations), listener_errors=self._num_listener_errors,
            failed_steps=self._step.num_failed_steps, miss_tokens=dict(self._step.miss_tokens),
            evicted_tokens=cache.evicted_tokens, kv_lifetime=cache.lifetime.snapshot(),
            reuse_gap=cache.reuse_gap.snapshot(), good_requests=g.good_requests,
            slo_violations=dict(g.violations), num_sessions=g.num_sessions, num_bad_sessions=g.num_bad_sessions,
            **({} if self.loras is None else self.loras.stats()),
            by_lora=None if self._by_adapter is None else self._by_adapter.snapshot())


class _Call:
    """A function to run on the loop thread, and its caller waiting for the outcome."""

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
