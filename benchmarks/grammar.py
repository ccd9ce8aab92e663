"""Constrained decoding benchmark on CPU: JSON-schema generation vs unconstrained at the same
output length, and forward steps saved by jump-forward on a key-heavy schema.

(a) Throughput: B requests generate JSON for a nested schema (temperature 1, seeded); then the
    same prompts generate unconstrained text with each request's max_new_tokens set to its
    JSON output length (EOS ignored), so both produce the same tokens per request. Ratio =
    constrained tokens/s over unconstrained tokens/s, with jump-forward off (the cost of masks
    alone) and on.
(b) Jump-forward: greedy generation of a key-heavy schema with jump_forward on and off; outputs
    are identical (checked), forward steps are counted by the engine.

    python benchmarks/grammar.py                   # small demo model, 16 requests
    python benchmarks/grammar.py --size tiny --num-requests 8   # quick look
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from radixflow.runtime import Engine, demo_model

NESTED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                     "zip": {"type": ["string", "null"], "maxLength": 5}},
                    "required": ["city", "zip"]},
    },
    "required": ["name", "age", "role", "active", "tags", "address"],
}
KEY_HEAVY = {
    "type": "object",
    "properties": {**{f"customer_{k}": {"type": "string", "maxLength": 6}
                      for k in ("first_name", "last_name", "street_address", "postal_code")},
                   **{f"is_{k}_enabled": {"type": "boolean"} for k in ("newsletter", "two_factor", "billing")},
                   "account_status": {"enum": ["active", "suspended", "closed"]}},
}
KEY_HEAVY["required"] = list(KEY_HEAVY["properties"])


def timed(engine: Engine, prompts: list[str], params: list[dict]) -> tuple[list[dict], float, int]:
    steps = engine.stats().num_steps
    t0 = time.perf_counter()
    out = engine.generate(prompts, params)
    return out, time.perf_counter() - t0, engine.stats().num_steps - steps


def throughput(model: str, prompts: list[str], jump_forward: bool) -> dict:
    with Engine(model, jump_forward=jump_forward) as e:
        e.generate(prompts[:2], {"json_schema": NESTED, "max_new_tokens": 8})  # warm up + compile
        json_params = [{"json_schema": NESTED, "max_new_tokens": 256, "temperature": 1.0, "seed": i}
                       for i in range(len(prompts))]
        e.flush_cache()
        cons, cons_s, cons_steps = timed(e, prompts, json_params)
        lens = [len(r["output_ids"]) for r in cons]
        assert all(r["meta_info"]["finish_reason"]["type"] == "stop" for r in cons)
        for r in cons:
            json.loads(r["text"])
        free_params = [{"max_new_tokens": n, "temperature": 1.0, "seed": i, "ignore_eos": True}
                       for i, n in enumerate(lens)]
        e.flush_cache()
        free, free_s, free_steps = timed(e, prompts, free_params)
        assert [len(r["output_ids"]) for r in free] == lens
    tokens = sum(lens)
    return {"jump_forward": jump_forward, "output_tokens": tokens,
            "constrained_s": cons_s, "constrained_tok_s": tokens / cons_s, "constrained_steps": cons_steps,
            "unconstrained_s": free_s, "unconstrained_tok_s": tokens / free_s, "unconstrained_steps": free_steps,
            "ratio": (tokens / cons_s) / (tokens / free_s)}


def steps_saved(model: str, prompts: list[str]) -> dict:
    runs = {}
    for jf in (False, True):
        with Engine(model, jump_forward=jf) as e:
            e.generate(prompts[:1], {"json_schema": KEY_HEAVY, "max_new_tokens": 4})
            e.flush_cache()
            out, secs, steps = timed(e, prompts, {"json_schema": KEY_HEAVY, "max_new_tokens": 256, "temperature": 0})
            runs[jf] = ([r["text"] for r in out], secs, steps, sum(len(r["output_ids"]) for r in out))
    assert runs[True][0] == runs[False][0], "greedy output differs with jump-forward on/off"
    off, on = runs[False], runs[True]
    return {"output_tokens": on[3], "steps_off": off[2], "steps_on": on[2],
            "steps_saved_pct": 100.0 * (1 - on[2] / off[2]), "seconds_off": off[1], "seconds_on": on[1],
            "example": on[0][0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="small", choices=("tiny", "small"))
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "grammar_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = demo_model(args.size)
    prompts = [f"Record {i}: give the customer as JSON." for i in range(args.num_requests)]
    rows = [throughput(model, prompts, jf) for jf in (False, True)]
    jf = steps_saved(model, prompts)
    print(f"model demo-{args.size}, {args.num_requests} requests, CPU threads {torch.get_num_threads()}")
    print(f"{'jump_forward':>12} {'tokens':>7} {'json tok/s':>11} {'free tok/s':>11} {'ratio':>6} "
          f"{'json steps':>10} {'free steps':>10}")
    for r in rows:
        print(f"{str(r['jump_forward']):>12} {r['output_tokens']:>7} {r['constrained_tok_s']:>11.1f} "
              f"{r['unconstrained_tok_s']:>11.1f} {r['ratio']:>6.2f} {r['constrained_steps']:>10} "
              f"{r['unconstrained_steps']:>10}")
    print(f"key-heavy schema, greedy (identical output on/off): forward steps {jf['steps_off']} -> "
          f"{jf['steps_on']} ({jf['steps_saved_pct']:.0f}% fewer), {jf['seconds_off']:.2f} s -> {jf['seconds_on']:.2f} s")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"model": f"demo-{args.size}", "num_requests": args.num_requests, "device": "cpu",
                   "torch_threads": torch.get_num_threads(), "throughput": rows, "jump_forward": jf},
                  f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
