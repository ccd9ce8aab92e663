"""Goodput: which finished requests (and sessions) met every configured latency SLO."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from radixflow.runtime.stats import RequestTiming

# Sessions remembered for session goodput; the least recently seen are forgotten first.
MAX_SESSIONS = 100_000
SLO_NAMES = ("ttft", "itl", "e2e")


@dataclass(frozen=True)
class SLOs:
    """Latency targets in seconds; None = not checked. `itl` is a request's mean time per
    output token after the first (TPOT), as serving benchmarks define it for goodput."""

    ttft: float | None = None
    itl: float | None = None
    e2e: float | None = None

    @classmethod
    def from_ms(cls, ttft_ms: float | None, itl_ms: float | None, e2e_ms: float | None) -> SLOs:
        def s(ms: float | None) -> float | None:
            return None if ms is None else ms / 1000.0
        return cls(s(ttft_ms), s(itl_ms), s(e2e_ms))

    def violations(self, t: RequestTiming) -> tuple[str, ...]:
        """Names of the SLOs `t` missed. A request with no token misses ttft and itl."""
        out = []
        if self.ttft is not None and (t.ttft_s is None or t.ttft_s > self.ttft):
            out.append("ttft")
        itl = t.mean_inter_token_s
        if self.itl is not None and t.completion_tokens > 1 and (itl is None or itl > self.itl):
            out.append("itl")
        if self.e2e is not None and t.e2e_s > self.e2e:
            out.append("e2e")
        return tuple(out)


@dataclass
class Goodput:
    """Counts, fed one finished request at a time (engine thread). A request is good when it
    ended normally (stop or length) within every set SLO; a session is good while all of its
    requests were."""

    slos: SLOs
    good_requests: int = 0
    violations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SLO_NAMES, 0))
    _sessions: OrderedDict[str, bool] = field(default_factory=OrderedDict)
    num_sessions: int = 0
    num_bad_sessions: int = 0

    def observe(self, t: RequestTiming) -> tuple[bool, tuple[str, ...]]:
        """Count `t`; returns whether it was good and the SLOs it missed."""
        missed = self.slos.violations(t)
        for name in missed:
            self.violations[name] += 1
        good = not missed and t.finish_type in ("stop", "length")
        self.good_requests += good
        if t.session_id is not None:
            self._observe_session(t.session_id, good)
        return good, missed

    def _observe_session(self, sid: str, good: bool) -> None:
        was_good = self._sessions.pop(sid, None)
        if was_good is None:
            self.num_sessions += 1
            was_good = True
        if was_good and not good:
            self.num_bad_sessions += 1
        self._sessions[sid] = was_good and good
        if len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
