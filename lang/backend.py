"""The one protocol every backend speaks: native /generate bodies in, native responses out."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Backend(Protocol):
    def generate(self, body: dict) -> dict | list[dict]:
        """A native /generate request body (`text` or `input_ids`, `sampling_params`, logprob keys)
        → the response: one dict for one input, a list in input order for a list."""
        ...

    def generate_stream(self, body: dict) -> Iterator[dict]:
        """The chunks of a streaming /generate for one input; each chunk's `text` is cumulative."""
        ...

    def role_markers(self) -> dict:
        """{"bos": str, "system": [begin, end], "user": [begin, end], "assistant": [begin, end]}."""
        ...


class BackendError(RuntimeError):
    """The backend refused or failed a request; the message is the server's."""


FAILED_FINISHES = ("error", "abort")


def check_finished(response: dict, what: str) -> None:
    """Raise BackendError if `response` (a /generate result, or a stream's last chunk) ended with
    finish reason `error` (the engine failed it) or `abort` (it was stopped before its end: an
    abort request, a grammar with no valid continuation, a KV cache too small, a shutdown).

    An abort fails the program as an error does: the text is partial (a constrained gen may not
    even match its grammar) and every later op would build on it. Over HTTP an engine error is
    already a 500 (BackendError); this gives the in-process backend the same outcome.
    """
    reason = (response.get("meta_info") or {}).get("finish_reason")
    if isinstance(reason, dict) and reason.get("type") in FAILED_FINISHES:
        raise BackendError(f"{what} ended with finish reason {reason['type']}: "
                           f"{reason.get('message') or 'no message'}")


_default: Backend | None = None


def set_default_backend(backend: Backend | None) -> None:
    global _default
    _default = backend


def get_default_backend() -> Backend | None:
    return _default


def resolve_backend(backend: Any) -> Backend:
    """`backend` if given, else the default one; neither → ValueError saying what to do."""
    chosen = backend if backend is not None else _default
    if chosen is None:
        raise ValueError("no backend: pass backend=... or call rf.set_default_backend(...)")
    if not isinstance(chosen, Backend):
        raise TypeError(f"{type(chosen).__name__} is not a backend: it needs generate, generate_stream, role_markers")
    return chosen
