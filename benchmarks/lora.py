"""Multi-LoRA throughput: 40 rank-16 adapters on q/k/v/o of the default model vs base-only traffic.

One engine serves both kinds of traffic, of the same shape (same prompts, exactly
`--output-len` greedy tokens each, EOS ignored, radix cache off so every round computes the
same work): base-only requests, and requests spread uniformly over 1, 8 or 40 distinct
adapters per batch. Workloads alternate round by round and each keeps its best round, so load
on a shared machine does not land on one side only. Reported: output tokens/s of each, their
ratio to base-only, and the memory one adapter takes (its device slot and its host weights).

    python benchmarks/lora.py                                  # CPU, default model (SmolLM2-135M)
    python benchmarks/lora.py --rounds 1 --output-len 8        # quick look
    python benchmarks/lora.py --model DIR --load-format dummy  # e.g. 8B shapes, random weights (GPU)
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

from radixflow.runtime import Engine
from radixflow.runtime.lora.random_adapter import write_random_adapter
from radixflow.runtime.model.default_model import default_model_path

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
WORDS = "the quick brown fox jumps over a lazy dog while seven small birds sing in the old oak tree".split()


def write_adapters(root: str, model: str, num: int, rank: int) -> list[str]:
    """`num` random PEFT adapters (bf16 files) for `model`'s q/k/v/o; returns their directories."""
    return [write_random_adapter(os.path.join(root, f"adapter{i}"), model, rank, TARGETS, seed=i, b_std=0.01,
                                 dtype=torch.bfloat16) for i in range(num)]


def prompts(batch: int, prompt_len: int) -> list[str]:
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(prompt_len)) for i in range(batch)]


def run(engine: Engine, texts: list[str], loras: list[str | None], output_len: int) -> float:
    """Seconds to serve every (prompt, adapter) concurrently, as one continuous batch."""
    import threading

    params = {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True}
    threads = [threading.Thread(target=engine.generate, args=(t, params), kwargs={"lora": lo})
               for t, lo in zip(texts, loras)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory or GGUF (default: the default model)")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--num-adapters", type=int, default=40)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--batch", type=int, default=40)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--distinct", default="1,8,40", help="distinct adapters per batch, comma-separated")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    model = a.model or default_model_path()
    distinct = [int(d) for d in a.distinct.split(",")]
    with tempfile.TemporaryDirectory() as root:
        paths = write_adapters(root, model, a.num_adapters, a.rank)
        engine = Engine(model, load_format=a.load_format, max_loras=max(distinct), max_lora_rank=a.rank,
                        lora_target_modules=",".join(TARGETS), disable_radix_cache=True,
                        max_num_seqs=max(a.batch, 1), lora_modules=[f"a{i}={p}" for i, p in enumerate(paths)])
        try:
            report = measure(engine, a, distinct)
        finally:
            engine.shutdown()
    print(json.dumps(report, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


def measure(engine: Engine, a: argparse.Namespace, distinct: list[int]) -> dict:
    texts = prompts(a.batch, a.prompt_len)
    workloads: dict[str, list[str | None]] = {"base": [None] * a.batch}
    for d in distinct:
        workloads[f"lora_{d}"] = [f"a{i % d}" for i in range(a.batch)]
    for loras in workloads.values():  # warm up: every adapter resident once, kernels compiled
        run(engine, texts, loras, 2)
    best = {name: float("inf") for name in workloads}
    for _ in range(a.rounds):
        for name, loras in workloads.items():
            best[name] = min(best[name], run(engine, texts, loras, a.output_len))
    tokens = a.batch * a.output_len
    slots = engine.runner.lora_slots
    adapter = engine.loras.registry.resolve("a0")[1]
    return {
        "model": a.model or "default (SmolLM2-135M-Instruct)", "device": str(engine.runner.device),
        "dtype": str(engine.runner.shape.dtype), "batch": a.batch, "prompt_len": a.prompt_len,
        "output_len": a.output_len, "rounds": a.rounds, "adapters": a.num_adapters, "rank": a.rank,
        "tokens_per_s": {n: round(tokens / s, 1) for n, s in best.items()},
        "ratio_to_base": {n: round(best["base"] / s, 3) for n, s in best.items() if n != "base"},
        "slot_mb_per_adapter": round(slots.bytes_per_slot() / 2**20, 2),
        "host_mb_per_adapter_fp32": round(adapter.nbytes / 2**20, 2),
        "peft_mb_per_adapter_bf16": round(adapter.nbytes / 2 / 2**20, 2),
    }


if __name__ == "__main__":
    main()
