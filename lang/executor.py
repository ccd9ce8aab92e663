"""Executor: runs a local state's ops in order on a worker thread, so `s += ...` returns at once.

One `Run` is shared by a program's root state and all its fork branches: one Condition guards
every executor's queue, event log and error, and tells waiters when the program body is done.
A worker thread exists only while ops are queued (no idle threads per state).
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any

from radixflow.lang import ir
from radixflow.lang.context import ProgramContext
from radixflow.lang.ops import run_ops


class ProgramError(RuntimeError):
    """A program failed; `__cause__` is the original exception."""


class Run:
    """The program body's progress, shared by the executors of one program.

    Until `begin()` there is no body (a state used directly): waits end once the queue is idle.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.body_done = True
        self.body_thread: int | None = None

    def begin(self) -> None:
        """Called by the launcher before the body starts (on whatever thread it will run)."""
        with self.cond:
            self.body_done, self.body_thread = False, None

    def enter_body(self) -> None:
        """Called on the body's own thread: its reads must not wait for itself."""
        with self.cond:
            self.body_thread = threading.get_ident()

    def end_body(self) -> None:
        with self.cond:
            self.body_done = True
            self.cond.notify_all()

    def body_may_add(self) -> bool:
        """True while the body can still queue ops that another thread would be waiting for."""
        return not self.body_done and threading.get_ident() != self.body_thread


class Executor:
    """Queue of op lists for one ProgramContext; also its listener (event log for text_iter)."""

    def __init__(self, ctx: ProgramContext, run: Run) -> None:
        self.ctx, self.run = ctx, run
        ctx.listener = self
        self.pending: deque[list[ir.Op]] = deque()
        self.running = False
        self.error: BaseException | None = None
        self.events: list[tuple[str | None, str | None]] = []  # (piece, var); piece None = var done

    # -- queue (caller threads) ---------------------------------------------------------------

    def submit(self, ops: list[ir.Op]) -> None:
        with self.run.cond:
            if self.error is not None:
                return
            self.pending.append(ops)
            if not self.running:
                self.running = True
                threading.Thread(target=self._work, name="rf-state", daemon=True).start()

    def fail(self, exc: BaseException) -> None:
        with self.run.cond:
            if self.error is None:
                self.error = exc
            self.pending.clear()
            self.run.cond.notify_all()

    def _work(self) -> None:
        while True:
            with self.run.cond:
                if self.error is not None or not self.pending:
                    self.running = False
                    self.pending.clear()
                    self.run.cond.notify_all()
                    return
                ops = self.pending.popleft()
            try:
                run_ops(self.ctx, ops)
            except Exception as exc:  # handed to the program's reader, re-raised on access
                self.fail(exc)

    # -- waiting (caller threads; call with run.cond held) -----------------------------------

    def idle(self) -> bool:
        return not self.running and not self.pending

    def finished(self) -> bool:
        """Nothing more will happen unless the caller itself adds ops."""
        return self.error is not None or (self.idle() and not self.run.body_may_add())

    def wait(self, predicate: Any) -> None:
        with self.run.cond:
            self.run.cond.wait_for(lambda: predicate() or self.finished())

    # -- listener (worker thread) ----------------------------------------------------------

    def on_text(self, piece: str, var: str | None) -> None:
        with self.run.cond:
            self.events.append((piece, var))
            self.run.cond.notify_all()

    def on_var(self, name: str) -> None:
        with self.run.cond:
            self.events.append((None, name))
            self.run.cond.notify_all()
