"""The engine core in its own process: an Engine behind one ZMQ ROUTER socket.

`start_core(address, model, config)` spawns the process and returns once the model is loaded (or
raises why it could not load); `run_core` is the process's entry point. Inside, the Engine's own
loop thread steps the scheduler as in-process; an IO thread owns the socket: it turns each
client's `SubmitRequest` into an engine request whose outputs (one `StepOutput` per step) go back
to that client, applies aborts and control calls, and sends every finished request's timeline to
every client (runtime/core/messages.py declares the messages). Clients are
runtime/core_client.py's EngineClient, one per API-server process. A client on this host whose
process ends without shutting the core down (killed, crashed) has its requests aborted within
CLIENT_CHECK_S: nobody else could abort them, and they would run to their token limit.

The process ends when a client calls `shutdown`, or when its parent process is gone. It runs
`python -m radixflow.runtime.core_process` with its settings pickled on stdin.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import zmq

from radixflow.runtime.core.messages import (
    AbortNotice, AbortRequest, ControlCall, ControlReply, CoreInfo, Health, Hello, Rejected, RequestOutput, StepOutput,
    SubmitRequest, Timings, ToCore, undecodable_submit_rid)
from radixflow.runtime.core.request import OutputOptions
from radixflow.runtime.process_liveness import process_alive, process_start
from radixflow.runtime.stats import RequestTiming

log = logging.getLogger(__name__)

# control calls a client may make; the slow ones run on a worker thread, the rest on the IO thread
BLOCKING_CALLS = frozenset({"generate", "encode", "abort_all", "flush_cache", "load_lora_adapter",
                            "unload_lora_adapter", "adapter_version", "check_accounting", "set_fault_injector",
                            "update_weights_from_disk", "update_weights_from_tensor", "update_weight_version",
                            "pause_generation",
                            "continue_generation", "score",
                            "shutdown"})
QUICK_CALLS = frozenset({"stats", "lora_adapters", "invariant_violations", "get_weight_version"})
_BROADCAST = b""  # the outbox identity of a message for every client
CLIENT_CHECK_S = 0.5  # how often the IO thread checks that the clients' processes are alive


class Outbox:
    """Messages for the IO thread to send, put from any thread (a ZMQ socket belongs to one
    thread). A byte on a pipe wakes the IO thread's poll; `fd` is the pipe's read end."""

    def __init__(self) -> None:
        self._items: deque[tuple[bytes, Any]] = deque()
        self.fd, self._wake = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._wake, False)

    def put(self, identity: bytes, message: Any) -> None:
        self._items.append((identity, message))
        try:
            os.write(self._wake, b"\0")
        except BlockingIOError:  # the pipe is full: the IO thread is awake already
            pass

    def take(self) -> list[tuple[bytes, Any]]:
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass
        items = []
        while self._items:
            items.append(self._items.popleft())
        return items

    def close(self) -> None:
        os.close(self.fd)
        os.close(self._wake)


class ClientSink:
    """One client's end of the engine output: the engine thread posts, the IO thread sends."""

    def __init__(self, outbox: Outbox, identity: bytes) -> None:
        self.outbox, self.identity = outbox, identity

    def post(self, step: StepOutput) -> None:
        self.outbox.put(self.identity, step)


class CoreServer:
    """Serves `engine` on `address` until shut down (see the module docstring)."""

    def __init__(self, engine: Any, address: str) -> None:
        self.engine = engine
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)  # outputs are never dropped: memory bounds them
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.bind(address)
        self.outbox = Outbox()
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(ToCore)
        self.clients: dict[bytes, ClientSink] = {}
        self.workers = ThreadPoolExecutor(max_workers=16, thread_name_prefix="rf-core-call")
        self._local_pids: dict[bytes, tuple[int, bytes | None]] = {}  # clients on this host: identity → process
        self._host = socket.gethostname()
        self._stop = False
        self._healthy = True
        engine.add_finish_listener(self._on_finish)

    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.outbox.fd, zmq.POLLIN)
        parent = os.getppid()
        checked = time.monotonic()
        while True:
            events = dict(poller.poll(100))
            if self.sock in events:
                self._receive()
            self._send(self.outbox.take())
            if time.monotonic() - checked >= CLIENT_CHECK_S:
                checked = time.monotonic()
                self._forget_gone_clients()
            if self._stop:
                self._send(self.outbox.take())  # what was put while the last batch went out
                return
            if self._healthy and not self.engine.is_healthy:
                self._healthy = False
                self._send([(_BROADCAST, Health(False, "the engine core stopped serving; see its log"))])
            if os.getppid() != parent:
                log.error("the engine core's parent process is gone; shutting down")
                return

    def close(self) -> None:
        self.workers.shutdown(wait=False, cancel_futures=True)
        self.sock.close(linger=1000)  # let the last replies leave
        self.ctx.term()
        self.outbox.close()

    # -- IO thread ------------------------------------------------------------------------------

    def _receive(self) -> None:
        for _ in range(1024):  # then send what is queued before reading more
            try:
                identity, payload = self.sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            try:
                message = self.decoder.decode(payload)
            except msgspec.ValidationError as exc:  # a request of wrong types: its client raises it
                self._refuse(identity, payload, exc)
                continue
            try:
                self._handle(identity, message)
            except Exception:  # one bad message must not end this thread (every client would hang)
                log.exception("dropping a client's message that could not be handled")

    def _refuse(self, identity: bytes, payload: bytes, exc: Exception) -> None:
        """A message that does not decode as its type: a submit is answered Rejected (its
        caller would wait for it forever); anything else is logged and dropped."""
        rid = undecodable_submit_rid(payload)
        if rid is None:
            log.error("dropping a client's message that could not be decoded: %s", exc)
        else:
            self.outbox.put(identity, Rejected.of(rid, ValueError(f"invalid request: {exc}")))

    def _handle(self, identity: bytes, message: Any) -> None:
        if isinstance(message, SubmitRequest):
            self._submit(identity, message)
        elif isinstance(message, AbortRequest):  # from any client (an /abort_request reaches any API
            self.engine.abort(message.rid, message.reason)  # server): a rid, or an n > 1 request's group
            if message.notify:
                notice = self.encoder.encode(AbortNotice(message.rid))
                for other in [c for c in self.clients if c != identity]:
                    self.sock.send_multipart([other, notice], copy=False)
        elif isinstance(message, ControlCall):
            self._call(identity, message)
        elif isinstance(message, Hello):
            self._sink(identity)
            if message.pid and message.host == self._host:
                self._local_pids[identity] = (message.pid, process_start(message.pid))
            e = self.engine
            self._send([(identity, CoreInfo(vocab_size=e.runner.args.vocab_size, max_context_len=e.max_context_len,
                                            kv_capacity=e.runner.kv_pool.capacity, healthy=e.is_healthy,
                                            pid=os.getpid(), hidden_size=e.hidden_size))])

    def _send(self, items: list[tuple[bytes, Any]]) -> None:
        timings: list[RequestTiming] = []
        for identity, message in items:
            if isinstance(message, RequestTiming):
                timings.append(message)
            elif identity == _BROADCAST:
                self._broadcast(message)
            else:
                self._send_to(identity, message)
        if timings:
            self._broadcast(Timings(timings))

    def _send_to(self, identity: bytes, message: Any) -> None:
        """Encode and send one message; a step's outputs that cannot be encoded end those
        requests with an error (and in the engine), so no client waits for them forever."""
        try:
            data = self.encoder.encode(message)
        except Exception as exc:
            log.exception("a message for a client could not be encoded")
            if not isinstance(message, StepOutput):
                return
            reason = {"type": "error", "message": f"its output could not be sent: {exc!r}"}
            outputs = message.request_outputs()
            for out in outputs:
                self.engine.abort(out.rid, reason)
            data = self.encoder.encode(StepOutput([RequestOutput(rid=out.rid, new_token_ids=[], finish_reason=reason)
                                                   for out in outputs]))
        self.sock.send_multipart([identity, data], copy=False)

    def _broadcast(self, message: Any) -> None:
        data = self.encoder.encode(message)
        for identity in list(self.clients):
            self.sock.send_multipart([identity, data], copy=False)

    def _sink(self, identity: bytes) -> ClientSink:
        sink = self.clients.get(identity)
        if sink is None:
            sink = self.clients[identity] = ClientSink(self.outbox, identity)
        return sink

    def _forget_gone_clients(self) -> None:
        for identity, (pid, start) in list(self._local_pids.items()):
            if not process_alive(pid, start):
                self.forget(identity, f"its client (process {pid}) is gone")

    def forget(self, identity: bytes, why: str) -> None:
        """A client is gone: abort its requests (started, or still waiting for a worker or
        compiling a grammar: the engine keeps those aborts until they start) and stop sending
        to it."""
        log.warning("aborting the requests of a client: %s", why)
        self._local_pids.pop(identity, None)
        sink = self.clients.pop(identity, None)
        if sink is not None:
            self.engine.abort_sink(sink, {"type": "abort", "message": why})

    def _submit(self, identity: bytes, m: SubmitRequest) -> None:
        sink = self._sink(identity)
        try:
            m.sampling.validate()  # decoded as a SamplingParams: its types are checked, its ranges not yet
            if m.sampling.is_constrained:  # a grammar compiles on a worker: the IO thread goes on
                self.engine.reserve(m.rid, m.group, sink)  # aborts meanwhile are kept by the engine
        except Exception as exc:  # the client raises it
            self.outbox.put(identity, Rejected.of(m.rid, exc))
            return
        if m.sampling.is_constrained:
            self.workers.submit(self._start, identity, sink, m, True)
        else:
            self._start(identity, sink, m, False)

    def _start(self, identity: bytes, sink: ClientSink, m: SubmitRequest, reserved: bool) -> None:
        try:
            opts = OutputOptions(m.return_logprob, m.logprob_start_len, m.top_logprobs_num, m.return_hidden_states)
            # tokens only: the client detokenizes and checks stop strings
            self.engine.start_stream(m.input_ids, m.sampling, opts, m.rid, m.lora, m.session_id, sink,
                                     group=m.group, lora_version=m.lora_version, reserved=reserved, embed=m.embed,
                                     priority=m.priority)
        except Exception as exc:  # bad input, a full queue, a stopped engine: the client raises it
            self.outbox.put(identity, Rejected.of(m.rid, exc))

    def _call(self, identity: bytes, m: ControlCall) -> None:
        if m.method in QUICK_CALLS:
            self._run_call(identity, m)
        elif m.method in BLOCKING_CALLS:
            self.workers.submit(self._run_call, identity, m)
        else:
            self._reply(identity, m.call_id, False, ValueError(f"unknown engine call {m.method!r}"))

    def _run_call(self, identity: bytes, m: ControlCall) -> None:
        try:
            args, kwargs = pickle.loads(m.args)
            if m.method == "invariant_violations":
                value: Any = list(self.engine.invariant_violations)
            else:
                value = getattr(self.engine, m.method)(*args, **kwargs)
        except Exception as exc:  # handed back to the caller, who raises it
            self._reply(identity, m.call_id, False, exc)
        else:
            self._reply(identity, m.call_id, True, value)
        if m.method == "shutdown":
            self._stop = True
            self.outbox.put(_BROADCAST, Health(False, "the engine core shut down"))  # wakes the poll

    def _reply(self, identity: bytes, call_id: int, ok: bool, value: Any) -> None:
        try:
            data = pickle.dumps(value)
        except Exception:  # an exception (or value) that does not pickle: its text does
            ok, data = False, pickle.dumps(RuntimeError(repr(value)))
        self.outbox.put(identity, ControlReply(call_id, ok, data))

    # -- engine thread --------------------------------------------------------------------------

    def _on_finish(self, timing: RequestTiming) -> None:
        self.outbox.put(_BROADCAST, timing)


def run_core(address: str, model: str | None, config: dict[str, Any], report: Any, log_level: int) -> None:
    """The core process's body: load the engine, write one JSON line to `report` (a binary file):
    {"ready": true} or {"ready": false, "error": message, "value_error": bool}; then serve until
    shut down."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s [core]: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the server, which shuts the core down
    from radixflow.runtime.engine import Engine

    try:
        engine = Engine(model, **config)
        server = CoreServer(engine, address)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        if isinstance(exc, ValueError):  # a model or setting that cannot be served: the parent says why
            log.debug("the engine core failed to start", exc_info=exc)
        else:  # unexpected: the traceback is the only clue
            log.exception("the engine core failed to start")
        report.write(json.dumps({"ready": False, "error": str(exc), "value_error": isinstance(exc, ValueError)})
                     .encode() + b"\n")
        report.close()
        return
    report.write(b'{"ready": true}\n')
    report.close()
    freeze_heap()
    try:
        server.serve()
    finally:
        engine.shutdown()
        server.close()


def freeze_heap() -> None:
    """Take everything allocated so far (imported modules, the model, the tokenizer: some
    300,000 objects) out of the garbage collector's view, in a process radixflow owns once it
    is ready to serve. Otherwise every full collection, which per-request and per-step
    allocations trigger every few seconds, walks them all: about 150-200 ms in which the
    process serves nothing (measured in the API server on the tiny model)."""
    gc.collect()
    gc.freeze()


def start_core(address: str, model: str | None, config: dict[str, Any], timeout_s: float = 900.0) -> subprocess.Popen:
    """Start the engine core process serving on `address`; returns it once the model is loaded.
    Raises ValueError (bad model or settings, as Engine would) or RuntimeError.

    A fresh interpreter (`python -m radixflow.runtime.core_process`), not multiprocessing: the
    caller's main module is never re-imported, so scripts need no `__main__` guard."""
    read_fd, write_fd = os.pipe()
    setup = pickle.dumps((address, model, config, logging.getLogger().getEffectiveLevel(), write_fd))
    proc = subprocess.Popen([sys.executable, "-m", "radixflow.runtime.core_process"], stdin=subprocess.PIPE,
                            pass_fds=(write_fd,))
    os.close(write_fd)
    assert proc.stdin is not None
    proc.stdin.write(setup)
    proc.stdin.close()
    with os.fdopen(read_fd, "rb") as report:
        ready = select.select([report], [], [], timeout_s)[0]
        line = report.readline() if ready else b""
    if not ready:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the engine core did not start within {timeout_s:.0f} s")
    if not line:
        raise RuntimeError(f"the engine core process exited with code {proc.wait()} while starting")
    status = json.loads(line)
    if not status["ready"]:
        proc.wait(timeout=30)
        raise (ValueError if status["value_error"] else RuntimeError)(status["error"])
    return proc


def _main() -> None:
    address, model, config, log_level, report_fd = pickle.loads(sys.stdin.buffer.read())
    run_core(address, model, config, os.fdopen(report_fd, "wb", buffering=0), log_level)


if __name__ == "__main__":
    _main()
