"""logit_bias: validation, the sampler's scatter (greedy, sampled, beside unbiased rows, under a
grammar mask, raw logprobs), and end to end on the tiny demo model, with and without overlap."""
from __future__ import annotations

import math
import re

import pytest
import torch

from radixflow.runtime import Engine
from radixflow.runtime.core.sampler import SampleRow, logprobs_of, sample
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.sampling_params import MAX_LOGIT_BIAS, SamplingParams

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
PROMPT = [5, 17, 230, 1001, 44]


def _row(bias=None, want_logprob=False, **sp) -> SampleRow:
    params = SamplingParams.from_dict({**sp, "logit_bias": bias})
    return SampleRow(params, [1, 2], [], None, [], want_logprob=want_logprob)


def _seeded(seed, **sp) -> SampleRow:
    return SampleRow(SamplingParams.from_dict(sp), [], [], torch.Generator().manual_seed(seed), [])


# -- validation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bias, what", [
    ({"abc": 1.0}, "token ids"), ({"-1": 1.0}, "token ids"), ({"1.5": 1.0}, "token ids"),
    ({"05": 1.0}, "token ids"), ({"9" * 5000: 1.0}, "token ids"), ({" 5": 1.0}, "token ids"), ({"": 1.0}, "token ids"),
    ({"5": 100.5}, r"\[-100, 100\]"), ({"5": -101}, r"\[-100, 100\]"),
    ({"5": math.nan}, r"\[-100, 100\]"), ({"5": math.inf}, r"\[-100, 100\]"),
    ({str(i): 1.0 for i in range(MAX_LOGIT_BIAS + 1)}, f"at most {MAX_LOGIT_BIAS}"),
    ({5.5: 1.0}, "token ids"), ({True: 1.0}, "token ids"),
])
def test_bad_logit_bias_is_a_value_error_naming_the_field(bias, what):
    with pytest.raises(ValueError, match=r"sampling_params\.logit_bias") as err:
        SamplingParams.from_dict({"logit_bias": bias})
    assert re.search(what, str(err.value)), err.value


@pytest.mark.parametrize("bias", [{"5": "x"}, [5], "5"])
def test_a_logit_bias_of_the_wrong_type_names_the_field(bias):
    with pytest.raises(ValueError, match=r"\$\.logit_bias"):
        SamplingParams.from_dict({"logit_bias": bias})


def test_int_keys_and_int_values_are_read_as_the_openai_shape():
    sp = SamplingParams.from_dict({"logit_bias": {5: 1, "7": -100, 0: 100}})
    assert sp.logit_bias == {"5": 1.0, "7": -100.0, "0": 100.0}
    assert SamplingParams.from_dict({"logit_bias": {}}).logit_bias is None  # empty: no bias
    assert SamplingParams.from_dict(SamplingParams(logit_bias={3: 2.0})).logit_bias == {"3": 2.0}


def test_a_biased_row_is_not_plain():
    assert _row(temperature=0).plain and not _row({"3": 1.0}, temperature=0).plain


# -- the sampler --------------------------------------------------------------------------------

def test_bias_moves_the_argmax_and_bans_tokens():
    logits = torch.tensor([[0.0, 5.0, 1.0, 0.5]])
    assert sample(logits.clone(), [_row({"3": 100}, temperature=0)], None).tokens == [3]
    assert sample(logits.clone(), [_row({"1": -100}, temperature=0)], None).tokens == [2]
    assert sample(logits.clone(), [_row({"1": -4.5, "2": -1, "3": 0.1}, temperature=0)], None).tokens == [3]


def test_sampled_rows_follow_the_biased_distribution():
    logits = torch.zeros(1000, 6)
    rows = [_row({"2": 100} if i % 2 else {"0": -100, "1": -100}, temperature=1.0) for i in range(1000)]
    tokens = torch.tensor(sample(logits, rows, torch.Generator().manual_seed(0)).tokens)
    assert (tokens[1::2] == 2).all()
    assert set(tokens[0::2].tolist()) == {2, 3, 4, 5}


def test_unbiased_rows_beside_biased_ones_are_untouched():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(3))

    def unbiased():  # greedy, and seeded draws (which depend on nothing else in the batch)
        return [_row(temperature=0), _seeded(5, temperature=0.8, top_k=5), _seeded(6, temperature=1.0, top_p=0.9)]

    alone = sample(logits[[0, 2, 4]].clone(), unbiased(), None).tokens
    plain = unbiased()
    rows = [plain[0], _row({"7": 100}, temperature=0), plain[1], _row({"9": 100}, temperature=1.0), plain[2]]
    mixed = sample(logits.clone(), rows, torch.Generator().manual_seed(9)).tokens
    assert mixed[1] == 7 and mixed[3] == 9
    assert [mixed[0], mixed[2], mixed[4]] == alone


def test_the_grammar_mask_wins_over_the_bias():
    # the grammar allows tokens 2 and 3 only: +100 on 1 cannot force it, -100 on 2 leaves 3
    bitmask = (torch.tensor([[(1 << 2) | (1 << 3)]], dtype=torch.int32), torch.tensor([0]))
    logits = torch.tensor([[0.0, 1.0, 2.0, 0.5]])
    assert sample(logits.clone(), [_row({"1": 100}, temperature=0)], None, bitmask=bitmask).tokens == [2]
    assert sample(logits.clone(), [_row({"1": 100, "2": -100}, temperature=0)], None, bitmask=bitmask).tokens == [3]
    g = torch.Generator().manual_seed(1)
    drawn = {sample(logits.clone(), [_row({"1": 100}, temperature=1.0)], g, bitmask=bitmask).tokens[0]
             for _ in range(50)}
    assert drawn == {2, 3}


def test_logprobs_are_of_the_raw_distribution():
    logits = torch.tensor([[0.0, 5.0, 1.0, 0.5]])
    row = SampleRow(SamplingParams.from_dict({"temperature": 0, "logit_bias": {"3": 100}}), [], [], None, [],
                    top_logprobs_num=2, want_logprob=True)
    out = sample(logits.clone(), [row], None)
    raw = logprobs_of(logits)[0]
    assert out.tokens == [3]
    assert out.logprobs[0] == pytest.approx(float(raw[3]))
    assert [t for t, _ in out.top_logprobs[0]] == [1, 2]


def test_bias_tensors_are_built_once_per_request():
    row = _row({"3": 100, "1": -5}, temperature=0)
    sample(torch.zeros(1, 4), [row], None)
    ids = row.state.bias_ids
    sample(torch.zeros(1, 4), [row], None)
    assert row.state.bias_ids is ids and sorted(ids.tolist()) == [1, 3]


# -- end to end ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=4096, check_invariants=True) as e:
        yield e
    assert not e.invariant_violations


def _out(engine, sp, prompt=PROMPT, **kw) -> list[int]:
    return engine.generate(input_ids=prompt, sampling_params=sp, **kw)["output_ids"]


def test_out_of_vocabulary_bias_is_a_value_error(engine):
    vocab = engine.runner.args.vocab_size
    with pytest.raises(ValueError, match=rf"sampling_params\.logit_bias holds token id {vocab}, outside"):
        engine.generate(input_ids=PROMPT, sampling_params={**GREEDY, "logit_bias": {str(vocab): 1}})
    with pytest.raises(ValueError, match=r"sampling_params\.logit_bias"):
        engine.generate(input_ids=PROMPT, sampling_params={**GREEDY, "logit_bias": {"x": 1}})


def test_plus_100_forces_its_token_greedy_sampled_seeded_and_n(engine):
    forced = 1234
    assert set(_out(engine, {**GREEDY, "logit_bias": {forced: 100}})) == {forced}
    for extra in ({"temperature": 1.0}, {"temperature": 1.3, "top_p": 0.9, "seed": 7}, {"temperature": 0.7, "n": 2}):
        outs = engine.generate(input_ids=PROMPT, sampling_params={**GREEDY, **extra, "logit_bias": {forced: 100}})
        for out in outs if isinstance(outs, list) else [outs]:
            assert out["output_ids"] == [forced] * GREEDY["max_new_tokens"], extra


def test_minus_100_bans_the_greedy_token(engine):
    plain = _out(engine, GREEDY)
    banned = plain[0]
    biased = _out(engine, {**GREEDY, "logit_bias": {str(banned): -100}})
    assert biased[0] != banned and banned not in biased


def test_penalties_and_logprobs_beside_the_bias(engine):
    out = engine.generate(input_ids=PROMPT, sampling_params={**GREEDY, "frequency_penalty": 1.0,
                                                             "logit_bias": {"99": 100}},
                          return_logprob=True, top_logprobs_num=1)
    assert out["output_ids"] == [99] * GREEDY["max_new_tokens"]  # 100 - 1.0 * 5 still leads
    logprobs = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    assert all(lp < -1.0 for lp in logprobs)  # raw: the model alone does not favour token 99


def test_a_biased_request_leaves_its_batch_mates_unchanged(engine):
    prompts = [PROMPT, [9, 8, 7], [300, 301, 302, 303, 304, 305, 306]]
    alone = [_out(engine, GREEDY, p) for p in prompts]
    biased = [{**GREEDY, "logit_bias": {"77": 100}}, {**GREEDY, "temperature": 1.0, "logit_bias": {"0": -50}}]
    engine.flush_cache()
    mixed = engine.generate(input_ids=[*prompts, PROMPT, PROMPT], sampling_params=[GREEDY] * 3 + biased)
    assert [r["output_ids"] for r in mixed[:3]] == alone and mixed[3]["output_ids"] == [77] * GREEDY["max_new_tokens"]


def test_the_grammar_wins_over_the_bias(engine):
    x = engine.tokenizer.encode("x")[-1]
    out = engine.generate(input_ids=PROMPT, sampling_params={"temperature": 0, "max_new_tokens": 12,
                                                             "regex": "(ab|cd)+", "logit_bias": {str(x): 100}})
    assert re.fullmatch("(ab|cd)+", out["text"]) and x not in out["output_ids"]


def test_overlap_gives_what_it_gives_without_it():
    jobs = [(PROMPT, GREEDY), ([9, 8, 7], {**GREEDY, "logit_bias": {"55": 100}}),
            ([3, 4], {**GREEDY, "max_new_tokens": 12, "logit_bias": {"10": 5.0, "11": -100}}),
            ([300, 301], {**GREEDY, "max_new_tokens": 10})]
    outs = []
    for overlap in (False, True):
        with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=4096, enable_overlap=overlap) as e:
            outs.append([r["output_ids"] for r in e.generate(input_ids=[p for p, _ in jobs],
                                                               sampling_params=[sp for _, sp in jobs])])
            steps = e.loop.step
    assert outs[0] == outs[1]
    assert outs[0][1] == [55] * GREEDY["max_new_tokens"]
    assert steps.num_overlapped_steps > 0 and steps.num_host_rows > 0


def test_the_language_gen_takes_logit_bias(engine):
    import radixflow.lang as rf

    @rf.function
    def prog(s):
        s += "Once upon a" + rf.gen("x", max_tokens=3, temperature=0, ignore_eos=True, logit_bias={1234: 100})

    state = prog.run(backend=rf.Engine(engine=engine))
    assert state["x"] == engine.tokenizer.decode([1234] * 3)
