"""Requests being started: made and submitted off the engine loop (a grammar may compile for a
while first), not yet known to the loop. An abort of such a request's rid, or of its group's,
is kept here and applied once the loop knows it (`Engine.start_stream`), instead of finding
nothing to end."""
from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class _Starting:
    group: str | None
    aborted: bool = False
    reason: dict | None = None


class StartingRequests:
    def __init__(self) -> None:
        self._requests: dict[str, _Starting] = {}
        self._lock = threading.Lock()

    def begin(self, rid: str, group: str | None) -> None:
        """`rid` is being started (ValueError if it already is)."""
        with self._lock:
            if rid in self._requests:
                raise ValueError(f"request id {rid!r} is already in use")
            self._requests[rid] = _Starting(group)

    def end(self, rid: str) -> tuple[bool, dict | None]:
        """`rid` is submitted (or failed): (aborted meanwhile, with what reason)."""
        with self._lock:
            starting = self._requests.pop(rid)
        return starting.aborted, starting.reason

    def abort(self, rid: str, reason: dict | None) -> None:
        """Mark every request being started whose rid or group is `rid`."""
        with self._lock:
            for key, starting in self._requests.items():
                if rid in (key, starting.group):
                    starting.aborted, starting.reason = True, reason
