"""Drive a workload through a client: Poisson arrivals of root requests, follow-up turns sent
when their parent finishes (after its think time), a concurrency cap, warm-up, progress bar."""
from __future__ import annotations

import asyncio
import json
import math
import random
import time
from typing import Any

from radixflow.frontend.bench.client import Client
from radixflow.frontend.bench.metrics import RequestResult
from radixflow.frontend.bench.workloads import FIRST_ID, Workload


def arrival_times(num: int, request_rate: float, seed: int) -> list[float]:
    """Offsets (s) of `num` arrivals of a Poisson process; rate inf = all at 0."""
    if request_rate <= 0:
        raise ValueError(f"request_rate must be > 0 (inf: all at once), got {request_rate}")
    if math.isinf(request_rate):
        return [0.0] * num
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(num):
        out.append(t)
        t += rng.expovariate(request_rate)
    return out


class _Run:
    """One pass over a workload; prompts of follow-ups are built from their parent's output."""

    def __init__(self, client: Client, workload: Workload, max_concurrency: int | None, bar: Any) -> None:
        self.client, self.requests, self.bar = client, workload.requests, bar
        n = len(self.requests)
        self.prompts: list[list[int] | None] = [None] * n
        self.results: list[RequestResult | None] = [None] * n
        self.children: list[list[int]] = [[] for _ in range(n)]
        for i, r in enumerate(self.requests):
            if r.parent is not None:
                assert r.parent < i, "a parent comes before its children"
                self.children[r.parent].append(i)
        self.limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.tasks: list[asyncio.Task] = []

    def prompt(self, i: int) -> list[int]:
        r = self.requests[i]
        if r.parent is None:
            return list(r.new_ids)
        parent_prompt, parent_out = self.prompts[r.parent], self.results[r.parent]
        assert parent_prompt is not None and parent_out is not None
        return parent_prompt + parent_out.output_ids + list(r.new_ids)

    async def one(self, i: int, delay_s: float) -> None:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        self.prompts[i] = ids = self.prompt(i)
        r = self.requests[i]
        if self.limit is None:
            result = await self.client.send(ids, r.max_new_tokens, r.json_schema)
        else:
            async with self.limit:
                result = await self.client.send(ids, r.max_new_tokens, r.json_schema)
        self.results[i] = result
        if self.bar is not None:
            self.bar.update(1)
        for child in self.children[i]:  # a failed parent still lets its session go on
            self.tasks.append(asyncio.create_task(self.one(child, self.requests[child].think_time_s)))

    async def all(self, arrivals: list[float]) -> None:
        roots = [i for i, r in enumerate(self.requests) if r.parent is None]
        self.tasks = [asyncio.create_task(self.one(i, t)) for i, t in zip(roots, arrivals)]
        done = 0
        while done < len(self.tasks):  # children are appended while we wait
            await self.tasks[done]
            done += 1


async def run_workload(client: Client, workload: Workload, *, request_rate: float = math.inf,
                       max_concurrency: int | None = None, seed: int = 0,
                       progress: bool = False) -> tuple[list[RequestResult], list[list[int]], float]:
    """Results and prompts in workload order, and the wall time from first send to last finish."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(workload.requests), desc=workload.name, unit="req")
    run = _Run(client, workload, max_concurrency, bar)
    t0 = time.perf_counter()
    try:
        await run.all(arrival_times(workload.num_roots, request_rate, seed))
    finally:
        if bar is not None:
            bar.close()
    duration = time.perf_counter() - t0
    assert all(r is not None for r in run.results) and all(p is not None for p in run.prompts)
    return run.results, run.prompts, duration  # type: ignore[return-value]


async def warm_up(client: Client, num: int, vocab_size: int, workload: Workload | None = None,
                  seed: int = 12345) -> None:
    """A few short requests of ids no workload uses first (a different seed), so the measured run
    does not pay one-time costs (a schema's grammar compiles here too); they share nothing with
    the workload beyond chance."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(FIRST_ID, vocab_size) for _ in range(32)] for _ in range(num)]
    schemas = {json.dumps(r.json_schema, sort_keys=True): r.json_schema
               for r in (workload.requests if workload else ()) if r.json_schema is not None}
    sends = [client.send(p, 4, None) for p in prompts]
    sends += [client.send(prompts[0] if prompts else [FIRST_ID], 16, s) for s in schemas.values()]
    await asyncio.gather(*sends)
