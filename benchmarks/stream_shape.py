"""What a long answer's chunks cost the API server: native `/generate` streams with cumulative
chunks (SGLang's default shape: every chunk repeats the text and output_ids so far) and with
`--incremental-streaming-output` (each chunk its new tokens only), OpenAI `/v1/completions`
streams (deltas) and non-streamed native `/generate` answers (folded from the engine's chunks),
the last two optionally against a server run from an older checkout.

    python benchmarks/stream_shape.py --out benchmarks/results/stream_shape_cpu.json
    python benchmarks/stream_shape.py --baseline /tmp/before/path --out /tmp/ss.json   # + an older checkout's OpenAI streams
    python benchmarks/stream_shape.py --smoke --out /tmp/ss.json                       # seconds

`radixflow serve` on the random-weight tiny model (the engine core in its own process, one torch
thread), N concurrent streams of L tokens each (greedy, `ignore_eos`), read by raw sockets. Per
server and workload: the API server process's CPU seconds per run (/proc), the run's wall time
and the SSE events received (a non-streamed answer counts one). Rounds run every (server, workload) in turn, alternating the order;
figures are medians over rounds. `--baseline PATH`: one more server started with PYTHONPATH=PATH
(a directory holding a `radixflow` package, e.g. a symlink to an older checkout), its OpenAI
streams and whole answers measured beside this checkout's.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_decode import TINY, write_model_dir  # noqa: E402
from http_load import SERVE, cpu_seconds, post_bytes, server  # noqa: E402

INCREMENTAL = SERVE.replace("import sys;", "import sys; sys.argv.append('--incremental-streaming-output');")


async def stream_all(url: str, requests: list[bytes]) -> int:
    """Send every request on its own connection at once; the SSE events received in all (a
    response that is not a stream counts one)."""
    host, port = url.removeprefix("http://").split(":")

    async def one(req: bytes) -> int:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(req)
        data = await reader.read(-1)
        writer.close()
        assert b" 200 " in data[:16], data[:300]
        events = data.count(b"\ndata: {")
        return events if events else int(b'"output_ids"' in data)

    return sum(await asyncio.gather(*(one(r) for r in requests)))


def workloads(model: str, num: int, length: int, rng: random.Random) -> dict[str, list[bytes]]:
    prompts = [[rng.randrange(3000) for _ in range(16)] for _ in range(num)]
    sp = {"max_new_tokens": length, "temperature": 0, "ignore_eos": True}
    return {"native": [post_bytes("bench", "/generate", {"input_ids": p, "sampling_params": sp, "stream": True})
                       for p in prompts],
            "openai": [post_bytes("bench", "/v1/completions",
                                  {"model": model, "prompt": p, "max_tokens": length, "temperature": 0,
                                   "ignore_eos": True, "stream": True})
                       for p in prompts],
            "whole": [post_bytes("bench", "/generate", {"input_ids": p, "sampling_params": sp})
                      for p in prompts]}


def measure(num: int, length: int, rounds: int, baseline: str | None, settle_s: float = 1.0) -> dict:
    """`settle_s`: the pause before each timed run (the servers' previous work done)."""
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir({**TINY, "max_position_embeddings": 4096}, Path(tmp) / "model")
        loads = workloads(str(model_dir), num, length, rng)
        # (server, workload) pairs: the native stream in both shapes, OpenAI deltas (and the baseline's)
        setups = {"default": {}, "incremental": {"launch": INCREMENTAL}}
        pairs = [("default", "native"), ("incremental", "native"), ("default", "openai"), ("default", "whole")]
        if baseline:
            setups["baseline"] = {"env": {"PYTHONPATH": baseline}}
            pairs += [("baseline", "openai"), ("baseline", "whole")]
        runs: dict[str, list[dict]] = {f"{s}/{w}": [] for s, w in pairs}
        with contextlib.ExitStack() as stack:
            urls = {name: stack.enter_context(server(model_dir, "process", num, **kw)) for name, kw in setups.items()}
            import httpx

            pids = {name: httpx.get(f"{url}/get_server_info").json()["api_server_pid"] for name, url in urls.items()}
            for s, w in pairs:  # warm-up
                asyncio.run(stream_all(urls[s], loads[w][:4]))
            for r in range(rounds):
                for s, w in (pairs if r % 2 == 0 else pairs[::-1]):
                    time.sleep(settle_s)
                    cpu0, t0 = cpu_seconds(pids[s]), time.perf_counter()
                    events = asyncio.run(stream_all(urls[s], loads[w]))
                    wall = time.perf_counter() - t0
                    runs[f"{s}/{w}"].append({"api_cpu_s": cpu_seconds(pids[s]) - cpu0, "wall_s": wall,
                                             "events": events})
    out: dict = {"streams": num, "tokens_per_stream": length, "rounds": rounds, "runs": runs}
    for key, rs in runs.items():
        cpu = statistics.median(x["api_cpu_s"] for x in rs)
        events = statistics.median(x["events"] for x in rs)
        out[key] = {"api_cpu_s": cpu, "wall_s": statistics.median(x["wall_s"] for x in rs),
                    "events": events, "api_us_per_event": 1e6 * cpu / max(events, 1)}
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per stream")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--baseline", default=None, help="PYTHONPATH of an older checkout: its OpenAI streams too")
    ap.add_argument("--smoke", action="store_true", help="4 streams of 8 tokens, one round, no pauses")
    ns = ap.parse_args()
    if ns.smoke:
        ns.streams, ns.tokens, ns.rounds = 4, 8, 1
    import torch

    import radixflow.runtime

    code_dir = os.path.dirname(os.path.realpath(radixflow.runtime.__file__))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=code_dir).stdout.strip()
    result = {"commit": commit, "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "torch": torch.__version__, "baseline": ns.baseline,
              "result": measure(ns.streams, ns.tokens, ns.rounds, ns.baseline, 0.0 if ns.smoke else 1.0)}
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
