"""Decode ms per step on CPU: radixflow's Engine against transformers eager, same model, same core, one run.

    taskset -c 1 python benchmarks/cpu_decode.py --model /tmp/smollm2-135m-hf --out benchmarks/results/cpu_decode.json

Both sides load the same Hugging Face directory in the same dtype, in this one process, with one
torch thread. Each round runs every batch size on both sides (transformers first, then radixflow);
the figures per side are the best round's median step time and the fastest single step (rounds
alternate, best-of-N, because the machine is shared and noisy), each with its ratio.

- radixflow: `batch` prompts of `--prompt-len` random token ids, `--decode-len` greedy tokens each
  (EOS ignored), through `Engine.generate`; one decode step is the median gap between a request's
  consecutive tokens once every request of the batch is decoding: scheduling, sampling and
  detokenizing included.
- transformers: the same prompts prefilled as one batch, then `--decode-len` forward calls of one
  token each over its KV cache (`past_key_values`, logits of the last position only) and an argmax:
  the model alone, no `generate` bookkeeping (a stricter baseline than `generate`).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch


def prompts_for(batch: int, prompt_len: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(prompt_len)] for _ in range(batch)]


@torch.inference_mode()
def hf_step_ms(model, prompts: list[list[int]], decode_len: int) -> list[float]:
    """ms of each batched decode forward of a transformers model over its own cache."""
    from transformers import DynamicCache

    cache = DynamicCache()
    out = model(input_ids=torch.tensor(prompts), past_key_values=cache, use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)  # [batch, 1]
    gaps = []
    for _ in range(decode_len - 1):
        start = time.perf_counter()
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        gaps.append(1e3 * (time.perf_counter() - start))
    return gaps


def radixflow_step_ms(engine, prompts: list[list[int]], decode_len: int, tag: str) -> list[float]:
    """ms between consecutive tokens of one request (the first), once the whole batch decodes."""
    rids = [f"{tag}-{i}" for i in range(len(prompts))]
    params = {"temperature": 0, "max_new_tokens": decode_len, "ignore_eos": True}
    engine.generate(input_ids=prompts, sampling_params=params, rid=rids)
    wanted = set(rids)
    timings = [t for t in engine.recent_timings if t.rid in wanted]
    start = max(t.token_times[0] for t in timings)
    first = min(timings, key=lambda t: t.rid)
    return [1e3 * (b - a) for a, b in zip(first.token_times, first.token_times[1:]) if a >= start]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="Hugging Face model directory (safetensors)")
    ap.add_argument("--out", type=Path, help="write the results here as JSON")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--batch-sizes", default="1,16,64")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-len", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from radixflow.runtime import Engine

    dtype = getattr(torch, args.dtype)
    batches = [int(b) for b in args.batch_sizes.split(",") if b]
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()
    engine = Engine(args.model, dtype=args.dtype, max_num_seqs=max(batches),
                    kv_cache_tokens=max(batches) * (args.prompt_len + args.decode_len) + 256,
                    max_model_len=args.prompt_len + args.decode_len + 64)
    vocab = hf.config.vocab_size
    best: dict[int, dict[str, float]] = {b: {"transformers": float("inf"), "radixflow": float("inf")} for b in batches}
    fastest: dict[int, dict[str, float]] = {b: {"transformers": float("inf"), "radixflow": float("inf")} for b in batches}
    radixflow_step_ms(engine, prompts_for(2, 16, vocab, 0), 4, "warm")
    hf_step_ms(hf, prompts_for(2, 16, vocab, 0), 4)
    for rnd in range(args.rounds):
        for b in batches:
            prompts = prompts_for(b, args.prompt_len, vocab, seed=1000 * rnd + b)
            hf_gaps = hf_step_ms(hf, prompts, args.decode_len)
            rf_gaps = radixflow_step_ms(engine, prompts, args.decode_len, f"r{rnd}-b{b}")
            hf_ms, rf_ms = statistics.median(hf_gaps), statistics.median(rf_gaps)
            for side, gaps in (("transformers", hf_gaps), ("radixflow", rf_gaps)):
                best[b][side] = min(best[b][side], statistics.median(gaps))
                fastest[b][side] = min(fastest[b][side], min(gaps))
            print(f"round {rnd} batch {b:>3}: transformers {hf_ms:7.1f} ms  radixflow {rf_ms:7.1f} ms", flush=True)
    engine.shutdown()
    rows = [{"batch": b, "transformers_ms": v["transformers"], "radixflow_ms": v["radixflow"],
             "ratio": v["radixflow"] / v["transformers"], "transformers_min_ms": fastest[b]["transformers"],
             "radixflow_min_ms": fastest[b]["radixflow"],
             "min_ratio": fastest[b]["radixflow"] / fastest[b]["transformers"]} for b, v in best.items()]
    print("batch | median step ms: transformers  radixflow  ratio | fastest step ms: transformers  radixflow  ratio")
    for r in rows:
        print(f"{r['batch']:>5} | {r['transformers_ms']:28.1f} {r['radixflow_ms']:10.1f} {r['ratio']:6.2f} | "
              f"{r['transformers_min_ms']:29.1f} {r['radixflow_min_ms']:10.1f} {r['min_ratio']:6.2f}")
    if args.out is not None:
        meta = {"model": args.model, "dtype": args.dtype, "prompt_len": args.prompt_len,
                "decode_len": args.decode_len, "rounds": args.rounds, "torch": torch.__version__,
                "cpu_capability": torch.backends.cpu.get_cpu_capability()}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
