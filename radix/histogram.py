"""A plain weighted histogram with fixed bucket bounds (exported by the frontend, no Prometheus here)."""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# Seconds: from a GPU step (sub-millisecond) to an idle day.
SECONDS_BOUNDS = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)


@dataclass
class Histogram:
    """Counts of observations at or below each bound (non-cumulative per bucket; the last
    bucket is +Inf), their weighted sum and total weight. `weight` lets one observation stand
    for many tokens."""

    bounds: tuple[float, ...] = SECONDS_BOUNDS
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, weight: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += weight
        self.sum += value * weight
        self.count += weight

    def cumulative(self) -> list[tuple[float, int]]:
        """[(upper bound, count at or below it)], ending with (inf, total)."""
        out, running = [], 0
        for bound, c in zip((*self.bounds, float("inf")), self.counts):
            running += c
            out.append((bound, running))
        return out

    def snapshot(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.sum, self.count)
