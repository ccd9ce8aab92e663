"""The systems one bench run compares: radixflow in-process (radix + lpm), the radix-off + fcfs
baseline, transformers `generate`, and external endpoints (native or OpenAI API), each by name."""
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
# POST routes that empty a server's prefix cache: radixflow's (and SGLang's), vLLM's (needs
# VLLM_SERVER_DEV_MODE=1 on the server).
FLUSH_ROUTES = ("/flush_cache", "/reset_prefix_cache")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """An external server: `backend` is "native" (radixflow /generate) or "openai" (/v1/completions)."""

    backend: str
    base_url: str
    served_model_name: str = "default"
    api_key: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in ("native", "openai"):
            raise ValueError(f"endpoint backend must be native or openai, got {self.backend!r}")


def parse_endpoint(text: str, served_model_name: str = "default", api_key: str | None = None) -> tuple[str, Endpoint]:
    """`NAME=BACKEND@URL`, e.g. `vllm-cpu=openai@http://127.0.0.1:8001` → (name, Endpoint)."""
    name, eq, rest = text.partition("=")
    backend, at, url = rest.partition("@")
    if not (eq and at and name and url):
        raise ValueError(f"--endpoint wants NAME=BACKEND@URL (e.g. vllm=openai@http://127.0.0.1:8000), got {text!r}")
    if name in SYSTEMS:
        raise ValueError(f"endpoint name {name!r} is a built-in system; pick another")
    return name, Endpoint(backend, url, served_model_name, api_key)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    request_rate: float = math.inf
    max_concurrency: int | None = None
    seed: int = 0
    num_warmup: int = 2
    slos: SLOs = SLOs()
    progress: bool = False
    hf_batch_size: int = 8


async def _flush(http: Any) -> bool:
    """Empty the server's prefix cache before a measured pass; False if no known route worked."""
    for route in FLUSH_ROUTES:
        response = await http.post(route)
        if response.status_code == 200:
            return True
    return False


def _full(prompts: list[list[int]], results: list[Any]) -> list[list[int]]:
    return [p + r.output_ids for p, r in zip(prompts, results)]


class Systems:
    """Owns what the systems need (engines, a transformers model, HTTP clients); `close()` frees it.

    `model`: the model path for in-process systems; `engine_config`: extra Engine settings;
    `endpoints`: external servers by system name (`--base-url` is the one named "endpoint");
    `hf_model`: the transformers baseline's model when it differs from `model` (a dense copy)."""

    def __init__(self, model: str | None, engine_config: dict[str, Any], vocab_size: int,
                 endpoints: dict[str, Endpoint] | None = None, tokenizer: Any = None,
                 hf_model: str | None = None) -> None:
        self.model, self.engine_config, self.vocab_size = model, engine_config, vocab_size
        self.hf_model = hf_model
        self.endpoints, self.tokenizer = dict(endpoints or {}), tokenizer
        self._engines: dict[str, Any] = {}
        self._hf: Any = None

    def in_process_dtype(self) -> str:
        """The dtype the in-process systems run in: the configured one, else the engine's CPU
        default (bfloat16 where the CPU has native bf16, else float32), so transformers matches."""
        from radixflow.runtime.model.cpu_features import has_native_bf16

        dtype = self.engine_config.get("dtype", "auto")
        if dtype != "auto":
            return dtype
        return "bfloat16" if has_native_bf16() else "float32"

    def engine(self, system: str) -> Any:
        if system not in self._engines:
            from radixflow.runtime import Engine

            self._engines[system] = Engine(self.model, **{**self.engine_config, **OFFLINE_SYSTEMS[system]})
        return self._engines[system]

    def _client(self, system: str) -> Client:
        if system in OFFLINE_SYSTEMS:
            return OfflineClient(self.engine(system))
        ep = self.endpoints.get(system)
        if ep is None:
            raise ValueError(f"system {system!r} is no endpoint: give --endpoint {system}=BACKEND@URL "
                             "(or --backend and --base-url for 'endpoint')")
        if ep.backend == "native":
            return NativeClient(ep.base_url, ep.api_key)
        return OpenAIClient(ep.base_url, ep.served_model_name, self.tokenizer, ep.api_key)

    def run(self, system: str, workload: Workload, opts: RunOptions) -> dict[str, Any]:
        """One measured pass (cache flushed, then warm-up) → its summary."""
        if system == "transformers":
            return self._run_transformers(workload, opts)
        if system in self._engines:
            self._engines[system].flush_cache()
        return asyncio.run(self._run_async(system, workload, opts))

    async def _run_async(self, system: str, workload: Workload, opts: RunOptions) -> dict[str, Any]:
        client = self._client(system)
        flushed: bool | None = None
        try:
            if system in self.endpoints:
                flushed = await _flush(client._http)  # type: ignore[attr-defined]
            await warm_up(client, opts.num_warmup, self.vocab_size, workload)
            results, prompts, duration = await run_workload(
                client, workload, request_rate=opts.request_rate, max_concurrency=opts.max_concurrency,
                seed=opts.seed, progress=opts.progress)
        finally:
            await client.close()
        summary = summarize(results, duration, opts.slos, unique_tokens(_full(prompts, results)))
        if flushed is not None:
            summary["cache_flushed"] = flushed  # False: a later round may hit an earlier round's prompts
        return summary

    def _run_transformers(self, workload: Workload, opts: RunOptions) -> dict[str, Any]:
        from radixflow.frontend.bench.baseline_hf import load_model, run_transformers

        if self._hf is None:
            from radixflow.runtime.model.model_path import resolve_model_path

            self._hf = load_model(self.hf_model or resolve_model_path(self.model), self.in_process_dtype())
        results, prompts, duration = run_transformers(self._hf, workload, opts.hf_batch_size)
        return summarize(results, duration, opts.slos, unique_tokens(_full(prompts, results)))

    def close(self) -> None:
        for engine in self._engines.values():
            engine.shutdown()
        self._engines.clear()
        self._hf = None
