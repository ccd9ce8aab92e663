"""bf16 projections on CPU: the native lane-pair kernel (kernels/cpu_linear.c) against oneDNN's
prepacked layout, side by side in one process, one torch thread.

    taskset -c 1 python benchmarks/cpu_linear.py --out benchmarks/results/cpu_linear_cpu.json

SmolLM2-135M's shapes with random bf16 weights: a decode step's 120 projections (30 layers of
qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536; every layer its own weights, so they
stream from memory as in a real step) and the tied LM head (49,152x576), each at 1-256 input
rows. The two layouts alternate in each round; the figure per layout is its fastest pass of
all rounds (the machine is shared).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in)
LM_HEAD = (49152, 576)


def onednn(weight: torch.Tensor):
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 16)
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,4,16,64,256")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from radixflow.kernels import native_layers
    from radixflow.runtime.model.packed_linear import PackedLinear

    weights = [torch.randn(*shape).to(torch.bfloat16) for _ in range(args.layers) for shape in LAYER_SHAPES]
    if not native_layers.linear_supports(weights[0]):
        print("the native kernel does not build here (no AVX512-BF16): nothing to compare")
        return 1
    head = torch.randn(*LM_HEAD).to(torch.bfloat16)
    sides = {"native": ([PackedLinear(w) for w in weights], PackedLinear(head)),
             "onednn": ([onednn(w) for w in weights], onednn(head))}
    rows_out = []
    for rows in [int(r) for r in args.rows.split(",")]:
        xs = {k: torch.randn(rows, k).to(torch.bfloat16) for k in {s[1] for s in LAYER_SHAPES}}
        best = {f"{side}_{part}": float("inf") for side in sides for part in ("layers", "head")}
        for _ in range(args.rounds):
            for side, (layers, lm_head) in sides.items():
                t = time.perf_counter()
                for w, f in zip(weights, layers):
                    f(xs[w.shape[1]])
                mid = time.perf_counter()
                lm_head(xs[LM_HEAD[1]])
                end = time.perf_counter()
                best[f"{side}_layers"] = min(best[f"{side}_layers"], 1e3 * (mid - t))
                best[f"{side}_head"] = min(best[f"{side}_head"], 1e3 * (end - mid))
        row = {"rows": rows, **{f"{k}_ms": v for k, v in best.items()},
               "layers_speedup": best["onednn_layers"] / best["native_layers"],
               "head_speedup": best["onednn_head"] / best["native_head"]}
        rows_out.append(row)
        print(f"rows {rows:>4}: {4 * args.layers} projections native {best['native_layers']:.1f} ms, oneDNN "
              f"{best['onednn_layers']:.1f} ms ({row['layers_speedup']:.2f}x); LM head native "
              f"{best['native_head']:.2f} ms, oneDNN {best['onednn_head']:.2f} ms ({row['head_speedup']:.2f}x)",
              flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": {"torch": torch.__version__, "layers": args.layers,
                                                 "rounds": args.rounds}, "rows": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
