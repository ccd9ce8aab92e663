"""The errors the engine raises to its callers, shared by Engine and EngineClient."""
from __future__ import annotations


class QueueFullError(ValueError):
    """More requests are waiting than `max_queued_requests` allows; retry later."""


class EngineClosedError(RuntimeError):
    """The engine was shut down: it takes no more work."""


class EngineDeadError(RuntimeError):
    """The engine loop thread died: every request in flight failed, new ones are refused."""
