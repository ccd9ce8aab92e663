"""Randomized memory-pressure fuzz of the in-process Engine (tiny random-weight demo model).

Each seed makes a (config, request mix) — a pure function of the seed (`scenario`): a tiny KV
pool, few running slots, chunked prefill or not, small prefill budgets, overlap and mixed chunks
on or off, each schedule policy, the radix cache on or off, random LoRA adapters with few slots;
requests with shared prefixes, prompts near the pool's size, multi-turn chains, n > 1,
logprobs, regexes and JSON schemas (jump-forward), stops, penalties, seeds, aborts and
flush_cache calls at random times, and (half the seeds) an optimistic admission (new-token
ratio 0, as after a long decay) so that retraction is common. The thread interleaving is not
deterministic — that is what is being tested — so every check below holds for any interleaving:

- no caller hangs, the engine stays healthy, no generate call raises;
- every finish reason is stop / length, or abort for a request that was aborted or can never
  fit the pool (its prompt plus max_new_tokens is about the pool's size: "KV cache" message);
- mid-run stats are sane (slots used within the pool, running ≤ max_num_seqs, preemptions
  never decrease); when idle: exact slot accounting, no request, lock or loop entry left, no
  invariant violation (check_invariants), KV used 0; after flush_cache the pool is all free;
- greedy outputs (and their logprobs, and text) equal those of the same mix on an ample-memory
  engine with no aborts and no flushes, up to the first near-tie (below); a partial output (an
  aborted request, a no-fit abort) is a prefix of the reference output.

Near-ties. fp32 logits differ slightly between batch compositions (retraction, chunking and
batching change them), so when the best two candidates are that close a different greedy choice
is not a bug. The rule: while the reference (ample-memory) run decides each greedy token, the
test records its decision margin — the gap between the two largest logits the sampler chose
from, after the grammar's mask, penalties and blocked ids (`record_margins`; the returned
logprobs cannot give it, being of the raw distribution). Outputs are compared only up to the
first position whose margin is below TIE; that position and later ones are not compared (nor
later turns of a chain, whose prompt then differs). Forced (jump-forward) tokens have no
margin: they are always compared. TIE (1e-3) is 50x the noise (the same token's logprob
differed by at most 2e-5 between the two runs, measured over 700 tokens of 7 seeds) and such
ties are rare (a few per thousand decisions); check_margins fails a seed where margins go
missing or ties stop being rare, so the rule cannot silently stop comparing. Sampled requests
(temperature > 0) get every check but the token comparison: their decision margin (the
uniform's distance from a CDF edge) is not observable here.

The fast tier (FAST_SEEDS, default suite) covers retraction, chunked prefill, jump-forward,
LoRA, n > 1, aborts and flush_cache (test_fast_seeds_cover_the_features asserts it); the slow
tier runs SLOW_SEEDS (`-m slow`). A failing seed reproduces its scenario with
`scenario(seed)`; its interleaving may need a few reruns.
"""
from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field

import pytest

import radixflow.runtime.core.scheduler as scheduler_module
import radixflow.runtime.core.step as step_module
from radixflow.runtime import Engine
from radixflow.runtime.lora.random_adapter import write_random_adapter
from radixflow.runtime.model.demo import demo_model

TIE = 1e-3            # greedy decisions with a smaller margin (logit gap) are near-ties
LOGPROB_TOL = 1e-3    # logprobs of equal tokens may differ by fp32 noise
MAX_TIE_FRACTION = 0.05  # more near-ties than this means the margins are wrong, not the model
RUN_BOUND_S = 120.0   # a run whose callers have not all returned by then hangs
VOCAB = 3000
NUM_JOBS = 16
ADAPTERS = ("a", "b", "c")

DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
LONG_RE = r"The answer to the question is [0-9]{2}, (yes|no) indeed, said the quick brown fox [a-z]{1,8}\."
SMALL_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["n"], "additionalProperties": False}
LONG_SCHEMA = {"type": "object", "properties": {
    "first_property_name": {"type": "integer", "minimum": 0, "maximum": 9},
    "second_property_name": {"type": "string", "maxLength": 5},
    "third_flag_value": {"type": "boolean"}},
    "required": ["first_property_name", "second_property_name", "third_flag_value"],
    "additionalProperties": False}


# -- the scenario: a pure function of the seed ----------------------------------------------------


@dataclass
class Job:
    """One caller: `turns` generate calls, each prompt the last plus its first output."""
    name: str
    prompt: list[int]
    sp: dict
    opts: dict
    turns: int
    delay: float                 # before the first call
    abort_after: float | None    # abort every turn's rid this long after `delay`

    def rid(self, turn: int) -> str:
        return f"{self.name}t{turn}"

    @property
    def greedy(self) -> bool:
        return self.sp.get("temperature", 1.0) == 0


@dataclass
class Scenario:
    """An engine config and the callers to run on it (plus when to flush the cache)."""
    seed: int
    config: dict
    jobs: list[Job]
    flush_at: list[float]        # seconds after the start
    optimistic: bool             # admission with new-token ratio 0: retraction is common

    def features(self) -> set[str]:
        """What the mix exercises by construction (retraction is only observed: the fast tier
        asserts it of RETRACTING_FAST_SEEDS)."""
        f = set()
        if self.config["chunked_prefill_size"]:
            f.add("chunked")
        if "lora_modules" in self.config and any("lora" in j.opts for j in self.jobs):
            f.add("lora")
        if any(j.sp.get("regex") == LONG_RE or j.sp.get("json_schema") == json.dumps(LONG_SCHEMA)
               for j in self.jobs if j.sp["max_new_tokens"]):
            f.add("jump_forward")
        if any(j.opts.get("return_logprob") and j.greedy and j.sp["max_new_tokens"] for j in self.jobs):
            f.add("logprobs")
        if any(j.sp.get("n", 1) > 1 for j in self.jobs):
            f.add("n>1")
        if any(j.abort_after is not None for j in self.jobs):
            f.add("abort")
        if self.flush_at:
            f.add("flush")
        return f


def make_config(rng: random.Random) -> dict:
    """Engine options: a tiny pool and small budgets, every scheduling switch at random; LoRA
    (three adapters, one or two slots) for about a third of the seeds."""
    config = dict(kv_cache_tokens=rng.choice([64, 96, 128, 192, 256, 400]),
                  max_num_seqs=rng.choice([2, 4, 8, 32]),
                  chunked_prefill_size=rng.choice([0, 8, 16, 33, 64]),
                  max_prefill_tokens=rng.choice([16, 64, 128, 8192]),
                  enable_overlap=rng.random() < 0.5, enable_mixed_chunk=rng.random() < 0.5,
                  schedule_policy=rng.choice(["lpm", "dfs-weight", "fcfs"]),
                  disable_radix_cache=rng.random() < 0.1, lpm_fcfs_threshold=rng.choice([3, 128]))
    if rng.random() < 0.3:
        config.update(max_loras=rng.choice([1, 2]), max_lora_rank=8, lora_modules=list(ADAPTERS))
        config["max_loras_per_batch"] = rng.randint(1, config["max_loras"])
    return config


def make_prompt(rng: random.Random, bases: list[list[int]], cap: int) -> list[int]:
    """A shared prefix plus a tail (40%), a prompt near the pool's size (10%), or a short one."""
    kind = rng.random()
    if kind < 0.4:
        prompt = rng.choice(bases)[: rng.randint(1, 80)] + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))]
    elif kind < 0.5:
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(cap // 2, cap - 2))]
    else:
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))]
    return prompt[: cap - 2]


def make_sampling(rng: random.Random) -> dict:
    """Greedy mostly; a grammar (short ones, and long literal ones that jump forward), n > 1,
    seeded sampling or penalties, stops, min_new_tokens at random."""
    sp: dict = {"temperature": 0, "max_new_tokens": rng.choice([0, 1, 3, 10, 25, 40, 60, 90]),
                "ignore_eos": rng.random() < 0.7}
    r = rng.random()
    if r < 0.07:
        sp["regex"] = DATE
    elif r < 0.14:
        sp["json_schema"] = json.dumps(SMALL_SCHEMA)
    elif r < 0.2:
        sp["regex"] = LONG_RE
    elif r < 0.25:
        sp["json_schema"] = json.dumps(LONG_SCHEMA)
    if sp["max_new_tokens"] and rng.random() < 0.15:
        sp["n"] = rng.choice([2, 3])
    r = rng.random()
    if r < 0.12:
        sp.update(temperature=0.8, seed=rng.randrange(1000))
    elif r < 0.22:
        sp.update(frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.1)
    if rng.random() < 0.1:
        sp["stop"] = ["e", "th", " a"][: rng.randint(1, 3)]
    if rng.random() < 0.1:
        sp["min_new_tokens"] = rng.randint(0, min(5, sp["max_new_tokens"]))
    return sp


def make_job(rng: random.Random, i: int, config: dict, bases: list[list[int]]) -> Job:
    prompt = make_prompt(rng, bases, config["kv_cache_tokens"])
    sp = make_sampling(rng)
    opts: dict = {}
    if rng.random() < 0.15:
        opts.update(return_logprob=True,
                    logprob_start_len=rng.choice([None, -1, 0, len(prompt) // 2, len(prompt) - 1]),
                    top_logprobs_num=rng.choice([0, 2]))
    if "lora_modules" in config and rng.random() < 0.6:
        opts["lora"] = rng.choice(ADAPTERS)
    return Job(f"j{i}", prompt, sp, opts, turns=rng.choice([1, 1, 1, 2, 3]),
               delay=rng.random() * 0.3 * rng.random(),
               abort_after=rng.choice([None] * 6 + [0.0, 0.01, 0.05, 0.2, 0.5]))


def scenario(seed: int, num_jobs: int = NUM_JOBS) -> Scenario:
    """The (config, request mix) of `seed`."""
    rng = random.Random(seed)
    optimistic = seed % 2 == 0
    config = make_config(rng)
    cap = config["kv_cache_tokens"]
    bases = [[rng.randrange(VOCAB) for _ in range(rng.randint(10, max(11, cap // 2)))] for _ in range(3)]
    jobs = [make_job(rng, i, config, bases) for i in range(num_jobs)]
    flush_at = sorted(rng.random() * 1.5 for _ in range(rng.randint(0, 4)))
    return Scenario(seed, config, jobs, flush_at, optimistic)


# -- running a scenario -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, str]:
    """Three random LoRA adapters of the tiny model, by name."""
    root = tmp_path_factory.mktemp("pressure_fuzz_lora")
    model = demo_model("tiny")
    return {name: write_random_adapter(str(root / name), model, seed=i) for i, name in enumerate(ADAPTERS)}


@dataclass
class Run:
    """What one engine run gave: per job its turns (each a result dict, or a list for n > 1)
    and the prompt of each turn; problems found while it ran; its retraction count."""
    results: dict[str, list] = field(default_factory=dict)
    prompts: dict[str, list[list[int]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    preemptions: int = 0
    forced_tokens: int = 0       # the reference's jump-forward tokens (set by fuzz)


def engine_config(config: dict, adapters: dict[str, str]) -> dict:
    """The scenario's config with adapter names turned into `name=path` modules (the paths are
    the test session's: the scenario itself stays a pure function of the seed)."""
    if "lora_modules" in config:
        config = {**config, "lora_modules": [f"{n}={adapters[n]}" for n in config["lora_modules"]]}
    return config


def run_chain(e: Engine, job: Job, cap: int, pressure: bool, run: Run, errors: dict) -> None:
    """One job's turns; the next turn's prompt extends the last by its output, while that
    finished normally and the prompt still fits the pool."""
    try:
        if pressure:
            time.sleep(job.delay)
        prompt, outs, prompts = list(job.prompt), [], []
        for t in range(job.turns):
            r = e.generate(input_ids=prompt, sampling_params=job.sp, rid=job.rid(t), **job.opts)
            outs.append(r)
            prompts.append(prompt)
            first = r[0] if isinstance(r, list) else r
            if reason(first) not in ("stop", "length"):
                break
            prompt = prompt + first["output_ids"] + [7, 8, 9]
            if len(prompt) >= cap - 2:
                break
        run.results[job.name], run.prompts[job.name] = outs, prompts
    except Exception as exc:  # reported as a problem
        errors[job.name] = repr(exc)


def poll_stats(e: Engine, max_num_seqs: int, stop: threading.Event, problems: list[str]) -> None:
    """Mid-run stats must stay sane (reports the first inconsistency only)."""
    last = 0
    while not stop.is_set():
        st = e.stats()
        if not (0 <= st.kv_slots_used <= st.kv_slots_total) or not (0 <= st.num_running <= max_num_seqs) \
                or st.num_waiting < 0 or st.num_preemptions < last:
            problems.append(f"stats inconsistent: used {st.kv_slots_used}/{st.kv_slots_total} running "
                            f"{st.num_running} waiting {st.num_waiting} preemptions {st.num_preemptions} (was {last})")
            return
        last = st.num_preemptions
        time.sleep(0.002)


def check_idle(e: Engine) -> list[str]:
    """Exact accounting once every caller has returned, and an empty pool after flush_cache."""
    problems = []
    time.sleep(0.05)
    st = e.stats()
    try:
        e.check_accounting()
    except AssertionError as exc:
        problems.append(f"accounting: {exc}")
    s = e.scheduler
    if st.num_running or st.num_waiting or s.cache.protected_size() or e.loop.active:
        problems.append(f"leak: running={st.num_running} waiting={st.num_waiting} "
                        f"protected={s.cache.protected_size()} active={sorted(e.loop.active)}")
    if st.kv_slots_used:
        problems.append(f"kv_slots_used={st.kv_slots_used} when idle")
    e.flush_cache()
    if s.kv.num_free != s.kv.capacity or s.cache.evictable_size():
        problems.append(f"after flush: free {s.kv.num_free}/{s.kv.capacity}, evictable {s.cache.evictable_size()}")
    if e.invariant_violations:
        problems.append(f"invariant violations: {e.invariant_violations[:3]}")
    if st.num_preemptions != s.num_preemptions:
        problems.append(f"preemption stat {st.num_preemptions} != scheduler's {s.num_preemptions}")
    return problems


def run_scenario(sc: Scenario, config: dict, pressure: bool) -> Run:
    """Run every job on a fresh engine with `config`. Under `pressure`, with the jobs' delays,
    aborts and the flushes; otherwise all at once, none aborted."""
    run, errors, stop = Run(), {}, threading.Event()
    e = Engine(demo_model("tiny"), dtype="float32", check_invariants=True, **config)
    try:
        cap = config["kv_cache_tokens"]
        chains = [threading.Thread(target=run_chain, args=(e, j, cap, pressure, run, errors), daemon=True)
                  for j in sc.jobs]
        helpers = []
        if pressure:
            helpers = [threading.Thread(target=abort_later, args=(e, j, stop), daemon=True)
                       for j in sc.jobs if j.abort_after is not None]
            helpers.append(threading.Thread(target=flush_at, args=(e, sc.flush_at, stop), daemon=True))
        threading.Thread(target=poll_stats, args=(e, config["max_num_seqs"], stop, run.problems), daemon=True).start()
        deadline = time.monotonic() + RUN_BOUND_S
        for t in chains + helpers:
            t.start()
        for t in chains:
            t.join(max(0.1, deadline - time.monotonic()))
        stop.set()  # every caller is back (or hangs): later aborts and flushes have nothing to act on
        for t in helpers:
            t.join(max(0.1, deadline - time.monotonic()))
        alive = sum(t.is_alive() for t in chains + helpers)
        if alive:
            s = e.scheduler
            run.problems.append(f"HANG: {alive} threads alive; waiting={[r.rid for r in s.waiting]} "
                                f"running={[r.rid for r in s.running]} active={sorted(e.loop.active)} "
                                f"healthy={e.is_healthy}")
            return run
        run.problems += [f"generate raised in {k}: {v}" for k, v in errors.items()]
        if not e.is_healthy:
            run.problems.append("engine unhealthy")
        run.preemptions = e.stats().num_preemptions
        run.problems += check_idle(e)
        return run
    finally:
        stop.set()
        e.shutdown()


def abort_later(e: Engine, job: Job, stop: threading.Event) -> None:
    """Abort every turn of `job` at its time, unless the run is over by then."""
    if stop.wait(job.delay + job.abort_after):
        return
    for t in range(job.turns):
        e.abort(job.rid(t))


def flush_at(e: Engine, times: list[float], stop: threading.Event) -> None:
    """flush_cache at each of `times` (seconds from now) until the run is over."""
    start = time.monotonic()
    for at in times:
        if stop.wait(max(0.0, at - (time.monotonic() - start))):
            return
        e.flush_cache()


# -- the reference's decision margins ------------------------------------------------------------


def record_margins(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, int], float]:
    """While installed: for each greedy token the engine samples, {(rid, output position): the
    gap between the two largest logits it chose from}. `sample` changes its logits in place
    (grammar mask, penalties, blocked ids), so after it returns they are what argmax saw. Rows
    are matched to requests by their output list (a SampleRow holds its request's own)."""
    margins: dict[tuple[str, int], float] = {}
    local = threading.local()
    real_step_sample, real_sample = step_module.StepRunner._sample, step_module.sample

    def step_sample(self, logits, prepared, step):
        local.reqs = {id(r.output_ids): r for r in prepared.reqs}
        return real_step_sample(self, logits, prepared, step)

    def sample(logits, rows, *args, **kwargs):
        result = real_sample(logits, rows, *args, **kwargs)
        for i, row in enumerate(rows):
            req = local.reqs.get(id(row.output_ids))
            if req is None or not row.sampling.is_greedy:
                continue
            top = logits[i].float().topk(2).values.tolist()
            margins[(req.rid, len(row.output_ids))] = top[0] - top[1]
        return result

    monkeypatch.setattr(step_module.StepRunner, "_sample", step_sample)
    monkeypatch.setattr(step_module, "sample", sample)
    return margins


def check_margins(sc: Scenario, margins: dict[tuple[str, int], float]) -> list[str]:
    """The near-tie rule must not go vacuous unnoticed: margins were recorded (the hooks still
    see the sampler) and near-ties are rare (MAX_TIE_FRACTION of the decisions)."""
    if not any(j.greedy and j.sp["max_new_tokens"] for j in sc.jobs):
        return []
    if not margins:
        return ["no greedy decision margin recorded: record_margins no longer sees the sampler"]
    ties = sum(m < TIE for m in margins.values())
    if ties > MAX_TIE_FRACTION * len(margins):
        return [f"{ties} of {len(margins)} greedy decisions are near-ties: the comparison would be vacuous"]
    return []


def first_tie(margins: dict[tuple[str, int], float], rid: str, length: int) -> int:
    """The first output position below `length` whose greedy decision was a near-tie, else length."""
    return next((p for p in range(length) if margins.get((rid, p), float("inf")) < TIE), length)


# -- comparing a pressure run with the reference -------------------------------------------------


def reason(result: dict) -> str:
    return result["meta_info"]["finish_reason"]["type"]


def as_list(r) -> list[dict]:
    return r if isinstance(r, list) else [r]


def child_rid(rid: str, k: int, n: int) -> str:
    return f"{rid}-{k}" if n > 1 else rid


def check_reasons(job: Job, turn: int, got: list[dict], cap: int) -> list[str]:
    """stop / length, or abort for an aborted job or one that cannot fit the pool."""
    problems = []
    for k, x in enumerate(got):
        fr = x["meta_info"]["finish_reason"]
        if fr["type"] in ("stop", "length"):
            continue
        if fr["type"] == "abort" and job.abort_after is not None:
            continue
        need = x["meta_info"]["prompt_tokens"] + job.sp["max_new_tokens"]
        if fr["type"] == "abort" and need >= cap - 4 and "KV cache" in fr.get("message", ""):
            continue
        problems.append(f"{job.rid(turn)}[{k}] unexpected finish {fr} (prompt {x['meta_info']['prompt_tokens']}, "
                        f"max_new {job.sp['max_new_tokens']}, pool {cap})")
    return problems


def compare_logprobs(where: str, ref: dict, got: dict, upto: int, partial: bool = False) -> list[str]:
    """Prompt logprobs in full, output logprobs of the first `upto` tokens: same tokens, values
    within LOGPROB_TOL. Of a partial output (aborted, maybe before its prompt was all scored),
    a prefix of the reference's."""
    problems = []
    for key, n in (("input_token_logprobs", None), ("output_token_logprobs", upto)):
        if key not in ref["meta_info"]:
            continue
        a, b = ref["meta_info"][key][:n], (got["meta_info"].get(key) or [])[:n]
        if partial:
            a = a[: len(b)]
        same = len(a) == len(b) and all(p[1] == q[1] and (p[0] is None) == (q[0] is None) and (
            p[0] is None or abs(p[0] - q[0]) <= LOGPROB_TOL) for p, q in zip(a, b))
        if not same:
            problems.append(f"{where} {key} differ: {a[:8]}... vs {b[:8]}...")
    return problems


def compare_one(where: str, rid: str, ref: dict, got: dict, margins: dict, partial: bool) -> list[str]:
    """`got` against the reference, up to the reference's first near-tie: a partial output a
    prefix of it, a finished one equal to it (with its text and finish reason when no tie
    intervened)."""
    a, b = ref["output_ids"], got["output_ids"]
    tie = first_tie(margins, rid, len(a))
    if partial:
        n = min(len(b), tie)
        if b[:n] != a[:n] or (tie == len(a) and len(b) > len(a)):
            return [f"{where} partial output is not a prefix of the reference: {b} vs {a} (tie at {tie})"]
        return compare_logprobs(where, ref, got, n, partial=True)
    if tie < len(a):
        if b[:tie] != a[:tie]:
            return [f"{where} greedy output differs before the near-tie at {tie}: {b} vs {a}"]
        return compare_logprobs(where, ref, got, tie)
    problems = []
    if a != b:
        problems.append(f"{where} greedy output differs: {b} vs reference {a}")
    elif got["text"] != ref["text"]:
        problems.append(f"{where} text differs: {got['text']!r} vs {ref['text']!r}")
    if ref["meta_info"]["finish_reason"] != got["meta_info"]["finish_reason"]:
        problems.append(f"{where} finish reason {got['meta_info']['finish_reason']} vs "
                        f"{ref['meta_info']['finish_reason']}")
    return problems + compare_logprobs(where, ref, got, len(a))


def compare_runs(sc: Scenario, ref: Run, got: Run, margins: dict) -> list[str]:
    """Every job's turns: reasons always; greedy outputs against the reference for each turn
    whose prompt equals the reference's (a near-tie earlier in the chain changes it)."""
    problems, cap = [], sc.config["kv_cache_tokens"]
    for job in sc.jobs:
        for t, turn in enumerate(got.results.get(job.name, [])):
            gots = as_list(turn)
            problems += check_reasons(job, t, gots, cap)
            refs = ref.results.get(job.name, [])
            if not job.greedy or t >= len(refs) or ref.prompts[job.name][t] != got.prompts[job.name][t]:
                continue
            for k, (x, y) in enumerate(zip(as_list(refs[t]), gots)):
                partial = reason(y) not in ("stop", "length")
                rid = child_rid(job.rid(t), k, len(gots))
                problems += compare_one(f"{job.rid(t)}[{k}]", rid, x, y, margins, partial)
    return problems


def fuzz(seed: int, adapters: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[Scenario, Run]:
    """Run `seed`'s scenario on an ample pool (the reference, margins recorded), then under
    pressure; fail with every problem found. Returns the scenario and the pressure run."""
    sc = scenario(seed)
    config = engine_config(sc.config, adapters)
    ref_config = {**config, "kv_cache_tokens": 8192, "max_num_seqs": 64, "enable_overlap": False}
    with monkeypatch.context() as m:
        margins = record_margins(m)
        ref = run_scenario(sc, ref_config, pressure=False)
    with monkeypatch.context() as m:
        if sc.optimistic:
            m.setattr(scheduler_module, "NEW_TOKEN_RATIO_INIT", 0.0)
            m.setattr(scheduler_module, "NEW_TOKEN_RATIO_MIN", 0.0)
        got = run_scenario(sc, config, pressure=True)
    problems = [f"reference: {p}" for p in ref.problems] + got.problems + check_margins(sc, margins)
    if not any(p.startswith("HANG") for p in problems):
        problems += compare_runs(sc, ref, got, margins)
    assert not problems, f"seed {seed} config {sc.config}:\n  " + "\n  ".join(problems[:20])
    got.forced_tokens = count_forced(sc, ref, margins)
    return sc, got


def count_forced(sc: Scenario, ref: Run, margins: dict[tuple[str, int], float]) -> int:
    """Output tokens of the reference's greedy requests that were not sampled (no margin): the
    ones jump-forward appended."""
    forced = 0
    for job in sc.jobs:
        if not job.greedy:
            continue
        for t, turn in enumerate(ref.results.get(job.name, [])):
            outs = as_list(turn)
            for k, x in enumerate(outs):
                rid = child_rid(job.rid(t), k, len(outs))
                forced += sum((rid, p) not in margins for p in range(len(x["output_ids"])))
    return forced


# -- the tiers -------------------------------------------------------------------------------------

# Chosen to cover, together: retraction (all may retract; 16 and 22 always did, several times),
# chunked prefill (14, 16), jump-forward (all; 2 and 14 append 40+ forced tokens), LoRA (16,
# 22), n > 1, aborts, flush_cache, and greedy logprobs of retracted requests (22). What is only
# observed at run time (retraction, jump-forward) is asserted of the seeds below.
FAST_SEEDS = [2, 14, 16, 22]
RETRACTING_FAST_SEEDS = {16, 22}
JUMP_FORWARD_FAST_SEEDS = {2, 14}
SLOW_SEEDS = range(100, 200)


RETRACTION_TRIES = 3  # retraction depends on when the callers' threads submit: a seed may miss it once


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_pressure_fuzz_fast(seed, adapters, monkeypatch):
    _, got = fuzz(seed, adapters, monkeypatch)
    if seed in RETRACTING_FAST_SEEDS:
        for _ in range(RETRACTION_TRIES - 1):
            if got.preemptions > 0:
                break
            _, got = fuzz(seed, adapters, monkeypatch)  # every run is checked in full
        assert got.preemptions > 0, (f"seed {seed} did not retract in {RETRACTION_TRIES} runs: the fast tier "
                                     "lost its retraction case")
    if seed in JUMP_FORWARD_FAST_SEEDS:
        assert got.forced_tokens > 0, f"seed {seed} no longer jumps forward: the fast tier lost that case"


def test_fast_seeds_cover_the_features():
    """The fast seeds keep covering what they were chosen for, if the generator changes."""
    covered = set().union(*(scenario(s).features() for s in FAST_SEEDS))
    assert covered >= {"chunked", "lora", "jump_forward", "logprobs", "n>1", "abort", "flush"}, covered
    assert any(scenario(s).optimistic for s in FAST_SEEDS)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_pressure_fuzz_slow(seed, adapters, monkeypatch):
    fuzz(seed, adapters, monkeypatch)
