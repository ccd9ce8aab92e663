"""Draw the eight numbers of a real run: serve the demo model, drive three phases of traffic
(shared-prefix chat, an overload that preempts, then a variable moved to the top of the prompt),
scrape /metrics every second and plot the panels with matplotlib.

    python examples/monitoring/plot_run.py --out examples/monitoring/eight-numbers.png
"""
from __future__ import annotations

import argparse
import random
import socket
import threading
import time

import httpx
import uvicorn

from radixflow.frontend.server import create_app
from radixflow.frontend.top import TIMERS, Scrape, quantile, _delta_buckets
from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model

SYSTEM = "You are a support assistant. Answer briefly and politely. Policies: " + "refunds within 30 days; " * 12


def _serve(engine: Engine) -> tuple[uvicorn.Server, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(engine, "demo"), log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}"


def _traffic(url: str, phase: dict, stop: threading.Event, rng: random.Random) -> None:
    with httpx.Client(base_url=url, timeout=120) as c:
        while not stop.is_set() and time.monotonic() < phase["until"]:
            q = f"question {rng.randrange(10**6)} about order {rng.randrange(1000)}"
            text = (q + " " + SYSTEM) if phase["name"] == "variable first" else (SYSTEM + q)
            c.post("/generate", json={"text": text, "session_id": f"s{rng.randrange(20)}",
                                      "sampling_params": {"max_new_tokens": phase["tokens"], "ignore_eos": True}})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="eight-numbers.png")
    ap.add_argument("--phase-s", type=float, default=15.0)
    args = ap.parse_args()
    engine = Engine(demo_model("tiny"), kv_cache_tokens=900, max_num_seqs=32, slo_ttft_ms=250, slo_itl_ms=50)
    server, url = _serve(engine)
    start = time.monotonic()
    phases, t = [], start
    for name, clients, tokens in (("shared prefix", 4, 16), ("overload", 24, 120), ("variable first", 4, 16)):
        t += args.phase_s
        phases.append({"name": name, "clients": clients, "tokens": tokens, "until": t})
    stop, rng, scrapes = threading.Event(), random.Random(0), []
    with httpx.Client(base_url=url, timeout=30) as c:
        for phase in phases:
            workers = [threading.Thread(target=_traffic, args=(url, phase, stop, random.Random(rng.random())))
                       for _ in range(phase["clients"])]
            for w in workers:
                w.start()
            while time.monotonic() < phase["until"]:
                scrapes.append(Scrape.parse(c.get("/metrics").text, time.monotonic() - start))
                time.sleep(1.0)
            for w in workers:
                w.join()
    stop.set()
    server.should_exit = True
    engine.shutdown()
    _plot(scrapes, [(p["name"], p["until"] - start) for p in phases], args.out)
    print(args.out)


def _series(scrapes: list[Scrape]) -> dict[str, list]:
    out: dict[str, list] = {"t": [], "kv": [], "waiting": [], "preempt": [], "hit": []}
    out.update({label: [] for label, _ in TIMERS})
    for prev, cur in zip(scrapes, scrapes[1:]):
        out["t"].append(cur.at)
        out["kv"].append(cur.get("radixflow_kv_cache_usage_ratio"))
        out["waiting"].append(cur.get("radixflow_num_requests_waiting"))
        dt = cur.at - prev.at
        out["preempt"].append((cur.get("radixflow_preemptions_total") - prev.get("radixflow_preemptions_total")) / dt)
        dq = cur.get("radixflow_prefix_cache_query_tokens_total") - prev.get("radixflow_prefix_cache_query_tokens_total")
        dh = cur.get("radixflow_prefix_cache_hit_tokens_total") - prev.get("radixflow_prefix_cache_hit_tokens_total")
        out["hit"].append(dh / dq if dq > 0 else float("nan"))
        for label, name in TIMERS:
            b = _delta_buckets(cur, prev, name)
            out[label].append([(quantile(q, b) or float("nan")) * 1000 for q in (0.5, 0.95, 0.99)])
    return out


def _plot(scrapes: list[Scrape], phases: list[tuple[str, float]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = _series(scrapes)
    fig, axes = plt.subplots(2, 4, figsize=(18, 7), sharex=True)
    titles = {"queue": "queue time (ms)", "prefill": "prefill time (ms)", "ttft": "time to first token (ms)",
              "itl": "inter-token latency (ms)"}
    for ax, (label, _) in zip(axes[0], TIMERS):
        for i, q in enumerate(("p50", "p95", "p99")):
            ax.plot(s["t"], [v[i] for v in s[label]], label=q)
        ax.set_title(titles[label])
        ax.legend(fontsize=7)
    for ax, key, title in zip(axes[1], ("kv", "waiting", "preempt", "hit"),
                              ("KV cache usage", "requests waiting", "preemptions / s", "prefix hit rate")):
        ax.plot(s["t"], s[key], color="tab:purple")
        ax.set_title(title)
    for ax in axes.flat:
        start = 0.0
        for name, end in phases:
            ax.axvline(end, color="grey", lw=0.5)
            if ax in axes[0]:
                ax.text((start + end) / 2, ax.get_ylim()[1] * 0.92, name, ha="center", fontsize=7, color="grey")
            start = end
    for ax in axes[1]:
        ax.set_xlabel("seconds")
    fig.suptitle("radixflow: the eight numbers over a real run (demo model, CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
