"""run_batch: run one program over many argument sets on a thread pool; states come back in input order.

Errors: a program that fails does not stop the others. Its state carries the error
(`state.error()`), and reading it (`state["x"]`, `state.text()`) raises ProgramError.
"""
from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixflow.lang.backend import resolve_backend
from radixflow.lang.context import ProgramContext
from radixflow.lang.executor import Run
from radixflow.lang.state import ProgramState


class _Progress:
    """A `done/total` line on stderr (no dependency on tqdm)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.done = total, enabled, 0
        self.lock = threading.Lock()

    def step(self) -> None:
        if not self.enabled:
            return
        with self.lock:
            self.done += 1
            end = "\n" if self.done == self.total else ""
            print(f"\rrun_batch: {self.done}/{self.total}", end=end, file=sys.stderr, flush=True)


def run_batch(function: Any, batch_kwargs: list[dict[str, Any]], *, backend: Any = None,
              num_threads: int | str = "auto", progress_bar: bool = False,
              **defaults: Any) -> list[ProgramState]:
    backend = resolve_backend(backend)
    if not isinstance(batch_kwargs, list) or not all(isinstance(k, dict) for k in batch_kwargs):
        raise TypeError("run_batch takes a list of keyword-argument dicts")
    if num_threads == "auto":
        num_threads = max(1, min(64, len(batch_kwargs)))
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be 'auto' or a positive int, got {num_threads!r}")
    prepared = [function.split_kwargs({**defaults, **kwargs}) for kwargs in batch_kwargs]
    states = [ProgramState(ProgramContext(backend=backend, default_params=d), Run()) for _, d in prepared]
    for state in states:
        state._run.begin()
    progress = _Progress(len(states), progress_bar)

    def one(i: int) -> None:
        function._run_body(states[i], (), prepared[i][0])
        states[i].sync()
        progress.step()

    with ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="rf-batch") as pool:
        for future in [pool.submit(one, i) for i in range(len(states))]:
            future.result()
    return states
