"""Plain stats the engine emits: per-request timings and engine gauges/counters (no Prometheus here)."""
from __future__ import annotations

from dataclasses import dataclass, field

from radixflow.radix.histogram import Histogram


@dataclass(frozen=True)
class RequestTiming:
    """One finished request's timeline (monotonic seconds) and sizes."""

    rid: str
    arrival: float
    scheduled: float | None
    first_token: float | None
    finished: float
    token_times: tuple[float, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_type: str
    miss_tokens: tuple[tuple[str, int], ...] = ()   # prefill tokens computed, by reason
    divergent_at: int | None = None                  # matched length where it left a cached path
    session_id: str | None = None
    lora_name: str | None = None  # None: the engine has no LoRA; "": a base-model request

    @property
    def queue_s(self) -> float | None:
        return None if self.scheduled is None else self.scheduled - self.arrival

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e_s(self) -> float:
        return self.finished - self.arrival

    @property
    def mean_inter_token_s(self) -> float | None:
        """Mean seconds per output token after the first (TPOT); None with fewer than two."""
        t = self.token_times
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None

    def inter_token_s(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


@dataclass(frozen=True)
class AdapterRequestStats:
    """One adapter's share of the per-request counters (EngineStats.by_lora); the field names
    and meanings are EngineStats's, so one reader serves both."""

    finish_counts: dict[str, int] = field(default_factory=dict)
    good_requests: int = 0
    slo_violations: dict[str, int] = field(default_factory=dict)
    miss_tokens: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot, refreshed by the engine thread after every step."""

    num_running: int = 0
    num_waiting: int = 0
    kv_slots_used: int = 0
    kv_slots_total: int = 0
    num_preemptions: int = 0
    prefix_hit_tokens: int = 0
    prefix_query_tokens: int = 0
    prefill_tokens_computed: int = 0
    prompt_tokens: int = 0          # of finished requests
    generated_tokens: int = 0
    num_steps: int = 0
    num_mixed_steps: int = 0        # prefill steps that also decoded running requests (enable_mixed_chunk)
    spec_draft_tokens: int = 0      # speculative decoding: drafts verified
    spec_accepted_tokens: int = 0   # of them accepted (tokens beyond one per drafted row and step)
    num_finished: int = 0
    finish_counts: dict[str, int] = field(default_factory=dict)
    invariant_violations: int = 0   # with check_invariants: steps after which a check failed
    listener_errors: int = 0        # finish listeners that raised (logged, serving went on)
    failed_steps: int = 0           # forwards that raised (their requests retried or failed)
    miss_tokens: dict[str, int] = field(default_factory=dict)  # prefill tokens by miss reason
    evicted_tokens: int = 0
    good_requests: int = 0          # finished normally within every set SLO
    slo_violations: dict[str, int] = field(default_factory=dict)  # requests that missed each SLO
    num_sessions: int = 0
    num_bad_sessions: int = 0       # sessions with at least one request that was not good
    kv_lifetime: Histogram = field(default_factory=Histogram)  # seconds evicted tokens were cached
    reuse_gap: Histogram = field(default_factory=Histogram)    # seconds between hits of a cached prefix
    lora_resident: int = 0          # adapters in device slots
    lora_loaded: int = 0            # adapter names loaded
    lora_requests: dict[str, int] = field(default_factory=dict)  # requests submitted, by adapter name
    lora_load_time: Histogram = field(default_factory=Histogram)  # seconds per adapter read from disk
    admission_paused: bool = False  # nothing waiting is admitted: pause_generation, or an update waiting
    weight_updates: int = 0         # update_weights_from_disk / _from_tensor applied
    # With LoRA (else None): the per-request counters by adapter name, base-model requests under ""
    by_lora: dict[str, AdapterRequestStats] | None = None

    @property
    def kv_usage(self) -> float:
        return self.kv_slots_used / self.kv_slots_total if self.kv_slots_total else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0
