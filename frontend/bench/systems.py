"""The systems one bench run compares: radixflow in-process (radix + lpm), the radix-off + fcfs
baseline, transformers `generate`, and an external endpoint (native or OpenAI API)."""
from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any

from radixflow.frontend.bench.client import Client, NativeClient, OfflineClient, OpenAIClient
from radixflow.frontend.bench.metrics import SLOs, summarize
from radixflow.frontend.bench.runner import run_workload, warm_up
from radixflow.frontend.bench.workloads import Workload, unique_tokens

OFFLINE_SYSTEMS = {
    "radixflow": {"schedule_policy": "lpm"},
    "radix-off": {"disable_radix_cache": True, "schedule_policy": "fcfs"},
}
SYSTEMS = (*OFFLINE_SYSTEMS, "transformers", "endpoint")


@dataclasses.dataclass(frozen=True)
class RunOptions:
    request_rate: float = math.inf
    max_concurrency: int | None = None
    seed: int = 0
    num_warmup: int = 2
    slos: SLOs = SLOs()
    progress: bool = False
    hf_batch_size: int = 8


def _full(prompts: list[list[int]], results: list[Any]) -> list[list[int]]:
    return [p + r.output_ids for p, r in zip(prompts, results)]


class Systems:
    """Owns what the systems need (engines, a transformers model, HTTP clients); `close()` frees it.

    `model`: the model path for in-process systems; `engine_config`: extra Engine settings;
    `endpoint`: (backend, base_url, served_model_name, api_key) of an external server."""

    def __init__(self, model: str | None, engine_config: dict[str, Any], vocab_size: int,
                 endpoint: tuple[str, str, str, str | None] | None = None, tokenizer: Any = None) -> None:
        self.model, self.engine_config, self.vocab_size = model, engine_config, vocab_size
        self.endpoint, self.tokenizer = endpoint, tokenizer
        self._engines: dict[str, Any] = {}
        self._hf: Any = None

    def engine(self, system: str) -> Any:
        if system not in self._engines:
            from radixflow.runtime import Engine

            self._engines[system] = Engine(self.model, **{**self.engine_config, **OFFLINE_SYSTEMS[system]})
        return self._engines[system]

    def _client(self, system: str) -> Client:
        if system in OFFLINE_SYSTEMS:
            return OfflineClient(self.engine(system))
        if self.endpoint is None:
            raise ValueError("system 'endpoint' needs --backend native|openai and --base-url")
        backend, url, name, key = self.endpoint
        if backend == "native":
            return NativeClient(url, key)
        return OpenAIClient(url, name, self.tokenizer, key)

    def run(self, system: str, workload: Workload, opts: RunOptions) -> dict[str, Any]:
        """One measured pass (cache flushed, then warm-up) → its summary."""
        if system == "transformers":
            return self._run_transformers(workload, opts)
        if system in self._engines:
            self._engines[system].flush_cache()
        return asyncio.run(self._run_async(system, workload, opts))

    async def _run_async(self, system: str, workload: Workload, opts: RunOptions) -> dict[str, Any]:
        client = self._client(system)
        try:
            if self.endpoint is not None and system == "endpoint" and self.endpoint[0] == "native":
                await client._http.post("/flush_cache")  # type: ignore[attr-defined]
            await warm_up(client, opts.num_warmup, self.vocab_size, workload)
            results, prompts, duration = await run_workload(
                client, workload, request_rate=opts.request_rate, max_concurrency=opts.max_concurrency,
                seed=opts.seed, progress=opts.progress)
        finally:
            await client.close()
        return summarize(results, duration, opts.slos, unique_tokens(_full(prompts, results)))

    def _run_transformers(self, workload: Workload, opts: RunOptions) -> dict[str, Any]:
        from radixflow.frontend.bench.baseline_hf import load_model, run_transformers

        if self._hf is None:
            from radixflow.runtime.model.model_path import resolve_model_path

            self._hf = load_model(resolve_model_path(self.model), self.engine_config.get("dtype", "float32")
                                  if self.engine_config.get("dtype", "auto") != "auto" else "float32")
        results, prompts, duration = run_transformers(self._hf, workload, opts.hf_batch_size)
        return summarize(results, duration, opts.slos, unique_tokens(_full(prompts, results)))

    def close(self) -> None:
        for engine in self._engines.values():
            engine.shutdown()
        self._engines.clear()
        self._hf = None
