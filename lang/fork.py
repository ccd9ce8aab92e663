"""fork/join: one shared prefill for the common text, then branches that copy it; join gathers their variables."""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from radixflow.lang.backend import check_finished
from radixflow.lang.context import ProgramContext

MAX_BRANCH_THREADS = 64  # one pool for every program's fork branches in this process


class BranchPool:
    """One bounded thread pool for fork branches, shared by all programs. A branch runs on a
    pool thread when one is free and otherwise inline on the forking thread, so nested forks
    never wait on a queue (no deadlock) and no fork opens threads of its own."""

    def __init__(self, max_threads: int = MAX_BRANCH_THREADS) -> None:
        self._free = threading.BoundedSemaphore(max_threads)
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="rf-branch")

    def run_all(self, tasks: list[Callable[[], None]]) -> None:
        """Run every task; wait for all; re-raise the first failure."""
        futures: list[Future] = []
        for task in tasks:
            if self._free.acquire(blocking=False):
                futures.append(self._pool.submit(self._release_after, task))
            else:
                done: Future = Future()
                try:
                    task()
                    done.set_result(None)
                except Exception as exc:  # re-raised below, after the other branches finish
                    done.set_exception(exc)
                futures.append(done)
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def _release_after(self, task: Callable[[], None]) -> None:
        try:
            task()
        finally:
            self._free.release()


BRANCHES = BranchPool()


def check_fork_size(n: Any, max_branches: int | None = None) -> None:
    """A fork's n is a positive int (a bool is not a count), at most `max_branches` when given."""
    if isinstance(n, bool):
        raise ValueError(f"fork needs a positive int number of branches, not a bool ({n!r})")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"fork needs a positive int number of branches, got {n!r}")
    if max_branches is not None and n > max_branches:
        raise ValueError(f"fork({n}): at most {max_branches} branches per fork (the default of the "
                         "program limit max_branches)")


def prefill(ctx: ProgramContext) -> None:
    """One prefill-only request for the text so far, so every branch's first request hits the cache."""
    if ctx.text:
        check_finished(ctx.backend.generate({"text": ctx.text, "sampling_params": {"max_new_tokens": 0}}),
                       "the fork's shared prefill")


def fork_contexts(ctx: ProgramContext, n: int, fork_id: str | None = None) -> list[ProgramContext]:
    """Send the shared prefill once, then return `n` branch copies of `ctx`."""
    check_fork_size(n)
    prefill(ctx)
    return [ctx.child((fork_id, i) if fork_id is not None else None) for i in range(n)]


def gather(parent: ProgramContext, branches: list[ProgramContext]) -> None:
    """Set each variable any branch set since the fork, on `parent`, as a list over the branches
    (None where a branch did not set it); meta info likewise."""
    names: list[str] = []
    for branch in branches:
        names.extend(n for n in branch.set_since_fork if n not in names)
    for name in names:
        metas = [b.meta.get(name) for b in branches]
        parent.set_var(name, [b.variables.get(name) for b in branches],
                       metas if any(m is not None for m in metas) else None)


class ForkGroup(list):
    """The branches of `s.fork(n)`: a list of states, plus `join()` (same as `s.join(forks)`)."""

    def __init__(self, parent: Any, states: list[Any], fork_id: str | None = None) -> None:
        super().__init__(states)
        self.parent = parent
        self.id = fork_id

    def join(self, mode: str = "gather_variable") -> None:
        self.parent.join(self, mode)


def check_join_mode(mode: str) -> None:
    if mode != "gather_variable":
        raise ValueError(f"join mode {mode!r} is not supported; only 'gather_variable'")
