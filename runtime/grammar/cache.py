"""LRU cache of compiled grammars, bounded in entries and bytes, with in-flight de-duplication."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from radixflow.runtime.grammar.backend import GrammarError

DEFAULT_MAX_ENTRIES = 1024
DEFAULT_MAX_BYTES = 1 << 30


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
        self._pending: dict[Any, Future] = {}
        self._lock = threading.Lock()
        self.num_bytes = 0
        self.hits = self.misses = 0

    def get_or_compile(self, key: Any, compile_fn: Callable[[], Any],
                       should_remember: Callable[[GrammarError], bool] = lambda _e: True) -> Any:
        """The cached value for `key`, else `compile_fn()` stored under it. Raises the
        GrammarError of a failed compile; failures are cached when `should_remember(err)`."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._unwrap(self._entries[key][0])
            future = self._pending.get(key)
            owner = future is None
            if owner:
                future = self._pending[key] = Future()
                self.misses += 1
        if not owner:
            return self._unwrap(future.result())
        try:
            value = compile_fn()
            size = int(getattr(value, "nbytes", 0))
        except GrammarError as exc:
            value, size = exc, len(str(exc))
        except BaseException as exc:  # not a grammar problem: waiters get it too, nothing cached
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
