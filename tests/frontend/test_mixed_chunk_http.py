"""`--enable-mixed-chunk` through the server, on both cores (the engine on a thread, and in its
own process): streams that decode while long prompts arrive and prefill in chunks give what an
unmixed engine gives, a stream closed mid-way is aborted, nothing is left held, and the mixed
steps show in /get_server_info."""
from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from radixflow.frontend.server import create_app
from radixflow.runtime import Engine, EngineClient
from radixflow.runtime.model.demo import demo_model

GREEDY = {"temperature": 0, "ignore_eos": True}
CONFIG = {"kv_cache_tokens": 4096, "chunked_prefill_size": 16, "dtype": "float32", "check_invariants": True}


def _prompts() -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(5)
    running = [[rng.randrange(3, 3000) for _ in range(6 + i)] for i in range(3)]
    arriving = [[rng.randrange(3, 3000) for _ in range(70 + 9 * i)] for i in range(2)]
    return running, arriving


async def _stream(client: httpx.AsyncClient, ids: list[int], max_new: int, stop_after: int | None = None) -> list[int]:
    """A native /generate stream's output ids; `stop_after`: close it after that many chunks."""
    body = {"input_ids": ids, "sampling_params": {**GREEDY, "max_new_tokens": max_new}, "stream": True}
    last: list[int] = []
    chunks = 0
    async with client.stream("POST", "/generate", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            last = json.loads(line[5:])["output_ids"]
            chunks += 1
            if stop_after is not None and chunks >= stop_after:
                break
    return last


async def _workload(url: str, running: list[list[int]], arriving: list[list[int]]) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        streams = [asyncio.create_task(_stream(client, p, 48)) for p in running]
        closed = asyncio.create_task(_stream(client, running[0][:4], 200, stop_after=3))
        await asyncio.sleep(0.05)  # the long prompts arrive while the streams decode
        late = [asyncio.create_task(_stream(client, p, 6)) for p in arriving]
        out = {"running": await asyncio.gather(*streams), "late": await asyncio.gather(*late)}
        await closed
        return out


@pytest.mark.parametrize("core", ["core-thread", "core-process"])
def test_mixed_steps_through_the_server(core, live_server, wait_idle):
    running, arriving = _prompts()
    with Engine(demo_model("tiny"), **CONFIG) as plain:
        want = {"running": [r["output_ids"] for r in plain.generate(
                    input_ids=running, sampling_params={**GREEDY, "max_new_tokens": 48})],
                "late": [r["output_ids"] for r in plain.generate(
                    input_ids=arriving, sampling_params={**GREEDY, "max_new_tokens": 6})]}
    kind = EngineClient if core == "core-process" else Engine
    with kind(demo_model("tiny"), enable_mixed_chunk=True, **CONFIG) as engine:
        live = live_server(create_app(engine, "tiny")).start()
        try:
            got = asyncio.run(_workload(live.url, running, arriving))
            assert got == want
            wait_idle(engine, kv=True)
            info = httpx.get(f"{live.url}/get_server_info").json()
            assert info["config"]["enable_mixed_chunk"] is True
            assert info["stats"]["num_mixed_steps"] > 0
            assert info["stats"]["finish_counts"].get("abort", 0) == 1  # the stream closed mid-way
            assert info["stats"]["invariant_violations"] == 0
        finally:
            live.stop()
