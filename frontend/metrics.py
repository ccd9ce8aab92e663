"""Every Prometheus metric the server exports, in one table; fed by finish listeners and engine stats.

Histograms observe each finished request's timeline (engine.add_finish_listener, engine
thread). Gauges and counters are read from `engine.stats()` at scrape time by a custom
collector, so counters mirror the engine's own monotone numbers. One registry per app.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radixflow.runtime.stats import EngineStats, RequestTiming

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _one(value: float | None) -> list[float]:
    return [] if value is None else [value]


def _prefill(t: RequestTiming) -> float | None:
    return None if t.scheduled is None or t.first_token is None else t.first_token - t.scheduled


# name, help, buckets, values observed per finished request
HISTOGRAMS: tuple[tuple[str, str, tuple[float, ...], Callable[[RequestTiming], list[float]]], ...] = (
    ("radixflow_queue_time_seconds", "Arrival to first scheduled.", _LATENCY_BUCKETS, lambda t: _one(t.queue_s)),
    ("radixflow_prefill_time_seconds", "First scheduled to first token.", _LATENCY_BUCKETS,
     lambda t: _one(_prefill(t))),
    ("radixflow_time_to_first_token_seconds", "Arrival to first token.", _LATENCY_BUCKETS,
     lambda t: _one(t.ttft_s)),
    ("radixflow_inter_token_latency_seconds", "Time between consecutive output tokens.", _ITL_BUCKETS,
     lambda t: t.inter_token_s()),
    ("radixflow_e2e_request_latency_seconds", "Arrival to finish.", _LATENCY_BUCKETS, lambda t: [t.e2e_s]),
)

# name, help, value read from the engine's stats at scrape time
GAUGES: tuple[tuple[str, str, Callable[[EngineStats], float]], ...] = (
    ("radixflow_kv_cache_usage_ratio", "KV slots held by running requests and locked prefixes / all slots.",
     lambda s: s.kv_usage),
    ("radixflow_num_requests_waiting", "Requests queued for admission.", lambda s: s.num_waiting),
    ("radixflow_num_requests_running", "Requests in the running batch.", lambda s: s.num_running),
)
COUNTERS: tuple[tuple[str, str, Callable[[EngineStats], float]], ...] = (
    ("radixflow_preemptions_total", "Running requests retracted for lack of KV slots.",
     lambda s: s.num_preemptions),
    ("radixflow_prefix_cache_hit_tokens_total", "Prompt tokens found in the prefix cache.",
     lambda s: s.prefix_hit_tokens),
    ("radixflow_prefix_cache_query_tokens_total", "Prompt tokens looked up in the prefix cache.",
     lambda s: s.prefix_query_tokens),
    ("radixflow_prompt_tokens_total", "Prompt tokens of finished requests.", lambda s: s.prompt_tokens),
    ("radixflow_prefill_tokens_computed_total", "Tokens run through prefill (cache misses and recompute).",
     lambda s: s.prefill_tokens_computed),
    ("radixflow_generation_tokens_total", "Output tokens generated.", lambda s: s.generated_tokens),
)
FINISHED = ("radixflow_requests_finished_total", "Finished requests by finish reason (stop, length, abort).")


class _StatsCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:  # engine not started yet
            return
        for name, doc, read in GAUGES:
            yield GaugeMetricFamily(name, doc, value=read(stats))
        for name, doc, read in COUNTERS:
            yield CounterMetricFamily(name, doc, value=read(stats))
        finished = CounterMetricFamily(FINISHED[0], FINISHED[1], labels=["reason"])
        for reason, count in sorted(stats.finish_counts.items()):
            finished.add_metric([reason], count)
        yield finished


class Metrics:
    """One app's metrics. `bind(engine)` once the engine exists; `render()` for /metrics."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._engine: Any = None
        self._histograms = [(Histogram(name, doc, buckets=buckets, registry=self.registry), values)
                            for name, doc, buckets, values in HISTOGRAMS]
        self.registry.register(_StatsCollector(lambda: None if self._engine is None else self._engine.stats()))

    def bind(self, engine: Any) -> None:
        self._engine = engine
        engine.add_finish_listener(self.observe)

    def observe(self, timing: RequestTiming) -> None:
        """Runs on the engine thread after each finished request (prometheus_client is thread-safe)."""
        for histogram, values in self._histograms:
            for value in values(timing):
                histogram.observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
