"""`radixflow bench` (run workloads against systems) and `radixflow bench plot` (PNGs from results)."""
from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from radixflow.frontend.bench.workloads import GENERATORS


def _csv(kind: type) -> Any:
    return lambda text: [kind(x) for x in text.split(",") if x]


def add_parser(sub: Any) -> None:
    bench = sub.add_parser("bench", help="serving benchmark: workloads against radixflow and baselines")
    bench.add_argument("--workload", type=_csv(str), default=["fewshot"],
                       help=f"comma list of: {', '.join(GENERATORS)}")
    bench.add_argument("--systems", type=_csv(str), default=None,
                       help="comma list of radixflow, radix-off, transformers, endpoint "
                            "(default: radixflow offline, endpoint with --base-url)")
    bench.add_argument("--backend", choices=("offline", "native", "openai"), default="offline",
                       help="how 'endpoint' is reached; offline = in-process only")
    bench.add_argument("--base-url", default=None, help="the endpoint, e.g. http://127.0.0.1:30000")
    bench.add_argument("--served-model-name", default="default", help="model name sent to an OpenAI endpoint")
    bench.add_argument("--api-key", default=None)
    bench.add_argument("--model", default=None, help="model for in-process systems and the tokenizer "
                                                     "(default: SmolLM2-135M-Instruct)")
    bench.add_argument("--demo-size", default=None, help="use the random-weight demo model of this size instead")
    bench.add_argument("--kv-cache-tokens", type=int, default=None)
    bench.add_argument("--num-prompts", type=int, default=32)
    bench.add_argument("--scale", type=float, default=1.0, help="multiplies every workload's token lengths")
    bench.add_argument("--think-time-s", type=float, default=0.0, help="agent: pause between turns")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--request-rate", type=_csv(float), default=[math.inf],
                       help="root requests per second (Poisson); comma list sweeps; inf = all at once")
    bench.add_argument("--max-concurrency", type=int, default=None)
    bench.add_argument("--num-warmup", type=int, default=2)
    bench.add_argument("--rounds", type=int, default=1, help="alternate systems this many rounds, keep each best")
    bench.add_argument("--hf-batch-size", type=int, default=8, help="transformers baseline batch size")
    bench.add_argument("--baseline", default="radix-off", help="system the 'vs base' column divides by")
    for name in ("ttft", "itl", "e2e"):
        bench.add_argument(f"--slo-{name}-ms", type=float, default=None, help=f"goodput SLO on {name.upper()}")
    bench.add_argument("--out", default=None, help="write the result JSON here")
    bench.add_argument("--no-progress", action="store_true")
    plots = bench.add_subparsers(dest="bench_command")
    plot = plots.add_parser("plot", help="PNGs from result JSON files")
    plot.add_argument("results", nargs="+", help="result JSON files of `radixflow bench --out`")
    plot.add_argument("--out-dir", required=True)


def _model_and_vocab(ns: argparse.Namespace) -> tuple[str | None, Any]:
    from radixflow.runtime.model.model_path import resolve_model_path
    from radixflow.runtime.text.tokenizer import Tokenizer

    model = ns.model
    if ns.demo_size:
        from radixflow.runtime.model.demo import demo_model

        model = demo_model(ns.demo_size)
    return model, Tokenizer.from_pretrained(resolve_model_path(model))


def run_bench(ns: argparse.Namespace) -> list[dict[str, Any]]:
    from radixflow.frontend.bench.metrics import SLOs
    from radixflow.frontend.bench.report import add_speedups, table, write
    from radixflow.frontend.bench.systems import SYSTEMS, RunOptions, Systems
    from radixflow.frontend.bench.workloads import make_workload

    systems = ns.systems or (["endpoint"] if ns.base_url else ["radixflow"])
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown system(s) {unknown}; choose from {', '.join(SYSTEMS)}")
    if "endpoint" in systems and (ns.backend == "offline" or not ns.base_url):
        raise ValueError("system 'endpoint' needs --backend native|openai and --base-url")
    model, tokenizer = _model_and_vocab(ns)
    config = {} if ns.kv_cache_tokens is None else {"kv_cache_tokens": ns.kv_cache_tokens}
    endpoint = (ns.backend, ns.base_url, ns.served_model_name, ns.api_key) if ns.base_url else None
    owner = Systems(model, config, tokenizer.vocab_size, endpoint, tokenizer)
    slos = SLOs(ns.slo_ttft_ms, ns.slo_itl_ms, ns.slo_e2e_ms)
    best: dict[tuple, dict[str, Any]] = {}
    try:
        for name in ns.workload:
            wl = make_workload(name, num_prompts=ns.num_prompts, vocab_size=tokenizer.vocab_size, seed=ns.seed,
                               scale=ns.scale, think_time_s=ns.think_time_s)
            for rate in ns.request_rate:
                opts = RunOptions(rate, ns.max_concurrency, ns.seed, ns.num_warmup, slos, not ns.no_progress,
                                  ns.hf_batch_size)
                for _ in range(ns.rounds):  # alternating, so load on a shared machine hits every system
                    for system in systems:
                        summary = owner.run(system, wl, opts)
                        key = (name, rate, system)
                        if key not in best or summary["total_token_throughput"] > best[key]["summary"]["total_token_throughput"]:
                            best[key] = {"workload": name, "system": system, "request_rate": rate, "summary": summary}
    finally:
        owner.close()
    runs = list(best.values())
    add_speedups(runs, ns.baseline)
    print(table(runs))
    if ns.out:
        write(ns.out, runs, {k: v for k, v in vars(ns).items() if k != "func"})
        print(f"wrote {ns.out}")
    return runs


def main(ns: argparse.Namespace) -> int:
    try:
        if ns.bench_command == "plot":
            from radixflow.frontend.bench.plot import plot_files

            for path in plot_files(ns.results, ns.out_dir):
                print(path)
        else:
            run_bench(ns)
    except ValueError as exc:
        print(f"radixflow bench: {exc}", file=sys.stderr)
        return 2
    return 0
