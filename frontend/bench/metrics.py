"""Per-request measurements and their summary: throughput, TTFT / ITL / E2E percentiles, goodput,
prefix hit rate."""
from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass
class RequestResult:
    """One finished request as the client saw it (seconds, client clock)."""

    prompt_len: int
    output_ids: list[int]
    ttft_s: float
    e2e_s: float
    itl_s: list[float]          # gaps between consecutive output chunks after the first
    cached_tokens: int | None   # what the server reported (None: it did not say)
    error: str | None = None

    @property
    def output_len(self) -> int:
        return len(self.output_ids)


@dataclasses.dataclass(frozen=True)
class SLOs:
    """Goodput thresholds in ms; None is not checked. ITL is a request's mean inter-token gap."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, r: RequestResult) -> bool:
        checks = ((self.ttft_ms, r.ttft_s), (self.itl_ms, _mean(r.itl_s) if r.itl_s else 0.0), (self.e2e_ms, r.e2e_s))
        return r.error is None and all(limit is None or value * 1000.0 <= limit for limit, value in checks)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan for no values."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _dist_ms(xs: list[float]) -> dict[str, float]:
    ms = [x * 1000.0 for x in xs if not math.isnan(x)]  # nan: not observable (no streaming)
    return {"mean": _mean(ms), "p50": percentile(ms, 50), "p99": percentile(ms, 99)}


def summarize(results: list[RequestResult], duration_s: float, slos: SLOs = SLOs(),
              unique_tokens: int | None = None) -> dict[str, Any]:
    """The report of one run. Hit rate = cached prompt tokens / prompt tokens over the requests
    whose server reported cached_tokens. `unique_tokens`: distinct prefixes over every request's
    prompt + output; an ideal cache (never evicts, shares every common prefix, keeps outputs)
    prefills `unique_tokens - output tokens` of the prompt tokens: `ideal_hit_rate` is the rest."""
    ok = [r for r in results if r.error is None]
    prompt = sum(r.prompt_len for r in ok)
    output = sum(r.output_len for r in ok)
    reported = [r for r in ok if r.cached_tokens is not None]
    reported_prompt = sum(r.prompt_len for r in reported)
    out: dict[str, Any] = {
        "num_requests": len(results), "num_failed": len(results) - len(ok), "duration_s": duration_s,
        "prompt_tokens": prompt, "output_tokens": output,
        "request_throughput": len(ok) / duration_s if duration_s > 0 else math.nan,
        "output_throughput": output / duration_s if duration_s > 0 else math.nan,
        "total_token_throughput": (prompt + output) / duration_s if duration_s > 0 else math.nan,
        "ttft_ms": _dist_ms([r.ttft_s for r in ok]),
        "itl_ms": _dist_ms([gap for r in ok for gap in r.itl_s]),
        "e2e_ms": _dist_ms([r.e2e_s for r in ok]),
        "goodput": sum(slos.met_by(r) for r in results) / duration_s if duration_s > 0 else math.nan,
        "slos_ms": dataclasses.asdict(slos),
        "prefix_hit_rate": (sum(r.cached_tokens for r in reported) / reported_prompt) if reported_prompt else None,
    }
    if unique_tokens is not None and prompt:
        out["ideal_hit_rate"] = 1.0 - max(0, unique_tokens - output) / prompt
    if ok and not reported:
        out["prefix_hit_rate_note"] = "the server reported no cached_tokens"
    return out
