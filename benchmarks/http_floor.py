"""The HTTP stack's floor: what streaming the HTTP workload of engine_overhead.py costs with no
engine at all.

    python benchmarks/http_floor.py --out benchmarks/results/http_floor_cpu.json

A bare starlette app on uvicorn (httptools, uvloop: what `radixflow serve` runs) answers each
POST /generate with `max_new_tokens` SSE chunks of the native stream's shape (cumulative text and
output ids, meta_info), every request's next chunk released at once every `step_s` (as engine
steps release them; 0: as fast as the loop goes, the streams taking turns). The same raw-socket client as
engine_overhead.py's HTTP part reads 256 streams of 32 tokens. Reported per setting: tokens/s and
the CPU seconds of the server process and of the client per run. Nothing of radixflow runs in
the server: this is the cost any Python ASGI front end pays for the workload on this machine.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from http_load import cpu_seconds, free_port, stream_all_raw, wait_healthy  # noqa: E402


def serve(port: int, step_s: float) -> None:
    """The bare server (in a child process)."""
    import msgspec
    import uvicorn
    import uvloop
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    released: dict[str, asyncio.Event] = {}  # "step": set when the streams' next chunks go out

    async def step_clock() -> None:
        while True:
            await asyncio.sleep(step_s)
            event, released["step"] = released["step"], asyncio.Event()
            event.set()

    async def generate(request):
        body = await request.json()
        n = body["sampling_params"]["max_new_tokens"]

        async def events():
            ids: list[int] = []
            for i in range(n):
                if step_s:
                    await released["step"].wait()
                else:
                    await asyncio.sleep(0)  # the other streams' chunks go out in turn
                ids.append(100 + i)
                meta = {"id": "req", "finish_reason": None if i < n - 1 else {"type": "length", "length": n},
                        "prompt_tokens": len(body["input_ids"]), "completion_tokens": len(ids), "cached_tokens": 0}
                yield b"data: " + msgspec.json.encode({"text": "ab" * len(ids), "output_ids": list(ids),
                                                        "meta_info": meta}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def health(_request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/generate", generate, methods=["POST"]), Route("/health", health)])

    async def main() -> None:
        released["step"] = asyncio.Event()
        clock = asyncio.get_running_loop().create_task(step_clock()) if step_s else None
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", http="httptools",
                                loop="uvloop")
        await uvicorn.Server(config).serve()
        if clock is not None:
            clock.cancel()

    uvloop.run(main())


@contextlib.contextmanager
def bare_server(step_s: float):
    """The bare server in a child process; yields its URL and pid once healthy."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", str(port), "--step-s", str(step_s)])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 60)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def measure(step_s: float, num_requests: int, decode_len: int, repeats: int) -> dict:
    ps = [[1] * 16 for _ in range(num_requests)]
    params = {"max_new_tokens": decode_len}
    runs = []
    with bare_server(step_s) as (url, pid):
        asyncio.run(stream_all_raw(url, ps[:8], params))
        for _ in range(repeats):
            time.sleep(1.0)
            server_before, client_before = cpu_seconds(pid), resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            tokens = asyncio.run(stream_all_raw(url, ps, params))
            wall = time.perf_counter() - t0
            client_after = resource.getrusage(resource.RUSAGE_SELF)
            assert tokens == num_requests * decode_len, tokens
            runs.append({"tok_per_s": tokens / wall, "wall_s": wall, "server_cpu_s": cpu_seconds(pid) - server_before,
                         "client_cpu_s": (client_after.ru_utime + client_after.ru_stime
                                          - client_before.ru_utime - client_before.ru_stime)})
    out = {"step_s": step_s, "runs": runs}
    for key in ("tok_per_s", "wall_s", "server_cpu_s", "client_cpu_s"):
        out[key] = statistics.median(r[key] for r in runs)
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="result JSON path")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child process: its port
    ap.add_argument("--step-s", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--decode", type=int, default=32)
    ns = ap.parse_args()
    if ns.serve is not None:
        serve(ns.serve, ns.step_s)
        return 0
    if not ns.out:
        ap.error("--out is required")
    result = {"command": " ".join(["python", "benchmarks/http_floor.py", *sys.argv[1:]]),
              "machine": platform.machine(), "cpus": os.cpu_count(),
              "sizes": {"requests": ns.requests, "decode": ns.decode, "repeats": ns.repeats},
              "settings": [measure(step_s, ns.requests, ns.decode, ns.repeats) for step_s in (0.0, 0.005, 0.01)]}
    with open(ns.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
