"""The monitoring kit: dashboard and alert rules use only exported metrics, promtool validates
the rules, `radixflow top` renders a live server, new series carry the right values."""
from __future__ import annotations

import io
import json
import pathlib
import re
import shutil
import subprocess

import pytest

from radixflow.frontend.metrics import METRIC_NAMES, METRICS
from radixflow.frontend.top import Scrape, quantile, render, run, view

MONITORING = pathlib.Path(__file__).resolve().parents[2] / "examples" / "monitoring"
_SUFFIXES = ("_bucket", "_sum", "_count")


def _names_used(text: str) -> set[str]:
    names = set(re.findall(r"\bradixflow_[a-z0-9_]+", text))
    return {next((n[: -len(s)] for s in _SUFFIXES if n.endswith(s) and n[: -len(s)] in METRIC_NAMES), n)
            for n in names}


def test_metric_table_is_hygienic():
    assert len(METRIC_NAMES) == len(METRICS)
    for m in METRICS:
        assert m.name.startswith("radixflow_") and ":" not in m.name
        assert m.help and m.unit
        if m.kind == "counter":
            assert m.name.endswith("_total")
        assert (m.observe is not None) + (m.read is not None) + (m.read_histogram is not None) == 1, m.name
        if m.unit == "seconds":
            assert m.name.endswith("_seconds"), m.name


def test_dashboard_and_alerts_use_exported_metrics_only():
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(dash["panels"]) >= 8
    used = _names_used("\n".join(exprs)) | _names_used((MONITORING / "alerts.yml").read_text())
    assert used and used <= METRIC_NAMES, used - METRIC_NAMES
    for must in ("radixflow_time_to_first_token_seconds", "radixflow_inter_token_latency_seconds",
                 "radixflow_queue_time_seconds", "radixflow_prefill_time_seconds", "radixflow_kv_cache_usage_ratio",
                 "radixflow_num_requests_waiting", "radixflow_preemptions_total",
                 "radixflow_prefix_cache_hit_tokens_total", "radixflow_goodput_requests_total",
                 "radixflow_prefix_cache_miss_tokens_total", "radixflow_kv_evicted_tokens_total"):
        assert must in used, must


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_checks_and_fires_every_alert():
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        out = subprocess.run(["promtool", *args], cwd=MONITORING, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
    tested = set(re.findall(r"alertname: (\w+)", (MONITORING / "alerts_test.yml").read_text()))
    defined = set(re.findall(r"- alert: (\w+)", (MONITORING / "alerts.yml").read_text()))
    assert defined and defined == tested


def test_quantile_matches_prometheus_interpolation():
    buckets = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (float("inf"), 40.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (20 - 10) / 20)
    assert quantile(0.25, buckets) == pytest.approx(0.1)
    assert quantile(0.99, [(1.0, 0.0), (float("inf"), 0.0)]) is None


def test_new_series_after_traffic(client, engine):
    shared = "Monitoring: a shared prefix long enough to hit " * 4
    for i in range(3):
        r = client.post("/generate", json={"text": shared + ["alpha beta", "gamma delta", "epsilon"][i] + " end",
                                           "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code == 200
    scrape = Scrape.parse(client.get("/metrics").text, 0.0)
    s = engine.stats()
    misses = scrape.by_label["radixflow_prefix_cache_miss_tokens_total"]
    assert sum(misses.values()) == scrape.get("radixflow_prefill_tokens_computed_total") == s.prefill_tokens_computed
    assert misses.get("divergent", 0) > 0
    assert scrape.get("radixflow_kv_evicted_tokens_total") == s.evicted_tokens
    assert scrape.buckets["radixflow_time_to_first_token_seconds"][-1][1] == \
        scrape.get("radixflow_time_to_first_token_seconds_count")
    assert "radixflow_kv_cached_token_lifetime_seconds" in scrape.buckets


def test_top_renders_a_live_server(server, client):
    client.post("/generate", json={"text": "top frame", "sampling_params": {"max_new_tokens": 3}})
    out = io.StringIO()
    run(server.url, 0.1, once=True, out=out)
    frame = out.getvalue()
    for label in ("queue", "prefill", "ttft", "itl", "KV usage", "waiting", "preemptions", "prefix hit rate",
                  "goodput", "miss reason"):
        assert label in frame, label
    ttft_row = next(line for line in frame.splitlines() if line.startswith("ttft"))
    assert re.search(r"\d+\.\d", ttft_row), ttft_row


def test_top_shows_interval_rates():
    text_a = 'radixflow_generation_tokens_total{model_name="m"} 10\n'
    text_b = 'radixflow_generation_tokens_total{model_name="m"} 30\n'
    a, b = Scrape.parse("# TYPE radixflow_generation_tokens_total counter\n" + text_a, 0.0), \
        Scrape.parse("# TYPE radixflow_generation_tokens_total counter\n" + text_b, 2.0)
    v = view(b, a)
    assert v["tokens_per_s"] == pytest.approx(10.0)
    assert "10.0 tok/s" in render("http://x", v)


def test_top_interval_ratios_come_from_the_interval_alone():
    def scrape(hits: float, queries: float, good: float, finished: float, at: float) -> Scrape:
        return Scrape.parse(
            f'radixflow_prefix_cache_hit_tokens_total{{model_name="m"}} {hits}\n'
            f'radixflow_prefix_cache_query_tokens_total{{model_name="m"}} {queries}\n'
            f'radixflow_goodput_requests_total{{model_name="m"}} {good}\n'
            f'radixflow_requests_finished_total{{model_name="m",reason="stop"}} {finished}\n', at)

    # the hit rate falls to zero and no request is good in the last interval: top must say so
    v = view(scrape(90, 100, 10, 10, 2.0), scrape(90, 100, 10, 10, 0.0))
    assert v["hit_rate"] == pytest.approx(0.9) and v["goodput"] == pytest.approx(1.0)  # idle: since start
    v = view(scrape(90, 200, 10, 20, 2.0), scrape(90, 100, 10, 10, 0.0))
    assert v["hit_rate"] == 0.0 and v["goodput"] == 0.0
    v = view(scrape(135, 200, 15, 20, 2.0), scrape(90, 100, 10, 10, 0.0))
    assert v["hit_rate"] == pytest.approx(0.45) and v["goodput"] == pytest.approx(0.5)


def test_top_command_prints_a_frame_of_a_live_server(server, client, capsys):
    from radixflow.frontend.cli import main

    client.post("/generate", json={"text": "top command", "sampling_params": {"max_new_tokens": 2}})
    assert main(["top", "--url", server.url, "--once"]) == 0
    frame = capsys.readouterr().out
    assert frame.startswith(f"radixflow top — {server.url}") and "prefix hit rate" in frame
    assert main(["top", "--url", "http://127.0.0.1:9", "--once"]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_sessions_counted_over_every_route(client, engine):
    import msgspec

    import radixflow.lang as rf

    @rf.function
    def two_gens(s):
        s += rf.user("a program run is one session")
        s += rf.assistant(rf.gen("a", max_tokens=2)) + rf.assistant(rf.gen("b", max_tokens=2))

    before = engine.stats()
    for text in ("first turn", "second turn"):
        r = client.post("/generate", json={"text": text, "session_id": "native-session",
                                           "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code == 200
    for route, body in (("/v1/completions", {"prompt": "hi"}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        r = client.post(route, json={"model": "tiny", "max_tokens": 2, "user": "openai-user", **body})
        assert r.status_code == 200
    r = client.post("/v1/programs", json={"program": msgspec.to_builtins(rf.trace(two_gens)), "arguments": {}})
    assert r.status_code == 200
    after = engine.stats()
    assert after.num_finished - before.num_finished == 6
    # no SLOs are set on this server: every session stays good
    assert (after.num_sessions - before.num_sessions, after.num_bad_sessions - before.num_bad_sessions) == (3, 0)
    scrape = Scrape.parse(client.get("/metrics").text, 0.0)
    assert scrape.get("radixflow_sessions_total") == after.num_sessions


def test_counters_never_go_back_while_serving(client):
    def counters() -> dict[str, float]:
        scrape = Scrape.parse(client.get("/metrics").text, 0.0)
        out = {name: scrape.get(name) for name in METRIC_NAMES if name.endswith("_total")}
        out |= {f"{name}:{k}": v for name, d in scrape.by_label.items() if name.endswith("_total")
                for k, v in d.items()}
        out |= {f"{name}_count": scrape.get(f"{name}_count") for name in scrape.buckets}
        return out

    shared = "counters survive a cache flush " * 3
    client.post("/generate", json={"text": shared + "one", "sampling_params": {"max_new_tokens": 2}})
    before = counters()
    assert client.post("/flush_cache").status_code == 200
    client.post("/generate", json={"text": shared + "two", "sampling_params": {"max_new_tokens": 2}})
    after = counters()
    assert before and all(after.get(k, 0.0) >= v for k, v in before.items()), \
        {k: (v, after.get(k)) for k, v in before.items() if after.get(k, 0.0) < v}
    assert after["radixflow_kv_evicted_tokens_total"] > before["radixflow_kv_evicted_tokens_total"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed (Debian package prometheus)")
def test_real_prometheus_scrapes_a_live_server(server, client, tmp_path):
    import socket
    import time

    import httpx

    for i in range(3):
        client.post("/generate", json={"text": f"scraped {i}", "sampling_params": {"max_new_tokens": 2}})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target = server.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(
        f"global: {{scrape_interval: 1s}}\nrule_files: [{MONITORING / 'alerts.yml'}]\n"
        f"scrape_configs:\n  - job_name: radixflow\n    static_configs: [{{targets: ['{target}']}}]\n")
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        want = float(client.get("/metrics").text.split("radixflow_generation_tokens_total{")[1].split("} ")[1].split()[0])
        deadline, got = time.monotonic() + 60, None
        while time.monotonic() < deadline and got != want:
            time.sleep(1)
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query",
                              params={"query": "sum(radixflow_generation_tokens_total)"}, timeout=5)
                result = r.json()["data"]["result"]
                got = float(result[0]["value"][1]) if result else None
            except (httpx.HTTPError, KeyError, ValueError):
                continue
        assert got == want
        rules = httpx.get(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5).json()["data"]["groups"]
        assert {r["name"] for g in rules for r in g["rules"]} >= {"RadixflowPreemptions", "RadixflowGoodputLow"}
    finally:
        proc.terminate()
        proc.wait(30)


def test_openai_usage_carries_the_miss_breakdown(client):
    body = {"model": "tiny", "prompt": "usage extension: why was this prompt computed", "max_tokens": 2}
    first = client.post("/v1/completions", json=body).json()["usage"]
    assert sum(first["prefill_miss_tokens"].values()) >= 1
    again = client.post("/v1/completions", json=body).json()["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] == again["prompt_tokens"] - 1
    assert again["prefill_miss_tokens"] == {"logits": 1}


def test_histogram_counts_equal_finished_requests(client, engine):
    def counts() -> tuple[float, float]:
        scrape = Scrape.parse(client.get("/metrics").text, 0.0)
        return (sum(scrape.by_label["radixflow_requests_finished_total"].values()),
                scrape.get("radixflow_e2e_request_latency_seconds_count"))

    finished_before, observed_before = counts()
    for i in range(3):
        client.post("/generate", json={"text": f"count me {i}", "sampling_params": {"max_new_tokens": 2}})
    finished, observed = counts()
    assert finished == engine.stats().num_finished
    assert finished - finished_before == observed - observed_before == 3
