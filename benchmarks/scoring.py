"""Generative scoring (`Engine.score`, /v1/score): one query against many items, on CPU.

A reranking-shaped workload: a `--query-len`-token query (a task description and a document
collection's shared context), `--items` candidate items of `--item-len` tokens, `--labels`
label tokens ("yes" / "no" ...). Each configuration scores the same batch in the same process,
rounds alternating:

- radix: `Engine.score` with the prefix cache (the query's KV shared by every item);
- no-cache: the same engine with the radix cache off (every (item, label) request prefills
  query + item + label in full);
- transformers (with --hf-model): one forward per item over query + item, the labels' probabilities
  read from its last position (a stricter baseline than per-label requests: it needs no cache).

Reported: seconds per batch (median of the rounds), prefill tokens computed, and the ratios.

    python benchmarks/scoring.py --out benchmarks/results/scoring_cpu.json            # SmolLM2, one thread
    python benchmarks/scoring.py --model tiny --rounds 2                                 # quick look
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model


def workload(vocab: int, query_len: int, items: int, item_len: int, labels: int) -> tuple[list[int], list[list[int]],
                                                                                            list[int]]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, vocab - 1, (query_len + items * item_len + labels,), generator=gen).tolist()
    query = ids[:query_len]
    item_ids = [ids[query_len + i * item_len: query_len + (i + 1) * item_len] for i in range(items)]
    return query, item_ids, ids[-labels:]


def time_engine(engine: Engine, query: list[int], items: list[list[int]], labels: list[int]) -> tuple[float, int,
                                                                                                       list]:
    engine.flush_cache()
    before = engine.stats().prefill_tokens_computed
    t0 = time.perf_counter()
    scores = engine.score(query, items, labels)
    return time.perf_counter() - t0, engine.stats().prefill_tokens_computed - before, scores


def time_hf(model, query: list[int], items: list[list[int]], labels: list[int]) -> tuple[float, list]:
    t0 = time.perf_counter()
    scores = []
    with torch.inference_mode():
        for item in items:
            logits = model(torch.tensor([query + item])).logits[0, -1].float()
            scores.append(torch.softmax(logits, -1)[labels].tolist())
    return time.perf_counter() - t0, scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model path, 'tiny' for the demo model; default: SmolLM2")
    ap.add_argument("--hf-model", default=None, help="the same model as a Hugging Face directory (transformers)")
    ap.add_argument("--query-len", type=int, default=1024)
    ap.add_argument("--items", type=int, default=32)
    ap.add_argument("--item-len", type=int, default=48)
    ap.add_argument("--labels", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = demo_model("tiny") if args.model == "tiny" else args.model
    config = {"kv_cache_tokens": 60_000, "max_prefill_tokens": 8192}
    with Engine(model, **config) as radix, Engine(model, disable_radix_cache=True, **config) as plain:
        query, items, labels = workload(radix.vocab_size, args.query_len, args.items, args.item_len, args.labels)
        hf = None
        if args.hf_model:
            import transformers

            hf = transformers.AutoModelForCausalLM.from_pretrained(args.hf_model, dtype=radix.runner.shape.dtype).eval()
        radix.score(query, items[:2], labels)  # warm-up
        plain.score(query, items[:2], labels)
        rows: dict[str, list[float]] = {"radix": [], "no_cache": [], "transformers": []}
        computed = {}
        for _ in range(args.rounds):
            seconds, computed["radix"], scores = time_engine(radix, query, items, labels)
            rows["radix"].append(seconds)
            seconds, computed["no_cache"], plain_scores = time_engine(plain, query, items, labels)
            rows["no_cache"].append(seconds)
            if hf is not None:
                seconds, hf_scores = time_hf(hf, query, items, labels)
                rows["transformers"].append(seconds)
        diff = max(abs(a - b) for ra, rb in zip(scores, plain_scores) for a, b in zip(ra, rb))
    med = {k: statistics.median(v) for k, v in rows.items() if v}
    result = {
        "model": model or "SmolLM2-135M-Instruct (default)", "dtype": str(radix.runner.shape.dtype),
        "threads": args.threads, "query_len": args.query_len, "items": args.items, "item_len": args.item_len,
        "labels": args.labels, "rounds": args.rounds, "seconds": rows, "median_s": med,
        "prefill_tokens_computed": computed, "max_score_diff_radix_vs_no_cache": diff,
        "speedup_radix_over_no_cache": med["no_cache"] / med["radix"],
        "load_avg_1min": os.getloadavg()[0],
    }
    if "transformers" in med:
        result["speedup_radix_over_transformers"] = med["transformers"] / med["radix"]
        result["max_score_diff_radix_vs_transformers"] = max(
            abs(a - b) for ra, rb in zip(scores, hf_scores) for a, b in zip(ra, rb))
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
