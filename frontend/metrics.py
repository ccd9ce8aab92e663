"""Every Prometheus metric the server exports, declared once in one table; fed by finish listeners
and engine stats.

Per-request histograms observe each finished request's timeline (engine.add_finish_listener,
engine thread). Gauges, counters and the cache's own histograms are read from `engine.stats()`
at scrape time by a custom collector, so counters mirror the engine's monotone numbers and never
reset while serving. Every series carries `model_name`. One registry per app.

When the engine serves LoRA adapters, the per-request series (`per_lora`: the request histograms,
finished requests, goodput, SLO violations, prefill misses) also carry `lora_name`: the adapter
name, or "" for base-model requests, which Prometheus stores as no label, so `{lora_name=""}`
selects base-model traffic on any engine. Without LoRA there is no `lora_name` label at all.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from radixflow.runtime.stats import AdapterRequestStats, EngineStats, RequestTiming

# Latency buckets resolve a GPU decode step (sub-millisecond) and a loaded CPU server (minutes).
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 120.0, 300.0)
_ITL_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)
_POSITION_BUCKETS = (1, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)


def _one(value: float | None) -> list[float]:
    return [] if value is None else [value]


def _prefill(t: RequestTiming) -> float | None:
    return None if t.scheduled is None or t.first_token is None else t.first_token - t.scheduled


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric. `kind`: counter | gauge | histogram. Exactly one source:
    `observe` (values per finished request, histogram; labelled by adapter when the engine has
    LoRA), `read` (from EngineStats: a number, or with `label` a dict label value -> number; with
    `per_lora` and LoRA, read from each adapter's AdapterRequestStats instead), or
    `read_histogram` (an engine Histogram)."""

    name: str
    kind: str
    unit: str
    help: str
    observe: Callable[[RequestTiming], list[float]] | None = None
    buckets: tuple[float, ...] = ()
    read: Callable[[EngineStats | AdapterRequestStats], Any] | None = None
    label: str | None = None
    read_histogram: Callable[[EngineStats], Any] | None = None
    per_lora: bool = False


METRICS: tuple[MetricSpec, ...] = (
    # the four timers
    MetricSpec("radixflow_queue_time_seconds", "histogram", "seconds", "Arrival to first scheduled.",
               observe=lambda t: _one(t.queue_s), buckets=_LATENCY_BUCKETS),
    MetricSpec("radixflow_prefill_time_seconds", "histogram", "seconds", "First scheduled to first token.",
               observe=lambda t: _one(_prefill(t)), buckets=_LATENCY_BUCKETS),
    MetricSpec("radixflow_time_to_first_token_seconds", "histogram", "seconds", "Arrival to first token.",
               observe=lambda t: _one(t.ttft_s), buckets=_LATENCY_BUCKETS),
    MetricSpec("radixflow_inter_token_latency_seconds", "histogram", "seconds",
               "Time between consecutive output tokens.", observe=lambda t: t.inter_token_s(), buckets=_ITL_BUCKETS),
    MetricSpec("radixflow_e2e_request_latency_seconds", "histogram", "seconds", "Arrival to finish.",
               observe=lambda t: [t.e2e_s], buckets=_LATENCY_BUCKETS),
    # the four gauges (preemptions and hit rate as counters: rate() them)
    MetricSpec("radixflow_kv_cache_usage_ratio", "gauge", "ratio",
               "KV slots held by running requests and locked prefixes / all slots.", read=lambda s: s.kv_usage),
    MetricSpec("radixflow_num_requests_waiting", "gauge", "requests", "Requests queued for admission.",
               read=lambda s: s.num_waiting),
    MetricSpec("radixflow_num_requests_running", "gauge", "requests", "Requests in the running batch.",
               read=lambda s: s.num_running),
    MetricSpec("radixflow_preemptions_total", "counter", "requests",
               "Running requests retracted for lack of KV slots.", read=lambda s: s.num_preemptions),
    MetricSpec("radixflow_admission_paused", "gauge", "boolean",
               "1 while nothing waiting is admitted: /pause_generation, or a weight update waiting for the "
               "running requests to end.", read=lambda s: float(s.admission_paused)),
    MetricSpec("radixflow_weight_updates_total", "counter", "updates",
               "Weight updates applied (/update_weights_from_disk, update_weights_from_tensor).",
               read=lambda s: s.weight_updates),
    MetricSpec("radixflow_prefix_cache_hit_tokens_total", "counter", "tokens",
               "Prompt tokens found in the prefix cache (once per admitted request).",
               read=lambda s: s.prefix_hit_tokens),
    MetricSpec("radixflow_prefix_cache_query_tokens_total", "counter", "tokens",
               "Prompt tokens looked up in the prefix cache (once per admitted request).",
               read=lambda s: s.prefix_query_tokens),
    # misses explained, eviction and residency
    MetricSpec("radixflow_prefix_cache_miss_tokens_total", "counter", "tokens",
               "Prefill tokens computed, by why they were not cached: cold, evicted, namespace, divergent, "
               "chunk (after a chunked prefill's first chunk), logits (kept out of the match for their logits).",
               read=lambda s: s.miss_tokens, label="reason", per_lora=True),
    MetricSpec("radixflow_prefix_cache_divergence_position_tokens", "histogram", "tokens",
               "Matched length at which a prompt left a cached sequence (divergent misses).",
               observe=lambda t: _one(t.divergent_at), buckets=_POSITION_BUCKETS),
    MetricSpec("radixflow_kv_evicted_tokens_total", "counter", "tokens", "Cached tokens evicted (LRU).",
               read=lambda s: s.evicted_tokens),
    MetricSpec("radixflow_kv_cached_token_lifetime_seconds", "histogram", "seconds",
               "How long evicted tokens had been cached (counts are tokens).", read_histogram=lambda s: s.kv_lifetime),
    MetricSpec("radixflow_prefix_cache_reuse_gap_seconds", "histogram", "seconds",
               "Time between counted hits of the same cached prefix.", read_histogram=lambda s: s.reuse_gap),
    # goodput
    MetricSpec("radixflow_goodput_requests_total", "counter", "requests",
               "Requests that ended normally within every configured SLO.", read=lambda s: s.good_requests,
               per_lora=True),
    MetricSpec("radixflow_slo_violations_total", "counter", "requests", "Requests that missed each configured SLO.",
               read=lambda s: s.slo_violations, label="slo", per_lora=True),
    MetricSpec("radixflow_sessions_total", "counter", "sessions", "Distinct sessions (session_id / user) seen.",
               read=lambda s: s.num_sessions),
    MetricSpec("radixflow_sessions_slo_violated_total", "counter", "sessions",
               "Sessions with at least one request that was not good.", read=lambda s: s.num_bad_sessions),
    # volume and health
    MetricSpec("radixflow_requests_finished_total", "counter", "requests",
               "Finished requests by finish reason (stop, length, abort, error).",
               read=lambda s: s.finish_counts, label="reason", per_lora=True),
    MetricSpec("radixflow_prompt_tokens_total", "counter", "tokens", "Prompt tokens of finished requests.",
               read=lambda s: s.prompt_tokens),
    MetricSpec("radixflow_prefill_tokens_computed_total", "counter", "tokens",
               "Tokens run through prefill (the sum of the miss reasons).", read=lambda s: s.prefill_tokens_computed),
    MetricSpec("radixflow_generation_tokens_total", "counter", "tokens", "Output tokens generated.",
               read=lambda s: s.generated_tokens),
    MetricSpec("radixflow_spec_decode_draft_tokens_total", "counter", "tokens",
               "Speculative decoding: draft tokens verified (--speculative-algorithm).",
               read=lambda s: s.spec_draft_tokens),
    MetricSpec("radixflow_spec_decode_accepted_tokens_total", "counter", "tokens",
               "Speculative decoding: draft tokens accepted (acceptance rate: this over the drafts).",
               read=lambda s: s.spec_accepted_tokens),
    MetricSpec("radixflow_failed_steps_total", "counter", "steps", "Forward passes that raised.",
               read=lambda s: s.failed_steps),
    # LoRA adapters
    MetricSpec("radixflow_lora_adapters_resident", "gauge", "adapters", "Adapters in device slots.",
               read=lambda s: s.lora_resident),
    MetricSpec("radixflow_lora_adapters_loaded", "gauge", "adapters", "Adapter names loaded.",
               read=lambda s: s.lora_loaded),
    MetricSpec("radixflow_lora_requests_total", "counter", "requests", "Requests submitted, by adapter name.",
               read=lambda s: s.lora_requests, label="lora_name"),
    MetricSpec("radixflow_lora_load_time_seconds", "histogram", "seconds",
               "Time to read one adapter from disk (load, or reload after the host LRU dropped it).",
               read_histogram=lambda s: s.lora_load_time),
    MetricSpec("radixflow_invariant_violations_total", "counter", "steps",
               "Steps after which an engine invariant check failed (--check-invariants).",
               read=lambda s: s.invariant_violations),
)
METRIC_NAMES = frozenset(m.name for m in METRICS)
_FAMILIES = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily}


class _StatsCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats | None], model: Callable[[], str]) -> None:
        self._stats, self._model = stats, model

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:  # engine not started yet
            return
        model = self._model()
        for spec in METRICS:
            if spec.read is not None:
                yield self._family(spec, stats, model)
            elif spec.read_histogram is not None:
                h = spec.read_histogram(stats)
                family = HistogramMetricFamily(spec.name, spec.help, labels=["model_name"])
                buckets = [("+Inf" if b == float("inf") else repr(b), c) for b, c in h.cumulative()]
                family.add_metric([model], buckets, h.sum)
                yield family

    @staticmethod
    def _family(spec: MetricSpec, stats: EngineStats, model: str) -> Metric:
        by_lora = stats.by_lora if spec.per_lora else None
        labels = ["model_name"] + ([spec.label] if spec.label else []) + ([] if by_lora is None else ["lora_name"])
        family = _FAMILIES[spec.kind](spec.name, spec.help, labels=labels)
        sources = [((), stats)] if by_lora is None else [((name,), s) for name, s in by_lora.items()]
        for lora, source in sources:
            value = spec.read(source)
            if spec.label:
                for key, v in sorted(value.items()):
                    family.add_metric([model, key, *lora], v)
            else:
                family.add_metric([model, *lora], value)
        return family


class Metrics:
    """One app's metrics. `bind(engine, model_name)` once the engine exists; `render()` for /metrics."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._engine: Any = None
        self.model_name = ""
        self._histograms: list[tuple[Histogram, Callable[[RequestTiming], list[float]]]] = []
        self.registry.register(_StatsCollector(lambda: None if self._engine is None else self._engine.stats(),
                                               lambda: self.model_name))

    def bind(self, engine: Any, model_name: str) -> None:
        """Once: the request histograms are created here, labelled lora_name when the engine has LoRA."""
        self._engine, self.model_name = engine, model_name
        labels = ["model_name"] + ([] if engine.stats().by_lora is None else ["lora_name"])
        self._histograms = [(Histogram(m.name, m.help, labels, buckets=m.buckets, registry=self.registry), m.observe)
                            for m in METRICS if m.observe is not None]
        engine.add_finish_listener(self.observe)

    def observe(self, timing: RequestTiming) -> None:
        """Runs on the engine thread after each finished request (prometheus_client is thread-safe)."""
        labels = (self.model_name,) if timing.lora_name is None else (self.model_name, timing.lora_name)
        for histogram, values in self._histograms:
            child = histogram.labels(*labels)
            for value in values(timing):
                child.observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
