"""Sampler microbenchmark: one sampling step over [batch, vocab] fp32 logits, by parameter mix.

    python benchmarks/sampler.py --out benchmarks/results/sampler_cpu.json          # 256 x 128256
    python benchmarks/sampler.py --batch 32 --vocab 32000 --reps 3                  # quicker

Mixes: greedy; top-p 0.9 at temperature 0.8; top-k 50 with top-p 0.95; frequency + presence +
repetition penalties (512 prompt ids, a growing output); every row seeded; and a quarter each of
greedy / top-p / penalties / seeded. Each mix reuses its rows across repetitions (their
persistent state, as in serving) and appends one output token per row per step. The figure is
the best of --reps steps. Logits are Zipf-shaped (logit = -1.1 ln rank, ranks shuffled per row,
peaked like a language model's), except `top_p_flat`: 3 x N(0, 1) logits, whose 0.9 nucleus is
wider than the sampler's 1024 top-p candidates (its full-sort fallback). `previous` is the sampler of the commit given by --previous (default:
the one before issue 16), loaded from git, when git can provide it.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from radixflow.runtime.core import sampler
from radixflow.runtime.sampling_params import SamplingParams

MIXES = {
    "greedy": [{"temperature": 0.0}],
    "top_p": [{"temperature": 0.8, "top_p": 0.9}],
    "top_p_flat": [{"temperature": 0.8, "top_p": 0.9}],  # on flat logits: the nucleus passes 1024
    "top_k_top_p": [{"temperature": 0.8, "top_k": 50, "top_p": 0.95}],
    "penalties": [{"temperature": 0.0, "frequency_penalty": 0.5, "presence_penalty": 0.3, "repetition_penalty": 1.1}],
    "seeded": [{"temperature": 1.0, "seed": 1}],
    "mixed": [{"temperature": 0.0}, {"temperature": 0.8, "top_p": 0.9},
              {"temperature": 0.7, "frequency_penalty": 0.5, "repetition_penalty": 1.1}, {"temperature": 1.0, "seed": 1}],
}


def make_rows(module, mix: list[dict], batch: int, vocab: int, gen: torch.Generator) -> list:
    rows = []
    for i in range(batch):
        params = dict(mix[i % len(mix)])
        seed = params.pop("seed", None)
        prompt = torch.randint(0, vocab, (512,), generator=gen).tolist()
        output = torch.randint(0, vocab, (64,), generator=gen).tolist()
        g = torch.Generator().manual_seed(seed + i) if seed is not None else None
        rows.append(module.SampleRow(SamplingParams.from_dict(params), prompt, output, g, []))
    return rows


def time_mix(module, mix: list[dict], logits: torch.Tensor, reps: int) -> float:
    """Best seconds of one sample() call over `reps` steps (rows persist; outputs grow)."""
    gen = torch.Generator().manual_seed(0)
    rows = make_rows(module, mix, logits.shape[0], logits.shape[1], gen)
    default = torch.Generator(logits.device).manual_seed(0)
    best = float("inf")
    for _ in range(reps):
        work = logits.clone()
        if logits.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = module.sample(work, rows, default)
        best = min(best, time.perf_counter() - start)
        for r, t in zip(rows, out.tokens):
            r.output_ids.append(t)
    return best


def load_previous(commit: str):
    """The sampler module as of `commit`, or None where git (or the commit) is not at hand."""
    try:
        src = subprocess.run(["git", "show", f"{commit}:runtime/core/sampler.py"], capture_output=True, text=True,
                             check=True, cwd=Path(__file__).resolve().parents[1]).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp()) / "previous_sampler.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("previous_sampler", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["previous_sampler"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--previous", default="e1fc192", help="commit whose sampler to compare against ('' = none)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(1)
    flat = torch.randn(args.batch, args.vocab, generator=gen).mul_(3).to(device)
    zipf = -1.1 * torch.log(torch.arange(1, args.vocab + 1, dtype=torch.float32))[torch.randperm(args.vocab, generator=gen)]
    shifts = torch.randint(0, args.vocab, (args.batch,), generator=gen).tolist()
    peaked = torch.stack([zipf.roll(s) for s in shifts]).to(device)  # [batch, vocab]
    previous = load_previous(args.previous) if args.previous else None
    rows = []
    for name, mix in MIXES.items():
        logits = flat if name == "top_p_flat" else peaked
        row = {"mix": name, "ours_ms": 1e3 * time_mix(sampler, mix, logits, args.reps)}
        if previous is not None:
            row["previous_ms"] = 1e3 * time_mix(previous, mix, logits, args.reps)
            row["speedup"] = row["previous_ms"] / row["ours_ms"]
        rows.append(row)
        extra = f"  previous {row['previous_ms']:9.1f} ms  x{row['speedup']:.1f}" if previous is not None else ""
        print(f"{name:>12}: ours {row['ours_ms']:9.1f} ms{extra}", flush=True)
    if args.out is not None:
        meta = {"batch": args.batch, "vocab": args.vocab, "reps": args.reps, "device": str(device),
                "previous": args.previous if previous is not None else None, "torch": torch.__version__,
                "threads": torch.get_num_threads()}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
