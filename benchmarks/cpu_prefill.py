"""CPU prefill on the native kernels vs the torch path: extend attention (kernels/cpu_extend.c:
native vs per-request SDPA, or chunked matmuls for a short turn on a long context), the
elementwise passes (kernels/cpu_elementwise.c: RMSNorm + residual, RoPE, SiLU-and-mul vs their
torch ops), then whole prefills of SmolLM2-135M-Instruct in bf16 with the native kernels on and off.

    python benchmarks/cpu_prefill.py --out benchmarks/results/cpu_prefill_cpu.json   # ~4 minutes on 2 cores
    python benchmarks/cpu_prefill.py --smoke --out /tmp/cpu_prefill.json              # seconds

One torch (and kernel) thread. Attention: one call is one layer's extend attention over a pool
of bf16 K/V whose slots are shuffled. Elementwise: one call over a prefill's rows at SmolLM2's
sizes, bf16. Both sides alternate round by round, medians of `--rounds`. Engine: one `Engine`
prefills random-id prompts (max_new_tokens 1, the radix cache flushed before each run) with
RADIXFLOW_NATIVE_KERNELS=1, then 0 (every native kernel off), alternating; tokens/s, medians.
The switch is read on every call, so both settings run on the same engine; since session 33 it
also takes the projections off the native linear kernel (kernels/cpu_linear.c) onto torch's
linear over the unpacked weight, which is slower than the oneDNN layout an engine started with
the kernels off would use: the engine figures of earlier sessions compare attention and the
elementwise passes alone.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import time

import torch

from radixflow.kernels import native, native_layers
from radixflow.kernels.torch_attention import extend_attention_torch
from radixflow.runtime.model.model import rmsnorm_cpu, rotate_cpu, silu_mul_cpu

# (name, num_heads, num_kv_heads, head_dim, prefix_len, extend_len, batch)
SHAPES = [
    ("smollm2 prompts 222 x32", 9, 3, 64, 0, 222, 32),
    ("smollm2 prompts 1024 x8", 9, 3, 64, 0, 1024, 8),
    ("smollm2 prompts 16 x64", 9, 3, 64, 0, 16, 64),
    ("smollm2 turn 64 on 4K", 9, 3, 64, 4096, 64, 4),
    ("smollm2 turn 16 on 100K", 9, 3, 64, 100_000, 16, 1),
    ("llama8b prompts 512 x4", 32, 8, 128, 0, 512, 4),
]
SMOKE_SHAPES = [("tiny", 4, 2, 64, 40, 30, 3)]
# (rows, hidden, intermediate, query + KV heads, head_dim): SmolLM2-135M's
ELEMENTWISE_SIZES = [(7104, 576, 1536, 12, 64), (32, 576, 1536, 12, 64)]
SMOKE_ELEMENTWISE_SIZES = [(8, 64, 128, 3, 16)]
ENGINE_PROMPTS = [(222, 32), (1024, 8)]  # (prompt tokens, prompts)


def _layout(num_kv_heads: int, head_dim: int, prefix_len: int, extend_len: int, batch: int, gen: torch.Generator):
    seq_len = prefix_len + extend_len
    num_slots = batch * seq_len + 1
    k = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen).to(torch.bfloat16)
    v = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen).to(torch.bfloat16)
    perm = torch.randperm(num_slots - 1, generator=gen) + 1
    table = perm[:batch * seq_len].view(batch, seq_len).to(torch.int32)
    rows = torch.arange(batch)
    prefix = torch.full((batch,), prefix_len)
    extend = torch.full((batch,), extend_len)
    starts = torch.arange(batch) * extend_len
    return k, v, table, rows, prefix, extend, starts


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_kernel(shapes: list, rounds: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    results = []
    for name, num_heads, num_kv_heads, head_dim, prefix_len, extend_len, batch in shapes:
        k, v, table, rows, prefix, extend, starts = _layout(num_kv_heads, head_dim, prefix_len, extend_len, batch, gen)
        q = torch.randn(batch * extend_len, num_heads, head_dim, generator=gen).to(torch.bfloat16)
        args = (q, k, v, table, rows, prefix, extend, starts, head_dim ** -0.5)
        times: dict[str, list[float]] = {"native": [], "torch": []}
        outs = {}
        for _ in range(rounds):
            for path in times:
                os.environ[native.ENV_SWITCH] = "1" if path == "native" else "0"
                outs[path] = extend_attention_torch(*args)  # warm
                times[path].append(_timed(lambda: extend_attention_torch(*args)))
        os.environ[native.ENV_SWITCH] = "1"
        flops = 4 * batch * num_heads * head_dim * (extend_len * prefix_len + extend_len * (extend_len + 1) / 2)
        ms = {path: 1e3 * statistics.median(t) for path, t in times.items()}
        row = {"shape": name, "num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim,
               "prefix_len": prefix_len, "extend_len": extend_len, "batch": batch,
               "native_ms": ms["native"], "torch_ms": ms["torch"], "speedup": ms["torch"] / ms["native"],
               "native_gflops": flops / ms["native"] / 1e6, "torch_gflops": flops / ms["torch"] / 1e6,
               "max_abs_diff": float((outs["native"].float() - outs["torch"].float()).abs().max())}
        print(f"{name:28s} native {ms['native']:8.2f} ms ({row['native_gflops']:5.1f} GFLOP/s)  torch "
              f"{ms['torch']:8.2f} ms ({row['torch_gflops']:5.1f})  x{row['speedup']:.2f}", flush=True)
        results.append(row)
    return results


def _elementwise_calls(rows: int, hidden: int, inter: int, heads: int, head_dim: int, gen: torch.Generator) -> dict:
    """name → (native call, torch call) over one layer's tensors of a prefill of `rows` tokens."""
    x = torch.randn(rows, hidden, generator=gen).to(torch.bfloat16)
    residual = torch.randn(rows, hidden, generator=gen)
    weight = torch.rand(hidden, generator=gen).to(torch.bfloat16)
    qk = torch.randn(rows, heads * head_dim * 2, generator=gen).to(torch.bfloat16)[:, :heads * head_dim]
    qk = qk.view(rows, heads, head_dim)  # q and k heads inside wider qkv rows, as the model rotates them
    angles = torch.rand(rows, 1, head_dim, generator=gen)
    cos, sin = angles.cos(), angles.sin()
    gate_up = torch.randn(rows, 2 * inter, generator=gen).to(torch.bfloat16)
    return {"rmsnorm+residual": (lambda: native_layers.rmsnorm(x, residual, weight, 1e-5),
                                 lambda: rmsnorm_cpu(x, residual, weight, 1e-5)),
            "rope": (lambda: native_layers.rope(qk, cos, sin), lambda: rotate_cpu(qk, cos, sin)),
            "silu_mul": (lambda: native_layers.silu_mul(gate_up), lambda: silu_mul_cpu(gate_up))}


def bench_elementwise(sizes: list, rounds: int) -> list[dict]:
    gen = torch.Generator().manual_seed(1)
    results = []
    for rows, hidden, inter, heads, head_dim in sizes:
        for name, (fast, slow) in _elementwise_calls(rows, hidden, inter, heads, head_dim, gen).items():
            times: dict[str, list[float]] = {"native": [], "torch": []}
            for _ in range(rounds):
                for path, fn in (("native", fast), ("torch", slow)):
                    os.environ[native.ENV_SWITCH] = "1" if path == "native" else "0"  # rotate_cpu reads it
                    fn()
                    times[path].append(min(_timed(fn) for _ in range(5)))
            os.environ[native.ENV_SWITCH] = "1"
            ms = {path: 1e3 * statistics.median(t) for path, t in times.items()}
            row = {"op": name, "rows": rows, "native_ms": ms["native"], "torch_ms": ms["torch"],
                   "speedup": ms["torch"] / ms["native"]}
            print(f"{name:18s} {rows:6d} rows: native {ms['native']:7.3f} ms  torch {ms['torch']:7.3f} ms  "
                  f"x{row['speedup']:.2f}", flush=True)
            results.append(row)
    return results


def bench_engine(prompts: list[tuple[int, int]], rounds: int) -> list[dict]:
    from radixflow.runtime import Engine
    from radixflow.runtime.model.default_model import default_model_path

    engine = Engine(default_model_path(), dtype="bfloat16")
    rng = random.Random(0)
    results = []
    try:
        engine.generate(input_ids=[[rng.randrange(100, 40000) for _ in range(50)]], sampling_params={"max_new_tokens": 1})
        for length, count in prompts:
            runs: dict[str, list[float]] = {"native": [], "torch": []}
            for _ in range(rounds):
                for path in runs:
                    os.environ[native.ENV_SWITCH] = "1" if path == "native" else "0"
                    batch = [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(count)]
                    engine.flush_cache()
                    seconds = _timed(lambda: engine.generate(input_ids=batch, sampling_params={
                        "max_new_tokens": 1, "temperature": 0}))
                    runs[path].append(length * count / seconds)
            os.environ[native.ENV_SWITCH] = "1"
            tok_s = {path: statistics.median(r) for path, r in runs.items()}
            row = {"prompt_len": length, "prompts": count, "native_tok_per_s": tok_s["native"],
                   "torch_tok_per_s": tok_s["torch"], "speedup": tok_s["native"] / tok_s["torch"], "runs": runs}
            print(f"prefill {count} x {length}: native {tok_s['native']:.0f} tok/s, torch {tok_s['torch']:.0f} tok/s, "
                  f"x{row['speedup']:.2f}", flush=True)
            results.append(row)
    finally:
        engine.shutdown()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="one tiny shape, no engine: seconds")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if native.library() is None:
        raise SystemExit("the native kernels did not build (no C compiler?): nothing to compare")
    rounds = 1 if args.smoke else args.rounds
    kernel = bench_kernel(SMOKE_SHAPES if args.smoke else SHAPES, rounds)
    elementwise = bench_elementwise(SMOKE_ELEMENTWISE_SIZES if args.smoke else ELEMENTWISE_SIZES, rounds)
    engine = [] if args.smoke else bench_engine(ENGINE_PROMPTS, max(1, rounds // 2))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"commit": commit, "machine": platform.machine(), "cpu": platform.processor(), "torch_threads": 1,
           "rounds": rounds, "kernel": kernel, "elementwise": elementwise, "engine_prefill": engine,
           "loadavg": os.getloadavg()}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
