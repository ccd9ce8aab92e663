"""How long `radixflow serve` takes to answer /health, and what its HTTP server process holds.

    python benchmarks/start_time.py --out benchmarks/results/start_time_cpu.json
    python benchmarks/start_time.py --baseline /tmp/before/path --rounds 4 --out /tmp/st.json   # + an older checkout
    python benchmarks/start_time.py --smoke --out /tmp/st.json

`radixflow serve` on the random-weight tiny model (`--load-format dummy`, one torch thread), with
the engine core in its own process (the default) and on a thread (`--engine-core thread`): wall
seconds from launch to the first 200 from /health, and the HTTP server process's resident memory
and whether it maps libtorch (/proc). `--baseline PATH`: the same for a server started with
PYTHONPATH=PATH (a directory holding a `radixflow` package, e.g. a symlink to an older checkout);
rounds alternate the order of the (code, core) pairs. Figures are medians over rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_decode import TINY, write_model_dir  # noqa: E402
from http_load import server  # noqa: E402


def _process_facts(pid: int) -> dict:
    """The process's resident MiB and whether it maps libtorch (None where /proc is missing)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return {"rss_mib": None, "maps_libtorch": None}
    kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return {"rss_mib": round(kib / 1024, 1), "maps_libtorch": "libtorch" in maps}


def start_once(model_dir: Path, core: str, env: dict | None) -> dict:
    import httpx

    start = time.perf_counter()
    with server(model_dir, core, 4, env=env) as url:
        seconds = time.perf_counter() - start
        pid = httpx.get(f"{url}/get_server_info").json()["api_server_pid"]
        return {"start_s": seconds, **_process_facts(pid)}


def measure(rounds: int, baseline: str | None) -> dict:
    codes = {"this": None} if baseline is None else {"this": None, "baseline": {"PYTHONPATH": baseline}}
    pairs = [(code, core) for code in codes for core in ("process", "thread")]
    runs: dict[str, list[dict]] = {f"{code}/{core}": [] for code, core in pairs}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir({**TINY, "max_position_embeddings": 4096}, Path(tmp) / "model")
        for r in range(rounds):
            for code, core in (pairs if r % 2 == 0 else pairs[::-1]):
                runs[f"{code}/{core}"].append(start_once(model_dir, core, codes[code]))
    out: dict = {"rounds": rounds, "runs": runs}
    for key, rs in runs.items():
        rss = [x["rss_mib"] for x in rs if x["rss_mib"] is not None]
        out[key] = {"start_s": round(statistics.median(x["start_s"] for x in rs), 2),
                    "api_rss_mib": statistics.median(rss) if rss else None,
                    "api_maps_libtorch": rs[-1]["maps_libtorch"]}
    if baseline is not None:
        for core in ("process", "thread"):
            out[f"start_ratio_{core}"] = round(out[f"this/{core}"]["start_s"] / out[f"baseline/{core}"]["start_s"], 2)
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--baseline", default=None, help="PYTHONPATH of an older checkout, measured beside this one")
    ap.add_argument("--smoke", action="store_true", help="one round")
    ns = ap.parse_args()
    if ns.smoke:
        ns.rounds = 1
    import radixflow.runtime

    code_dir = os.path.dirname(os.path.realpath(radixflow.runtime.__file__))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=code_dir).stdout.strip()
    result = {"commit": commit, "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "baseline": ns.baseline, "result": measure(ns.rounds, ns.baseline)}
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
