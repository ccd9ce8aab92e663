"""Issue 15's 100K-prefix turn, this checkout against another, alternating round by round.

    python benchmarks/prefix_ttft_ab.py --baseline /tmp/before/path --rounds 3 --out benchmarks/results/prefix_ttft_ab.json

Each round runs `engine_overhead.py --only prefix_ttft --repeats 1` (a 16-token turn on a
100K-token cached prefix against a 16-token prompt without one, tiny model, one core's worth of
torch threads: see engine_overhead.py) in a fresh process, first with this checkout, then with
the `radixflow` package that `--baseline` puts first on PYTHONPATH.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def commit_of(pythonpath: str | None) -> str:
    code = "import os, radixflow.runtime as r; print(os.path.dirname(os.path.realpath(r.__file__)))"
    env = {**os.environ, **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    folder = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            check=True, cwd=tempfile.gettempdir()).stdout.strip()
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=folder).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="PYTHONPATH whose radixflow is the other checkout")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    sides = {"this": None, "baseline": args.baseline}
    result = {"command": "python benchmarks/prefix_ttft_ab.py " + " ".join(argv or sys.argv[1:]),
              "commits": {side: commit_of(path) for side, path in sides.items()}, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for side, path in sides.items():
                out = Path(tmp, f"{side}-{rnd}.json")
                env = {**os.environ, **({"PYTHONPATH": path} if path else {})}
                done = subprocess.run([sys.executable, str(HERE / "engine_overhead.py"), "--only", "prefix_ttft",
                                       "--repeats", "1", "--out", str(out)], env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"{side} round {rnd + 1} failed:\n{done.stderr[-3000:]}")
                run = json.loads(out.read_text())["prefix_ttft"]
                result["runs"].append({"round": rnd + 1, "side": side, "prefix_ttft": run})
                print(f"round {rnd + 1} {side}: turn {run['cached_prefix_ms']:.1f} ms, no prefix "
                      f"{run['no_prefix_ms']:.2f} ms, ratio {run['ratio']:.1f}", flush=True)
    for side in sides:
        runs = [r["prefix_ttft"] for r in result["runs"] if r["side"] == side]
        result[side] = {key: statistics.median(r[key] for r in runs) for key in ("cached_prefix_ms", "no_prefix_ms",
                                                                                  "ratio")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"medians: this {result['this']}, baseline {result['baseline']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
