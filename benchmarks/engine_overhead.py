"""Engine CPU overhead (issue 15): per-step bookkeeping, admission on a long cached prefix,
memory-blocked queues, and the HTTP streaming path, with the model taken out where it can be.

    python benchmarks/engine_overhead.py --out benchmarks/results/engine_overhead_cpu.json
    python benchmarks/engine_overhead.py --smoke --out /tmp/eo.json      # small sizes, seconds
    python benchmarks/engine_overhead.py --gpu --out OUT/engine_overhead.json   # CUDA, 8B shape

A fake model runner (`fake_forward`: no forward at all, fixed logits whose argmax is one token)
times only engine work in (1) and (3). The model is a random-weight tiny Llama (the demo
tokenizer, `load_format="dummy"`, 131072 positions so a 100K-token prefix fits).

1. `decode_step`: ms per decode step at batch B, with the fake runner, through `generate`
   (callers wait on events), through `generate_stream` (an asyncio loop consumes every chunk,
   as a server with `--engine-core thread` does), and as the engine core process runs requests
   (`core_process`: token ids only, each step's outputs msgpack-encoded for the socket; the
   server process's detokenizing and chunk building run on another core). `sample_ms` is the part spent in the sampler. The machine
   these ran on is shared: each figure is the median of `repeats` runs.
2. `prefix_ttft`: wall time of `generate` for a 16-token turn after a P-token cached prefix, over
   that of a 16-token prompt with no prefix (real tiny forward; the prefix is cached with the
   fake runner first). Median of several turns. `fake_runner`: the same turns without the model
   (engine and caller work alone).
3. `blocked`: ms per decode step of 4 running requests while 128 requests of 2K tokens wait for
   memory (a 4,096-token pool), over the same without them (fake runner), from the moment the
   queue is in place.
4. `http`: 256 concurrent streaming native /generate requests to `radixflow serve` in a child
   process (benchmarks/http_load.py), tokens/s, over the same workload through `Engine.generate`
   in-process (real tiny forward, one torch thread in both): with the engine core in its own
   process (`ratio`, the default) and on a thread of the server's process (`--engine-core
   thread`); each with the httpx client and with a raw-socket client that parses only each
   response's last event (the client runs on the same two cores: httpx alone takes ~4x the
   server's CPU); and the default server over the same streams consumed in-process
   (`ratio_vs_inprocess_stream`); and, as the floor of any Python ASGI front end, the same
   streams from a bare starlette app with no engine (benchmarks/http_floor.py, every chunk at
   once: `floor_raw`). Rounds run the in-process engine and every server in turn; ratios are
   medians of per-round ratios.

`--gpu`: the same on CUDA with a Llama-3-8B-shaped model (random bf16 weights, 131072 positions)
in place of the tiny one; the fake runner's figures measure the same engine work, now beside a
GPU's sampler.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_decode import LLAMA3_8B, TINY, write_model_dir  # noqa: E402
from http_floor import bare_server  # noqa: E402
from http_load import cpu_seconds, server, stream_all_httpx, stream_all_raw  # noqa: E402

PROMPT_VOCAB = 3000
FAKE_TOKEN = 100
GREEDY = {"temperature": 0, "ignore_eos": True}
PLACEMENT = {"device": "cpu", "dtype": "float32"}  # `--gpu`: cuda, bfloat16


def fake_forward(engine, token: int = FAKE_TOKEN) -> None:
    """Replace the engine's forward by one that computes nothing: logits favour `token`."""
    vocab = engine.runner.args.vocab_size
    row = torch.zeros(vocab, device=engine.runner.device)
    row[token] = 1.0

    def forward(batch, logit_offsets):
        return row.expand(sum(len(o) for o in logit_offsets), vocab)
    engine.runner.forward = forward


def real_forward(engine) -> None:
    engine.runner.__dict__.pop("forward", None)


class SampleTimer:
    """Wraps the step's sampler to time it (subtracted to give the engine's own work)."""

    def __init__(self) -> None:
        import radixflow.runtime.core.step as step_mod
        self.mod, self.orig, self.total_s, self.cpu_s, self.calls = step_mod, step_mod.sample, 0.0, 0.0, 0

        def timed(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return self.orig(*args, **kwargs)
            finally:
                self.total_s += time.perf_counter() - t0
                self.cpu_s += time.thread_time() - c0
                self.calls += 1
        step_mod.sample = timed

    def reset(self) -> None:
        self.total_s, self.cpu_s, self.calls = 0.0, 0.0, 0

    def close(self) -> None:
        self.mod.sample = self.orig


def prompts(rng: random.Random, n: int, length: int) -> list[list[int]]:
    return [[rng.randrange(PROMPT_VOCAB) for _ in range(length)] for _ in range(n)]


def step_window(engine, rids: set[str], since: float = 0.0) -> tuple[float, int]:
    """(seconds, decode steps) while every one of `rids` was decoding (from `since` on, a
    time.monotonic() value)."""
    timings = [t for t in engine.recent_timings if t.rid in rids]
    start = max(since, max(t.token_times[0] for t in timings))
    end = min(t.token_times[-1] for t in timings)
    steps = min(sum(1 for x in t.token_times if start < x <= end) for t in timings)
    return end - start, steps


def make_engine(model_dir: Path, **kw):
    """The engine, with this process's heap frozen once it is loaded, as `radixflow serve`'s
    processes do (runtime/core_process.py::freeze_heap): otherwise a full garbage collection
    (~200 ms over the imported modules) lands in some runs and not others."""
    from radixflow.runtime import Engine
    from radixflow.runtime.core_process import freeze_heap

    engine = Engine(str(model_dir), load_format="dummy", **PLACEMENT, **kw)
    freeze_heap()
    return engine


MODES = ("generate", "generate_stream", "core_process")


class EncodingSink:
    """The engine process's side of a step's output: the StepOutput msgpack-encoded as its IO
    thread sends it (the socket itself and the server process are left out)."""

    def __init__(self, n: int) -> None:
        import msgspec

        self.encode = msgspec.msgpack.Encoder().encode
        self.left = n
        self.done = threading.Event()

    def post(self, step) -> None:
        self.encode(step)
        self.left -= sum(out.finish_reason is not None for out in step.outputs)
        if self.left == 0:
            self.done.set()


def run_tokens_only(engine, ps: list[list[int]], params: dict, rids: list[str]) -> None:
    """Requests as the engine process runs them: token ids only (no detokenizing, no stop
    strings: the server process does those), each step's outputs encoded for the socket."""
    from radixflow.runtime import SamplingParams
    from radixflow.runtime.core.request import OutputOptions

    sink = EncodingSink(len(ps))
    sp = SamplingParams.from_dict(params)
    for p, rid in zip(ps, rids):
        engine.start_stream(p, sp, OutputOptions(), rid, None, None, sink)
    sink.done.wait()


def bench_decode_step(model_dir: Path, batch: int, decode_len: int, repeats: int) -> dict:
    rng = random.Random(0)
    out: dict = {"batch": batch, "decode_len": decode_len, "repeats": repeats}
    timer = SampleTimer()
    with make_engine(model_dir, max_num_seqs=batch, kv_cache_tokens=65536) as engine:
        fake_forward(engine)
        params = {**GREEDY, "max_new_tokens": decode_len}
        engine.generate(input_ids=prompts(rng, 4, 16), sampling_params=params)  # warm-up
        for mode, rep in [(m, r) for r in range(repeats) for m in MODES]:
            rids = [f"{mode}-{rep}-{i}" for i in range(batch)]
            ps = prompts(rng, batch, 16)
            timer.reset()
            clock = time.pthread_getcpuclockid(engine.loop._thread.ident)  # the engine thread's CPU time
            cpu0, steps0 = time.clock_gettime(clock), engine.stats().num_steps
            if mode == "generate":
                engine.generate(input_ids=ps, sampling_params=params, rid=rids)
            elif mode == "core_process":
                run_tokens_only(engine, ps, params, rids)
            else:
                async def consume(p, rid):
                    async for _ in engine.generate_stream(input_ids=p, sampling_params=params, rid=rid):
                        pass

                async def run_all():
                    await asyncio.gather(*(consume(p, r) for p, r in zip(ps, rids)))
                asyncio.run(run_all())
            cpu_s, all_steps = time.clock_gettime(clock) - cpu0, engine.stats().num_steps - steps0
            wall, steps = step_window(engine, set(rids))
            sample_ms = 1e3 * timer.total_s / max(timer.calls, 1)
            run = {"ms_per_step": 1e3 * wall / steps, "sample_ms_per_step": sample_ms,
                   "engine_ms_per_step": 1e3 * wall / steps - sample_ms, "steps": steps,
                   # the engine thread's CPU time over the whole run (admission and finishes
                   # included) per step, less the sampler's: steadier than wall time on a
                   # shared machine, which the other threads and processes do not enter
                   "engine_cpu_ms_per_step": 1e3 * (cpu_s - timer.cpu_s) / all_steps}
            print(f"decode_step {mode}: {run}", flush=True)
            out.setdefault(f"{mode}_runs", []).append(run)
    for mode in MODES:  # the median run: the machine is shared
        out[mode] = _median_run(out[f"{mode}_runs"])
    timer.close()
    return out


def bench_prefix_ttft(model_dir: Path, prefix_len: int, turns: int) -> dict:
    rng = random.Random(1)
    one = {**GREEDY, "max_new_tokens": 1}
    with make_engine(model_dir, kv_cache_tokens=prefix_len + 8192, max_num_seqs=8) as engine:
        prefix = prompts(rng, 1, prefix_len)[0]
        fake_forward(engine)
        t0 = time.perf_counter()
        engine.generate(input_ids=prefix, sampling_params=one)
        warm_s = time.perf_counter() - t0
        real_forward(engine)
        engine.generate(input_ids=prompts(rng, 1, 16)[0], sampling_params=one)  # warm-up

        def median_wall(make_prompt) -> tuple[float, float, int]:
            walls, ttfts, cached = [], [], 0
            for _ in range(turns):
                p = make_prompt()
                t = time.perf_counter()
                res = engine.generate(input_ids=p, sampling_params=one)
                walls.append(time.perf_counter() - t)
                ttfts.append(res["meta_info"]["timings"]["ttft_s"])
                cached = res["meta_info"]["cached_tokens"]
            return statistics.median(walls), statistics.median(ttfts), cached

        cold = median_wall(lambda: prompts(rng, 1, 16)[0])
        hit = median_wall(lambda: prefix + prompts(rng, 1, 16)[0])
        fake_forward(engine)  # the same without the model: engine work alone
        fake_cold = median_wall(lambda: prompts(rng, 1, 16)[0])
        fake_hit = median_wall(lambda: prefix + prompts(rng, 1, 16)[0])
    out = {"prefix_len": prefix_len, "turns": turns, "cache_fill_s": warm_s,
           "no_prefix_ms": 1e3 * cold[0], "cached_prefix_ms": 1e3 * hit[0], "cached_tokens": hit[2],
           "engine_ttft_no_prefix_ms": 1e3 * cold[1], "engine_ttft_cached_prefix_ms": 1e3 * hit[1],
           "ratio": hit[0] / cold[0],
           "fake_runner": {"no_prefix_ms": 1e3 * fake_cold[0], "cached_prefix_ms": 1e3 * fake_hit[0],
                           "cached_prefix_minus_no_prefix_ms": 1e3 * (fake_hit[0] - fake_cold[0])}}
    print(f"prefix_ttft: {out}", flush=True)
    return out


def bench_blocked(model_dir: Path, num_blocked: int, blocked_len: int, repeats: int) -> dict:
    rng = random.Random(2)
    running_params = {**GREEDY, "max_new_tokens": 800}  # 4 x (200 + 800) tokens: the pool, nearly
    out: dict = {"num_blocked": num_blocked, "blocked_prompt_len": blocked_len, "repeats": repeats}
    for label, n_wait in [x for _ in range(repeats) for x in (("none", 0), ("blocked", num_blocked))]:
        with make_engine(model_dir, kv_cache_tokens=4096, max_num_seqs=256) as engine:
            fake_forward(engine)
            rids = [f"run-{i}" for i in range(4)]
            done = threading.Event()

            def run(ps=prompts(rng, 4, 200), rids=rids):
                engine.generate(input_ids=ps, sampling_params=running_params, rid=rids)
                done.set()
            threading.Thread(target=run, daemon=True).start()
            while engine.stats().num_running < 4:
                time.sleep(0.001)
            waiter = None
            if n_wait:
                blocked = prompts(rng, n_wait, blocked_len)
                waiter = threading.Thread(target=engine.generate, daemon=True, kwargs=dict(
                    input_ids=blocked, sampling_params={**GREEDY, "max_new_tokens": 1}))
                waiter.start()
                while engine.stats().num_waiting < n_wait and not done.is_set():
                    time.sleep(0.001)
            since = time.monotonic()  # from here on nothing but the steps runs (and the queue waits)
            done.wait()
            wall, steps = step_window(engine, set(rids), since)
            if steps == 0:
                raise RuntimeError("the running requests finished before the queue was in place")
            waiting_seen = engine.stats().num_waiting
            run = {"ms_per_step": 1e3 * wall / steps, "steps": steps}
            if waiter is not None:
                run["waiting_at_end"] = waiting_seen
                waiter.join()
            print(f"blocked {label}: {run}", flush=True)
            out.setdefault(f"{label}_runs", []).append(run)
    out["none"], out["blocked"] = _median_run(out["none_runs"]), _median_run(out["blocked_runs"])
    out["ratio"] = out["blocked"]["ms_per_step"] / out["none"]["ms_per_step"]
    return out


def _median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["ms_per_step"])[len(runs) // 2]


CLIENTS = {"httpx": stream_all_httpx, "raw": stream_all_raw}
SETTLE_S = 1.0  # idle time before each timed run: the last run's connections close, its requests end


async def _stream_inprocess(engine, ps: list[list[int]], params: dict, first_chunks: list[float] | None = None) -> int:
    """The HTTP workload's streams consumed in-process: one async consumer per request.
    `first_chunks`: each stream's first chunk's arrival, seconds after the start, appended."""
    t0 = time.perf_counter()

    async def one(p) -> int:
        last: dict = {}
        first = first_chunks is not None
        async for last in engine.generate_stream(input_ids=p, sampling_params=params):
            if first:  # its first chunk, however many tokens it holds (a consumer behind gets several)
                first_chunks.append(time.perf_counter() - t0)
                first = False
        return len(last["output_ids"])

    return sum(await asyncio.gather(*(one(p) for p in ps)))


def core_num_steps(url: str) -> int:
    import httpx

    return httpx.get(f"{url}/get_server_info").json()["stats"]["num_steps"]


def bench_http(model_dir: Path, num_requests: int, decode_len: int, repeats: int, stream_interval: int = 1,
               mixed_chunk: bool = False) -> dict:
    """The server with its engine core in its own process (the default) and on a thread of the
    server's process, each over in-process `Engine.generate` on the same requests (`ratio`: the
    strict comparison, no streaming in-process), and the core-process server with the raw client
    over the same streams consumed in-process (`Engine.generate_stream` from one asyncio loop:
    `ratio_vs_inprocess_stream`). Both servers and the in-process engine are up at once and
    every round runs each of them in turn, so a round's figures share the machine's state (its
    speed drifts by up to 2x over minutes); the ratios are medians of the rounds' ratios."""
    rng = random.Random(3)
    params = {**GREEDY, "max_new_tokens": decode_len}
    if stream_interval != 1:
        params["stream_interval"] = stream_interval  # the streams, over HTTP and in-process (generate ignores it)
    warm = prompts(rng, 8, 16)
    ps = prompts(rng, num_requests, 16)
    names = [f"http_core_{core}_{client}" for core in ("process", "thread") for client in CLIENTS]
    runs: dict[str, list[float]] = {name: [] for name in ["inprocess", "inprocess_stream", "floor_raw", *names]}
    with contextlib.ExitStack() as stack:
        flags = ("--enable-mixed-chunk",) if mixed_chunk else ()
        urls = {core: stack.enter_context(server(model_dir, core, num_requests, **PLACEMENT, flags=flags))
                for core in ("process", "thread")}
        floor_url, floor_pid = stack.enter_context(bare_server(0.0))
        engine = stack.enter_context(make_engine(model_dir, max_num_seqs=num_requests, kv_cache_tokens=65536,
                                                 enable_mixed_chunk=mixed_chunk))
        engine.generate(input_ids=warm, sampling_params=params)
        for url in urls.values():
            asyncio.run(stream_all_httpx(url, warm, params))
        import httpx

        info = httpx.get(f"{urls['process']}/get_server_info").json()
        pids = {"api_server": info["api_server_pid"], "core": info["engine_core_pid"]}
        # per raw-client run of the process core; `client`: this process (the raw client, the
        # in-process engine idle)
        cpu: dict[str, list[float]] = {name: [] for name in [*pids, "client"]}
        floor_cpu: list[float] = []
        inprocess_cpu: list[float] = []
        # per run: each stream's first chunk, seconds after the run began (the burst's intake)
        first_chunk: dict[str, list[list[float]]] = {"inprocess_stream": [], "http_core_process_raw": []}
        steps: dict[str, list[int]] = {"inprocess": [], "http_core_process_raw": []}  # engine steps per run
        for _ in range(repeats):
            time.sleep(SETTLE_S)
            t0, c0, s0 = time.perf_counter(), time.process_time(), engine.stats().num_steps
            res = engine.generate(input_ids=ps, sampling_params=params)
            runs["inprocess"].append(sum(len(r["output_ids"]) for r in res) / (time.perf_counter() - t0))
            inprocess_cpu.append(time.process_time() - c0)
            steps["inprocess"].append(engine.stats().num_steps - s0)
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            first = []
            tokens = asyncio.run(_stream_inprocess(engine, ps, params, first))
            runs["inprocess_stream"].append(tokens / (time.perf_counter() - t0))
            first_chunk["inprocess_stream"].append(first)
            time.sleep(SETTLE_S)
            before_floor, t0 = cpu_seconds(floor_pid), time.perf_counter()
            tokens = asyncio.run(stream_all_raw(floor_url, ps, params))
            runs["floor_raw"].append(tokens / (time.perf_counter() - t0))
            floor_cpu.append(cpu_seconds(floor_pid) - before_floor)
            for core, url in urls.items():
                for client_name, client in CLIENTS.items():
                    time.sleep(SETTLE_S)
                    light = (core, client_name) == ("process", "raw")
                    first, core_steps = [], core_num_steps(url) if light else 0
                    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                    before["client"], t0 = time.process_time(), time.perf_counter()
                    tokens = asyncio.run(client(url, ps, params, first) if light else client(url, ps, params))
                    runs[f"http_core_{core}_{client_name}"].append(tokens / (time.perf_counter() - t0))
                    assert tokens == len(ps) * params["max_new_tokens"], tokens
                    if light:
                        cpu["client"].append(time.process_time() - before["client"])
                        for name, pid in pids.items():
                            cpu[name].append(cpu_seconds(pid) - before[name])
                        first_chunk["http_core_process_raw"].append(first)
                        steps["http_core_process_raw"].append(core_num_steps(url) - core_steps)
    inproc = runs["inprocess"]
    out: dict = {"num_requests": num_requests, "decode_len": decode_len, "repeats": repeats,
                 "stream_interval": stream_interval, "enable_mixed_chunk": mixed_chunk,
                 "inprocess_tok_per_s": statistics.median(inproc),
                 "inprocess_runs": inproc}
    for name in names:
        ratios = [h / i for h, i in zip(runs[name], inproc)]
        out[name] = {"tok_per_s": statistics.median(runs[name]), "runs": runs[name],
                     "ratio": statistics.median(ratios), "round_ratios": ratios}
    out["ratio"] = out["http_core_process_raw"]["ratio"]  # `radixflow serve`'s default, a light client
    out["inprocess_stream_tok_per_s"] = statistics.median(runs["inprocess_stream"])
    out["inprocess_stream_runs"] = runs["inprocess_stream"]
    out["ratio_vs_inprocess_stream"] = statistics.median(
        [h / i for h, i in zip(runs["http_core_process_raw"], runs["inprocess_stream"])])
    raw = out["http_core_process_raw"]
    raw["cpu_s_per_run"] = {name: statistics.median(v) for name, v in cpu.items()}
    out["inprocess_cpu_s_per_run"] = statistics.median(inprocess_cpu)
    # a burst that reaches the core in groups runs more steps: a prefill step per group
    out["inprocess_steps_per_run"] = statistics.median(steps["inprocess"])
    raw["steps_per_run"] = statistics.median(steps["http_core_process_raw"])
    # The ratio the machine's cores allow at best: the three processes' CPU seconds spread evenly
    # over them, against the in-process run's wall time (per round, median).
    cores = len(os.sched_getaffinity(0))
    tokens = len(ps) * params["max_new_tokens"]
    raw["cpu_bound_ratio"] = statistics.median(
        [(tokens / i) / (sum(c) / cores) for i, c in zip(inproc, zip(*cpu.values()))])
    out["floor_raw"] = {"tok_per_s": statistics.median(runs["floor_raw"]), "runs": runs["floor_raw"],
                        "ratio": statistics.median([f / i for f, i in zip(runs["floor_raw"], inproc)]),
                        "server_cpu_s_per_run": statistics.median(floor_cpu)}
    # A burst of streams waits on the front end's intake: the last stream's first chunk comes
    # once every request was read, parsed and submitted; `generate` submits the batch at once.
    for name, per_run in first_chunk.items():
        spread = {"median": 1e3 * statistics.median(statistics.median(r) for r in per_run),
                  "last": 1e3 * statistics.median(max(r) for r in per_run)}
        if name in out:
            out[name]["first_chunk_ms"] = spread
        else:
            out[f"{name}_first_chunk_ms"] = spread
    print(f"http: {out}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="result JSON path")
    ap.add_argument("--smoke", action="store_true", help="small sizes: a run in seconds")
    ap.add_argument("--gpu", action="store_true", help="CUDA and a Llama-3-8B-shaped random model")
    ap.add_argument("--only", default="decode_step,prefix_ttft,blocked,http",
                    help="comma-separated subset of the four measurements")
    ap.add_argument("--label", default="", help="free text stored with the results (e.g. the commit)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per figure (default 3; 1 with --smoke)")
    ap.add_argument("--http-decode", type=int, default=None,
                    help="tokens per HTTP request (default 32; 8 with --smoke)")
    ap.add_argument("--mixed-chunk", action="store_true",
                    help="http: mixed steps (--enable-mixed-chunk) on the servers and the in-process engine")
    ap.add_argument("--http-stream-interval", type=int, default=1,
                    help="the HTTP requests' sampling_params.stream_interval (a chunk per this many tokens)")
    ns = ap.parse_args()
    only = set(ns.only.split(","))
    torch.set_num_threads(1)
    sizes = dict(batch=16, decode_len=16, prefix_len=4096, turns=3, num_blocked=8, blocked_len=2048,
                 http_requests=16, http_decode=8, repeats=1) if ns.smoke else dict(
        batch=256, decode_len=64, prefix_len=100_000, turns=7, num_blocked=128, blocked_len=2048,
        http_requests=256, http_decode=32, repeats=3)
    if ns.repeats is not None:
        sizes["repeats"] = ns.repeats
    if ns.http_decode is not None:
        sizes["http_decode"] = ns.http_decode
    import radixflow.runtime  # the commit of the code measured (PYTHONPATH may point at another checkout)
    code_dir = os.path.dirname(os.path.realpath(radixflow.runtime.__file__))
    commit = os.environ.get("RADIXFLOW_COMMIT") or subprocess.run(  # gpu_check.sh names it: see attention_kernels.py
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=code_dir).stdout.strip()
    shape = TINY
    if ns.gpu:
        PLACEMENT.update(device="cuda", dtype="bfloat16")
        shape = {**LLAMA3_8B, "torch_dtype": "bfloat16"}
    result: dict = {"label": ns.label, "commit": commit, "machine": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "torch_threads": 1, "sizes": sizes, "placement": dict(PLACEMENT),
                    "model": "Llama-3-8B shape" if ns.gpu else "tiny",
                    "gpu": torch.cuda.get_device_name() if ns.gpu else None}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model_dir({**shape, "max_position_embeddings": 131072}, Path(tmp) / "model")
        if "decode_step" in only:
            result["decode_step"] = bench_decode_step(model_dir, sizes["batch"], sizes["decode_len"], sizes["repeats"])
        if "prefix_ttft" in only:
            result["prefix_ttft"] = bench_prefix_ttft(model_dir, sizes["prefix_len"], sizes["turns"])
        if "blocked" in only:
            result["blocked"] = bench_blocked(model_dir, sizes["num_blocked"], sizes["blocked_len"], sizes["repeats"])
        if "http" in only:
            result["http"] = bench_http(model_dir, sizes["http_requests"], sizes["http_decode"], sizes["repeats"],
                                        ns.http_stream_interval, ns.mixed_chunk)
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
