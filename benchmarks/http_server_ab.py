"""API server CPU per run of 256 streaming requests, for several server setups side by side.

    python benchmarks/http_server_ab.py h11+asyncio httptools+uvloop
    python benchmarks/http_server_ab.py h11+asyncio+/tmp/basepkg h11+asyncio   # two code versions

Each setup is `HTTP+LOOP[+PYTHONPATH]`: uvicorn's http implementation (h11, httptools) and event
loop (asyncio, uvloop), and optionally a PYTHONPATH holding another checkout as `radixflow` (a
folder with a `radixflow` link to it). One `radixflow serve` per setup (tiny random model, the
core in its own process) runs at once; rounds alternate between them, so machine noise spreads
over all. Per run: tokens/s of 256 native streams (32 tokens each, the raw-socket client of
engine_overhead.py) and the CPU seconds the API server and the core process used (/proc).
Medians over `--rounds`.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_decode import TINY, write_model_dir  # noqa: E402
from engine_overhead import GREEDY, prompts  # noqa: E402
from http_load import cpu_seconds, server as serve, stream_all_raw  # noqa: E402

# Starts `radixflow serve` with uvicorn's http and loop taken from the environment.
LAUNCH = ("import os, sys, uvicorn\n"
          "init = uvicorn.Config.__init__\n"
          "def config(self, *a, **k):\n"
          "    k['http'], k['loop'] = os.environ['AB_HTTP'], os.environ['AB_LOOP']\n"
          "    init(self, *a, **k)\n"
          "uvicorn.Config.__init__ = config\n"
          "from radixflow.frontend.cli import main\n"
          "sys.exit(main())\n")


def server(model_dir: Path, setup: str, num_requests: int) -> contextlib.AbstractContextManager[str]:
    http, loop, *path = setup.split("+")
    return serve(model_dir, "process", num_requests, launch=LAUNCH,
                 env={"AB_HTTP": http, "AB_LOOP": loop, "PYTHONPATH": "+".join(path)})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("setups", nargs="+", help="HTTP+LOOP[+PYTHONPATH], e.g. h11+asyncio httptools+uvloop")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=32)
    ns = ap.parse_args()
    rng = random.Random(3)
    params = {**GREEDY, "max_new_tokens": ns.tokens}
    ps = prompts(rng, ns.requests, 16)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir({**TINY, "max_position_embeddings": 4096}, Path(tmp) / "tiny")
        with contextlib.ExitStack() as stack:
            urls = {setup: stack.enter_context(server(model_dir, setup, ns.requests)) for setup in ns.setups}
            pids = {}
            for setup, url in urls.items():
                info = httpx.get(f"{url}/get_server_info").json()
                pids[setup] = (info["api_server_pid"], info["engine_core_pid"])
                asyncio.run(stream_all_raw(url, prompts(rng, 8, 16), params))  # warm-up
            runs: dict[str, dict[str, list[float]]] = {s: {"tok_s": [], "api_cpu_s": [], "core_cpu_s": []}
                                                      for s in urls}
            for _ in range(ns.rounds):
                for setup, url in urls.items():
                    api, core = pids[setup]
                    a0, c0, t0 = cpu_seconds(api), cpu_seconds(core), time.perf_counter()
                    tokens = asyncio.run(stream_all_raw(url, ps, params))
                    wall = time.perf_counter() - t0
                    assert tokens == ns.requests * ns.tokens, tokens
                    runs[setup]["tok_s"].append(tokens / wall)
                    runs[setup]["api_cpu_s"].append(cpu_seconds(api) - a0)
                    runs[setup]["core_cpu_s"].append(cpu_seconds(core) - c0)
            for setup, r in runs.items():
                print(setup, " ".join(f"{k} {statistics.median(v):.2f}" for k, v in r.items()),
                      "| api_cpu_s runs", " ".join(f"{x:.2f}" for x in r["api_cpu_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
