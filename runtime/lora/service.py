"""The engine's adapters: the registry of names plus slot capacity, and what a request gets from them."""
from __future__ import annotations

from typing import NamedTuple

from radixflow.runtime.config import EngineConfig
from radixflow.runtime.core.request import Req
from radixflow.runtime.lora.adapter import LoraAdapter
from radixflow.runtime.lora.capacity import AdapterCapacity
from radixflow.runtime.lora.registry import AdapterSpec, LoraRegistry
from radixflow.runtime.lora.slots import LoraSlots
from radixflow.runtime.model.model_config import ModelArgs


class AdapterChoice(NamedTuple):
    """What an adapter name meant when a request resolved it: the requests of one group (the
    samples of n > 1) share one, so a replace while they are submitted cannot split them."""

    name: str
    adapter: LoraAdapter


class LoraService:
    """Registry (any thread) and capacity (engine thread) of one engine's adapters."""

    def __init__(self, cfg: EngineConfig, args: ModelArgs, slots: LoraSlots) -> None:
        spec = AdapterSpec(cfg.max_lora_rank, cfg.lora_targets, cfg.lora_dir, cfg.max_cpu_loras)
        self.registry = LoraRegistry(args, spec)
        self.capacity = AdapterCapacity(slots, cfg.max_loras_per_batch or cfg.max_loras, self.registry.is_loaded)
        for item in cfg.lora_modules:
            name, path = item.split("=", 1)
            self.registry.load(name, path)

    def resolve(self, lora: str) -> tuple[AdapterChoice, str | None]:
        """Adapter `lora` (a name, or a path under lora_dir) as it is now, and a namespace no name
        refers to any more (the name's file changed on disk), whose KV the caller drops."""
        if not isinstance(lora, str) or not lora:
            raise ValueError(f"lora must be an adapter name, got {lora!r}")
        name, adapter, orphan = self.registry.resolve(lora)
        return AdapterChoice(name, adapter), orphan

    def attach(self, req: Req, choice: AdapterChoice) -> None:
        """Point `req` at the chosen adapter: its weights and its KV namespace, which is the
        adapter's content hash and never anything a client typed."""
        req.lora, req.lora_name, req.namespace = choice.adapter, choice.name, choice.adapter.namespace
        self.registry.count_request(choice.name)

    def stats(self) -> dict[str, object]:
        """EngineStats fields of the adapters (engine thread)."""
        reg = self.registry
        return {"lora_resident": self.capacity.num_resident, "lora_loaded": len(reg.names()),
                "lora_requests": dict(reg.requests), "lora_load_time": reg.load_time.snapshot()}


def check_lora_request(service: LoraService | None, lora: str | None) -> None:
    if lora is not None and service is None:
        raise ValueError("LoRA adapters are not enabled: start the engine with lora_modules, "
                         "lora_dir or enable_lora")
