"""LRU cache of compiled grammars, bounded in entries and bytes, with in-flight de-duplication."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from radixflow.runtime.grammar.backend import GrammarCancelled, GrammarError, Gone
from radixflow.runtime.grammar.worker import POLL_S

DEFAULT_MAX_ENTRIES = 1024
DEFAULT_MAX_BYTES = 1 << 30


class _Pending:
    """A compile in flight: its result, and the cancel events of the callers waiting for it
    (None: one that never stops waiting)."""

    def __init__(self) -> None:
        self.future: Future = Future()
        self.waiters: list[threading.Event | None] = []

    def gone(self) -> bool:
        """Whether every waiter was cancelled (the compile may stop)."""
        return all(w is not None and w.is_set() for w in self.waiters)


class GrammarCache:
    """Maps a key to a compiled grammar (or to the GrammarError it failed with, so a bad or
    pathological grammar is not compiled again). Thread-safe.

    Concurrent requests for one key wait for a single compilation. Entries past `max_entries`
    or `max_bytes` (sum of `nbytes`) are dropped least recently used first; a grammar in use by
    running requests stays alive through their references, the cache merely forgets it.
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._pending: dict[Any, _Pending] = {}
        self._lock = threading.Lock()
        self.num_bytes = 0
        self.hits = self.misses = 0

    def get_or_compile(self, key: Any, compile_fn: Callable[[Gone], Any],
                       should_remember: Callable[[GrammarError], bool] = lambda _e: True,
                       cancel: threading.Event | None = None) -> Any:
        """The cached value for `key`, else `compile_fn(gone)` stored under it. Raises the
        GrammarError of a failed compile; failures are cached when `should_remember(err)`.
        `cancel`: set once this caller no longer wants the result (its request was aborted):
        it stops waiting (GrammarCancelled), and a compile every waiter has left is stopped
        (`gone()` tells compile_fn so)."""
        while True:
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    self.hits += 1
                    return self._unwrap(self._entries[key][0])
                pending = self._pending.get(key)
                owner = pending is None
                if owner:
                    pending = self._pending[key] = _Pending()
                    self.misses += 1
                pending.waiters.append(cancel)
            if owner:
                return self._compile(key, pending, compile_fn, should_remember)
            try:
                return self._unwrap(self._wait(pending, cancel))
            except GrammarCancelled:
                if cancel is not None and cancel.is_set():
                    raise
                # the compile was stopped as this caller joined it: compile again

    @staticmethod
    def _wait(pending: _Pending, cancel: threading.Event | None) -> Any:
        while True:
            try:
                return pending.future.result(timeout=None if cancel is None else POLL_S)
            except FutureTimeout:
                if cancel.is_set():  # type: ignore[union-attr]
                    raise GrammarCancelled("the request was aborted while its grammar compiled") from None

    def _compile(self, key: Any, pending: _Pending, compile_fn: Callable[[Gone], Any],
                 should_remember: Callable[[GrammarError], bool]) -> Any:
        future = pending.future
        try:
            value = compile_fn(pending.gone)
            size = int(getattr(value, "nbytes", 0))
        except GrammarError as exc:
            value, size = exc, len(str(exc))
        except BaseException as exc:  # not a grammar problem (or stopped): waiters get it too, nothing cached
            with self._lock:
                del self._pending[key]
            future.set_exception(exc)
            raise
        remember = not isinstance(value, GrammarError) or should_remember(value)
        with self._lock:
            del self._pending[key]
            if remember:
                self._store(key, value, size)
        future.set_result(value)
        return self._unwrap(value)

    def __len__(self) -> int:
        return len(self._entries)

    def _store(self, key: Any, value: Any, size: int) -> None:
        if size > self.max_bytes:
            return
        self._entries[key] = (value, size)
        self.num_bytes += size
        while len(self._entries) > self.max_entries or self.num_bytes > self.max_bytes:
            _, (_, old) = self._entries.popitem(last=False)
            self.num_bytes -= old

    @staticmethod
    def _unwrap(value: Any) -> Any:
        if isinstance(value, GrammarError):
            raise GrammarError(str(value))
        return value
