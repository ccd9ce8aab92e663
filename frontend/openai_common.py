"""Pieces both OpenAI endpoints share: model check, launching engine streams, usage, ids."""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

from starlette.requests import Request

from radixflow.frontend.errors import APIError, bad_request
from radixflow.frontend.openai_sampling import RENAMED
from radixflow.frontend.openai_schemas import PromptTokensDetails, Usage
from radixflow.frontend.streams import Fanout, launch
from radixflow.runtime.sampling_params import SamplingParams


def check_model(request: Request, model: str) -> str | None:
    """None for the base model; the adapter name when `model` names a loaded LoRA adapter."""
    server = request.app.state.server
    if model in (server.served_model_name, server.engine.model_path):
        return None
    if model in server.engine.lora_adapters():
        return model
    raise APIError(404, f"the model {model!r} does not exist; this server serves "
                   f"{server.served_model_name!r}", param="model", code="model_not_found")


async def start(request: Request, prompts: list[list[int]], sampling: list[SamplingParams],
                options: dict[str, Any], names: dict[str, str] | None = None) -> tuple[Fanout, dict[int, int]]:
    """Launch n streams per prompt (response index = prompt * n + sample), `sampling[p]` for
    prompt p; bad input → 400 naming the field as in `names` (openai_sampling.client_names).
    Returns the fan-out and the cached_tokens of prompts whose samples shared a prefill."""
    server = request.app.state.server
    try:
        fanout, cached = await launch(request.receive, server.engine, prompts, sampling, [options] * len(prompts),
                                      server.in_flight)
    except ValueError as exc:
        raise bad_request(exc, names or RENAMED) from exc
    shared = dict(enumerate(cached)) if sampling[0].n > 1 else {}
    return fanout, shared


def usage(metas: dict[int, dict], n: int, shared_cached: dict[int, int]) -> Usage:
    """Prompt tokens count once per prompt (its n samples share one prefill)."""
    prompt = completion = cached = 0
    misses: dict[str, int] = {}
    for index, meta in metas.items():
        completion += meta["completion_tokens"]
        for reason, count in meta.get("prefill_miss_tokens", {}).items():
            misses[reason] = misses.get(reason, 0) + count
        if index % n == 0:
            p = index // n
            prompt += meta["prompt_tokens"]
            cached += shared_cached.get(p, meta["cached_tokens"])
    return Usage(prompt, completion, prompt + completion, PromptTokensDetails(cached), misses or None,
                 _slowest_timings(metas.values()))


def _slowest_timings(metas: Iterable[dict]) -> dict[str, float | None] | None:
    """The `timings` of the choice that took longest end to end: one request's own figures,
    so queue_s + prefill_s = ttft_s holds as it does in each meta_info."""
    timings = [m["timings"] for m in metas if "timings" in m]
    return max(timings, key=lambda t: t["e2e_s"] or 0.0, default=None)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())
