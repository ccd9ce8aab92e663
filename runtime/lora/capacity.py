"""Which adapters sit in the device slots: pinned while a request holds one, LRU otherwise.

The scheduler asks `can_admit` before admitting a request and calls `acquire` / `release` when
it gives a request KV and when it takes it back (finish, retraction, a failed step). An adapter
in use by a holding request is never evicted from its slot; a request whose adapter would
exceed `max_loras_per_batch` distinct adapters waits in the queue instead of failing.
Engine-thread only.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from radixflow.runtime.core.request import Req
from radixflow.runtime.lora.slots import LoraSlots


class AdapterAdmission(Protocol):
    def can_admit(self, req: Req) -> bool: ...
    def acquire(self, req: Req) -> None: ...
    def release(self, req: Req) -> str | None: ...


class NoAdapters:
    """The engine without LoRA: every request is a base-model request."""

    def can_admit(self, req: Req) -> bool:
        return True

    def acquire(self, req: Req) -> None:
        pass

    def release(self, req: Req) -> str | None:
        return None


NO_ADAPTERS = NoAdapters()


class AdapterCapacity:
    """Slot residency of adapters, keyed by content namespace (two names, one slot).

    `is_loaded(namespace)`: whether some adapter name still refers to the namespace (the
    registry's answer, asked at each last release, so an unload or a reload needs no bookkeeping here).
    """

    def __init__(self, slots: LoraSlots, max_loras_per_batch: int,
                 is_loaded: Callable[[str], bool] = lambda namespace: True) -> None:
        self.slots = slots
        self.max_per_batch = min(max_loras_per_batch, slots.num_slots)
        self.is_loaded = is_loaded
        self.pins: dict[str, int] = {}                    # namespace -> holding requests using it
        self.slot_of: dict[str, int] = {}                 # resident namespace -> slot
        self.idle: OrderedDict[str, None] = OrderedDict()  # resident, unpinned; least recent first
        self.num_slot_loads = 0
        self.peak_in_batch = 0  # most distinct adapters held at once (a batch's mix)
        self.slot_load_s = 0.0

    @property
    def num_resident(self) -> int:
        return len(self.slot_of)

    def can_admit(self, req: Req) -> bool:
        if req.lora is None:
            return True
        return req.lora.namespace in self.pins or len(self.pins) < self.max_per_batch

    def acquire(self, req: Req) -> None:
        """Pin req's adapter in a slot (copying it in when not resident); sets `req.lora_id`."""
        if req.lora is None:
            return
        ns = req.lora.namespace
        if ns not in self.slot_of:
            self._make_resident(req)
        self.idle.pop(ns, None)
        self.pins[ns] = self.pins.get(ns, 0) + 1
        self.peak_in_batch = max(self.peak_in_batch, len(self.pins))
        req.lora_id = self.slot_of[ns]

    def release(self, req: Req) -> str | None:
        """Unpin req's adapter. Returns its namespace when req was the last user of an adapter
        no name refers to any more (unloaded, or replaced by new weights while req was queued or
        running): the caller drops that namespace's KV (its slot is freed here)."""
        if req.lora is None or req.lora_id < 0:
            return None
        ns = req.lora.namespace
        req.lora_id = -1
        self.pins[ns] -= 1
        if self.pins[ns]:
            return None
        del self.pins[ns]
        if not self.is_loaded(ns):
            self.slots.holder[self.slot_of.pop(ns)] = None
            return ns
        self.idle[ns] = None
        return None

    def forget(self, namespace: str) -> None:
        """An adapter no name refers to: free its slot now, unless a request holds it (then its
        last `release` does)."""
        if namespace not in self.pins and namespace in self.slot_of:
            self.slots.holder[self.slot_of.pop(namespace)] = None
            self.idle.pop(namespace, None)

    def _make_resident(self, req: Req) -> None:
        free = [s for s, holder in enumerate(self.slots.holder) if holder is None]
        if free:
            slot = free[0]
        else:
            assert self.idle, "can_admit guarantees a slot that no holding request uses"
            victim, _ = self.idle.popitem(last=False)
            slot = self.slot_of.pop(victim)
        start = time.perf_counter()
        self.slots.write(slot, req.lora)
        self.slot_load_s += time.perf_counter() - start
        self.num_slot_loads += 1
        self.slot_of[req.lora.namespace] = slot
