"""Per-request counters split by adapter name, for the series labelled `lora_name` (engine thread)."""
from __future__ import annotations

from radixflow.runtime.slo import SLO_NAMES
from radixflow.runtime.stats import AdapterRequestStats, RequestTiming

# The name base-model requests count under: to Prometheus an empty label value is no label, so
# `{lora_name=""}` selects base-model traffic on engines with and without adapters alike.
BASE = ""


class AdapterRequestCounts:
    """Finished requests (by finish reason, goodput, SLO missed) and prefill tokens (by miss
    reason) per adapter name; `snapshot()` gives EngineStats.by_lora."""

    def __init__(self) -> None:
        self._finish: dict[str, dict[str, int]] = {BASE: {}}
        self._good: dict[str, int] = {}
        self._violations: dict[str, dict[str, int]] = {}
        self._misses: dict[str, dict[str, int]] = {}

    def finished(self, t: RequestTiming, good: bool, missed: tuple[str, ...]) -> None:
        name = t.lora_name or BASE
        _add(self._finish.setdefault(name, {}), t.finish_type, 1)
        self._good[name] = self._good.get(name, 0) + good
        violations = self._violations.setdefault(name, dict.fromkeys(SLO_NAMES, 0))
        for slo in missed:
            violations[slo] += 1

    def prefill(self, name: str | None, reason: str, num_tokens: int) -> None:
        _add(self._misses.setdefault(name or BASE, {}), reason, num_tokens)

    def snapshot(self) -> dict[str, AdapterRequestStats]:
        return {name: AdapterRequestStats(dict(self._finish.get(name, {})), self._good.get(name, 0),
                                          dict(self._violations.get(name, dict.fromkeys(SLO_NAMES, 0))),
                                          dict(self._misses.get(name, {})))
                for name in sorted(self._finish.keys() | self._misses.keys())}


def _add(counts: dict[str, int], key: str, n: int) -> None:
    counts[key] = counts.get(key, 0) + n
