"""The engine core in its own process (runtime/core_client.py, runtime/core_process.py): what
crosses the boundary, and what happens when the core dies."""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx
import pytest

from radixflow.frontend.server import create_app
from radixflow.runtime import EngineClient
from radixflow.runtime.errors import EngineDeadError
from radixflow.runtime.model.demo import demo_model

LONG = {"max_new_tokens": 1900, "ignore_eos": True}  # the tiny model: a 2,048-token context


def test_a_killed_core_fails_every_client_within_a_second(live_server):
    """SIGKILL the core mid-stream: streaming and non-streaming clients, native and OpenAI, all
    get an error within a second; /health and new requests answer 503."""
    engine = EngineClient(demo_model("tiny"), kv_cache_tokens=8192)
    live = live_server(create_app(engine, "tiny-crash")).start()
    try:
        outcomes: dict[str, tuple[str, float]] = {}
        started = threading.Barrier(4)

        def stream(name: str, path: str, body: dict) -> None:
            with httpx.Client(base_url=live.url, timeout=60) as c:
                with c.stream("POST", path, json={**body, "stream": True}) as r:
                    lines = r.iter_lines()
                    first = next(line for line in lines if line.startswith("data:"))
                    assert "error" not in first, first
                    started.wait()
                    rest = [line for line in lines if line.startswith("data:")]
            outcomes[name] = (" ".join(rest[-2:]), time.monotonic())

        def whole(name: str, path: str, body: dict) -> None:
            with httpx.Client(base_url=live.url, timeout=60) as c:
                r = c.post(path, json=body)
            outcomes[name] = (f"{r.status_code} {r.text}", time.monotonic())

        jobs = [threading.Thread(target=stream, args=("native", "/generate", {"text": "a", "sampling_params": LONG})),
                threading.Thread(target=stream, args=("openai", "/v1/completions",
                                                      {"model": "tiny-crash", "prompt": "b", "max_tokens": 1900,
                                                       "ignore_eos": True})),
                threading.Thread(target=stream, args=("chat", "/v1/chat/completions",
                                                      {"model": "tiny-crash", "max_tokens": 1900, "ignore_eos": True,
                                                       "messages": [{"role": "user", "content": "c"}]})),
                threading.Thread(target=whole, args=("native-whole", "/generate",
                                                     {"text": "d", "sampling_params": LONG}))]
        for job in jobs:
            job.start()
        started.wait(timeout=60)  # the three streams are producing; the whole request is running
        time.sleep(0.3)
        killed_at = time.monotonic()
        os.kill(engine.core_pid, signal.SIGKILL)
        for job in jobs:
            job.join(timeout=30)
        assert set(outcomes) == {"native", "openai", "chat", "native-whole"}
        for name, (text, at) in outcomes.items():
            assert at - killed_at < 1.0, (name, at - killed_at)
            assert "engine core died" in text, (name, text)
        assert outcomes["native-whole"][0].startswith("500 ")
        assert all(outcomes[n][0].endswith("data: [DONE]") for n in ("native", "openai", "chat"))
        with httpx.Client(base_url=live.url, timeout=10) as c:
            assert c.get("/health").status_code == 503
            r = c.post("/generate", json={"text": "again", "sampling_params": {"max_new_tokens": 1}})
            assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
            assert c.get("/metrics").status_code == 200  # the last numbers stay readable
        with pytest.raises(EngineDeadError):
            engine.flush_cache()
    finally:
        live.stop()
        engine.shutdown()


def test_client_refusals_and_core_start_errors(tmp_path):
    """Bad settings fail in the constructor as Engine's do; refusals arrive as the same exception
    types; a rid in use is refused; after shutdown the core process is gone."""
    with pytest.raises(ValueError, match="config.json|model"):
        EngineClient(str(tmp_path))
    with EngineClient(demo_model("tiny"), kv_cache_tokens=4096, max_queued_requests=1, max_num_seqs=1) as engine:
        async def run() -> list:
            a = engine.generate_stream(input_ids=[5, 6], sampling_params=LONG, rid="same")
            first = await a.__anext__()
            with pytest.raises(ValueError, match="already in use"):
                await engine.generate_stream(input_ids=[5], sampling_params=LONG, rid="same").__anext__()
            with pytest.raises(ValueError, match="regex"):
                await engine.generate_stream(input_ids=[5], sampling_params={"regex": "(["}).__anext__()
            from radixflow.runtime.errors import QueueFullError
            b = engine.generate_stream(input_ids=[6], sampling_params=LONG)
            queued = asyncio.ensure_future(b.__anext__())  # waits behind "same": the queue is full
            await asyncio.sleep(0)  # b's submit goes out first
            with pytest.raises(QueueFullError):
                await engine.generate_stream(input_ids=[7], sampling_params=LONG).__anext__()
            await a.aclose()  # aborts "same"; b runs
            await queued
            await b.aclose()
            return first["output_ids"]

        assert len(asyncio.run(run())) >= 1
        deadline = time.monotonic() + 10
        while engine.stats().num_running + engine.stats().num_waiting:
            assert time.monotonic() < deadline, "the abort never reached the core"
            time.sleep(0.02)
        engine.check_accounting()
        pid = engine.core_pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
