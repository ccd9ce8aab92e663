"""A bench run's result file (JSON) and its printed table."""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from typing import Any

COLUMNS = (  # header, how to read it from a run
    ("workload", lambda r: r["workload"]),
    ("system", lambda r: r["system"]),
    ("rate", lambda r: "inf" if math.isinf(r["request_rate"]) else f"{r['request_rate']:g}"),
    ("seconds", lambda r: f"{r['summary']['duration_s']:.2f}"),
    ("req/s", lambda r: f"{r['summary']['request_throughput']:.2f}"),
    ("tok/s", lambda r: f"{r['summary']['total_token_throughput']:.0f}"),
    ("out tok/s", lambda r: f"{r['summary']['output_throughput']:.1f}"),
    ("TTFT p50/p99 ms", lambda r: _pair(r["summary"]["ttft_ms"])),
    ("ITL p50/p99 ms", lambda r: _pair(r["summary"]["itl_ms"])),
    ("E2E p50/p99 ms", lambda r: _pair(r["summary"]["e2e_ms"])),
    ("goodput", lambda r: f"{r['summary']['goodput']:.2f}"),
    ("hit", lambda r: _pct(r["summary"].get("prefix_hit_rate"))),
    ("ideal", lambda r: _pct(r["summary"].get("ideal_hit_rate"))),
    ("vs base", lambda r: f"{r['speedup']:.2f}x" if r.get("speedup") is not None else ""),
)


def _pair(d: dict[str, float]) -> str:
    return "-" if math.isnan(d["p50"]) else f"{d['p50']:.0f}/{d['p99']:.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def add_speedups(runs: list[dict[str, Any]], baseline: str) -> None:
    """speedup = total token throughput ÷ the baseline's at the same workload and rate."""
    base = {(r["workload"], r["request_rate"]): r["summary"]["total_token_throughput"]
            for r in runs if r["system"] == baseline}
    for r in runs:
        b = base.get((r["workload"], r["request_rate"]))
        r["speedup"] = r["summary"]["total_token_throughput"] / b if b else None


def table(runs: list[dict[str, Any]]) -> str:
    rows = [[h for h, _ in COLUMNS]] + [[get(r) for _, get in COLUMNS] for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def markdown(runs: list[dict[str, Any]], baseline: str) -> str:
    """A Markdown table of runs (as README tables): seconds, throughput, hit rate and, per workload
    and rate, `baseline` seconds ÷ this system's seconds (> 1: faster than the baseline)."""
    base = {(r["workload"], r["request_rate"]): r["summary"]["duration_s"] for r in runs if r["system"] == baseline}
    head = "| workload | system | seconds | tok/s | out tok/s | TTFT p50/p99 ms | hit | ideal hit | " \
           f"{baseline} s ÷ s |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        s, b = r["summary"], base.get((r["workload"], r["request_rate"]))
        ratio = f"**{b / s['duration_s']:.2f}**" if b and r["system"] != baseline else ("1" if b else "-")
        rate = "" if math.isinf(r["request_rate"]) else f" @ {r['request_rate']:g}/s"
        lines.append(f"| {r['workload']}{rate} | {r['system']} | {s['duration_s']:.2f} | {s['total_token_throughput']:.0f} "
                     f"| {s['output_throughput']:.1f} | {_pair(s['ttft_ms'])} | {_pct(s.get('prefix_hit_rate'))} "
                     f"| {_pct(s.get('ideal_hit_rate'))} | {ratio} |")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    return {"argv": sys.argv, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": platform.python_version(), "machine": platform.machine(),
            "cpus_visible": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "loadavg_1_5_15": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def write(path: str, runs: list[dict[str, Any]], config: dict[str, Any]) -> None:
    """JSON: {"environment", "config", "runs": [{workload, system, request_rate, summary, speedup}]}.
    Infinite rates are written as the string "inf" (JSON has no infinity)."""
    def clean(r: dict[str, Any]) -> dict[str, Any]:
        return {**r, "request_rate": "inf" if math.isinf(r["request_rate"]) else r["request_rate"]}

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"environment": environment(), "config": config, "runs": [clean(r) for r in runs]}, f, indent=1)


def read(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    for r in data["runs"]:
        r["request_rate"] = float(r["request_rate"])
    return data
