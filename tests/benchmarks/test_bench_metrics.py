"""Bench summary math on synthetic timings: percentiles, throughput, goodput, hit rates."""
from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from radixflow.frontend.bench.metrics import SLOs, RequestResult, percentile, summarize
from radixflow.frontend.bench.runner import arrival_times


def test_percentile_matches_numpy_linear():
    xs = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for q in (0, 10, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert math.isnan(percentile([], 50))


def _r(ttft, e2e, itl, prompt=100, out=4, cached=50, error=None):
    return RequestResult(prompt, list(range(out)), ttft, e2e, itl, cached, error)


def test_summary_throughput_latency_goodput_and_hit_rate():
    results = [_r(0.1, 1.0, [0.02, 0.04]), _r(0.3, 2.0, [0.2, 0.2]), _r(0.05, 0.5, [0.01], cached=None),
               _r(0.0, 0.0, [], error="HTTP 500")]
    s = summarize(results, duration_s=2.0, slos=SLOs(ttft_ms=200, itl_ms=50), unique_tokens=180)
    assert s["num_requests"] == 4 and s["num_failed"] == 1
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["output_throughput"] == pytest.approx(6.0) and s["total_token_throughput"] == pytest.approx(156.0)
    assert s["ttft_ms"]["p50"] == pytest.approx(100.0) and s["ttft_ms"]["mean"] == pytest.approx(150.0)
    assert s["itl_ms"]["p50"] == pytest.approx(40.0)  # gaps 10, 20, 40, 200, 200 ms
    assert s["goodput"] == pytest.approx(1.0)  # the 1st and 3rd meet both SLOs; the 2nd has ITL 200 ms
    assert s["prefix_hit_rate"] == pytest.approx(100 / 200)  # only requests that reported cached_tokens
    assert s["ideal_hit_rate"] == pytest.approx(1 - (180 - 12) / 300)


def test_no_slo_means_every_successful_request_counts():
    s = summarize([_r(9.0, 9.0, [1.0]), _r(0.1, 0.1, [], error="x")], duration_s=1.0)
    assert s["goodput"] == pytest.approx(1.0)


def test_poisson_arrivals_have_the_asked_rate():
    times = arrival_times(4000, request_rate=20.0, seed=3)
    gaps = np.diff(times)
    assert np.mean(gaps) == pytest.approx(1 / 20.0, rel=0.1)
    assert np.std(gaps) == pytest.approx(1 / 20.0, rel=0.15)  # exponential: std == mean
    assert arrival_times(3, math.inf, 0) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        arrival_times(3, 0.0, 0)


def test_max_concurrency_caps_requests_in_flight():
    from radixflow.frontend.bench.runner import run_workload
    from radixflow.frontend.bench.workloads import make_workload

    class Slow:
        live = peak = 0

        async def send(self, ids, n, schema):
            Slow.live += 1
            Slow.peak = max(Slow.peak, Slow.live)
            await asyncio.sleep(0.01)
            Slow.live -= 1
            return _r(0.01, 0.01, [], prompt=len(ids), out=n)

    wl = make_workload("random", num_prompts=12, vocab_size=3072)
    results, _, _ = asyncio.run(run_workload(Slow(), wl, max_concurrency=3))
    assert Slow.peak == 3 and len(results) == 12
