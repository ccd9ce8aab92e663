"""End-to-end decode throughput of the Engine on a Llama-3-8B-shaped model with random bf16 weights.

    python benchmarks/engine_decode.py --out benchmarks/out/engine     # a CUDA machine, ~2 minutes
    python benchmarks/engine_decode.py --smoke --out /tmp/engine       # CPU, a tiny model, seconds

No checkpoint: a model directory holds only a config.json of the 8B shape and the demo
tokenizer; `load_format="dummy"` builds the weights on the device. Each run submits `batch`
random prompts of `--prompt-len` tokens with `--decode-len` greedy tokens (EOS ignored), so all
of them prefill first and then decode together. Decode throughput counts the tokens generated
after the last request's first token, over the time until the last token: the whole batch
decoding, with scheduling, sampling and detokenizing included. CUDA graphs on (the default)
at every batch size, off (run first) at the smallest ones, and overlap scheduling on
(`--overlap-batch-sizes`, graphs on; compared with the graphs-on rows of the same batch).
Results: OUT/engine_decode.json.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
}
TINY = {**LLAMA3_8B, "vocab_size": 3072, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512, "torch_dtype": "float32"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
PROMPT_VOCAB = 3000  # prompt ids the demo tokenizer knows; the model's vocab is far larger


def write_model_dir(config: dict, out: Path) -> Path:
    """config.json plus the demo tokenizer: everything Engine(load_format="dummy") reads."""
    from radixflow.runtime.model.demo import demo_model

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    demo = Path(demo_model("tiny"))
    for name in TOKENIZER_FILES:
        shutil.copy(demo / name, out / name)
    return out


def decode_window(timings: list) -> dict[str, float]:
    """Throughput once every request of the batch is decoding: from the last first token on."""
    start = max(t.token_times[0] for t in timings)
    end = max(t.token_times[-1] for t in timings)
    tokens = sum(sum(1 for x in t.token_times if x > start) for t in timings)
    gaps = [b - a for t in timings for a, b in zip(t.token_times, t.token_times[1:]) if a >= start]
    return {"decode_tokens": tokens, "decode_s": end - start,
            "decode_tok_per_s": tokens / (end - start) if end > start else float("nan"),
            "itl_median_ms": 1e3 * statistics.median(gaps) if gaps else float("nan"),
            "ttft_median_s": statistics.median(t.ttft_s for t in timings)}


def run_batch(engine, batch: int, prompt_len: int, decode_len: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(PROMPT_VOCAB) for _ in range(prompt_len)] for _ in range(batch)]
    rids = [f"b{batch}-s{seed}-{i}" for i in range(batch)]
    params = {"temperature": 0, "max_new_tokens": decode_len, "ignore_eos": True}
    preempted = engine.stats().num_preemptions
    start = time.perf_counter()
    results = engine.generate(input_ids=prompts, sampling_params=params, rid=rids)
    wall = time.perf_counter() - start
    assert all(len(r["output_ids"]) == decode_len for r in results)
    wanted = set(rids)
    timings = [t for t in engine.recent_timings if t.rid in wanted]
    return {"batch": batch, "prompt_len": prompt_len, "decode_len": decode_len, "wall_s": wall,
            "preemptions": engine.stats().num_preemptions - preempted, **decode_window(timings)}


def free_device() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def bench_engine(model_dir: Path, graphs: bool, batches: list[int], args: argparse.Namespace,
                 deadline: float, rows: list[dict], save, overlap: bool = False) -> None:
    from radixflow.runtime import Engine

    max_bs = max(batches)
    config = dict(load_format="dummy", max_num_seqs=max_bs, cuda_graph_max_bs=max_bs, disable_cuda_graph=not graphs,
                  enable_overlap=overlap,
                  kv_cache_tokens=max_bs * (args.prompt_len + args.decode_len) + 4096,
                  max_model_len=args.prompt_len + args.decode_len + 64)
    start = time.perf_counter()
    with Engine(str(model_dir), **config) as engine:
        setup_s = time.perf_counter() - start
        runner = engine.runner
        common = {"cuda_graphs": runner.graph_runner is not None, "attention_backend": runner.shape.attention_backend,
                  "dtype": str(runner.shape.dtype).removeprefix("torch."), "device": str(runner.device),
                  "engine_setup_s": setup_s, "graphs_asked": graphs, "overlap": overlap}
        run_batch(engine, min(2, max_bs), 16, 4, seed=0)  # warm-up: kernels compile here
        for batch in batches:
            if time.monotonic() > deadline:
                rows.append({**common, "batch": batch, "skipped": "time budget"})
                continue
            row = {**common, **run_batch(engine, batch, args.prompt_len, args.decode_len, seed=batch)}
            rows.append(row)
            save()
            print(f"batch {batch:>4} graphs {'on ' if row['cuda_graphs'] else 'off'} "
                  f"overlap {'on ' if overlap else 'off'}: "
                  f"{row['decode_tok_per_s']:9.1f} tok/s, ITL {row['itl_median_ms']:7.2f} ms, "
                  f"TTFT {row['ttft_median_s']:.3f} s", flush=True)
    del engine, runner
    free_device()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for engine_decode.json")
    ap.add_argument("--smoke", action="store_true", help="a tiny random model on CPU")
    ap.add_argument("--batch-sizes", default="1,16,64,256", help="comma-separated, CUDA graphs on")
    ap.add_argument("--no-graph-batch-sizes", default="1,16", help="comma-separated, CUDA graphs off")
    ap.add_argument("--overlap-batch-sizes", default="64,256", help="comma-separated, graphs and overlap on")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-len", type=int, default=96)
    ap.add_argument("--time-budget-s", type=float, default=240.0, help="start no run after this long")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() and not args.smoke:
        print("no CUDA device: run with --smoke for the CPU check", file=sys.stderr)
        return 2
    batches = [int(x) for x in args.batch_sizes.split(",") if x]
    eager_batches = [int(x) for x in args.no_graph_batch_sizes.split(",") if x]
    overlap_batches = [int(x) for x in args.overlap_batch_sizes.split(",") if x]
    if args.smoke:
        batches, eager_batches, overlap_batches, args.prompt_len, args.decode_len = [1, 3], [1], [3], 8, 4
    deadline = time.monotonic() + args.time_budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    meta = {"model": "tiny (smoke)" if args.smoke else "Llama-3-8B shape, random weights", "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}

    def save() -> None:
        tmp = args.out / "engine_decode.json.tmp"
        tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        os.replace(tmp, args.out / "engine_decode.json")

    with tempfile.TemporaryDirectory(prefix="radixflow-bench-") as tmp:
        model_dir = write_model_dir(TINY if args.smoke else LLAMA3_8B, Path(tmp) / "model")
        if eager_batches:  # first: the graph speedup needs it, and it is the quicker engine to build
            bench_engine(model_dir, False, eager_batches, args, deadline, rows, save)
        bench_engine(model_dir, True, batches, args, deadline, rows, save)
        if overlap_batches:
            bench_engine(model_dir, True, overlap_batches, args, deadline, rows, save, overlap=True)
    done = [r for r in rows if "decode_tok_per_s" in r]
    on = {r["batch"]: r for r in done if r["cuda_graphs"] and not r["overlap"]}
    off = {r["batch"]: r for r in done if not r["graphs_asked"]}
    meta["graph_speedup"] = {b: on[b]["decode_tok_per_s"] / off[b]["decode_tok_per_s"] for b in on if b in off}
    plain = {r["batch"]: r for r in done if r["graphs_asked"] and not r["overlap"]}  # graphs as the overlap rows'
    overlapped = {r["batch"]: r for r in done if r["overlap"]}
    meta["overlap_speedup"] = {b: overlapped[b]["decode_tok_per_s"] / plain[b]["decode_tok_per_s"]
                               for b in overlapped if b in plain}
    save()
    for b, x in meta["graph_speedup"].items():
        print(f"CUDA graph decode speedup at batch {b}: {x:.2f}x")
    for b, x in meta["overlap_speedup"].items():
        print(f"overlap scheduling decode speedup at batch {b}: {x:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
