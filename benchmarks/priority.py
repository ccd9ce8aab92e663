"""Priority scheduling under load, on CPU: how long urgent requests wait behind a full batch.

A batch-shaped background (`--background` requests of priority 0, each `--background-tokens`
long, more than `--max-num-seqs` seats) keeps the engine full; once it is running, `--urgent`
short requests of priority 100 arrive `--gap-ms` apart. Each configuration runs the same load in
the same process, rounds alternating:

- off: priorities ignored (arrival order: the urgent requests queue behind the background);
- queue: `--enable-priority-scheduling --disable-priority-preemption` (they go to the head of
  the queue and wait for a seat to free);
- preempt: `--enable-priority-scheduling` (they take the seats of background requests, which
  resume later from their cached KV).

Reported per configuration (medians over rounds): the urgent requests' median and worst time to
first token and end to end, the background's total time, preemptions; and the urgent TTFT of
`off` over each of the others.

    python benchmarks/priority.py --out benchmarks/results/priority_cpu.json     # tiny model, one thread
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import time

import torch

from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model

CONFIGS = {"off": {}, "queue": {"enable_priority_scheduling": True, "disable_priority_preemption": True},
           "preempt": {"enable_priority_scheduling": True}}


async def one_run(engine: Engine, args: argparse.Namespace) -> dict:
    gen = torch.Generator().manual_seed(0)
    vocab = engine.vocab_size

    def prompt(n: int) -> list[int]:
        return torch.randint(100, vocab - 1, (n,), generator=gen).tolist()

    async def consume(ids: list[int], max_new: int, priority: int) -> tuple[float, float]:
        """(seconds to the first chunk, seconds to the end) of one request."""
        t0, first = time.perf_counter(), None
        params = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
        async for _ in engine.generate_stream(input_ids=ids, sampling_params=params, priority=priority):
            first = first or time.perf_counter() - t0
        return first, time.perf_counter() - t0

    before = engine.stats().num_preemptions
    t0 = time.perf_counter()
    background = [asyncio.create_task(consume(prompt(args.prompt_tokens), args.background_tokens, 0))
                  for _ in range(args.background)]
    while engine.stats().num_running < args.max_num_seqs:
        await asyncio.sleep(0.001)
    urgent = []
    for _ in range(args.urgent):
        urgent.append(asyncio.create_task(consume(prompt(args.prompt_tokens), args.urgent_tokens, 100)))
        await asyncio.sleep(args.gap_ms / 1000)
    urgent_times = await asyncio.gather(*urgent)
    await asyncio.gather(*background)
    ttft = sorted(t[0] for t in urgent_times)
    e2e = sorted(t[1] for t in urgent_times)
    return {"urgent_ttft_ms_median": 1000 * statistics.median(ttft), "urgent_ttft_ms_max": 1000 * ttft[-1],
            "urgent_e2e_ms_median": 1000 * statistics.median(e2e), "urgent_e2e_ms_max": 1000 * e2e[-1],
            "background_s": time.perf_counter() - t0,
            "preemptions": engine.stats().num_preemptions - before}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="'tiny' (the demo model) or a model path")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--background", type=int, default=64)
    ap.add_argument("--background-tokens", type=int, default=192)
    ap.add_argument("--urgent", type=int, default=8)
    ap.add_argument("--urgent-tokens", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = demo_model("tiny") if args.model == "tiny" else args.model
    engines = {name: Engine(path, max_num_seqs=args.max_num_seqs, **config) for name, config in CONFIGS.items()}
    runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    try:
        for r in range(args.rounds):
            for name in (list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS))):
                engines[name].flush_cache()
                got = asyncio.run(one_run(engines[name], args))
                runs[name].append(got)
                print(f"round {r} {name}: {json.dumps({k: round(v, 1) for k, v in got.items()})}", flush=True)
    finally:
        for engine in engines.values():
            engine.shutdown()
    result = {name: {key: statistics.median(run[key] for run in rs) for key in rs[0]} for name, rs in runs.items()}
    for name in ("queue", "preempt"):
        result[name]["off_over_this_urgent_ttft"] = (result["off"]["urgent_ttft_ms_median"]
                                                     / result[name]["urgent_ttft_ms_median"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    doc = {"command": "python benchmarks/priority.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                                  vars(args).items() if k != "out" and v is not None),
           "commit": commit, "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "dtype": str(next(iter(engines.values())).runner.shape.dtype), "result": result, "runs": runs}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
