"""Killable subprocesses that build outlines-core indexes under a time and memory limit.

Why a process: an outlines-core Index build is a Rust call that holds its thread until it is
done, and some schemas run for minutes and take gigabytes (a JSON string with a large
`maxLength` at a 128k vocabulary; a regex such as `[ab]*a[ab]{20}` whose DFA is exponential).
A thread cannot be stopped, a process can. The Index pickles (it serializes to bytes), so the
worker sends the finished index back and the engine process unpickles it.

Measured on the 3072-token demo vocabulary (2-core CPU): worker start plus a first small
compile 40 ms, later small compiles < 1 ms round trip; `[ab]*a[ab]{n}` takes 0.5 s at n=14,
2.1 s at n=16, 8.5 s at n=18 (x4 per step, 480 MB); a string with maxLength 3000 compiles in
0.8 s but its Index pickles to 82 MB (the cache bound counts these bytes). Unpickling is
~memcpy speed, so the transfer costs little next to the build.

Protocol (multiprocessing.connection framing over the child's stdin/stdout): the parent first
sends the pickled (eos_id, {bytes: [ids]}) vocabulary, then one regex (UTF-8) per job; the
child answers b"\\x00" + pickled Index, or b"\\x01" + an error message.

Run as `python -m radixflow.runtime.grammar.worker`; imports only the standard library and
outlines_core, so it starts in well under a second.
"""
from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

log = logging.getLogger(__name__)

DEFAULT_MAX_WORKERS = 2
DEFAULT_MAX_MEMORY_BYTES = 8 << 30   # address-space cap of one worker
POLL_S = 0.05  # how often a waiting or running job checks whether anybody still waits for it


class CompileTimeout(Exception):
    """The job did not finish in time; `ran_s` is how long it actually ran in a worker."""

    def __init__(self, message: str, ran_s: float) -> None:
        super().__init__(message)
        self.ran_s = ran_s


class CompileCancelled(Exception):
    """Nobody waited for the job any more: it was stopped (its worker killed)."""


class CompileFailed(Exception):
    """The worker reported an error, or died (usually out of memory)."""


class _Worker:
    def __init__(self, vocab_payload: bytes, max_memory_bytes: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radixflow.runtime.grammar.worker", str(max_memory_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.send = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self.recv = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.send.send_bytes(vocab_payload)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.send.close()
        self.recv.close()


class CompileWorkers:
    """A small pool of persistent worker processes, started on first use.

    `build_index(regex, timeout_s)` is thread-safe and returns the pickled Index. Waiting for a
    free worker counts against `timeout_s`; a job past its time is killed with its process
    (the next job starts a fresh one).
    """

    def __init__(self, eos_id: int, token_map: dict[bytes, list[int]],
                 max_workers: int = DEFAULT_MAX_WORKERS,
                 max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES) -> None:
        self._payload = pickle.dumps((eos_id, token_map))
        self._max_memory_bytes = max_memory_bytes
        self._slots = threading.BoundedSemaphore(max_workers)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False

    def build_index(self, regex: str, timeout_s: float, gone: Callable[[], bool] = lambda: False) -> bytes:
        """The pickled Index of `regex`. CompileCancelled once `gone()` (checked every POLL_S
        while it waits for a worker or runs: the job is killed with its worker)."""
        deadline = time.monotonic() + timeout_s
        while not self._slots.acquire(timeout=max(0.0, min(POLL_S, deadline - time.monotonic()))):
            if gone():
                raise CompileCancelled("nobody waits for this compile any more")
            if time.monotonic() >= deadline:
                raise CompileTimeout(f"no grammar compile worker became free within {timeout_s:g} s", 0.0)
        try:
            return self._run(regex, deadline, timeout_s, gone)
        finally:
            self._slots.release()

    def _run(self, regex: str, deadline: float, timeout_s: float, gone: Callable[[], bool]) -> bytes:
        with self._lock:
            if self._closed:
                raise CompileFailed("the engine is shut down")
            worker = self._idle.pop() if self._idle else None
        start = time.monotonic()
        try:
            worker = worker or _Worker(self._payload, self._max_memory_bytes)
            worker.send.send_bytes(regex.encode("utf-8"))
            while not worker.recv.poll(max(0.0, min(POLL_S, deadline - time.monotonic()))):
                if gone():
                    worker.kill()
                    raise CompileCancelled("nobody waits for this compile any more")
                if time.monotonic() >= deadline:
                    worker.kill()
                    raise CompileTimeout(f"grammar compilation exceeded the {timeout_s:g} s limit",
                                         time.monotonic() - start)
            reply = worker.recv.recv_bytes()
        except (EOFError, OSError) as exc:
            if worker is not None:
                worker.kill()
            raise CompileFailed("the grammar compiler process died (the grammar is probably too "
                                f"large for the memory limit): {exc}") from exc
        with self._lock:
            if self._closed:
                worker.kill()
            else:
                self._idle.append(worker)
        if reply[:1] == b"\x01":
            raise CompileFailed(reply[1:].decode("utf-8", "replace"))
        return reply[1:]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


def _serve(max_memory_bytes: int) -> None:
    import resource

    from outlines_core import Index, Vocabulary

    recv = Connection(os.dup(0), writable=False)
    send = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # NOTE: stray prints must never corrupt the reply channel
    resource.setrlimit(resource.RLIMIT_AS, (max_memory_bytes, max_memory_bytes))
    eos_id, token_map = pickle.loads(recv.recv_bytes())
    vocabulary = Vocabulary(eos_id, token_map)
    while True:
        try:
            regex = recv.recv_bytes().decode("utf-8")
        except EOFError:
            return
        try:
            reply = b"\x00" + pickle.dumps(Index(regex, vocabulary))
        except (ValueError, TypeError, RuntimeError, OverflowError, MemoryError) as exc:
            reply = b"\x01" + f"{type(exc).__name__}: {exc}".encode("utf-8")
        send.send_bytes(reply)


if __name__ == "__main__":
    _serve(int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_MAX_MEMORY_BYTES)
