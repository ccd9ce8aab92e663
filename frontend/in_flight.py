"""This server's engine requests in flight: client rids kept unique, aborts by client rid, abort on shutdown."""
from __future__ import annotations

import threading
from typing import Any

from radixflow.frontend.errors import APIError


class InFlight:
    """The engine rids of every fan-out this server runs, and which client rid each belongs to.

    A client rid is refused while a request of this server still uses it (n > 1 samples run as
    `rid-0`, `rid-1`, ... so the engine alone would not see the clash); `abort(rid)` asks the
    engine to end `rid`, whichever server runs it, and remembers it for a request of this server
    between its shared prefill and its samples (`aborted`), when the engine holds nothing of it;
    `abort_all()` ends everything this server runs (shutdown: the streams finish with reason
    abort instead of being cut). Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[int, list[str]] = {}  # a fan-out → its engine rids
        self._groups: dict[str, list[str]] = {}  # a client rid → the engine rids of its samples
        self._aborted: set[str] = set()  # client rids of this server that an abort named
        self._stopping = False

    def add(self, key: int, jobs: list[tuple[str, str | None]]) -> None:
        """Register a fan-out's jobs as (engine rid, client rid or None). ValueError when a
        client rid is in use by another request; APIError 503 once shutting down."""
        groups: dict[str, list[str]] = {}
        for rid, group in jobs:
            if group is not None:
                groups.setdefault(group, []).append(rid)
        with self._lock:
            if self._stopping:
                raise APIError(503, "the server is shutting down")
            used = next((g for g in groups if g in self._groups), None)
            if used is not None:
                raise ValueError(f"request id {used!r} is already in use")
            self._groups.update(groups)
            self._by_key[key] = [rid for rid, _ in jobs]

    def remove(self, key: int) -> None:
        """Forget a fan-out (idempotent)."""
        with self._lock:
            rids = set(self._by_key.pop(key, ()))
            for group in [g for g, members in self._groups.items() if rids.intersection(members)]:
                del self._groups[group]
                self._aborted.discard(group)

    def abort(self, engine: Any, rid: str) -> None:
        """Abort the request the client named `rid`, or the engine rid `rid`. Sent to the engine
        even when this server does not run it: with several API servers another one may, and
        the core ends every sample of an n > 1 request by its rid (each carries it as `group`)
        and tells the other servers (`notice`)."""
        with self._lock:
            if rid in self._groups:
                self._aborted.add(rid)
        engine.abort_request(rid)

    def notice(self, engine: Any, rid: str) -> None:
        """Another server's abort named `rid` (any thread): when a request of this server runs
        under that client rid, remember it (its samples may not be submitted yet: `aborted`,
        `end_if_aborted`) and end what it submitted."""
        with self._lock:
            if rid not in self._groups:
                return
            self._aborted.add(rid)
        engine.abort(rid)

    def end_if_aborted(self, engine: Any, rids: set[str]) -> None:
        """Once a fan-out's requests are submitted: end those under a client rid an abort named
        meanwhile. Such an abort may have reached the engine before they did, and found nothing."""
        with self._lock:
            aborted = rids & self._aborted
        for rid in aborted:
            engine.abort(rid)

    def aborted(self, rid: str | None) -> bool:
        """Whether a request of this server under client rid `rid` (None: none given) is to end:
        an abort named it, or the server is shutting down."""
        with self._lock:
            return self._stopping or rid in self._aborted

    def abort_all(self, engine: Any) -> None:
        """Abort everything this server runs and refuse new fan-outs (shutdown)."""
        with self._lock:
            self._stopping = True
            rids = [rid for members in self._by_key.values() for rid in members]
        for rid in rids:
            engine.abort(rid)
