"""Decode steps on CPU with one long context among short ones, side by side: on the torch path
the long row read by itself in chunks of SHARED_CHUNK_TOKENS (kernels/torch_decode.py: past
LONG_ROW_TOKENS) or gathered whole, in a chunk of its own (the short rows are gathered apart from
it either way); and every row read in place by the native kernel (kernels/native.py).

    python benchmarks/long_context_decode.py --out benchmarks/results/long_context_decode_cpu.json

One engine in this process (a random-weight tiny Llama, the demo tokenizer, float32, 131,072
positions, one torch thread; or `--model DIR` with `--dtype`). One prompt of `--context` tokens and
`--short` prompts of 100 are prefilled once (cached), then decoded `--decode` tokens each, greedy,
EOS ignored, the three settings alternating for `--rounds` rounds ("alone" and "gathered": the
native kernel off; "gathered": the module's LONG_ROW_TOKENS set past any context). A decode step
is the wall time while every request of the batch was decoding over the steps in it; reported per
setting as the median of the rounds, with how many requests got the same tokens as "alone".
`--threads N` (N > 1) runs N torch threads and adds "native_one_piece": the native kernel without
cutting long contexts into pieces for idle threads (SPLIT_PIECE_TOKENS set past any context).
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
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_decode import TINY, write_model_dir  # noqa: E402

GREEDY = {"temperature": 0, "ignore_eos": True}


def decode_step_ms(engine, rids: set[str]) -> float:
    """ms per step while every one of `rids` was decoding."""
    timings = [t for t in engine.recent_timings if t.rid in rids]
    start = max(t.token_times[0] for t in timings)
    end = min(t.token_times[-1] for t in timings)
    steps = min(sum(1 for x in t.token_times if start < x <= end) for t in timings)
    return 1e3 * (end - start) / steps


def run(model_dir: str, load_format: str, dtype: str, context: int, short: int, decode: int, rounds: int,
        threads: int = 1) -> dict:
    from radixflow.kernels import native, torch_decode
    from radixflow.runtime import Engine

    rng = random.Random(0)
    prompts = [[rng.randrange(3000) for _ in range(context)]]
    prompts += [[rng.randrange(3000) for _ in range(100)] for _ in range(short)]
    long_row = torch_decode.LONG_ROW_TOKENS
    split = torch_decode.SPLIT_PIECE_TOKENS
    # (native switch, LONG_ROW_TOKENS, SPLIT_PIECE_TOKENS)
    settings = {"alone": ("0", long_row, split), "gathered": ("0", 1 << 62, split), "native": ("1", long_row, split)}
    if threads > 1:
        settings["native_one_piece"] = ("1", long_row, 1 << 62)
    out: dict = {"context": context, "short": short, "decode": decode, "rounds": rounds,
                 "long_row_tokens": long_row, "threads": threads, "step_ms_runs": {name: [] for name in settings}}
    switch = os.environ.get(native.ENV_SWITCH)
    tokens: dict[str, list] = {}
    kv = context + 100 * short + 2 * decode * (short + 1) + 4096
    with Engine(model_dir, load_format=load_format, device="cpu", dtype=dtype, kv_cache_tokens=kv,
                max_num_seqs=short + 1) as engine:
        engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 0})  # cached from here on
        try:
            for r in range(rounds):
                for name, (on, threshold, piece) in settings.items():
                    os.environ[native.ENV_SWITCH] = on
                    torch_decode.LONG_ROW_TOKENS, torch_decode.SPLIT_PIECE_TOKENS = threshold, piece
                    rids = [f"{name}-{r}-{i}" for i in range(len(prompts))]
                    res = engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": decode},
                                          rid=rids)
                    out["step_ms_runs"][name].append(decode_step_ms(engine, set(rids)))
                    tokens.setdefault(name, [x["output_ids"] for x in res])
                    print(f"round {r} {name}: {out['step_ms_runs'][name][-1]:.2f} ms per decode step", flush=True)
        finally:
            torch_decode.LONG_ROW_TOKENS, torch_decode.SPLIT_PIECE_TOKENS = long_row, split
            if switch is None:
                os.environ.pop(native.ENV_SWITCH, None)
            else:
                os.environ[native.ENV_SWITCH] = switch
    out["native_built"] = native.library() is not None  # else "native" ran the torch path
    out["step_ms"] = {name: statistics.median(v) for name, v in out["step_ms_runs"].items()}
    out["speedup"] = out["step_ms"]["gathered"] / out["step_ms"]["alone"]
    out["native_speedup"] = out["step_ms"]["alone"] / out["step_ms"]["native"]
    out["same_tokens"] = {name: sum(a == b for a, b in zip(tokens["alone"], tokens[name]))
                          for name in settings if name != "alone"}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a model directory (default: a random-weight tiny Llama)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--context", type=int, default=20000, help="the long prompt's tokens")
    ap.add_argument("--short", type=int, default=15, help="how many 100-token prompts beside it")
    ap.add_argument("--decode", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the native kernel's too)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            model_dir, load_format = str(write_model_dir({**TINY, "max_position_embeddings": 131072},
                                                         Path(tmp) / "model")), "dummy"
        else:
            model_dir, load_format = args.model, "auto"
        result = run(model_dir, load_format, args.dtype, args.context, args.short, args.decode, args.rounds,
                     args.threads)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    doc = {"command": " ".join(["python benchmarks/long_context_decode.py", *sys.argv[1:]]), "commit": commit,
           "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
           "model": args.model or "tiny (random weights)", "dtype": args.dtype, **result}
    print(json.dumps({k: v for k, v in doc.items() if k != "step_ms_runs"}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
