"""Engine behaviour on the tiny demo model: the greedy equivalence invariant, accounting,
prefix hits, stops, seeds, logprobs, validation."""
from __future__ import annotations

import asyncio
import random

import pytest

from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model

# Engines here run fp32: the invariants compare greedy tokens across batch shapes, and a random-weight
# model's near-tied logits flip under bf16 rounding (the CPU default where the CPU has native bf16).
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


def _prompts(engine: Engine, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    vocab = engine.runner.args.vocab_size
    base = [rng.randrange(vocab) for _ in range(40)]
    out = []
    for i in range(n):
        shared = base[: rng.randrange(0, 40)] if i % 2 else []
        out.append(shared + [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))])
    return out


@pytest.fixture(scope="module")
def engine():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=8192, check_invariants=True) as e:
        yield e
    assert not e.invariant_violations


@pytest.fixture(scope="module")
def reference(engine):
    """Greedy outputs of 20 prompts, each run alone on a fresh cache."""
    prompts = _prompts(engine, 20)
    outs = []
    for p in prompts:
        engine.flush_cache()
        outs.append(engine.generate(input_ids=p, sampling_params=GREEDY)["output_ids"])
    return prompts, outs


def _ids(results):
    return [r["output_ids"] for r in results]


def test_batch_equals_alone(engine, reference):
    prompts, alone = reference
    engine.flush_cache()
    assert _ids(engine.generate(input_ids=prompts, sampling_params=GREEDY)) == alone


def test_fully_cached_second_run_equals_first(engine, reference):
    prompts, alone = reference
    engine.generate(input_ids=prompts, sampling_params=GREEDY)
    again = engine.generate(input_ids=prompts, sampling_params=GREEDY)
    assert _ids(again) == alone
    assert all(r["meta_info"]["cached_tokens"] == len(p) - 1 for r, p in zip(again, prompts))


@pytest.mark.parametrize("config", [
    {"disable_radix_cache": True},
    {"chunked_prefill_size": 7},
    {"schedule_policy": "fcfs"},
    {"schedule_policy": "dfs-weight"},
    {"kv_cache_tokens": 160, "max_num_seqs": 16},  # forces retraction
])
def test_greedy_equivalence_across_configs(reference, config):
    prompts, alone = reference
    with Engine(demo_model("tiny"), dtype="float32", **{"kv_cache_tokens": 8192, "check_invariants": True, **config}) as e:
        assert _ids(e.generate(input_ids=prompts, sampling_params=GREEDY)) == alone
        if config.get("kv_cache_tokens") == 160:
            assert e.stats().num_preemptions > 0
        e.check_accounting()
    assert not e.invariant_violations


def test_shared_prefix_hits(engine):
    engine.flush_cache()
    before = engine.stats()
    vocab = engine.runner.args.vocab_size
    rng = random.Random(7)
    prefix = [rng.randrange(vocab) for _ in range(300)]
    prompts = [prefix + [rng.randrange(vocab) for _ in range(5)] for _ in range(10)]
    for p in prompts:  # one after another: each later request must hit the prefix
        engine.generate(input_ids=p, sampling_params={"max_new_tokens": 2})
    after = engine.stats()
    assert after.prefix_hit_tokens - before.prefix_hit_tokens >= 9 * 300


def test_generated_tokens_are_cached_for_next_turn(engine):
    engine.flush_cache()
    first = engine.generate("The weather today", {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True})
    turn2 = engine.tokenizer.encode("The weather today") + first["output_ids"] + [5, 6]
    res = engine.generate(input_ids=turn2, sampling_params={"max_new_tokens": 1})
    assert res["meta_info"]["cached_tokens"] >= len(turn2) - 3


def test_prefill_only_then_cached(engine):
    engine.flush_cache()
    warm = engine.generate("A long shared system prompt about caching.", {"max_new_tokens": 0})
    assert warm["text"] == "" and warm["output_ids"] == []
    assert warm["meta_info"]["finish_reason"]["type"] == "length"
    res = engine.generate("A long shared system prompt about caching.", {"max_new_tokens": 3})
    assert res["meta_info"]["cached_tokens"] > 0


def test_stop_string_across_tokens(engine):
    engine.flush_cache()
    free = engine.generate("Once upon a time", {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True})
    text = free["text"]
    assert len(text) > 8
    # A stop string spanning a token boundary: take characters around the 4th token's start.
    piece_ends = [len(engine.tokenizer.decode(free["output_ids"][:k])) for k in range(1, 8)]
    cut = piece_ends[3]
    stop = text[cut - 2: cut + 2]
    assert len(stop) == 4
    res = engine.generate("Once upon a time", {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True,
                                                "stop": [stop]})
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert res["text"] == text[: text.index(stop)]


def test_stop_token_ids_and_min_new_tokens(engine):
    free = engine.generate("Numbers", {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True})
    target = free["output_ids"][2]
    first = free["output_ids"].index(target)
    res = engine.generate("Numbers", {"max_new_tokens": 10, "temperature": 0, "stop_token_ids": [target]})
    assert res["output_ids"] == free["output_ids"][: first + 1]
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
    blocked = engine.generate("Numbers", {"max_new_tokens": 10, "temperature": 0, "min_new_tokens": 10,
                                          "stop_token_ids": [target]})
    assert len(blocked["output_ids"]) == 10 and target not in blocked["output_ids"]


def test_a_special_stop_tokens_text_is_left_out_unless_no_stop_trim(engine):
    """The special token that ends an output (EOS, or a special stop token id) is in output_ids
    but not in the text even with skip_special_tokens false, as vLLM and SGLang leave it out,
    unless no_stop_trim; on every text path (made at the finish, made step by step for a stop
    string, streamed). A stop token id that is not special keeps its text
    (test_stop_token_ids_and_min_new_tokens, test_grammar_edges)."""
    special = min(engine.tokenizer.special_token_ids)
    sp = {"max_new_tokens": 10, "temperature": 0, "skip_special_tokens": False, "stop_token_ids": [special],
          "logit_bias": {str(special): 100.0}, "min_new_tokens": 1}  # one token, then the special one
    before = engine.generate("Numbers", {**sp, "max_new_tokens": 1})["text"]
    kept = before + engine.tokenizer.decode([special], skip_special_tokens=False)
    assert kept != before

    async def stream(extra):
        return [c async for c in engine.generate_stream("Numbers", {**sp, **extra})]
    for extra in ({}, {"stop": ["\x00never"]}):
        res = engine.generate("Numbers", {**sp, **extra})
        assert res["output_ids"][-1] == special and res["meta_info"]["finish_reason"]["matched"] == special
        assert res["text"] == before, extra
        assert engine.generate("Numbers", {**sp, **extra, "no_stop_trim": True})["text"] == kept, extra
        assert asyncio.run(stream(extra))[-1]["text"] == before
    assert asyncio.run(stream({"no_stop_trim": True}))[-1]["text"] == kept


def test_seed_reproducible_and_batch_independent(engine):
    sp = {"max_new_tokens": 16, "temperature": 1.0, "seed": 42, "ignore_eos": True}
    a = engine.generate("Seeded sampling", sp)["output_ids"]
    noise = {"max_new_tokens": 16, "temperature": 1.0, "ignore_eos": True}
    batch = engine.generate(["Seeded sampling", "other", "Seeded sampling"], [sp, noise, sp])
    assert batch[0]["output_ids"] == a and batch[2]["output_ids"] == a
    c = engine.generate("Seeded sampling", {**sp, "seed": 43})["output_ids"]
    assert c != a


def test_sampling_filters_respected(engine):
    # top_k=1 is greedy whatever the temperature.
    greedy = engine.generate("Filters", {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
    topk1 = engine.generate("Filters", {"max_new_tokens": 8, "temperature": 5.0, "top_k": 1, "ignore_eos": True})
    assert topk1["output_ids"] == greedy["output_ids"]
    # min_p=1 keeps only the most likely token.
    minp = engine.generate("Filters", {"max_new_tokens": 8, "temperature": 2.0, "min_p": 1.0, "ignore_eos": True})
    assert minp["output_ids"] == greedy["output_ids"]


def test_return_logprob_alone_means_output_only_and_keeps_the_cache_hit(engine):
    """As SGLang's Engine: without logprob_start_len, only output logprobs, so a warm prompt is a hit."""
    prompt = "A warm prompt scored twice in a row, " * 4
    engine.generate(prompt, {"max_new_tokens": 2, "temperature": 0}, return_logprob=True)
    res = engine.generate(prompt, {"max_new_tokens": 2, "temperature": 0}, return_logprob=True)
    meta = res["meta_info"]
    assert meta["input_token_logprobs"] == [] and len(meta["output_token_logprobs"]) == 2
    assert meta["cached_tokens"] == meta["prompt_tokens"] - 1


def test_logprobs(engine):
    res = engine.generate("Score this prompt please", {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
                          return_logprob=True, logprob_start_len=0, top_logprobs_num=3, return_text_in_logprobs=True)
    meta = res["meta_info"]
    prompt_len = meta["prompt_tokens"]
    assert len(meta["input_token_logprobs"]) == prompt_len
    assert meta["input_token_logprobs"][0][0] is None
    assert all(lp <= 0 for lp, _, _ in meta["input_token_logprobs"][1:])
    out = meta["output_token_logprobs"]
    assert [t for _, t, _ in out] == res["output_ids"]
    for (lp, tok, text), tops in zip(out, meta["output_top_logprobs"]):
        assert tops[0][1] == tok and abs(tops[0][0] - lp) < 1e-5  # greedy: chosen is the top
        assert text == engine.tokenizer.decode([tok], skip_special_tokens=False)
    # Prompt logprobs do not depend on whether the prompt was cached.
    again = engine.generate("Score this prompt please", {"max_new_tokens": 1}, return_logprob=True,
                            logprob_start_len=2)
    lps = again["meta_info"]["input_token_logprobs"]
    assert len(lps) == prompt_len - 2
    for (a, _, _), (b, _, _) in zip(lps, meta["input_token_logprobs"][2:]):
        assert abs(a - b) < 1e-4


def test_n_greater_than_one_shares_prefill(engine):
    engine.flush_cache()
    res = engine.generate("Fan out", {"max_new_tokens": 5, "n": 3, "temperature": 1.0})
    assert len(res) == 3
    assert all(r["meta_info"]["cached_tokens"] > 0 for r in res)


def test_streaming_text_is_cumulative(engine):
    async def run():
        chunks = []
        async for c in engine.generate_stream("Stream me", {"max_new_tokens": 10, "temperature": 0,
                                                            "ignore_eos": True}):
            chunks.append(c)
        return chunks

    chunks = asyncio.run(run())
    full = engine.generate("Stream me", {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True})
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert texts[-1] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_abort_stream_frees_everything(engine):
    async def run():
        gen = engine.generate_stream("Abort me", {"max_new_tokens": 200, "ignore_eos": True})
        n = 0
        async for _ in gen:
            n += 1
            if n == 3:
                break
        await gen.aclose()

    asyncio.run(run())
    engine.check_accounting()
    import time
    deadline = time.time() + 5
    while engine.stats().num_running and time.time() < deadline:
        time.sleep(0.01)
    assert engine.stats().num_running == 0


@pytest.mark.parametrize("bad, match", [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"bogus": 1}, "bogus"),
])
def test_bad_sampling_params(engine, bad, match):
    with pytest.raises(ValueError, match=match):
        engine.generate("x", bad)


def test_prompt_too_long_rejected(engine):
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate(input_ids=[1] * (engine.max_context_len + 5), sampling_params={"max_new_tokens": 1})
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate(input_ids=[10**9], sampling_params={"max_new_tokens": 1})
    # The engine still serves.
    assert engine.generate("still alive", {"max_new_tokens": 2, "ignore_eos": True})["meta_info"]["completion_tokens"] == 2


@pytest.mark.parametrize("ids, match", [
    ([1, 2.5], "got float 2.5"),
    ([1, "a"], "got str 'a'"),
    ([1, True], "got bool True"),
    ([1, None], "got NoneType None"),
    ([1, -1], "token id -1 is outside the vocabulary"),
    ([1, 2**70], "outside the vocabulary"),
    ([[1, 2], 3], "list of ints or a list of such lists"),
    ([[1, 2], [3, 2.0]], "got float 2.0"),
    ([], "non-empty"),
])
def test_malformed_input_ids_rejected(engine, ids, match):
    with pytest.raises(ValueError, match=match):
        engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})
    assert engine.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 1})["meta_info"]["completion_tokens"] == 1
    engine.check_accounting()


def test_engine_without_arguments_generates():
    with Engine(demo_model("tiny"), dtype="float32") as e:
        res = e.generate("Hello", {"max_new_tokens": 4, "ignore_eos": True})
    assert res["meta_info"]["completion_tokens"] == 4 and isinstance(res["text"], str)


def test_accounting_under_random_workload_with_aborts():
    """200 requests with shared prefixes, random lengths, some aborted mid-flight, through a
    small pool (eviction and retraction happen): slot accounting holds after every step, and
    every request ends with a finish reason."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(3)
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=700, max_num_seqs=24, chunked_prefill_size=32, check_invariants=True) as e:
        vocab = e.runner.args.vocab_size
        roots = [[rng.randrange(vocab) for _ in range(60)] for _ in range(4)]
        jobs = []
        for i in range(200):
            prompt = roots[i % 4][: rng.randrange(0, 60)] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
            sp = {"max_new_tokens": rng.randrange(0, 24), "temperature": rng.choice([0, 1.0]), "ignore_eos": True}
            jobs.append((f"r{i}", prompt, sp, rng.random() < 0.2))

        def run(job):
            rid, prompt, sp, abort = job
            if abort:
                threading.Timer(rng.random() * 0.05, e.abort, args=(rid,)).start()
            return e.generate(input_ids=prompt, sampling_params=sp, rid=rid)

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(run, jobs))
        time.sleep(0.1)
        assert all(r["meta_info"]["finish_reason"]["type"] in ("length", "abort") for r in results)
        assert sum(r["meta_info"]["finish_reason"]["type"] == "abort" for r in results) >= 1
        for (_, _, sp, aborted), r in zip(jobs, results):
            if not aborted:
                assert r["meta_info"]["completion_tokens"] == sp["max_new_tokens"]
        e.check_accounting()
        stats = e.stats()
        assert stats.num_running == 0 and stats.num_waiting == 0
        assert stats.num_steps > 50
    assert not e.invariant_violations


@pytest.mark.parametrize("chunk", [0, 7, 64])
def test_prefill_computes_each_prompt_token_once(chunk):
    """Radix off: prefill work equals the prompt tokens exactly; a request whose chunked prefill
    ends joins the decode batch (it is not stepped alone through further prefill steps)."""
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=8192, disable_radix_cache=True, chunked_prefill_size=chunk,
                max_prefill_tokens=100) as e:
        prompts = [[5 + i] * (30 + 17 * i) for i in range(6)]
        before = e.stats()
        e.generate(input_ids=prompts, sampling_params={"max_new_tokens": 16, "ignore_eos": True})
        after = e.stats()
    assert after.prefill_tokens_computed - before.prefill_tokens_computed == sum(map(len, prompts))
    # Decode steps are shared: far fewer steps than one per request per token.
    assert after.num_steps - before.num_steps < 6 * 16


def test_prompt_larger_than_pool_rejected():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=64) as e:
        with pytest.raises(ValueError, match="KV cache holds only"):
            e.generate(input_ids=[5] * 100, sampling_params={"max_new_tokens": 1})
        assert e.generate(input_ids=[5] * 10, sampling_params={"max_new_tokens": 2, "ignore_eos": True})["meta_info"]["completion_tokens"] == 2


def test_queue_limit_rejects_with_a_reason_and_serves_on():
    import threading

    from radixflow.runtime.errors import QueueFullError

    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=4096, max_num_seqs=1, max_queued_requests=1) as e:
        gate = threading.Event()
        rejected, done = [], []

        def run(i):
            gate.wait()
            try:
                done.append(e.generate(f"request {i}", {"max_new_tokens": 300, "ignore_eos": True}))
            except QueueFullError as exc:
                rejected.append(str(exc))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        gate.set()
        for t in threads:
            t.join()
        assert rejected and "max_queued_requests" in rejected[0]
        assert len(done) + len(rejected) == 6 and len(done) >= 2
        assert e.generate("after", {"max_new_tokens": 2, "ignore_eos": True})["meta_info"]["completion_tokens"] == 2


@pytest.mark.parametrize("abort_rid", ["c", "g"])
def test_an_abort_while_the_grammar_compiles_ends_the_request_once_started(engine, monkeypatch, abort_rid):
    """A constrained stream compiles its grammar on a worker thread before the engine loop knows
    it: an abort(rid) meanwhile (an /abort_request; by its n > 1 request's rid `g` too) found
    nothing to end, and the request then ran to its limit."""
    import threading

    compiling, release = threading.Event(), threading.Event()
    new_state = engine.grammar.new_state

    def slow_new_state(sp, want_logprob, cancel=None):
        compiling.set()
        assert release.wait(10)
        return new_state(sp, want_logprob, cancel)
    monkeypatch.setattr(engine.grammar, "new_state", slow_new_state)

    async def run() -> dict:
        stream = engine.generate_stream("x", {"regex": "[ab]{900}", "max_new_tokens": 1000},
                                        rid="c", group="g")
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.to_thread(compiling.wait, 10)
        engine.abort(abort_rid)
        release.set()
        last = await first
        async for last in stream:
            pass
        return last

    last = asyncio.run(asyncio.wait_for(run(), 30))
    assert last["meta_info"]["finish_reason"]["type"] == "abort" and last["meta_info"]["completion_tokens"] < 900
    engine.check_accounting()
