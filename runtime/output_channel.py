"""OutputChannel: hands the engine's StepOutputs to one asyncio loop, one wake-up per step."""
from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any

from radixflow.runtime.core.messages import StepOutput


class OutputQueue:
    """One request's outputs on its loop: put by the channel's delivery, taken all at once by
    the request's stream. Lighter than an asyncio.Queue (no getter queue, no join event): a
    stream has one reader."""

    __slots__ = ("_items", "_waiter", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._items: list[Any] = []
        self._waiter: asyncio.Future | None = None
        self._loop = loop

    def put(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[Any]:
        """Everything that arrived since the last take, in order; waits for at least one."""
        while not self._items:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self._items = self._items, []
        return items


class OutputChannel:
    """One asyncio loop's end of the engine output (the in-process stand-in for the socket of
    the engine-process split).

    The engine thread calls `post`; the loop thread `open`s a queue per request id before the
    request is submitted, reads RequestOutputs from it, and `close`s it. Posts that arrive while
    a delivery is pending join it, so a loop that falls behind is woken once, not once per
    request per step. Outputs for a request id with no open queue (a consumer gone) are dropped.
    A request's queue closes once its last output (a finish, or a refusal) is delivered.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._queues: dict[str, OutputQueue] = {}
        self._pending: list[list[Any] | StepOutput] = []
        self._lock = threading.Lock()

    def open(self, rid: str) -> OutputQueue:
        """Loop thread: the queue `rid`'s outputs will arrive on (open it before submitting the
        request). ValueError if a queue is open for `rid`: another stream's."""
        if rid in self._queues:
            raise ValueError(f"request id {rid!r} is already in use")
        queue = self._queues[rid] = OutputQueue(self.loop)
        return queue

    def close(self, rid: str, queue: OutputQueue) -> None:
        """Loop thread: stop delivering to `rid` if `queue` is still its queue (a stream closed
        late leaves a newer stream of the same rid alone)."""
        if self._queues.get(rid) is queue:
            del self._queues[rid]

    def post(self, step: StepOutput) -> None:
        """Engine thread: deliver `step` on the loop soon. A closed loop drops it (its consumers
        are gone; their aborts are queued). Its columns become RequestOutputs on the loop."""
        self.post_items(step)

    def post_items(self, items: list[Any] | StepOutput) -> None:
        """Any thread: deliver each item (a RequestOutput, or anything with a `rid`: the core
        client's refusals; or a StepOutput's) to its request's queue on the loop soon."""
        with self._lock:
            self._pending.append(items)
            wake = len(self._pending) == 1
        if wake and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the loop closed since the check
                pass

    def _deliver(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        queues = self._queues
        for items in pending:
            if isinstance(items, StepOutput):
                items = items.request_outputs()
            for out in items:
                queue = queues.get(out.rid)
                if queue is not None:
                    queue.put(out)
                    if getattr(out, "finish_reason", True) is not None:  # its last (a refusal has none)
                        del queues[out.rid]  # the rid is free for a new stream, read or not


class ChannelsByLoop:
    """One OutputChannel per asyncio loop, made on first use; any thread."""

    def __init__(self) -> None:
        self._channels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, OutputChannel] = (
            weakref.WeakKeyDictionary())
        self._lock = threading.Lock()

    def get(self, loop: asyncio.AbstractEventLoop) -> OutputChannel:
        with self._lock:
            channel = self._channels.get(loop)
            if channel is None:
                channel = self._channels[loop] = OutputChannel(loop)
            return channel
