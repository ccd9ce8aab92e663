"""Prefix-cache benchmark: radix+lpm vs radix off+fcfs vs transformers static batches, on CPU.

Workload (a): N requests sharing a ~1,000-token few-shot prefix, each with its own question.
Workload (b): N requests with no shared prefix. Every request generates exactly
`--output-len` tokens (greedy, EOS ignored) so throughput compares like with like.

    python benchmarks/prefix_cache.py                 # small demo model, 64 requests, all systems (~12 min)
    python benchmarks/prefix_cache.py --size tiny --num-requests 16 --skip-hf   # quick look
    python benchmarks/prefix_cache.py --model default --num-requests 16 --kv-cache-tokens 20000  # SmolLM2
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch

from radixflow.runtime import Engine, demo_model
from radixflow.runtime.model.demo import CORPUS_PATH
from radixflow.runtime.text.tokenizer import Tokenizer


def corpus_token_pool(model_dir: str) -> list[int]:
    with open(CORPUS_PATH, encoding="utf-8") as f:
        text = f.read()
    return Tokenizer.from_pretrained(model_dir).encode(text, add_special_tokens=False)


def make_workloads(pool: list[int], n: int, prefix_len: int, question_len: int, distinct_len: int,
                   bos: int | None) -> dict[str, list[list[int]]]:
    """(a) shared few-shot prefix + distinct question; (b) distinct prompts, no shared prefix."""
    rng = random.Random(0)
    head = [bos] if bos is not None else []
    prefix = pool[:prefix_len]

    def span(length: int) -> list[int]:
        start = rng.randrange(prefix_len, len(pool) - length)
        return pool[start: start + length]

    shared = [head + prefix + span(question_len) for _ in range(n)]
    distinct = [head + [i % 7] + span(distinct_len) for i in range(n)]  # first tokens differ too
    return {"shared_prefix": shared, "no_shared_prefix": distinct}


def run_engine(model_dir: str, prompts: list[list[int]], output_len: int, **config) -> dict:
    params = {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True}
    with Engine(model_dir, **config) as engine:
        engine.generate(input_ids=prompts[0][:8], sampling_params={"max_new_tokens": 2})  # warm up
        engine.flush_cache()
        before = engine.stats()
        t0 = time.perf_counter()
        results = engine.generate(input_ids=prompts, sampling_params=params)
        elapsed = time.perf_counter() - t0
        after = engine.stats()
    out_tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    return {"seconds": elapsed, "output_tokens": out_tokens, "throughput_tok_s": out_tokens / elapsed,
            "requests_s": len(prompts) / elapsed,
            "prefill_tokens_computed": after.prefill_tokens_computed - before.prefill_tokens_computed,
            "prompt_tokens": sum(len(p) for p in prompts),
            "cached_tokens": sum(r["meta_info"]["cached_tokens"] for r in results),
            "output_ids": [r["output_ids"] for r in results]}


def run_transformers(model_dir: str, prompts: list[list[int]], output_len: int, batch_size: int) -> dict:
    from transformers import AutoModelForCausalLM

    if os.path.isfile(model_dir):  # a GGUF file: transformers dequantizes it too
        model = AutoModelForCausalLM.from_pretrained(os.path.dirname(model_dir), gguf_file=os.path.basename(model_dir),
                                                     dtype=torch.float32).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = model.config.pad_token_id or 0
    t0 = time.perf_counter()
    outputs: list[list[int]] = []
    for i in range(0, len(prompts), batch_size):
        batch = prompts[i: i + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=output_len,
                                 min_new_tokens=output_len, do_sample=False, pad_token_id=pad)
        outputs.extend(out[:, width:].tolist())
    elapsed = time.perf_counter() - t0
    out_tokens = sum(len(o) for o in outputs)
    return {"seconds": elapsed, "output_tokens": out_tokens, "throughput_tok_s": out_tokens / elapsed,
            "requests_s": len(prompts) / elapsed,
            "prefill_tokens_computed": sum(len(ids_row) for ids_row in prompts),
            "prompt_tokens": sum(len(p) for p in prompts), "batch_size": batch_size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="small", help="demo model size")
    ap.add_argument("--model", default=None, help="model path instead of the demo model ('default': SmolLM2)")
    ap.add_argument("--kv-cache-tokens", type=int, default=80000)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--prefix-len", type=int, default=1000)
    ap.add_argument("--question-len", type=int, default=24)
    ap.add_argument("--distinct-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--repeats", type=int, default=2, help="runs per engine system (best kept)")
    ap.add_argument("--out", default="benchmarks/results/prefix_cache_cpu.json")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    model_dir = args.model or demo_model(args.size)
    if model_dir == "default":
        from radixflow.runtime.model.default_model import default_model_path

        model_dir = default_model_path()
    tok = Tokenizer.from_pretrained(model_dir)
    workloads = make_workloads(corpus_token_pool(model_dir), args.num_requests, args.prefix_len,
                               args.question_len, args.distinct_len, tok.bos_token_id)
    systems = {
        "radix+lpm": dict(schedule_policy="lpm"),
        "radix-off+fcfs": dict(schedule_policy="fcfs", disable_radix_cache=True),
    }
    report: dict = {"args": vars(args), "torch_threads": torch.get_num_threads(), "results": {}}
    for wname, prompts in workloads.items():
        rows: dict[str, dict] = {}
        # Systems alternate (A B A B ...) and each keeps its best run, so neither pays alone for
        # the process's first large allocations or a burst of load on the machine.
        for rep in range(args.repeats):
            for sname, cfg in systems.items():
                r = run_engine(model_dir, prompts, args.output_len, kv_cache_tokens=args.kv_cache_tokens, **cfg)
                print(f"{wname:17s} {sname:15s} run {rep}: {r['seconds']:8.1f}s "
                      f"{r['throughput_tok_s']:8.1f} tok/s  prefill {r['prefill_tokens_computed']}", flush=True)
                if sname not in rows or r["seconds"] < rows[sname]["seconds"]:
                    rows[sname] = {**r, "runs_s": rows.get(sname, {}).get("runs_s", []) + [r["seconds"]]}
                else:
                    rows[sname]["runs_s"].append(r["seconds"])
        if not args.skip_hf:
            rows["transformers"] = run_transformers(model_dir, prompts, args.output_len, args.hf_batch_size)
            print(f"{wname:17s} {'transformers':15s} {rows['transformers']['seconds']:8.1f}s "
                  f"{rows['transformers']['throughput_tok_s']:8.1f} tok/s", flush=True)
        same = rows["radix+lpm"]["output_ids"] == rows["radix-off+fcfs"]["output_ids"]
        for r in rows.values():
            r.pop("output_ids", None)
        ratios = {"radix+lpm / radix-off+fcfs": rows["radix+lpm"]["throughput_tok_s"]
                  / rows["radix-off+fcfs"]["throughput_tok_s"]}
        if "transformers" in rows:
            ratios["radix+lpm / transformers"] = (rows["radix+lpm"]["throughput_tok_s"]
                                                  / rows["transformers"]["throughput_tok_s"])
        report["results"][wname] = {"systems": rows, "ratios": ratios, "greedy_outputs_identical": same}
    print_table(report)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")


def print_table(report: dict) -> None:
    print("\n| workload | system | seconds | output tok/s | prompt tokens | prefill tokens computed |")
    print("|---|---|---|---|---|---|")
    for wname, res in report["results"].items():
        for sname, r in res["systems"].items():
            print(f"| {wname} | {sname} | {r['seconds']:.1f} | {r['throughput_tok_s']:.1f} | "
                  f"{r['prompt_tokens']} | {r['prefill_tokens_computed']} |")
    for wname, res in report["results"].items():
        for k, v in res["ratios"].items():
            print(f"{wname}: {k} = {v:.2f}x")
        print(f"{wname}: greedy outputs identical across engine configs: {res['greedy_outputs_identical']}")


if __name__ == "__main__":
    main()
