"""A mixture-of-experts layer's experts on CPU bf16: the stacked weights through torch (kernels.fused_moe_ref)
against one packed (gate | up, down) pair per expert (runtime/model/packed_linear.py, the engine's
CPU bf16 path), side by side in one process on the same weights and routing.

    taskset -c 1 python benchmarks/moe_cpu.py --out benchmarks/results/moe_cpu.json   # ~1 minute
    python benchmarks/moe_cpu.py --smoke                                              # seconds

Shapes: GraniteMoE-3B-A800M's experts (hidden 1536, 40 experts of width 512, top 8) by default;
`--shape olmoe` takes OLMoE-1B-7B's (2048, 64 of 1024, top 8). Rows: a decode step of 1, 4 and
16 tokens and a 256-token prefill chunk, routed by a random router. One torch thread. Figures: the
median of --reps timed calls, milliseconds per layer; the two paths alternate call by call. The
outputs must agree to bf16 rounding (the script checks).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time

import torch

from radixflow import kernels
from radixflow.kernels import native_layers
from radixflow.kernels.moe import grouped_experts
from radixflow.runtime.model.packed_linear import PackedLinear, can_prepack

SHAPES = {"granitemoe": (1536, 40, 512, 8), "olmoe": (2048, 64, 1024, 8)}  # hidden, experts, width, top-k


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    act = native_layers.silu_mul(gate_up)
    return kernels.silu_and_mul_ref(gate_up) if act is None else act


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=tuple(SHAPES), default="granitemoe")
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 3 repetitions: a check that it runs")
    ap.add_argument("--out", help="write the results here as JSON")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not can_prepack(torch.device("cpu"), torch.bfloat16):
        raise SystemExit("this CPU has no oneDNN bf16: the packed path does not apply")
    hidden, experts, width, top_k = (64, 8, 32, 2) if args.smoke else SHAPES[args.shape]
    reps = 3 if args.smoke else args.reps
    gen = torch.Generator().manual_seed(0)
    w_gate_up = (torch.randn(experts, 2 * width, hidden, generator=gen) * hidden ** -0.5).bfloat16()
    w_down = (torch.randn(experts, hidden, width, generator=gen) * width ** -0.5).bfloat16()
    router = torch.randn(experts, hidden, generator=gen).bfloat16()
    packed = [(PackedLinear(w_gate_up[e]), PackedLinear(w_down[e])) for e in range(experts)]

    def packed_mlp(e: int, rows: torch.Tensor) -> torch.Tensor:
        gate_up, down = packed[e]
        return down(silu_mul(gate_up(rows)))

    rows_out = []
    for tokens in (1, 4, 16, 256):
        x = torch.randn(tokens, hidden, generator=gen).bfloat16()
        weights, ids = kernels.moe_route(x @ router.T, top_k, renormalize=True)
        paths = {"stacked": lambda: kernels.fused_moe_ref(x, weights, ids, w_gate_up, w_down, silu_mul),
                 "packed": lambda: grouped_experts(x, weights, ids, experts, packed_mlp)}
        torch.testing.assert_close(paths["packed"]().float(), paths["stacked"]().float(), rtol=3e-2, atol=3e-2)
        times: dict[str, list[float]] = {name: [] for name in paths}
        for i in range(reps):
            for name in (list(paths) if i % 2 == 0 else list(paths)[::-1]):
                start = time.perf_counter()
                paths[name]()
                times[name].append(time.perf_counter() - start)
        stacked, fast = (statistics.median(times[n]) * 1e3 for n in ("stacked", "packed"))
        rows_out.append({"tokens": tokens, "experts_used": int(ids.unique().numel()), "stacked_ms": round(stacked, 3),
                         "packed_ms": round(fast, 3), "speedup": round(stacked / fast, 2)})
    print(f"{'tokens':>7}{'experts used':>14}{'stacked ms':>12}{'packed ms':>11}{'speedup':>9}")
    for row in rows_out:
        print(f"{row['tokens']:>7}{row['experts_used']:>14}{row['stacked_ms']:>12}{row['packed_ms']:>11}"
              f"{row['speedup']:>9}")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(args.out, "w") as f:
            json.dump({"commit": commit, "python": platform.python_version(), "torch": torch.__version__,
                       "shape": "smoke" if args.smoke else args.shape,
                       "hidden_experts_width_topk": [hidden, experts, width, top_k], "reps": reps,
                       "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
