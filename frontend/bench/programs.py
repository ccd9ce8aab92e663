"""Program-level figure: `agent` and `tree` as radixflow language programs, run in-process and
submitted over HTTP (/v1/programs), reporting prefill tokens computed ÷ unique tokens.

Unique tokens: the distinct token prefixes of every request the programs sent (prompt + output,
as the engine tokenized them), read as the tokens the radix cache holds after the run: the cache
is flushed before the run and again after it, and the second flush's evicted-token count is the
figure (valid when the run itself evicted nothing, which the report shows; an unevicted radix
cache holds each distinct prefix once). 1.0 means every token was prefilled once; the generated tokens never need a prefill, so an
ideal run lands below 1.0 by the share of generated tokens.

Prompts are text (programs work in text): deterministic pseudo-words from a seed, sized in words.
"""
from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import radixflow.lang as rf

WORDS = ("alpha bravo cargo delta engine file graph hash index json kernel list merge node option "
         "parse query radix stack token update value write yield zone cache batch query tool").split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@rf.function
def agent_session(s, system_prompt, task, tool_results=(), out_tokens=8):
    """A tool-using trace: system prompt + task, then per turn an action and its tool result."""
    s += rf.system(system_prompt)
    s += rf.user(task)
    for t, result in enumerate(tool_results):
        s += rf.assistant(rf.gen(f"action{t}", max_tokens=out_tokens, temperature=0, ignore_eos=True))
        s += rf.user(result)
    s += rf.assistant(rf.gen("final", max_tokens=out_tokens, temperature=0, ignore_eos=True))


@rf.function
def tree_of_thought(s, problem, width=3, out_tokens=16):
    """A problem, `width` thoughts on it (fork), `width` continuations of each (nested fork)."""
    s += rf.user(problem)
    thoughts = s.fork(width)
    for i, f in enumerate(thoughts):
        f += rf.assistant(f"Thought {i + 1}: " + rf.gen("thought", max_tokens=out_tokens, temperature=0,
                                                        ignore_eos=True))
        steps = f.fork(width)
        for j, g in enumerate(steps):
            g += rf.user(f"Continue path {j + 1}.")
            g += rf.assistant(rf.gen("step", max_tokens=out_tokens, temperature=0, ignore_eos=True))
        steps.join()
    thoughts.join()


def agent_args(seed: int, sessions: int, turns: int, system_words: int) -> list[dict[str, Any]]:
    """One shared system prompt; per session a task and `turns - 1` tool results of ~2% of the context."""
    rng = random.Random(f"agent-program:{seed}")
    system_prompt = words(rng, system_words)
    out = []
    for _ in range(sessions):
        context, results = system_words + 32, []
        for _t in range(turns - 1):
            n = max(8, context // 50)
            results.append(words(rng, n))
            context += n + 8
        out.append({"system_prompt": system_prompt, "task": words(rng, 32), "tool_results": tuple(results)})
    return out


def tree_args(seed: int, trees: int, problem_words: int) -> list[dict[str, Any]]:
    rng = random.Random(f"tree-program:{seed}")
    return [{"problem": words(rng, problem_words)} for _ in range(trees)]


COUNTERS = ("prefill_tokens_computed", "evicted_tokens", "prompt_tokens", "generated_tokens")


class _Counters:
    """The engine counters a figure needs, read in-process or over HTTP; `flush` empties the cache."""

    def __init__(self, engine: Any = None, url: str | None = None) -> None:
        self.engine, self.url = engine, url

    def read(self) -> dict[str, int]:
        if self.engine is not None:
            s = self.engine.stats()
            return {k: getattr(s, k) for k in COUNTERS}
        import httpx

        s = httpx.get(self.url + "/get_server_info", timeout=30).json()["stats"]
        return {k: s[k] for k in COUNTERS}

    def settled(self, changed_from: dict[str, int] | None = None, timeout_s: float = 5.0) -> dict[str, int]:
        """Counters once the engine has published them: the stats snapshot is refreshed on the
        engine thread just after a call such as a flush returns, so poll briefly."""
        deadline = time.monotonic() + timeout_s
        stats = self.read()
        while time.monotonic() < deadline:
            time.sleep(0.2)
            again = self.read()
            if again == stats and (changed_from is None or again != changed_from):
                return again
            stats = again
        return stats

    def flush(self) -> None:
        if self.engine is not None:
            self.engine.flush_cache()
            return
        import httpx

        httpx.post(self.url + "/flush_cache", timeout=60).raise_for_status()


def _run(fn: Any, batch: list[dict[str, Any]], backend: Any, url: str | None) -> None:
    """Every program at once: in-process through run_batch, over HTTP as concurrent submissions."""
    if url is None:
        states = fn.run_batch(batch, backend=backend)
        failed = [st.error() for st in states if st.error() is not None]
        if failed:
            raise RuntimeError(f"{len(failed)} programs failed: {failed[0]}")
        return
    with ThreadPoolExecutor(max_workers=len(batch)) as pool:
        list(pool.map(lambda kwargs: fn.submit(url, **kwargs), batch))


def measure(name: str, fn: Any, batch: list[dict[str, Any]], counters: _Counters, backend: Any = None,
            url: str | None = None) -> dict[str, Any]:
    """Flush, run every program once, flush again: the second flush evicts exactly the distinct
    tokens the run left in the cache (its unique tokens, when the run itself evicted nothing)."""
    counters.flush()
    before = counters.settled()
    t0 = time.perf_counter()
    _run(fn, batch, backend, url)
    seconds = time.perf_counter() - t0
    ran = counters.settled()
    counters.flush()
    after = counters.settled(changed_from=ran)
    d = {k: ran[k] - before[k] for k in ran}
    unique = after["evicted_tokens"] - ran["evicted_tokens"]
    return {"program": name, "mode": "http" if url else "in-process", "num_programs": len(batch),
            "seconds": seconds, "prefill_tokens_computed": d["prefill_tokens_computed"],
            "unique_tokens": unique, "prompt_tokens": d["prompt_tokens"], "generated_tokens": d["generated_tokens"],
            "evicted_during_run": d["evicted_tokens"],
            "prefill_per_unique": d["prefill_tokens_computed"] / unique if unique else None,
            "prefill_per_prompt": d["prefill_tokens_computed"] / d["prompt_tokens"] if d["prompt_tokens"] else None}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`radixflow serve` in a child process on 127.0.0.1 (a free port) until `close()`."""

    def __init__(self, serve_args: list[str], timeout_s: float = 600.0) -> None:
        import subprocess
        import sys

        import httpx

        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "radixflow.frontend.cli", "serve", "--host", "127.0.0.1",
                                      "--port", str(port), "--log-level", "warning", *serve_args])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"radixflow serve exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health_generate", timeout=10).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.close()
        raise TimeoutError(f"radixflow serve not ready after {timeout_s} s")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


def run_programs(model: str | None, engine_config: dict[str, Any], modes: list[str], sessions: int, turns: int,
                 system_words: int, trees: int, problem_words: int, seed: int = 0) -> list[dict[str, Any]]:
    """Both programs in each mode ("in-process", "http"); one result row per (program, mode)."""
    batches = {"agent": (agent_session, agent_args(seed, sessions, turns, system_words)),
               "tree": (tree_of_thought, tree_args(seed, trees, problem_words))}
    rows = []
    for mode in modes:
        if mode == "in-process":
            backend = rf.Engine(model, **engine_config)
            try:
                counters = _Counters(engine=backend.engine)
                rows += [measure(name, fn, batch, counters, backend=backend) for name, (fn, batch) in batches.items()]
            finally:
                backend.shutdown()
        elif mode == "http":
            serve_args = [] if model is None else ["--model", model]
            for key, value in engine_config.items():
                serve_args += [f"--{key.replace('_', '-')}", str(value)]
            server = Server(serve_args)
            try:
                counters = _Counters(url=server.url)
                rows += [measure(name, fn, batch, counters, url=server.url) for name, (fn, batch) in batches.items()]
            finally:
                server.close()
        else:
            raise ValueError(f"unknown mode {mode!r}; choose in-process or http")
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| program | mode | programs | seconds | prompt tokens | prefill tokens computed | unique tokens "
            "| generated | evicted in run | prefill ÷ unique |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        ratio = "-" if r["prefill_per_unique"] is None else f"**{r['prefill_per_unique']:.3f}**"
        lines.append(f"| {r['program']} | {r['mode']} | {r['num_programs']} | {r['seconds']:.1f} | {r['prompt_tokens']} "
                     f"| {r['prefill_tokens_computed']} | {r['unique_tokens']} | {r['generated_tokens']} "
                     f"| {r['evicted_during_run']} | {ratio} |")
    return "\n".join(lines)
