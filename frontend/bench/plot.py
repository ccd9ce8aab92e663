"""PNGs from `radixflow bench` result files: throughput per workload and system, latency
percentiles against request rate, prefix hit rate per workload."""
from __future__ import annotations

import math
import os
from typing import Any

from radixflow.frontend.bench.report import read


def _runs(paths: list[str]) -> list[dict[str, Any]]:
    """All runs of all files; a system name repeated across files keeps the file's label."""
    runs = []
    for path in paths:
        runs.extend(read(path)["runs"])
    return runs


def _grouped_bars(ax: Any, runs: list[dict[str, Any]], value: Any, ylabel: str) -> None:
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    systems = list(dict.fromkeys(r["system"] for r in runs))
    width = 0.8 / max(1, len(systems))
    for k, system in enumerate(systems):
        by_wl = {r["workload"]: value(r) for r in runs if r["system"] == system}
        xs = [i + k * width for i, w in enumerate(workloads) if w in by_wl]
        ys = [by_wl[w] for w in workloads if w in by_wl]
        ax.bar(xs, ys, width, label=system)
    ax.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(workloads))], workloads, rotation=20)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)


def _fastest_rate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (workload, system), the run at the highest request rate (inf when present)."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for r in runs:
        key = (r["workload"], r["system"])
        if key not in best or r["request_rate"] > best[key]["request_rate"]:
            best[key] = r
    return list(best.values())


def plot_throughput(runs: list[dict[str, Any]], path: str) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    _grouped_bars(ax, _fastest_rate(runs), lambda r: r["summary"]["total_token_throughput"], "tokens/s (prompt + output)")
    ax.set_title("Throughput per workload")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# (system, baseline) pairs the speedup plot draws where both ran the same workload and rate
SPEEDUP_PAIRS = (("radixflow", "radix-off"), ("radixflow", "transformers"), ("radixflow-serve", "vllm-cpu"))


def speedups(runs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """{(system, baseline): {workload: system tok/s ÷ baseline tok/s}} at the fastest rate."""
    tput = {(r["workload"], r["system"]): r["summary"]["total_token_throughput"] for r in _fastest_rate(runs)}
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    out: dict[tuple[str, str], dict[str, float]] = {}
    for system, base in SPEEDUP_PAIRS:
        ratios = {w: tput[(w, system)] / tput[(w, base)] for w in workloads
                  if (w, system) in tput and (w, base) in tput and tput[(w, base)] > 0}
        if ratios:
            out[(system, base)] = ratios
    return out


def plot_speedup(runs: list[dict[str, Any]], path: str) -> str | None:
    """Bars of throughput ÷ each baseline's per workload (log scale, 1x marked); None if no pair ran."""
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    pairs = speedups(runs)
    if not pairs:
        return None
    workloads = list(dict.fromkeys(w for ratios in pairs.values() for w in ratios))
    width = 0.8 / len(pairs)
    fig, ax = plt.subplots(figsize=(9, 4))
    for k, ((system, base), ratios) in enumerate(pairs.items()):
        xs = [i + k * width for i, w in enumerate(workloads) if w in ratios]
        ys = [ratios[w] for w in workloads if w in ratios]
        bars = ax.bar(xs, ys, width, label=f"{system} ÷ {base}")
        ax.bar_label(bars, [f"{y:.2f}x" for y in ys], fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}x"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks([i + width * (len(pairs) - 1) / 2 for i in range(len(workloads))], workloads, rotation=20)
    ax.set_ylabel("throughput ratio (log scale)")
    ax.set_title("Throughput vs each baseline per workload")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_hit_rate(runs: list[dict[str, Any]], path: str) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    _grouped_bars(ax, _fastest_rate(runs), lambda r: 100 * (r["summary"].get("prefix_hit_rate") or 0.0),
                  "prefix hit rate (% of prompt tokens)")
    ax.set_ylim(0, 100)
    ax.set_title("Prefix cache hit rate per workload (0 where not reported)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_latency(runs: list[dict[str, Any]], workload: str, path: str) -> str:
    """TTFT and E2E p50/p99 against finite request rates, one line per system and percentile."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("ttft_ms", "e2e_ms")):
        for system in dict.fromkeys(r["system"] for r in runs):
            rs = sorted((r for r in runs if r["system"] == system and r["workload"] == workload
                         and not math.isinf(r["request_rate"])), key=lambda r: r["request_rate"])
            if not rs:  # this system did not run the sweep
                continue
            for q, style in (("p50", "-o"), ("p99", "--x")):
                ax.plot([r["request_rate"] for r in rs], [r["summary"][metric][q] for r in rs], style,
                        label=f"{system} {q}")
        ax.set_xlabel("request rate (root requests/s)")
        ax.set_ylabel(metric.replace("_ms", " (ms)").upper())
        ax.legend(fontsize=7)
    fig.suptitle(f"Latency vs request rate: {workload}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_files(paths: list[str], out_dir: str) -> list[str]:
    """Writes throughput.png, hit_rate.png, speedup.png (where a SPEEDUP_PAIRS pair ran) and latency_<workload>.png (workloads measured at
    two or more finite rates); returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    runs = _runs(paths)
    if not runs:
        raise ValueError("the result files hold no runs")
    os.makedirs(out_dir, exist_ok=True)
    written = [plot_throughput(runs, os.path.join(out_dir, "throughput.png")),
               plot_hit_rate(runs, os.path.join(out_dir, "hit_rate.png"))]
    speedup = plot_speedup(runs, os.path.join(out_dir, "speedup.png"))
    written += [speedup] if speedup else []
    for workload in dict.fromkeys(r["workload"] for r in runs):
        rates = {r["request_rate"] for r in runs if r["workload"] == workload and not math.isinf(r["request_rate"])}
        if len(rates) >= 2:
            written.append(plot_latency(runs, workload, os.path.join(out_dir, f"latency_{workload}.png")))
    return written
