"""Adapters known by name: loading (timed), host-memory LRU of their weights, name resolution.

Thread-safe: the engine's callers load, unload and resolve from any thread. A name maps to a
path and to the content namespace last read from it; two names of identical weights resolve
to one namespace (and so share KV). Weights past `max_cpu_loras` adapters in host memory are
dropped least recently used first and read again from their path on the next use; a request
in flight keeps its adapter object (and weights) alive whatever the LRU drops.
"""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from radixflow.radix.histogram import Histogram
from radixflow.runtime.lora.adapter import LoraAdapter, check_path, load_adapter
from radixflow.runtime.model.model_config import ModelArgs


@dataclass(frozen=True)
class AdapterSpec:
    """What the engine accepts: sizes of its slots and where adapter paths may lie."""

    max_rank: int
    targets: frozenset[str]
    lora_dir: str | None
    max_cpu_loras: int | None  # None: keep every loaded adapter's weights in host memory


class LoraRegistry:
    def __init__(self, args: ModelArgs, spec: AdapterSpec) -> None:
        self.args, self.spec = args, spec
        self._lock = threading.Lock()
        self._paths: dict[str, str] = {}                                # name -> adapter path
        self._namespace: dict[str, str] = {}                            # name -> content namespace
        self._loads: dict[str, int] = {}                                # name -> loads + unloads so far
        self._host: OrderedDict[str, LoraAdapter] = OrderedDict()       # namespace -> weights, LRU
        self.load_time = Histogram()                                    # seconds per adapter read
        self.requests: dict[str, int] = {}                              # name -> requests submitted

    def _read(self, path: str) -> LoraAdapter:
        start = time.perf_counter()
        adapter = load_adapter(path, self.args, self.spec.max_rank, self.spec.targets, self.spec.lora_dir)
        with self._lock:
            self.load_time.observe(time.perf_counter() - start)
        return adapter

    def load(self, name: str, path: str) -> tuple[LoraAdapter, str | None]:
        """Register `name` for the adapter at `path` (replacing what the name meant before).
        Returns the adapter and the namespace no name refers to any more (its KV can go), if any."""
        if not isinstance(name, str) or not name.strip() or "=" in name:
            raise ValueError(f"adapter name must be a non-empty string without '=', got {name!r}")
        adapter = self._read(path)
        with self._lock:
            old = self._namespace.get(name)
            self._paths[name], self._namespace[name] = path, adapter.namespace
            self._loads[name] = self._loads.get(name, 0) + 1
            self._keep(adapter)
            return adapter, self._orphan(old)

    def unload(self, name: str) -> str | None:
        """Forget `name`; returns its namespace when no other name shares it (its KV can go)."""
        with self._lock:
            if name not in self._paths:
                raise ValueError(f"no adapter named {name!r} is loaded")
            del self._paths[name]
            self._loads[name] = self._loads.get(name, 0) + 1
            return self._orphan(self._namespace.pop(name))

    def resolve(self, name_or_path: str) -> tuple[str, LoraAdapter, str | None]:
        """(name, adapter, orphan) for a loaded name, or for a path under lora_dir (loaded on first
        use, under its path as name); ValueError otherwise. `orphan`: the namespace no name refers
        to any more when re-reading dropped weights found new content on disk (its KV can go)."""
        with self._lock:
            path, loads = self._paths.get(name_or_path), self._loads.get(name_or_path)
            adapter = self._host.get(self._namespace.get(name_or_path, ""))
            if adapter is not None:
                self._host.move_to_end(adapter.namespace)
                return name_or_path, adapter, None
        if path is None:
            if self.spec.lora_dir is None or not os.path.isdir(name_or_path):
                raise ValueError(f"unknown LoRA adapter {name_or_path!r} (not a loaded name"
                                 f"{'' if self.spec.lora_dir is None else ' nor an adapter directory'}); "
                                 f"loaded: {sorted(self.names())}")
            check_path(name_or_path, self.spec.lora_dir)
            return (name_or_path, *self.load(name_or_path, name_or_path))
        adapter = self._read(path)  # weights left host memory: read again (the content may differ)
        with self._lock:
            # unloaded or loaded again meanwhile (perhaps the same path, a new file): not kept
            if self._loads.get(name_or_path) != loads:
                return name_or_path, adapter, None
            old = self._namespace.get(name_or_path)
            self._namespace[name_or_path] = adapter.namespace
            self._keep(adapter)
            return name_or_path, adapter, self._orphan(old)

    def is_loaded(self, namespace: str) -> bool:
        """Whether some loaded name refers to `namespace`."""
        with self._lock:
            return namespace in self._namespace.values()

    def count_request(self, name: str) -> None:
        with self._lock:
            self.requests[name] = self.requests.get(name, 0) + 1

    def names(self) -> dict[str, str]:
        """name -> path of every loaded adapter."""
        with self._lock:
            return dict(self._paths)

    @property
    def num_in_host(self) -> int:
        return len(self._host)

    def _keep(self, adapter: LoraAdapter) -> None:
        """Hold `adapter`'s weights as most recent; drop the oldest past max_cpu_loras (locked)."""
        self._host[adapter.namespace] = adapter
        self._host.move_to_end(adapter.namespace)
        limit = self.spec.max_cpu_loras
        while limit is not None and len(self._host) > limit:
            self._host.popitem(last=False)

    def _orphan(self, namespace: str | None) -> str | None:
        """`namespace` when no name refers to it any more (locked), its weights dropped; else None."""
        if namespace is None or namespace in self._namespace.values():
            return None
        self._host.pop(namespace, None)
        return namespace
