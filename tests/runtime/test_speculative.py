"""Speculative decoding (runtime/core/speculative.py): the n-gram drafter, and verify steps that
append exactly what one-token greedy steps append, the KV of rejected drafts freed."""
from __future__ import annotations

import asyncio
import random

import pytest
import torch

from radixflow.frontend.cli import build_parser
from radixflow.runtime import Engine, EngineClient
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.core.faults import Fault, FaultInjector
from radixflow.runtime.core import speculative
from radixflow.runtime.core.request import Req
from radixflow.runtime.core.sampler import filtered_probs, sample
from radixflow.runtime.core.speculative import (NgramDrafter, accept_sampled, can_speculate, max_drafts,
                                                 record_verify)
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.sampling_params import SamplingParams

# fp32: greedy tokens are compared across step shapes (see tests/runtime/test_engine.py)
GREEDY = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}


def _req(prompt: list[int], output: list[int] = ()) -> Req:
    req = Req("r", list(prompt), SamplingParams(temperature=0))
    req.output_ids = list(output)
    return req


# -- the drafter ---------------------------------------------------------------------------------

def test_drafts_follow_the_latest_earlier_occurrence_of_the_longest_suffix():
    drafter = NgramDrafter(3, 1, 3, 8, 4096)
    # suffix (7, 8): its 2-gram occurred at 1 (then 9, 10, 11) and its 1-gram (8) later at 6 (then 5)
    req = _req([7, 8, 9, 10, 11, 0, 8, 5, 3, 7, 8])
    assert drafter.draft(req, 3) == [9, 10, 11]
    assert drafter.draft(req, 2) == [9, 10]  # the index is reused; k cuts


def test_no_drafts_without_an_earlier_occurrence():
    drafter = NgramDrafter(4, 2, 4, 8, 4096)
    req = _req([1, 2, 3, 4, 5, 6])
    assert drafter.draft(req, 4) == []
    req.output_ids += [1, 2]     # (1, 2) occurred at the start: drafts are what followed it
    assert drafter.draft(req, 4) == [3, 4, 5, 6]


def test_a_continuation_running_into_the_suffix_repeats_it():
    drafter = NgramDrafter(5, 1, 2, 8, 4096)
    assert drafter.draft(_req([4, 9, 9, 9]), 5) == [9, 9, 9, 9, 9]        # a loop of one token
    assert drafter.draft(_req([4, 1, 2, 1, 2]), 5) == [1, 2, 1, 2, 1]     # of two


def test_the_index_grows_with_the_output_and_sees_only_its_window():
    drafter = NgramDrafter(2, 2, 2, 8, 4096, window=4)
    req = _req([1, 2, 3, 0, 0, 0, 0, 0])
    assert drafter.draft(req, 2) == [0, 0]   # only the last four positions indexed: (1, 2) is not
    req.output_ids += [1, 2]
    assert drafter.draft(req, 2) == []       # (1, 2) lies before the window
    req.output_ids += [6, 1, 2]
    assert drafter.draft(req, 2) == [6, 1]   # the output's own (1, 2), indexed as it came


def test_a_long_context_is_indexed_newest_first_a_budget_at_a_time(monkeypatch):
    monkeypatch.setattr(speculative, "INDEX_BUDGET", 4)
    drafter = NgramDrafter(2, 2, 2, 8, 4096, window=100)
    req = _req([9, 8, 7, 6] + list(range(20, 40)) + [5, 4, 3, 5, 4, 9, 8])
    assert drafter.draft(req, 2) == []        # the ends of the last 8 positions: (9, 8) is older
    assert req.ngram.lo == len(req.prompt_ids) - 8
    # four more positions a lookup, newest first: the sixth more reaches (9, 8) at the start
    assert [drafter.draft(req, 2) for _ in range(6)] == [[]] * 5 + [[7, 6]]
    req.output_ids += [5, 4]
    assert drafter.draft(req, 2) == [9, 8]    # the latest (5, 4) wins over the older one


def test_drafting_backs_off_after_rejections_and_resumes_on_acceptance():
    drafter = NgramDrafter(2, 1, 1, 8, 4096)
    req = _req([5, 6, 5])
    assert drafter.draft(req, 2) == [6, 5]
    record_verify(req, 2, 0)                 # none accepted: a pause of one token
    assert drafter.draft(req, 2) == []
    req.output_ids += [7]
    assert drafter.draft(req, 2) == []       # (7) never occurred before
    req.output_ids += [5]
    assert drafter.draft(req, 2) == [7, 5]
    record_verify(req, 2, 0)
    record_verify(req, 2, 0)                 # a third rejection in a row: four tokens
    req.output_ids += [6, 5, 6]
    assert drafter.draft(req, 2) == []
    req.output_ids += [5]
    assert drafter.draft(req, 2) == [6, 5]
    record_verify(req, 2, 1)                 # an acceptance ends the backoff
    record_verify(req, 2, 0)
    req.output_ids += [6]
    assert req.ngram.backoff == 1 and drafter.draft(req, 2) == [5, 6]


def test_only_plain_greedy_rows_without_grammar_are_drafted():
    drafter = NgramDrafter(2, 1, 1, 1, 4096)
    req = _req([5, 6, 5])
    assert drafter.propose([req], 10) == [[]]  # no sampler row yet (before its first token)
    req.sample_row = type("Row", (), {"plain": True})()
    assert can_speculate(req) and drafter.propose([req], 10) == [[6, 5]]
    assert drafter.propose([req], 1) == [[6]]           # the free slots bound the drafts
    assert drafter.propose([req, _req([1])], 10) is None  # more requests than max_batch
    req.grammar = object()
    assert drafter.propose([req], 10) == [[]]


def test_drafts_stop_at_the_output_limit_and_the_context_length():
    req = _req(list(range(10)), [1, 2])
    req.finish_ids, req.output_limit = frozenset(), 5
    assert max_drafts(req, 4, 100) == 2    # 2 + (2 drafts + the token after them) = 5 outputs
    assert max_drafts(req, 4, 14) == 2     # positions 11..13 for the pending token and 2 drafts
    assert max_drafts(req, 4, 12) == 0


# -- verifying sampled rows ----------------------------------------------------------------------

@pytest.mark.parametrize("params", [{"temperature": 0.8}, {"temperature": 1.0, "top_k": 3},
                                    {"temperature": 1.3, "top_p": 0.8, "min_p": 0.05}], ids=["plain", "top_k", "top_p"])
def test_sampled_verification_keeps_plain_samplings_distribution(params):
    """The first token a verify step appends for a sampled row, and the second where the first
    draft was kept, are distributed as the sampler draws them (`choose`), whatever the draft:
    3,000 draws each, every probability within 4 standard errors."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.3, -0.5, -2.0], [0.1, 1.2, -0.3, 2.2, 0.0, 0.9]])
    sp = SamplingParams(**params)
    probs = filtered_probs(logits, [sp, sp])
    want = probs / probs.sum(dim=-1, keepdim=True)
    n = 3000
    from radixflow.runtime.core.sampler import SampleRow
    row = SampleRow(sp, [], [], None, [])
    drawn = torch.tensor(sample(logits[:1].repeat(n, 1), [row] * n, gen).tokens)
    _close(torch.bincount(drawn, minlength=6) / n, want[0], n)  # filtered_probs is what the sampler draws from
    for draft in (0, 2, 5):  # likely, unlikely, filtered out (top_k / top_p drop it)
        firsts, seconds = [], []
        for _ in range(n):
            out = accept_sampled(probs, [draft], gen)
            firsts.append(out[0])
            if len(out) == 2:
                assert out[0] == draft
                seconds.append(out[1])
        _close(torch.bincount(torch.tensor(firsts), minlength=6) / n, want[0], n)
        if len(seconds) > 500:
            _close(torch.bincount(torch.tensor(seconds), minlength=6) / len(seconds), want[1], len(seconds))


def _close(got: torch.Tensor, want: torch.Tensor, n: int) -> None:
    err = 4 * (want * (1 - want) / n).sqrt() + 1e-9
    assert bool(((got - want).abs() <= err).all()), (got.tolist(), want.tolist())
    assert bool((got[want == 0] == 0).all()), "a filtered-out token was drawn"


# -- configuration -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"speculative_algorithm": "eagle"}, "speculative_algorithm"),
    ({"speculative_algorithm": "ngram", "enable_overlap": True}, "enable_overlap"),
    ({"speculative_num_draft_tokens": 0}, "speculative_num_draft_tokens"),
    ({"speculative_ngram_min": 3, "speculative_ngram_max": 2}, "speculative_ngram_min"),
    ({"speculative_max_batch": 0}, "speculative_max_batch"),
])
def test_bad_speculative_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_kwargs(**kwargs)


def test_sglang_spelling_of_the_algorithm_is_taken():
    args = build_parser().parse_args(["serve", "--speculative-algorithm", "NGRAM"])
    assert args.speculative_algorithm == "ngram"
    assert EngineConfig.from_kwargs(speculative_algorithm="NGRAM").speculative_algorithm == "ngram"


# -- verify steps on the tiny model --------------------------------------------------------------

class Oracle:
    """Drafts the known greedy continuation of each prompt, wrong (shifted by one id) at the
    output positions in `wrong`: verification is then checked against what it must accept."""

    def __init__(self, engine: Engine, truth: dict[tuple[int, ...], list[int]], k: int = 4,
                 wrong: frozenset[int] = frozenset()) -> None:
        self.engine, self.truth, self.k, self.wrong = engine, truth, k, wrong

    def propose(self, reqs: list[Req], room: int) -> list[list[int]]:
        out = []
        for req in reqs:
            truth = self.truth.get(tuple(req.prompt_ids))
            k = min(room, max_drafts(req, self.k, self.engine.max_context_len))
            if truth is None or not can_speculate(req) or k <= 0:
                out.append([])
                continue
            n = len(req.output_ids)
            drafts = [(t + 1) % 100 if n + j in self.wrong else t for j, t in enumerate(truth[n: n + k])]
            room -= len(drafts)
            out.append(drafts)
        return out


@pytest.fixture(scope="module")
def engine():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=4096, check_invariants=True) as e:
        yield e
    assert not e.invariant_violations


@pytest.fixture(scope="module")
def reference(engine):
    rng = random.Random(3)
    vocab = engine.runner.args.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(rng.randrange(3, 30))] for _ in range(4)]
    engine.scheduler.drafter = None
    outs = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
    return prompts, outs


def _run(engine, drafter, prompts, params=GREEDY):
    engine.flush_cache()
    engine.scheduler.drafter = drafter
    before = engine.stats()
    try:
        results = engine.generate(input_ids=prompts, sampling_params=params)
    finally:
        engine.scheduler.drafter = None
    after = engine.stats()
    assert after.kv_slots_used == 0, "a request's KV stayed held after it finished"
    return ([r["output_ids"] for r in results], after.spec_draft_tokens - before.spec_draft_tokens,
            after.spec_accepted_tokens - before.spec_accepted_tokens, after.num_steps - before.num_steps)


def test_right_drafts_are_all_accepted_in_fewer_steps(engine, reference):
    prompts, truth = reference
    _, _, _, plain_steps = _run(engine, None, prompts)
    outs, drafted, accepted, steps = _run(engine, Oracle(engine, dict(zip(map(tuple, prompts), truth))), prompts)
    assert outs == truth
    assert drafted == accepted > 0
    assert steps < plain_steps / 3  # five tokens a step after the first


@pytest.mark.parametrize("wrong", [frozenset(range(100)), frozenset(range(1, 100, 3))], ids=["all", "some"])
def test_wrong_drafts_are_rejected_and_the_output_is_unchanged(engine, reference, wrong):
    prompts, truth = reference
    outs, drafted, accepted, _ = _run(engine, Oracle(engine, dict(zip(map(tuple, prompts), truth)), wrong=wrong),
                                      prompts)
    assert outs == truth
    assert drafted > 0
    if len(wrong) == 100:
        assert accepted == 0
    else:  # the drafts before each wrong one are accepted
        assert 0 < accepted < drafted


def test_a_finish_inside_accepted_drafts_ends_the_output_there(engine, reference):
    prompts, truth = reference
    oracle = Oracle(engine, dict(zip(map(tuple, prompts), truth)))
    outs, _, accepted, _ = _run(engine, oracle, prompts, {**GREEDY, "max_new_tokens": 7})
    assert outs == [t[:7] for t in truth] and accepted > 0
    stop = truth[0][4]
    outs, _, _, _ = _run(engine, oracle, prompts[:1], {**GREEDY, "stop_token_ids": [stop]})
    assert outs == [truth[0][: truth[0].index(stop) + 1]]


def test_a_stop_string_inside_accepted_drafts_ends_the_text_there(engine, reference):
    prompts, truth = reference
    text = engine.tokenizer.decode(truth[1], skip_special_tokens=False)
    params = {**GREEDY, "stop": [text[len(text) // 3: len(text) // 3 + 3]]}
    engine.flush_cache()
    plain = engine.generate(input_ids=prompts[1], sampling_params=params)
    assert plain["meta_info"]["finish_reason"]["matched"] == params["stop"][0]
    engine.flush_cache()
    engine.scheduler.drafter = Oracle(engine, {tuple(prompts[1]): truth[1]})
    accepted = engine.stats().spec_accepted_tokens
    try:
        spec = engine.generate(input_ids=prompts[1], sampling_params=params)
    finally:
        engine.scheduler.drafter = None
    assert engine.stats().spec_accepted_tokens > accepted
    assert (spec["text"], spec["output_ids"], spec["meta_info"]["finish_reason"]) == \
        (plain["text"], plain["output_ids"], plain["meta_info"]["finish_reason"])


def test_rows_not_drafted_decode_beside_drafted_ones(engine, reference):
    """A logprob row and a penalized row are not plain: they take one token a step in the same
    batch as drafted rows, and every output is what it is without drafting."""
    prompts, truth = reference
    params = [GREEDY, {**GREEDY, "frequency_penalty": 0.5}, GREEDY, GREEDY]
    engine.flush_cache()
    alone = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=params)]
    logprobs = engine.generate(input_ids=prompts[2], sampling_params=GREEDY, return_logprob=True)
    oracle = Oracle(engine, {tuple(p): t for p, t in zip(prompts, alone)})
    outs, drafted, accepted, _ = _run(engine, oracle, prompts, params)
    assert outs == alone and accepted > 0
    engine.scheduler.drafter = oracle
    try:
        again = engine.generate(input_ids=prompts[2], sampling_params=GREEDY, return_logprob=True)
    finally:
        engine.scheduler.drafter = None
    assert again["output_ids"] == logprobs["output_ids"]
    assert len(again["meta_info"]["output_token_logprobs"]) == len(again["output_ids"])


@pytest.mark.parametrize("wrong", [frozenset(), frozenset(range(1, 100, 3))], ids=["right", "some wrong"])
def test_bf16_verify_rows_give_plain_decodings_tokens(wrong):
    """In bf16 a near-tie falls the same way only where the arithmetic is the same: a verify
    step runs its drafts as decode rows (model_runner._decode_rows_batch), so the tokens are
    plain decoding's whatever the drafts."""
    rng = random.Random(5)
    with Engine(demo_model("tiny"), dtype="bfloat16", kv_cache_tokens=4096, check_invariants=True) as e:
        prompts = [[rng.randrange(e.runner.args.vocab_size) for _ in range(rng.randrange(3, 300))] for _ in range(5)]
        params = {**GREEDY, "max_new_tokens": 40}
        truth, _, _, _ = _run(e, None, prompts, params)
        outs, drafted, accepted, _ = _run(e, Oracle(e, dict(zip(map(tuple, prompts), truth)), wrong=wrong),
                                          prompts, params)
        assert not e.invariant_violations
    assert outs == truth and accepted > 0


def test_adapter_rows_are_verified_with_their_adapter(tmp_path):
    """Drafted rows of two LoRA adapters and the base model in one batch: each verify row gets
    its request's adapter, so the outputs are plain decoding's."""
    from lora_adapters import ALL, write_adapter

    model = demo_model("tiny")
    paths = [write_adapter(str(tmp_path / f"a{i}"), model, rank=8, targets=ALL, seed=i) for i in range(2)]
    with Engine(model, dtype="float32", kv_cache_tokens=4096, max_loras=2, check_invariants=True,
                lora_modules=[f"a{i}={p}" for i, p in enumerate(paths)]) as e:
        jobs = [([7, 8, 9, 10], "a0"), ([11, 12, 13], "a1"), ([14, 15, 16, 17, 18], None)]

        def run() -> list[list[int]]:
            e.flush_cache()
            return [r["output_ids"] for r in _concurrently(e, jobs)]

        plain = run()
        e.scheduler.drafter = Oracle(e, {tuple(p): out for (p, _), out in zip(jobs, plain)})
        try:
            spec = run()
        finally:
            e.scheduler.drafter = None
        assert not e.invariant_violations and e.stats().spec_accepted_tokens > 0
    assert spec == plain


def _concurrently(engine: Engine, jobs: list[tuple[list[int], str | None]]) -> list[dict]:
    async def main():
        async def one(ids, lora):
            return [c async for c in engine.generate_stream(input_ids=ids, sampling_params=GREEDY, lora=lora)][-1]
        return await asyncio.gather(*(one(ids, lora) for ids, lora in jobs))
    return asyncio.run(main())


def test_drafts_under_memory_pressure_never_retract_and_keep_the_output():
    """A pool too small for every request: requests are retracted for one-token decode room as
    without drafting, drafts take only what is free or evictable, and the outputs are plain
    decoding's."""
    rng = random.Random(9)
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=256, max_num_seqs=8,
                check_invariants=True) as e:
        prompts = [[rng.randrange(e.runner.args.vocab_size) for _ in range(30)] for _ in range(6)]
        params = {**GREEDY, "max_new_tokens": 30}
        truth, _, _, _ = _run(e, None, prompts, params)
        preempted = e.stats().num_preemptions
        assert preempted > 0, "the pool must be small enough to retract"
        outs, drafted, accepted, _ = _run(e, Oracle(e, dict(zip(map(tuple, prompts), truth))), prompts, params)
        assert not e.invariant_violations
    assert outs == truth and accepted > 0


def test_a_failed_verify_forward_leaves_no_draft_behind(engine, reference):
    prompts, truth = reference
    engine.flush_cache()
    engine.scheduler.drafter = Oracle(engine, dict(zip(map(tuple, prompts), truth)))
    fault = Fault("forward", after_step=engine.stats().num_steps + 2, times=1, exc=torch.cuda.OutOfMemoryError)
    engine.set_fault_injector(FaultInjector([fault]))
    try:
        outs = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
    finally:
        engine.set_fault_injector(None)
        engine.scheduler.drafter = None
    assert fault.fired == 1
    assert outs == truth  # retried: the drafts the failed step carried never became output


@pytest.mark.parametrize("step_level", [False, True], ids=["one request", "the step"])
def test_a_verify_fault_fails_its_requests_alone_and_frees_their_drafts(engine, reference, step_level):
    """A sampler fault in a verify step: its own request fails (with step_level, the whole
    step's), the others' outputs are plain decoding's, and no KV slot stays held."""
    prompts, truth = reference
    engine.flush_cache()
    rids = [f"spec-fault-{step_level}-{i}" for i in range(len(prompts))]
    # a request's own fault fires again when its row is verified alone after the batch raised
    fault = Fault("sampler", rids=[rids[1]], after_step=engine.stats().num_steps + 2,
                  times=1 if step_level else None, step_level=step_level)
    engine.set_fault_injector(FaultInjector([fault]))
    engine.scheduler.drafter = Oracle(engine, dict(zip(map(tuple, prompts), truth)))
    try:
        results = engine.generate(input_ids=prompts, sampling_params=GREEDY, rid=rids)
    finally:
        engine.set_fault_injector(None)
        engine.scheduler.drafter = None
    assert fault.fired >= 1
    reasons = [r["meta_info"]["finish_reason"]["type"] for r in results]
    failed = {i for i, reason in enumerate(reasons) if reason == "error"}
    assert failed == ({i for i, r in enumerate(rids) if r in fault.fired_for} if step_level else {1})
    assert all(results[i]["output_ids"] == truth[i] for i in range(len(prompts)) if i not in failed)
    assert engine.stats().kv_slots_used == 0 and not engine.invariant_violations


def test_the_ngram_drafter_end_to_end(engine):
    """Prompt lookup on outputs that loop (this random model falls into loops): drafts are
    accepted, and the output is plain greedy decoding's."""
    rng = random.Random(0)
    vocab = engine.runner.args.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(20)] for _ in range(4)]
    params = {**GREEDY, "max_new_tokens": 40}
    plain, _, _, _ = _run(engine, None, prompts, params)
    outs, drafted, accepted, _ = _run(engine, NgramDrafter(4, 1, 3, 8, engine.max_context_len), prompts, params)
    assert outs == plain
    assert 0 < accepted < drafted


def test_sampled_rows_are_drafted_and_seeded_ones_keep_their_draws(engine):
    rng = random.Random(0)
    vocab = engine.runner.args.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(20)] for _ in range(4)]
    drafter = NgramDrafter(4, 1, 3, 8, engine.max_context_len)
    params = {"temperature": 0.05, "top_p": 0.9, "max_new_tokens": 40, "ignore_eos": True}
    outs, drafted, accepted, _ = _run(engine, drafter, prompts, params)
    assert [len(o) for o in outs] == [40] * 4 and 0 < accepted < drafted
    seeded = {**params, "temperature": 0.8, "seed": 11}
    plain, _, _, _ = _run(engine, None, prompts, seeded)
    outs, drafted, _, _ = _run(engine, drafter, prompts, seeded)
    assert outs == plain and drafted == 0  # a seeded request's draws are plain decoding's


def test_the_core_process_drafts_and_streams_what_it_returns_whole():
    """`radixflow serve`'s engine: the config reaches the core process, drafts are verified
    there, and a stream of multi-token steps gives the text and ids of the whole response."""
    async def stream(client, ids, params):
        chunks = [c async for c in client.generate_stream(input_ids=ids, sampling_params=params)]
        return chunks[-1]

    ids, params = [5, 6, 7, 5, 6, 7, 5, 6], {**GREEDY, "max_new_tokens": 30}
    with EngineClient(demo_model("tiny"), dtype="float32", kv_cache_tokens=2048, speculative_algorithm="ngram",
                      speculative_ngram_min=1) as client:
        whole = client.generate(input_ids=ids, sampling_params=params)
        last = asyncio.run(stream(client, ids, params))
        stats = client.stats()
    assert len(whole["output_ids"]) == 30
    assert 0 < whole["meta_info"]["spec_verify_ct"] < 29  # steps that verified drafts (SGLang's field)
    assert (last["output_ids"], last["text"]) == (whole["output_ids"], whole["text"])
    assert stats.spec_accepted_tokens > 0 and stats.kv_slots_used == 0
