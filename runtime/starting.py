"""Requests being started: made and submitted off the engine loop (a grammar may compile for a
while first, or, in the core process, the submit may wait for a worker), not yet known to the
loop. An abort meanwhile — of such a request's rid, of its group's, or of everything its output
sink receives (a client that is gone) — is kept here and applied once the loop knows it
(`Engine.start_stream`), instead of finding nothing to end."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Starting:
    group: str | None
    sink: Any
    aborted: bool = False
    reason: dict | None = None
    cancel: threading.Event = field(default_factory=threading.Event)  # set with `aborted`: its compile may stop


class StartingRequests:
    def __init__(self) -> None:
        self._requests: dict[str, _Starting] = {}
        self._lock = threading.Lock()

    def begin(self, rid: str, group: str | None, sink: Any = None) -> None:
        """`rid` (outputs to `sink`) is being started (ValueError if it already is)."""
        with self._lock:
            if rid in self._requests:
                raise ValueError(f"request id {rid!r} is already in use")
            self._requests[rid] = _Starting(group, sink)

    def cancel_event(self, rid: str) -> threading.Event:
        """Set once `rid` (being started) is aborted: what its grammar compile watches."""
        with self._lock:
            return self._requests[rid].cancel

    def end(self, rid: str) -> tuple[bool, dict | None]:
        """`rid` is submitted (or failed): (aborted meanwhile, with what reason)."""
        with self._lock:
            starting = self._requests.pop(rid)
        return starting.aborted, starting.reason

    def abort(self, rid: str, reason: dict | None) -> None:
        """Mark every request being started whose rid or group is `rid`."""
        self._mark(lambda key, starting: rid in (key, starting.group), reason)

    def abort_sink(self, sink: Any, reason: dict | None) -> None:
        """Mark every request being started whose outputs go to `sink`."""
        self._mark(lambda key, starting: starting.sink is sink, reason)

    def _mark(self, matches: Any, reason: dict | None) -> None:
        with self._lock:
            for key, starting in self._requests.items():
                if matches(key, starting):
                    starting.aborted, starting.reason = True, reason
                    starting.cancel.set()
