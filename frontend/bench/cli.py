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
                       help="comma list of radixflow, radix-off, transformers, endpoint and --endpoint names "
                            "(default: the --endpoint names, else endpoint with --base-url, else radixflow offline)")
    bench.add_argument("--backend", choices=("offline", "native", "openai"), default="offline",
                       help="how 'endpoint' is reached; offline = in-process only")
    bench.add_argument("--base-url", default=None, help="the endpoint, e.g. http://127.0.0.1:30000")
    bench.add_argument("--endpoint", action="append", default=[], metavar="NAME=BACKEND@URL",
                       help="a named external server (repeatable), e.g. vllm-cpu=openai@http://127.0.0.1:8001; "
                            "rounds alternate over all systems")
    bench.add_argument("--served-model-name", default="default", help="model name sent to an OpenAI endpoint")
    bench.add_argument("--api-key", default=None)
    bench.add_argument("--model", default=None, help="model for in-process systems and the tokenizer "
                                                     "(default: SmolLM2-135M-Instruct)")
    bench.add_argument("--demo-size", default=None, help="use the random-weight demo model of this size instead")
    bench.add_argument("--kv-cache-tokens", type=int, default=None)
    bench.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                       help="in-process systems (radixflow, radix-off, transformers); auto = the engine's default "
                            "(bfloat16 on CPUs with native bf16, else float32), and the same for transformers")
    bench.add_argument("--num-prompts", type=int, default=32)
    bench.add_argument("--scale", type=float, default=1.0, help="multiplies every workload's token lengths")
    bench.add_argument("--think-time-s", type=float, default=0.0, help="agent: pause between turns")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--request-rate", type=_csv(float), default=[math.inf],
                       help="root requests per second (Poisson); comma list sweeps; inf = all at once")
    bench.add_argument("--max-concurrency", type=int, default=None)
    bench.add_argument("--num-warmup", type=int, default=2)
    bench.add_argument("--rounds", type=int, default=1, help="alternate systems this many rounds, keep each best")
    bench.add_argument("--hf-model", default=None,
                       help="model directory for the transformers baseline (default: --model); give a dense "
                            "Hugging Face directory: transformers keeps a GGUF's weights packed and casts per matmul")
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
    prog = plots.add_parser("programs", help="agent and tree as language programs: prefill tokens ÷ unique tokens")
    prog.add_argument("--modes", type=_csv(str), default=["in-process", "http"], help="in-process, http")
    prog.add_argument("--sessions", type=int, default=4, help="agent programs (sessions) run at once")
    prog.add_argument("--turns", type=int, default=8, help="generation calls per agent session")
    prog.add_argument("--system-words", type=int, default=1024, help="shared agent system prompt, in words")
    prog.add_argument("--trees", type=int, default=2, help="tree programs run at once")
    prog.add_argument("--problem-words", type=int, default=384, help="tree problem length, in words")
    tab = plots.add_parser("table", help="one Markdown table from result JSON files")
    tab.add_argument("results", nargs="+", help="result JSON files of `radixflow bench --out`")
    tab.add_argument("--baseline", default="radix-off", help="system whose seconds the last column divides")


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
    from radixflow.frontend.bench.systems import SYSTEMS, Endpoint, RunOptions, Systems, parse_endpoint
    from radixflow.frontend.bench.workloads import make_workload

    endpoints = dict(parse_endpoint(e, ns.served_model_name, ns.api_key) for e in ns.endpoint)
    if ns.base_url and ns.backend != "offline":
        endpoints["endpoint"] = Endpoint(ns.backend, ns.base_url, ns.served_model_name, ns.api_key)
    systems = ns.systems or list(endpoints) or ["radixflow"]
    unknown = [s for s in systems if s not in SYSTEMS and s not in endpoints]
    if unknown:
        raise ValueError(f"unknown system(s) {unknown}; choose from {', '.join([*SYSTEMS, *endpoints])}")
    if "endpoint" in systems and "endpoint" not in endpoints:
        raise ValueError("system 'endpoint' needs --backend native|openai and --base-url")
    model, tokenizer = _model_and_vocab(ns)
    config: dict[str, Any] = {} if ns.kv_cache_tokens is None else {"kv_cache_tokens": ns.kv_cache_tokens}
    if ns.dtype != "auto":
        config["dtype"] = ns.dtype
    owner = Systems(model, config, tokenizer.vocab_size, endpoints, tokenizer, hf_model=ns.hf_model)
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
        in_process = [s for s in systems if s not in endpoints]
        write(ns.out, runs, {**{k: v for k, v in vars(ns).items() if k != "func"},
                             "in_process_dtype": owner.in_process_dtype() if in_process else None})
        print(f"wrote {ns.out}")
    return runs


def _programs(ns: argparse.Namespace) -> None:
    from radixflow.frontend.bench.programs import markdown, run_programs
    from radixflow.frontend.bench.report import environment

    config: dict[str, Any] = {} if ns.kv_cache_tokens is None else {"kv_cache_tokens": ns.kv_cache_tokens}
    if ns.dtype != "auto":
        config["dtype"] = ns.dtype
    model = ns.model
    if ns.demo_size:
        from radixflow.runtime.model.demo import demo_model

        model = demo_model(ns.demo_size)
    rows = run_programs(model, config, ns.modes, ns.sessions, ns.turns, ns.system_words, ns.trees,
                        ns.problem_words, ns.seed)
    print(markdown(rows))
    if ns.out:
        import json
        import os

        os.makedirs(os.path.dirname(os.path.abspath(ns.out)), exist_ok=True)
        with open(ns.out, "w", encoding="utf-8") as f:
            json.dump({"environment": environment(), "config": {k: v for k, v in vars(ns).items() if k != "func"},
                       "programs": rows}, f, indent=1)
        print(f"wrote {ns.out}")


def main(ns: argparse.Namespace) -> int:
    try:
        if ns.bench_command == "plot":
            from radixflow.frontend.bench.plot import plot_files

            for path in plot_files(ns.results, ns.out_dir):
                print(path)
        elif ns.bench_command == "programs":
            _programs(ns)
        elif ns.bench_command == "table":
            from radixflow.frontend.bench.report import markdown, read

            print(markdown([r for path in ns.results for r in read(path)["runs"]], ns.baseline))
        else:
            run_bench(ns)
    except ValueError as exc:
        print(f"radixflow bench: {exc}", file=sys.stderr)
        return 2
    return 0
