"""`radixflow top`: a refreshing terminal view of a server's eight numbers, goodput and misses."""
from __future__ import annotations

import math
import sys
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TextIO

from prometheus_client.parser import text_string_to_metric_families

TIMERS = (("queue", "radixflow_queue_time_seconds"), ("prefill", "radixflow_prefill_time_seconds"),
          ("ttft", "radixflow_time_to_first_token_seconds"), ("itl", "radixflow_inter_token_latency_seconds"))
CLEAR = "\x1b[H\x1b[2J"


@dataclass
class Scrape:
    """One /metrics read: sample values by name; model_name and lora_name summed over, one other
    label kept (`by_label`)."""

    at: float
    values: dict[str, float] = field(default_factory=dict)
    by_label: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    buckets: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, at: float) -> Scrape:
        out = cls(at)
        buckets: dict[str, dict[float, float]] = defaultdict(dict)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                extra = {k: v for k, v in s.labels.items() if k not in ("model_name", "lora_name", "le")}
                if s.name.endswith("_bucket"):
                    le = buckets[s.name[:-7]]
                    le[float(s.labels["le"])] = le.get(float(s.labels["le"]), 0.0) + s.value
                elif extra:
                    (label,) = extra.values()
                    out.by_label[s.name][label] = out.by_label[s.name].get(label, 0.0) + s.value
                else:
                    out.values[s.name] = out.values.get(s.name, 0.0) + s.value
        out.buckets = {name: sorted(counts.items()) for name, counts in buckets.items()}
        return out

    def get(self, name: str) -> float:
        return self.values.get(name, 0.0)


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus-style quantile of cumulative buckets [(le, count)], linear within a bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, prev_le, prev_count = q * buckets[-1][1], 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            span = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / span if span else 1.0)
        prev_le, prev_count = le, count
    return prev_le


def _delta_buckets(cur: Scrape, prev: Scrape | None, name: str) -> list[tuple[float, float]]:
    now = cur.buckets.get(name, [])
    if prev is None or name not in prev.buckets:
        return now
    before = dict(prev.buckets[name])
    diff = [(le, c - before.get(le, 0.0)) for le, c in now]
    return diff if diff and diff[-1][1] > 0 else now


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def view(cur: Scrape, prev: Scrape | None) -> dict[str, object]:
    """The numbers shown: over the last interval when there was traffic, else since start."""
    def change(name: str) -> float:
        return cur.get(name) - (prev.get(name) if prev else 0.0)

    def share(num: str, den_now: float, den_before: float) -> float | None:
        # NOTE: both over the same span: 0 new hits over 100 new queries is 0%, not the total.
        if den_now > den_before:
            return change(num) / (den_now - den_before)
        return _ratio(cur.get(num), den_now)

    dt = (cur.at - prev.at) if prev else 0.0
    before = prev or Scrape(0.0)
    finished = cur.by_label.get("radixflow_requests_finished_total", {})
    finished_before = before.by_label.get("radixflow_requests_finished_total", {})
    queries = "radixflow_prefix_cache_query_tokens_total"
    misses = cur.by_label.get("radixflow_prefix_cache_miss_tokens_total", {})
    timers = {label: [quantile(q, _delta_buckets(cur, prev, name)) for q in (0.5, 0.95, 0.99)]
              for label, name in TIMERS}
    return {
        "timers": timers,
        "kv_usage": cur.get("radixflow_kv_cache_usage_ratio"),
        "waiting": cur.get("radixflow_num_requests_waiting"),
        "running": cur.get("radixflow_num_requests_running"),
        "preemptions": cur.get("radixflow_preemptions_total"),
        "preemptions_per_s": change("radixflow_preemptions_total") / dt if dt else None,
        "hit_rate": share("radixflow_prefix_cache_hit_tokens_total", cur.get(queries), before.get(queries)),
        "goodput": share("radixflow_goodput_requests_total", sum(finished.values()), sum(finished_before.values())),
        "tokens_per_s": change("radixflow_generation_tokens_total") / dt if dt else None,
        "misses": dict(sorted(misses.items(), key=lambda kv: -kv[1])),
        "finished": dict(finished),
    }


def _ms(v: float | None) -> str:
    return "     -" if v is None else f"{v * 1000:6.1f}"


def _pct(v: float | None) -> str:
    return "  -" if v is None else f"{v * 100:5.1f}%"


def render(url: str, v: dict) -> str:
    lines = [f"radixflow top — {url}   {time.strftime('%H:%M:%S')}", "",
             f"{'timer (ms)':<12}{'p50':>8}{'p95':>8}{'p99':>8}"]
    for label, (p50, p95, p99) in v["timers"].items():
        lines.append(f"{label:<12}{_ms(p50):>8}{_ms(p95):>8}{_ms(p99):>8}")
    pre_rate = v["preemptions_per_s"]
    lines += ["",
              f"KV usage   {_pct(v['kv_usage'])}    waiting {v['waiting']:.0f}    running {v['running']:.0f}",
              f"preemptions {v['preemptions']:.0f}" + ("" if pre_rate is None else f" ({pre_rate:.2f}/s)"),
              f"prefix hit rate {_pct(v['hit_rate'])}    goodput {_pct(v['goodput'])}"
              + ("" if v["tokens_per_s"] is None else f"    {v['tokens_per_s']:.1f} tok/s"),
              "", "prefill tokens by miss reason (since start):"]
    total = sum(v["misses"].values())
    for reason, n in v["misses"].items():
        lines.append(f"  {reason:<10}{n:>10.0f}  {_pct(n / total if total else None)}")
    lines.append("finished: " + ", ".join(f"{k} {n:.0f}" for k, n in sorted(v["finished"].items())))
    return "\n".join(lines)


def fetch(url: str, timeout_s: float = 5.0) -> Scrape:
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout_s) as r:  # noqa: S310 (operator's URL)
        return Scrape.parse(r.read().decode(), time.monotonic())


def run(url: str, interval_s: float, once: bool, out: TextIO | None = None) -> None:
    """Print frames to `out` (default: sys.stdout at call time) every `interval_s` (one frame
    with `once`) until interrupted."""
    out = out or sys.stdout
    prev = None
    while True:
        cur = fetch(url)
        frame = render(url, view(cur, prev))
        out.write(frame + "\n" if once else CLEAR + frame + "\n")
        out.flush()
        if once:
            return
        prev = cur
        time.sleep(interval_s)
