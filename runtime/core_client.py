"""EngineClient: the Engine API with the engine core in another process (runtime/core_process.py).

The HTTP server's process keeps what is per-request text work (tokenizing, prompt validation,
detokenizing, stop strings and stop regexes, stream chunks, response shaping) and talks to the
core over one ZMQ DEALER socket with msgspec messages that carry token ids only
(runtime/core/messages.py). The core runs the
scheduler, radix cache, pools, model, sampler and grammar masks with a GIL of its own, so HTTP
and JSON work never stalls a step and a step never stalls HTTP.

`EngineClient(model, **config)` spawns a core and owns it (`shutdown()` stops it);
`EngineClient(model, address=..., **config)` attaches to a core another process started (several
API servers, `radixflow serve --api-server-count N`). If the core dies, every request in flight
finishes at once with reason `error`, calls raise EngineDeadError and `is_healthy` turns False
(the server answers 503).

Decided: the in-process `Engine` stays the Python API for tests, notebooks and the language's
in-process backend (its core runs in a thread); servers use this client.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import pickle
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import zmq

from radixflow.runtime.config import EngineConfig
from radixflow.runtime.core.messages import (
    AbortNotice, AbortRequest, ControlCall, ControlReply, CoreInfo, FromCore, Health, Hello, Rejected, RequestOutput, StepOutput,
    SubmitRequest, Timings)
from radixflow.runtime.core.request import OutputOptions, new_rid
from radixflow.runtime.core_process import QUICK_CALLS, Outbox, start_core
from radixflow.runtime.errors import EngineClosedError, EngineDeadError
from radixflow.runtime.model.model_path import resolve_model_path
from radixflow.runtime.output_channel import ChannelsByLoop, OutputChannel
from radixflow.runtime.request_inputs import (
    InputIds, Prompt, check_embed, check_hidden_states_use, check_options, check_priority_use, check_prompt,
    normalize_inputs, stream_inputs,
)
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.stats import EngineStats, RequestTiming
from radixflow.runtime.stream_chunks import StreamChunks
from radixflow.runtime.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

QUICK_CALL_TIMEOUT_S = 10.0


class EngineClient:
    """An engine whose core runs in its own process; same public surface as `Engine` (see the
    module docstring)."""

    supports_grammar = True

    def __init__(self, model: str | None = None, *, address: str | None = None, start_timeout_s: float = 900.0,
                 **config: Any) -> None:
        self.config = EngineConfig.from_kwargs(model=model, **config)
        self.model_path = resolve_model_path(model)
        self.tokenizer = Tokenizer.from_pretrained(self.model_path, self.config.chat_template)
        self._dir: str | None = None
        self._process: Any = None
        if address is None:
            self._dir = tempfile.mkdtemp(prefix="radixflow-core-")
            address = f"ipc://{os.path.join(self._dir, 'core.sock')}"
            self._process = start_core(address, model, config, start_timeout_s)
        self.address = address
        self._lock = threading.Lock()
        self._routes: dict[str, OutputChannel] = {}
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._call_ids = itertools.count()
        self._finish_listeners: list[Callable[[RequestTiming], None]] = []
        self._abort_listeners: list[Callable[[str], None]] = []
        self._channels = ChannelsByLoop()
        self._closed = False
        self._dead: str | None = None
        self._stopping = False
        self._last_stats: EngineStats | None = None
        self._info: CoreInfo | None = None
        self._info_ready = threading.Event()
        self._outbox = Outbox()
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(FromCore)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self._sock.connect(address)
        self._thread = threading.Thread(target=self._io, name="radixflow-core-client", daemon=True)
        self._thread.start()
        self._send(Hello(pid=os.getpid(), host=socket.gethostname()))
        if not self._info_ready.wait(start_timeout_s) or self._info is None:
            self.shutdown()
            raise RuntimeError(f"no engine core answered at {address}" + (f": {self._dead}" if self._dead else ""))
        self.max_context_len = self._info.max_context_len
        self.hidden_size = self._info.hidden_size
        self.vocab_size = self._info.vocab_size
        self.kv_capacity = self._info.kv_capacity

    # -- the Engine API ---------------------------------------------------------------------------

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
        """As Engine.generate_stream: cumulative chunks (`incremental`: each chunk's new text and
        ids only); closing the iterator early aborts. `group`, `lora_version`, `embed`,
        `priority`, `return_hidden_states`: as Engine.generate_stream's."""
        lora = lora if lora is not None else lora_path
        check_options(rid, return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                      top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs,
                      session_id=session_id, lora_path=lora, priority=priority,
                      return_hidden_states=return_hidden_states)
        check_priority_use(priority, self.config)
        check_hidden_states_use(return_hidden_states, self.config)
        ids, sp = stream_inputs(self.tokenizer, prompt, input_ids, sampling_params)
        check_embed(embed, sp)
        opts = OutputOptions(return_logprob, logprob_start_len, top_logprobs_num, return_hidden_states)
        self.validate_prompt(ids, sp)
        opts.validate(len(ids), self.vocab_size)
        rid = rid or new_rid()
        chunks = StreamChunks.for_stream(self.tokenizer, rid, ids, sp, opts, self.config.stream_interval,
                                         return_text_in_logprobs, lambda reason: self._send(AbortRequest(rid, reason)),
                                         incremental, embed)
        channel = self._channels.get(asyncio.get_running_loop())
        with self._lock:
            self._refuse_if_stopped()
            if rid in self._routes:
                raise ValueError(f"request id {rid!r} is already in use")
            self._routes[rid] = channel
        outputs = channel.open(rid)
        self._send(SubmitRequest(rid=rid, input_ids=ids, sampling=sp, return_logprob=return_logprob,
                                 logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
                                 lora=lora, session_id=session_id, group=group,
                                 lora_version=lora_version, embed=embed, priority=priority,
                                 return_hidden_states=return_hidden_states))
        try:
            while not chunks.done:
                batch = await outputs.take()
                if isinstance(batch[0], Rejected):
                    chunks.done = True
                    raise batch[0].error()
                chunk = chunks.add(batch)
                if chunk is not None:
                    yield chunk
        finally:
            channel.close(rid, outputs)
            if not chunks.done:
                with self._lock:
                    self._routes.pop(rid, None)
                self.abort(rid)

    def generate(self, prompt: Prompt = None, sampling_params: dict | list[dict] | SamplingParams | None = None,
                 input_ids: InputIds = None, **kwargs: Any) -> dict | list[dict]:
        """As Engine.generate (blocking; runs in the core, results come back whole)."""
        prompt, input_ids = self._tokenized(prompt, input_ids)
        return self._call("generate", prompt, sampling_params, input_ids, **kwargs)

    def encode(self, prompt: Prompt = None, input_ids: InputIds = None, **kwargs: Any) -> dict | list[dict]:
        """As Engine.encode (blocking; runs in the core, results come back whole)."""
        return self._call("encode", *self._tokenized(prompt, input_ids), **kwargs)

    def _tokenized(self, prompt: Prompt, input_ids: InputIds) -> tuple[Prompt, InputIds]:
        """A blocking call's (prompt, input_ids) with a lone prompt tokenized here, as every
        request is; anything else as given (the core checks it)."""
        if prompt is None or input_ids is not None:
            return prompt, input_ids
        prompts, is_batch = normalize_inputs(self.tokenizer, prompt, None)
        return None, prompts if is_batch else prompts[0]

    def validate_prompt(self, ids: list[int], sp: SamplingParams) -> None:
        check_prompt(ids, sp, self.vocab_size, self.max_context_len, self.kv_capacity)

    def abort(self, rid: str) -> None:
        if self._dead is None and not self._stopping:
            self._send(AbortRequest(rid))

    def abort_request(self, rid: str) -> None:
        """An /abort_request of `rid`: as abort, and the core's other clients hear of it
        (add_abort_listener): one of them may run the request without having submitted it yet."""
        if self._dead is None and not self._stopping:
            self._send(AbortRequest(rid, notify=True))

    def add_abort_listener(self, fn: Callable[[str], None]) -> None:
        """`fn(rid)` runs on this client's IO thread when another client's abort_request names
        `rid`: keep it cheap."""
        self._abort_listeners.append(fn)

    def abort_all(self) -> None:
        self._call("abort_all")

    def flush_cache(self) -> bool:
        return bool(self._call("flush_cache"))

    def update_weights_from_disk(self, model_path: str, **kwargs: Any) -> dict:
        """As Engine.update_weights_from_disk, in the core process."""
        return self._call("update_weights_from_disk", model_path, **kwargs)

    def update_weights_from_tensor(self, named_tensors: Any, **kwargs: Any) -> dict:
        """As Engine.update_weights_from_tensor: the tensors are pickled to the core process."""
        return self._call("update_weights_from_tensor", named_tensors, **kwargs)

    def get_weight_version(self) -> str:
        return self._call("get_weight_version")

    def score(self, query: Any, items: Any, label_token_ids: list[int], **kwargs: Any) -> list[list[float]]:
        """As Engine.score, in the core process."""
        return self._call("score", query, items, label_token_ids, **kwargs)

    def update_weight_version(self, new_version: str, abort_all_requests: bool = True) -> None:
        self._call("update_weight_version", new_version, abort_all_requests)

    def pause_generation(self, mode: str = "abort") -> None:
        self._call("pause_generation", mode)

    def continue_generation(self) -> None:
        self._call("continue_generation")

    def load_lora_adapter(self, name: str, path: str) -> None:
        self._call("load_lora_adapter", name, path)

    def unload_lora_adapter(self, name: str) -> None:
        self._call("unload_lora_adapter", name)

    def adapter_version(self, lora: str) -> str:
        """As Engine.adapter_version (blocking: call it off any event loop)."""
        return self._call("adapter_version", lora)

    def lora_adapters(self) -> dict[str, str]:
        return self._call("lora_adapters")

    def stats(self) -> EngineStats:
        """The core's numbers now; once it stopped, the last numbers read before (the error of
        a stopped core when none were)."""
        if (self._dead is not None or self._closed) and self._last_stats is not None:
            return self._last_stats
        self._last_stats = self._call("stats")
        return self._last_stats

    def add_finish_listener(self, fn: Callable[[RequestTiming], None]) -> None:
        """`fn(timing)` runs on this client's IO thread after each request finishes (every
        request of the core, whichever client sent it): keep it cheap."""
        self._finish_listeners.append(fn)

    def check_accounting(self) -> None:
        self._call("check_accounting")

    def set_fault_injector(self, injector: Any) -> None:
        """Test-only: installs a copy of `injector` in the core (its counters stay there)."""
        self._call("set_fault_injector", injector)

    @property
    def invariant_violations(self) -> list[str]:
        return self._call("invariant_violations")

    @property
    def is_healthy(self) -> bool:
        return self._dead is None and not self._closed

    @property
    def core_pid(self) -> int:
        """The engine core process's id."""
        assert self._info is not None
        return self._info.pid

    def shutdown(self) -> None:
        """Abort everything in flight and stop the core this client started (a shared core is
        left running). Idempotent; calls after it raise EngineClosedError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._process is not None and self._dead is None:
            try:
                self._call("shutdown", _closing=True)
            except EngineDeadError:  # it went away first
                pass
            except Exception:  # noqa: BLE001 - it is going away either way
                log.warning("the engine core did not shut down cleanly", exc_info=True)
        self._stopping = True
        self._outbox.put(b"", None)  # wakes the IO thread to stop
        self._thread.join(timeout=10)
        if self._process is not None:
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        self._fail_all({"type": "abort", "message": "the engine shut down"},
                       EngineClosedError("the engine is shut down"))
        self._sock.close(linger=0)
        self._monitor.close(linger=0)
        self._ctx.term()
        self._outbox.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- callers' side ---------------------------------------------------------------------------

    def _refuse_if_stopped(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"the engine core died: {self._dead}")
        if self._closed:
            raise EngineClosedError("the engine is shut down")

    def _send(self, message: Any) -> None:
        self._outbox.put(b"", message)

    def _call(self, method: str, *args: Any, _closing: bool = False, **kwargs: Any) -> Any:
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            payload = pickle.dumps((args, kwargs))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # e.g. a generator or a lambda
            raise ValueError(f"the arguments of {method} cannot be sent to the engine core: {exc}") from None
        with self._lock:
            if not _closing:
                self._refuse_if_stopped()
            call_id = next(self._call_ids)
            self._calls[call_id] = future
        self._send(ControlCall(call_id, method, payload))
        try:
            # quick calls are made on event loops (metrics, server info): a stuck core (stopped,
            # not dead) must not freeze the server; the others wait as long as they take
            return future.result(timeout=QUICK_CALL_TIMEOUT_S if method in QUICK_CALLS else None)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self._calls.pop(call_id, None)
            raise TimeoutError(f"the engine core did not answer {method} within {QUICK_CALL_TIMEOUT_S:.0f} s") from None

    # -- the IO thread --------------------------------------------------------------------------------

    def _io(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        poller.register(self._outbox.fd, zmq.POLLIN)
        connected = False
        while not self._stopping:
            events = dict(poller.poll(100))
            if self._sock in events:  # before the monitor: a core's last replies precede its disconnect
                self._receive()
            if self._monitor in events:
                connected = self._on_monitor(connected)
            for _, message in self._outbox.take():
                if message is not None and self._dead is None:
                    self._send_now(message)
            if self._dead is None and self._process is not None and self._process.poll() is not None:
                self._core_gone(f"its process exited with code {self._process.returncode}")

    def _on_monitor(self, connected: bool) -> bool:
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return connected
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                connected = True
            elif event["event"] == zmq.EVENT_DISCONNECTED and connected and not self._stopping:
                self._core_gone("its socket closed")

    def _send_now(self, message: Any) -> None:
        """Encode and send; a message that cannot be encoded fails its own caller only."""
        try:
            data = self._encoder.encode(message)
        except Exception as exc:  # e.g. a value msgpack cannot carry: refuse that request or call
            log.exception("a message for the engine core could not be encoded")
            if isinstance(message, SubmitRequest):
                self._deliver([Rejected.of(message.rid, ValueError(f"the request could not be sent: {exc}"))])
            elif isinstance(message, ControlCall):
                self._reply(ControlReply(message.call_id, False, pickle.dumps(RuntimeError(repr(exc)))))
            return
        self._sock.send(data, copy=False)

    def _receive(self) -> None:
        for _ in range(1024):
            try:
                payload = self._sock.recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            try:
                self._handle(self._decoder.decode(payload))
            except Exception:  # one bad message must not end this thread (every caller would hang)
                log.exception("dropping a message from the engine core that could not be handled")

    def _handle(self, message: Any) -> None:
        if isinstance(message, StepOutput):
            self._deliver(message.request_outputs())
        elif isinstance(message, Rejected):
            self._deliver([message])
        elif isinstance(message, ControlReply):
            self._reply(message)
        elif isinstance(message, Timings):
            self._on_timings(message.timings)
        elif isinstance(message, AbortNotice):
            for fn in self._abort_listeners:
                fn(message.rid)
        elif isinstance(message, Health):
            if not message.healthy and not self._closed:
                self._core_gone(message.message)
        elif isinstance(message, CoreInfo):
            self._info = message
            self._info_ready.set()

    def _deliver(self, items: list[Any]) -> None:
        routed = []
        with self._lock:
            for item in items:
                channel = self._routes.get(item.rid)
                if channel is None:  # its consumer is gone (aborted)
                    continue
                if isinstance(item, Rejected) or item.finish_reason is not None:
                    del self._routes[item.rid]
                routed.append((channel, item))
        _post(routed)

    def _reply(self, message: ControlReply) -> None:
        with self._lock:
            future = self._calls.pop(message.call_id, None)
        if future is None:
            return
        try:
            value = pickle.loads(message.value)
        except Exception as exc:  # e.g. an exception class this process cannot import
            future.set_exception(RuntimeError(f"the engine core's reply could not be read: {exc!r}"))
            return
        if message.ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def _on_timings(self, timings: list[RequestTiming]) -> None:
        for timing in timings:
            for fn in self._finish_listeners:
                try:
                    fn(timing)
                except Exception:  # the listener's bug: log it, keep going
                    log.exception("finish listener %r failed for request %s", fn, timing.rid)

    def _core_gone(self, why: str) -> None:
        """The core stopped serving: fail every request and call in flight, refuse new ones."""
        if self._dead is not None:
            return
        (log.info if self._closed else log.error)("the engine core stopped serving: %s", why)
        self._dead = why
        message = f"the engine core died: {why}"
        self._fail_all({"type": "error", "message": message}, EngineDeadError(message))

    def _fail_all(self, reason: dict[str, Any], error: Exception) -> None:
        with self._lock:
            routes, self._routes = self._routes, {}
            calls, self._calls = self._calls, {}
        _post([(channel, RequestOutput(rid=rid, new_token_ids=[], finish_reason=reason))
               for rid, channel in routes.items()])
        for future in calls.values():
            if not future.done():
                future.set_exception(error)


def _post(routed: list[tuple[OutputChannel, Any]]) -> None:
    """Post each item to its channel: one post (one wake-up of its loop) per channel."""
    by_channel: dict[int, tuple[OutputChannel, list[Any]]] = {}
    for channel, item in routed:
        by_channel.setdefault(id(channel), (channel, []))[1].append(item)
    for channel, items in by_channel.values():
        channel.post_items(items)
