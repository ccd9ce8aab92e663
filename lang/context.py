"""ProgramContext: the mutable data of one running program (text, variables, roles) and where it goes.

Owned by exactly one thread at a time: a local state's worker thread, or the interpreter's
caller (each fork branch owns its own child context). `listener` hears every appended piece of
text and every variable set, for streaming and for waiters on other threads.
"""
from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from radixflow.lang.budget import UNLIMITED, Budget
from radixflow.lang.roles import RoleMarkers


class Listener(Protocol):
    def on_text(self, piece: str, var: str | None) -> None: ...
    def on_var(self, name: str) -> None: ...


class NullListener:
    def on_text(self, piece: str, var: str | None) -> None:
        pass

    def on_var(self, name: str) -> None:
        pass


class Stop:
    """Whether the program's body failed (shared by its branches), and what to abort then:
    streamed gens watch `is_set()` and close their streams; a non-streamed gen registers its
    request id with its backend's `abort` while it runs (`tracking`)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._inflight: dict[str, Callable[[str], None]] = {}

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        """Stop: abort every tracked request in flight."""
        with self._lock:
            self._event.set()
            inflight, self._inflight = self._inflight, {}
        for rid, abort in inflight.items():
            abort(rid)

    @contextlib.contextmanager
    def tracking(self, rid: str, abort: Callable[[str], None]) -> Iterator[None]:
        with self._lock:
            if self._event.is_set():
                raise RuntimeError("stopped: the program's body failed")
            self._inflight[rid] = abort
        try:
            yield
        finally:
            with self._lock:
                self._inflight.pop(rid, None)


@dataclass
class ProgramContext:
    backend: Any
    stream: bool = False  # gens use backend.generate_stream
    arguments: dict[str, Any] = field(default_factory=dict)
    default_params: dict[str, Any] = field(default_factory=dict)  # under every gen's own params
    listener: Listener = field(default_factory=NullListener)
    text: str = ""
    variables: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, str]] = field(default_factory=list)
    role: str | None = None  # the open chat turn
    role_start: int = 0  # text index where the open turn's content starts
    scopes: list[tuple[str, int]] = field(default_factory=list)  # var_scope name, text start
    forks: dict[str, list[ProgramContext]] = field(default_factory=dict)  # interpreter: fork id → branches
    branch: tuple[str, int] | None = None  # (fork id, index) when this context is a fork branch
    set_since_fork: list[str] = field(default_factory=list)  # names a branch set, for join
    budget: Budget = UNLIMITED  # characters and time the run may still spend (shared by its branches)
    stopped: Stop = field(default_factory=Stop)  # set when the body failed (shared by the branches)
    _markers: RoleMarkers | None = None

    def append(self, piece: str, var: str | None = None) -> None:
        self.budget.spend(len(piece))
        self.text += piece
        self.listener.on_text(piece, var)

    def set_var(self, name: str, value: Any, meta: Any = None) -> None:
        self.budget.spend(len(value) if isinstance(value, str) else 1)
        self.variables[name] = value
        if meta is not None:
            self.meta[name] = meta
        if name not in self.set_since_fork:
            self.set_since_fork.append(name)
        self.listener.on_var(name)

    def markers(self) -> RoleMarkers:
        """The backend's role markers, asked once per program (branches share the answer)."""
        if self._markers is None:
            self._markers = RoleMarkers.from_dict(self.backend.role_markers())
        return self._markers

    def child(self, branch: tuple[str, int] | None = None) -> ProgramContext:
        """A fork branch: a copy of everything so far, with its own listener and no forks."""
        self.budget.spend(len(self.text))
        return ProgramContext(
            backend=self.backend, stream=self.stream, arguments=self.arguments,
            default_params=self.default_params, text=self.text,
            variables=copy.copy(self.variables), meta=copy.copy(self.meta),
            messages=[dict(m) for m in self.messages], role=self.role, role_start=self.role_start,
            scopes=list(self.scopes), branch=branch, budget=self.budget, stopped=self.stopped,
            _markers=self._markers)
