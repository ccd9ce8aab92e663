"""The Engine: the public Python API and request construction, on the callers' threads.

Callers on any thread (or asyncio loop) build requests here (prompt checks, grammar compiles,
LoRA attachment) and hand them to the engine thread (runtime/core/engine_loop.py), which owns
every piece of engine state and answers each request exactly once. Results travel back through
per-request callbacks that only hand data over (threading.Event or `loop.call_soon_threadsafe`);
no caller ever touches engine state directly.
"""
from __future__ import annotations

import asyncio
import functools
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
from radixflow.runtime.model.weight_update import PendingTensors
from radixflow.runtime.core.model_runner import ModelRunner
from radixflow.runtime.core.request import OutputOptions, Req, check_finish_reason, new_rid
from radixflow.runtime.result import make_result
from radixflow.runtime.scoring import PREFILL_ONLY, score_requests
from radixflow.runtime.core.publish import OutputSink, StreamCursor
from radixflow.runtime.output_channel import ChannelsByLoop
from radixflow.runtime.stream_chunks import StreamChunks
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.core.priority import priority_rules
from radixflow.runtime.core.scheduler import Scheduler, SchedulerLimits
from radixflow.runtime.core.speculative import drafter
from radixflow.runtime.lora.capacity import NO_ADAPTERS
from radixflow.runtime.lora.request_counts import AdapterRequestCounts
from radixflow.runtime.lora.service import AdapterChoice, LoraService, check_lora_request
from radixflow.runtime.stats import EngineStats, RequestTiming
from radixflow.runtime.core.engine_loop import EngineLoop
from radixflow.runtime.core.step import StepRunner
from radixflow.runtime.starting import StartingRequests
from radixflow.runtime.request_inputs import (
    InputIds, Prompt, check_embed, check_hidden_states_use, check_options, check_priority_use, check_prompt,
    normalize_inputs, stream_inputs,
)
from radixflow.runtime.text.output_text import OutputText
from radixflow.runtime.text.tokenizer import Tokenizer
from radixflow.runtime.weight_updates import WeightUpdates


class Engine(WeightUpdates):
    """An LLM engine with a persistent radix prefix cache and continuous batching.

    `Engine()` serves the default model (SmolLM2-135M-Instruct); `Engine(path, **config)` a Hugging
    Face directory or a GGUF file, config names as in EngineConfig. Use as a context manager or call `shutdown()`.
    Grammars (`regex`, `json_schema`, `choices`, `ebnf`, `structural_tag`) compile in the caller's
    thread before a request is submitted (cached; a failure or timeout raises ValueError), never on
    the engine loop.
    """

    supports_grammar = True  # the HTTP server enables response_format and the other constraint fields

    def __init__(self, model: str | None = None, **config: Any) -> None:
        self.config = EngineConfig.from_kwargs(model=model, **config)
        self.model_path = resolve_model_path(model)
        self.tokenizer = Tokenizer.from_pretrained(self.model_path, self.config.chat_template)
        self.runner = ModelRunner(self.config, self.model_path)
        self.max_context_len = self.runner.shape.max_context_len
        self.hidden_size = self.runner.args.hidden_size  # an embedding's length (encode)
        self.vocab_size = self.runner.args.vocab_size  # the model's: ids a prompt may hold
        cache = NullCache() if self.config.disable_radix_cache else RadixCache()
        limits = SchedulerLimits(
            max_num_seqs=self.config.max_num_seqs, max_prefill_tokens=self.config.max_prefill_tokens,
            chunked_prefill_size=self.config.chunked_prefill_size, max_context_len=self.max_context_len,
            policy=self.config.schedule_policy, lpm_fcfs_threshold=self.config.lpm_fcfs_threshold,
            mixed=self.config.enable_mixed_chunk)
        slots = self.runner.lora_slots
        self.loras = None if slots is None else LoraService(self.config, self.runner.args, slots)
        self.scheduler = Scheduler(limits, self.runner.kv_pool, self.runner.req_pool, cache,
                                   NO_ADAPTERS if self.loras is None else self.loras.capacity,
                                   long_rope_len=self.runner.args.long_rope_len,
                                   priority=priority_rules(self.config))
        self.scheduler.drafter = drafter(self.config, self.max_context_len)
        self.eos_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(self.runner.args.eos_token_ids)
        self.grammar = GrammarCompiler(self.tokenizer, self.runner.args.vocab_size, self.eos_ids,
                                       self.config.grammar_backend, self.config.grammar_timeout_s,
                                       self.config.jump_forward)
        step = StepRunner(self.runner, self.scheduler, self.eos_ids, self.max_context_len,
                          torch.Generator(self.runner.device).manual_seed(self.config.seed),
                          overlap=self.config.enable_overlap)
        # with LoRA: per-request counters by adapter too, for series labelled lora_name
        by_adapter = None if self.loras is None else AdapterRequestCounts()
        step.by_adapter = by_adapter
        self._channels = ChannelsByLoop()
        self._starting = StartingRequests()  # requests start_stream is making
        self._abort_listeners: list[Callable[[str], None]] = []
        self.loop = EngineLoop(self.config, self.runner, self.scheduler, step, self.loras, by_adapter)
        self._weights_lock = threading.Lock()
        self._pending_tensors = PendingTensors(self.runner.args)  # update_weights_from_tensor's parts so far

    # -- public API -------------------------------------------------------------------------

    def generate(self, prompt: Prompt = None, sampling_params: dict | list[dict] | SamplingParams | None = None,
                 input_ids: InputIds = None, *, return_logprob: bool = False,
                 logprob_start_len: int | None = None, top_logprobs_num: int = 0,
                 return_text_in_logprobs: bool = False, rid: str | list[str] | None = None,
                 lora_path: str | None = None, session_id: str | None = None,
                 lora: str | None = None, priority: int | None = None,
                 return_hidden_states: bool = False) -> dict | list[dict]:
        """Generate for one prompt (→ one result) or a list (→ a list, in order).

        Results are shaped like SGLang's native /generate response. With n > 1 each prompt
        gives n results (a list for one prompt) after one shared prefill. `lora`: an adapter
        name (`lora_path`, as SGLang's: a name, or a path under lora_dir). `priority`: with
        priority scheduling, the request's rank (runtime/core/priority.py).
        `return_hidden_states` (with `enable_return_hidden_states`): meta_info["hidden_states"]
        holds the final hidden states, as SGLang's: first the prompt's [prompt_tokens][hidden],
        then one [hidden] per output token but the last (the positions it fed the model).
        """
        lora_path = lora if lora is not None else lora_path
        check_options(rid, return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                      top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs,
                      session_id=session_id, lora_path=lora_path, priority=priority,
                      return_hidden_states=return_hidden_states)
        check_priority_use(priority, self.config)
        check_hidden_states_use(return_hidden_states, self.config)
        prompts, is_batch = self._normalize_inputs(prompt, input_ids)
        if isinstance(sampling_params, list):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"got {len(sampling_params)} sampling_params for {len(prompts)} prompts")
            sps = [SamplingParams.from_dict(p) for p in sampling_params]
        else:
            sps = [SamplingParams.from_dict(sampling_params)] * len(prompts)
        opts = OutputOptions(return_logprob, logprob_start_len, top_logprobs_num, return_hidden_states)
        groups = self._run_batch(prompts, sps, [opts] * len(prompts), self._normalize_rids(rid, len(prompts)),
                                 lora_path, session_id, priority)
        decode = self._decode_token if return_text_in_logprobs else None
        out = []
        for group, sp in zip(groups, sps):
            res = [make_result(q, decode, return_text_in_logprobs) for q in group]
            out.append(res[0] if sp.n == 1 else res)
        return out if is_batch else out[0]

    def _run_batch(self, prompts: list[list[int]], sps: list[SamplingParams], opts: list[OutputOptions],
                   rids: list[str | None], lora_path: str | None, session_id: str | None,
                   priority: int | None = None) -> list[list[Req]]:
        """Run each prompt (its n samples) to its finish; per prompt its finished requests.
        Everything that can refuse the batch runs before anything is submitted."""
        for ids, sp, o in zip(prompts, sps, opts):
            self.validate_prompt(ids, sp)
            o.validate(len(ids), self.runner.args.vocab_size)
        check_lora_request(self.loras, lora_path)
        for sp in sps:  # every grammar compiles (or fails) before anything is submitted
            self.grammar.compile(sp)
        submitted: list[Req] = []
        try:
            groups = [self._make_group(ids, sp, o, r, lora_path, session_id, checked=True, submitted=submitted,
                                       priority=priority)
                      for ids, sp, o, r in zip(prompts, sps, opts, rids)]
        except BaseException:  # a full queue or a rid in use part-way: nothing of the batch runs on
            for req in submitted:
                self.abort(req.rid)
            raise
        for group in groups:
            for _, ev in group:
                ev.wait()
        return [[req for req, _ in group] for group in groups]

    def score(self, query: str | list[int], items: str | list[str] | list[list[int]], label_token_ids: list[int],
              *, apply_softmax: bool = False, item_first: bool = False, lora: str | None = None,
              priority: int | None = None) -> list[list[float]]:
        """SGLang's generative scoring: per item, the probability of each label token right after
        query + item (item + query with `item_first`), in label order; with `apply_softmax`
        normalized over the labels. Text is tokenized joined; token ids are joined as lists.
        The items share the query's KV (runtime/scoring.py). `priority`: every pair's, as
        generate's. ValueError for bad input, and when a request was aborted or failed before its
        score."""
        check_options(None, lora_path=lora, priority=priority)
        check_priority_use(priority, self.config)
        batch = score_requests(self.tokenizer, query, items, label_token_ids, item_first, self.vocab_size)
        pairs = batch.requests()
        room = self.config.max_num_seqs + self.config.max_queued_requests
        if len(pairs) > room:
            raise ValueError(f"{len(pairs)} item-label pairs are more requests than the engine takes at once ({room}: "
                             "max_num_seqs + max_queued_requests); score fewer items or labels per call")
        opts = [OutputOptions(True, start, 0) for _, start in pairs]
        groups = self._run_batch([ids for ids, _ in pairs], [PREFILL_ONLY] * len(pairs), opts, [None] * len(pairs),
                                 lora, None, priority)
        return batch.scores([make_result(group[0], None, False) for group in groups], apply_softmax)

    def encode(self, prompt: Prompt = None, input_ids: InputIds = None, *, rid: str | list[str] | None = None,
               lora_path: str | None = None, lora: str | None = None, priority: int | None = None) -> dict | list[dict]:
        """Embed one prompt (→ one result) or a list (→ a list, in order): each is prefilled
        (its prefix from the cache like any request's) and its last token's final hidden state,
        after the model's last norm, L2-normalized, is `embedding` (SGLang's /encode shape:
        {"embedding": [...], "meta_info": {...}}). A request that fails or is aborted has
        `embedding` None and says why in meta_info's finish_reason. `priority`: as generate's."""
        lora_path = lora if lora is not None else lora_path
        check_options(rid, lora_path=lora_path, priority=priority)
        check_priority_use(priority, self.config)
        prompts, is_batch = self._normalize_inputs(prompt, input_ids)
        sp = SamplingParams.from_dict({"max_new_tokens": 0})
        rids = self._normalize_rids(rid, len(prompts))
        for ids in prompts:  # everything that can refuse the batch runs before anything is submitted
            self.validate_prompt(ids, sp)
        check_lora_request(self.loras, lora_path)
        choice = None if lora_path is None else self._choose_adapter(lora_path)
        submitted: list[Req] = []
        try:
            waits = [self._submit(ids, sp, OutputOptions(), r, choice, None, None, True, submitted, embed=True,
                                  priority=priority)
                     for ids, r in zip(prompts, rids)]
        except BaseException:  # a full queue or a rid in use part-way: nothing of the batch runs on
            for req in submitted:
                self.abort(req.rid)
            raise
        for _, ev in waits:
            ev.wait()
        out = [make_result(req, None, False) for req, _ in waits]
        return out if is_batch else out[0]

    async def generate_stream(self, prompt: str | None = None,
                              sampling_params: dict | SamplingParams | None = None,
                              input_ids: list[int] | None = None, *, return_logprob: bool = False,
                              logprob_start_len: int | None = None, top_logprobs_num: int = 0,
                              return_text_in_logprobs: bool = False, rid: str | None = None,
                              lora_path: str | None = None, session_id: str | None = None,
                              lora: str | None = None, incremental: bool = False,
                              group: str | None = None, lora_version: str | None = None,
                              embed: bool = False, priority: int | None = None,
                              return_hidden_states: bool = False) -> AsyncIterator[dict]:
        """Yield SGLang-style stream chunks: cumulative `text` and `output_ids` (`incremental`:
        only those new since the previous chunk, `completion_tokens` still counting all); logprob
        lists hold only the entries new since the previous chunk. Closing the iterator early (a
        client gone away) aborts the request. `group`: the rid of the n > 1 request this stream
        is a sample (or the prefill) of, so `abort(group)` ends it too. `lora_version`: what
        `adapter_version(lora)` said when the request began (its other samples' weights).
        `embed`: an embedding request (as `encode`'s; `sampling_params` must be prefill-only,
        max_new_tokens 0): its one chunk carries `embedding`. `return_hidden_states`: as
        generate's, in the last chunk's meta_info."""
        lora_path = lora if lora is not None else lora_path
        check_options(rid, return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                      top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs,
                      session_id=session_id, lora_path=lora_path, priority=priority,
                      return_hidden_states=return_hidden_states)
        check_priority_use(priority, self.config)
        check_hidden_states_use(return_hidden_states, self.config)
        ids, sp = stream_inputs(self.tokenizer, prompt, input_ids, sampling_params)
        check_embed(embed, sp)
        loop = asyncio.get_running_loop()
        opts = OutputOptions(return_logprob, logprob_start_len, top_logprobs_num, return_hidden_states)
        channel = self._channels.get(loop)
        rid = self._normalize_rids(rid, 1)[0] or new_rid()
        # The engine thread sends token ids only; the text is made here, on this loop. Made
        # before the submit: nothing that can fail stands between it and the `try` below.
        chunks = StreamChunks.for_stream(self.tokenizer, rid, ids, sp, opts, self.config.stream_interval,
                                         return_text_in_logprobs, lambda reason: self.abort(rid, reason), incremental,
                                         embed)
        # Opened before the submit: a constrained request is submitted from a worker thread while
        # this loop runs on, and its first outputs may be delivered before that call returns.
        outputs = channel.open(rid)  # ValueError if a stream of this loop has the rid
        start = functools.partial(self.start_stream, ids, sp, opts, rid, lora_path, session_id, channel, group=group,
                                  lora_version=lora_version, embed=embed, priority=priority)
        submitted = None
        try:
            if sp.is_constrained:  # the grammar compiles in a worker thread: the loop must not wait for it
                submitted = loop.run_in_executor(None, start)
                await asyncio.shield(submitted)
            else:
                start()
        except BaseException:  # the submit failed, or this stream was cancelled while it ran
            channel.close(rid, outputs)
            if submitted is not None:  # what the worker submits after all is aborted
                self._starting.abort(rid, None)  # its grammar compile may stop now
                submitted.add_done_callback(lambda done: self._abort_submitted(done, rid))
            raise
        try:
            while not chunks.done:
                chunk = chunks.add(await outputs.take())  # fell behind: one chunk for all that arrived
                if chunk is not None:
                    yield chunk
        finally:
            channel.close(rid, outputs)
            if not chunks.done:
                self.abort(rid)

    def _abort_submitted(self, submitted: asyncio.Future, rid: str) -> None:
        """A stream gave up before its worker-thread submit returned: abort what it submitted."""
        if not submitted.cancelled() and submitted.exception() is None:
            self.abort(rid)

    def start_stream(self, ids: list[int], sp: SamplingParams, opts: OutputOptions, rid: str | None,
                     lora: str | None, session_id: str | None, sink: OutputSink, *,
                     group: str | None = None, lora_version: str | None = None, reserved: bool = False,
                     embed: bool = False, priority: int | None = None) -> Req:
        """Submit one request whose outputs go to `sink` (one StepOutput per step, posted on the
        engine thread); returns it. Raises what validation or a full queue raises; a grammar
        compiles here, so call it off any event loop when `sp.is_constrained`. Its outputs carry
        token ids only: detokenizing and stop strings are the caller's (ClientText), which ends
        the request with `abort(rid, reason)` at a stop. `group`: as `Req.group`; `lora_version`:
        as generate_stream's (ValueError when `lora` means other weights now). `reserved`: the
        caller called `reserve(rid, group, sink)` first; this call takes the reservation over.
        `embed`: an embedding request (prefill-only `sp`). `priority`: as generate's."""
        if not reserved:
            rid = rid or new_rid()
            self.reserve(rid, group, sink)
        elif rid is None:
            raise ValueError("a reserved request is started by its rid")
        try:
            check_embed(embed, sp)
            check_priority_use(priority, self.config)
            self.validate_prompt(ids, sp)  # before an adapter is chosen (perhaps read from disk)
            check_lora_request(self.loras, lora)
            choice = None if lora is None else self._choose_adapter(lora, lora_version)
            req = self._make_req(ids, sp, opts, rid, choice, None, checked=True, with_text=False,
                                 cancel=self._starting.cancel_event(rid), embed=embed)
            req.sink, req.cursor, req.session_id, req.group = sink, StreamCursor(), session_id, group
            req.priority = priority
            self.loop.submit(req)
        finally:
            aborted, reason = self._starting.end(rid)
        if aborted:  # while it was being made: now the loop knows it
            self.abort(rid, reason)
        return req

    def reserve(self, rid: str, group: str | None, sink: OutputSink) -> None:
        """Announce a request that `start_stream(..., reserved=True)` will start later (another
        thread may run it once a worker is free): from now on an abort of `rid`, of `group`, or
        of `sink` ends it once started. ValueError: `rid` is being started already, or `group`
        is not a string."""
        if group is not None and not isinstance(group, str):
            raise ValueError(f"group must be a request id (a string), got {group!r}")
        self._starting.begin(rid, group, sink)

    def _decode_token(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def abort(self, rid: str, reason: dict | None = None) -> None:
        """Finish `rid` with reason abort (or `reason`: {"type": ..., "message"/"matched": str})
        and free all it holds (no-op if unknown/finished). The rid of an n > 1 request ends each
        of its samples. A stream still being started (its grammar compiling) ends once started."""
        check_finish_reason(reason)
        self._starting.abort(rid, reason)
        self.loop.post("abort", (rid, reason))

    def abort_request(self, rid: str) -> None:
        """An /abort_request of `rid`: as abort, and every abort listener hears of it (servers
        sharing this engine: one may run the request without having submitted it yet)."""
        self.abort(rid)
        for fn in self._abort_listeners:
            fn(rid)

    def add_abort_listener(self, fn: Callable[[str], None]) -> None:
        """`fn(rid)` runs, on the caller's thread, for each abort_request."""
        self._abort_listeners.append(fn)

    def abort_sink(self, sink: OutputSink, reason: dict) -> None:
        """Finish with `reason` every request in flight whose outputs go to `sink` (its consumer
        is gone), those still being started included."""
        self._starting.abort_sink(sink, reason)
        self.loop.post("abort_sink", (sink, reason))

    def abort_all(self) -> None:
        """Finish every request in flight with reason abort (returns once done)."""
        self.loop.call(lambda: self.loop.finish_all({"type": "abort", "message": "aborted"}))

    def flush_cache(self) -> bool:
        """Drop every unlocked prefix-cache entry. Returns True once done."""
        cache = self.scheduler.cache
        self.loop.call(lambda: cache.evict(cache.evictable_size(), self.runner.kv_pool.free))
        return True

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

    def adapter_version(self, lora: str) -> str:
        """Which weights adapter `lora` (a name, or a path under lora_dir) means now. The samples
        of an n > 1 request submitted one by one (over HTTP) each pass it as `lora_version`: a
        load replacing the name between two submits refuses the later ones (ValueError) instead
        of running them on other weights than the first ones."""
        check_lora_request(self.loras, lora)
        return self._choose_adapter(lora).adapter.namespace

    def lora_adapters(self) -> dict[str, str]:
        """name -> path of the loaded adapters (empty without LoRA)."""
        return {} if self.loras is None else self.loras.registry.names()

    def _drop_adapter_kv(self, namespace: str | None) -> None:
        """Free the KV and slot of a namespace no name refers to; returns once done. What running
        requests hold goes when the last of them ends (AdapterCapacity.release)."""
        if namespace is not None:
            self.loop.call(lambda: self.loop.drop_namespace(namespace))

    def stats(self) -> EngineStats:
        return self.loop.stats

    def add_finish_listener(self, fn: Callable[[RequestTiming], None]) -> None:
        """`fn(timing)` runs on the engine thread after each request finishes: keep it cheap."""
        self.loop.finish_listeners.append(fn)

    def check_accounting(self) -> None:
        """Verify the KV slot accounting invariants (runs on the engine thread)."""
        self.loop.call(self.loop.check_invariants_now)

    @property
    def is_healthy(self) -> bool:
        """False once the engine thread died or the engine shut down."""
        return self.loop.is_healthy

    @property
    def invariant_violations(self) -> list[str]:
        """With check_invariants: what broke, per step (also a request finished twice)."""
        return self.loop.invariant_violations

    @property
    def recent_timings(self) -> deque[RequestTiming]:
        """The last 10,000 finished requests' timings, oldest first."""
        return self.loop.recent_timings

    def set_fault_injector(self, injector: FaultInjector | None) -> None:
        """Test-only: make chosen step points raise (runtime/core/faults.py); None removes it."""
        def install() -> None:
            self.loop.step.faults = injector or NO_FAULTS
        self.loop.call(install)

    def shutdown(self) -> None:
        """Abort everything in flight, wake every waiter, stop the engine thread. Idempotent;
        calls after it raise EngineClosedError."""
        self.loop.stop()
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

    def _make_req(self, ids: list[int], sp: SamplingParams, opts: OutputOptions, rid: str | None,
                  lora_path: str | AdapterChoice | None, on_output: Callable[[Req, bool], None] | None,
                  checked: bool = False, with_text: bool = True, cancel: threading.Event | None = None,
                  embed: bool = False) -> Req:
        """`checked`: the caller already ran validate_prompt(ids, sp) (an O(prompt) scan);
        `with_text=False`: tokens only, its text and stop strings are the caller's; `cancel`: set
        when the request is aborted while its grammar compiles (it gets none then). The text of
        a request nobody streams and no stop string or regex ends is made once, at its finish
        (`Req.deferred_text`): its steps append tokens only."""
        if not checked:
            self.validate_prompt(ids, sp)
        check_lora_request(self.loras, lora_path)
        opts.validate(len(ids), self.runner.args.vocab_size)
        check_hidden_states_use(opts.return_hidden_states, self.config)
        req = Req(rid=rid or new_rid(), prompt_ids=ids, sampling=sp, options=opts, on_output=on_output, embed=embed)
        if self.loras is not None and lora_path is not None:
            self.loras.attach(req, self._choose_adapter(lora_path) if isinstance(lora_path, str) else lora_path)
        if with_text:
            text = OutputText(self.tokenizer, sp, ids)
            if sp.stop_strings or sp.stop_regexes:
                req.output_text = text
            else:
                req.deferred_text = text
        if sp.seed is not None:
            req.generator = torch.Generator(self.runner.device).manual_seed(sp.seed)
        req.grammar = self.grammar.new_state(sp, opts.return_logprob, cancel)
        return req

    def _choose_adapter(self, lora_path: str, version: str | None = None) -> AdapterChoice:
        """What adapter `lora_path` means now (ValueError when nothing, or when that is not the
        weights `version`, an adapter_version, named)."""
        assert self.loras is not None
        choice, orphan = self.loras.resolve(lora_path)
        if orphan is not None:  # its file changed on disk: drop the old content's KV (no waiting here)
            self.loop.post("drop", orphan)
        if version is not None and choice.adapter.namespace != version:
            raise ValueError(f"LoRA adapter {lora_path!r} was replaced (loaded again or changed on disk) while "
                             f"this request's samples were being started; send the request again")
        return choice

    def _make_group(self, ids: list[int], sp: SamplingParams, opts: OutputOptions, rid: str | None,
                    lora_path: str | AdapterChoice | None, session_id: str | None = None, checked: bool = False,
                    submitted: list[Req] | None = None, priority: int | None = None) -> list[tuple[Req, threading.Event]]:
        """One request, or for n > 1 a prefill-only request first and then n that hit it (the
        samples' rids are `rid-0` ...; `abort(rid)` ends them all, or the prefill before them).
        Each request submitted is appended to `submitted`. The adapter is resolved once for the
        group: every sample runs on the weights its prefill ran on."""
        submitted = [] if submitted is None else submitted
        if self.loras is not None and lora_path is not None:
            lora_path = self._choose_adapter(lora_path)
        if sp.n == 1:
            return [self._submit(ids, sp, opts, rid, lora_path, session_id, None, checked, submitted, priority=priority)]
        warm = SamplingParams.from_dict({"max_new_tokens": 0})
        first, ev = self._submit(ids, warm, OutputOptions(), None, lora_path, None, rid, checked, submitted,
                                 priority=priority)
        ev.wait()
        if (first.finish_reason or {}).get("type") in ("abort", "error"):
            return [(self._unsubmitted(ids, sp, first.finish_reason), ev) for _ in range(sp.n)]
        return [self._submit(ids, sp.for_sample(i), opts, None if rid is None else f"{rid}-{i}", lora_path,
                             session_id, rid, checked, submitted, priority=priority)
                for i in range(sp.n)]

    def _submit(self, ids: list[int], sp: SamplingParams, opts: OutputOptions, rid: str | None,
                lora_path: str | AdapterChoice | None, session_id: str | None, group: str | None, checked: bool,
                submitted: list[Req], embed: bool = False, priority: int | None = None) -> tuple[Req, threading.Event]:
        ev = threading.Event()
        req = self._make_req(ids, sp, opts, rid, lora_path,
                             lambda _r, finished: ev.set() if finished else None, checked=checked, embed=embed)
        req.session_id, req.group, req.priority = session_id, group, priority
        self.loop.submit(req)
        submitted.append(req)
        return req, ev

    @staticmethod
    def _unsubmitted(ids: list[int], sp: SamplingParams, reason: dict) -> Req:
        """A sample never submitted, ended with `reason` (its group's prefill was aborted)."""
        req = Req(rid=new_rid(), prompt_ids=ids, sampling=sp)
        req.finish(reason)
        return req
