"""`return_hidden_states` (SGLang's): meta_info["hidden_states"] holds the final hidden state,
after the model's last norm, of every position a request fed the model (its prompt's first,
[prompt_tokens][hidden], then one [hidden] per output token but the last), equal to transformers'
last hidden state on prompt + output[:-1], through every path a request takes: batched, beside
plain and embedding requests, on a cached prefix, in chunks, preempted and resumed, overlapped,
speculative, streamed, through the core process."""
from __future__ import annotations

import asyncio

import pytest
import torch

from radixflow.runtime import Engine, EngineClient
from radixflow.runtime.core.request import OutputOptions
from radixflow.runtime.sampling_params import SamplingParams

PROMPTS = [[5, 77, 300, 12, 9, 41, 8, 8, 3], [901, 44, 2, 17], [5, 77, 300, 12, 9, 41, 60, 61, 62, 63, 64]]
GREEDY = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}


def _hf_hidden(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf.model(torch.tensor([ids])).last_hidden_state[0].float()


def _stacked(result: dict) -> torch.Tensor:
    """meta_info["hidden_states"] as one [positions, hidden] tensor, its shape checked."""
    hidden = result["meta_info"]["hidden_states"]
    prompt, outputs = result["meta_info"]["prompt_tokens"], len(result["output_ids"])
    assert len(hidden) == outputs  # SGLang's count: the prompt's block, then one per fed output token
    assert len(hidden[0]) == prompt and all(isinstance(row, list) and not isinstance(row[0], list) for row in hidden[1:])
    return torch.tensor([*hidden[0], *hidden[1:]])


def _check_against(hf, ids: list[int], result: dict) -> None:
    want = _hf_hidden(hf, ids + result["output_ids"][:-1])
    torch.testing.assert_close(_stacked(result), want, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def llama(hf_checkpoint):
    return hf_checkpoint("llama3")


@pytest.mark.parametrize("family", ["llama3", "gemma3"])
def test_hidden_states_equal_transformers_last_hidden_state(hf_checkpoint, family):
    model_dir, hf = hf_checkpoint(family)
    with Engine(model_dir, dtype="float32", kv_cache_tokens=512, enable_return_hidden_states=True) as engine:
        results = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY, return_hidden_states=True)
        plain = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        engine.check_accounting()
    for ids, result, other in zip(PROMPTS, results, plain):
        assert len(result["meta_info"]["hidden_states"][0][0]) == hf.config.hidden_size
        _check_against(hf, ids, result)
        assert result["output_ids"] == other["output_ids"] and "hidden_states" not in other["meta_info"]


def test_cached_prefixes_chunks_and_company_change_nothing(llama):
    """A cached prompt is computed again for its hidden states (the cache keeps KV only); chunked
    prefill, plain and embedding requests in the same steps and a prefill-only request change nothing."""
    model_dir, hf = llama
    with Engine(model_dir, dtype="float32", kv_cache_tokens=512, chunked_prefill_size=4,
                enable_return_hidden_states=True) as engine:
        engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)  # every prompt cached
        assert engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)["meta_info"]["cached_tokens"] > 0

        async def together():
            async def one(ids, **kw):
                last = None
                async for chunk in engine.generate_stream(input_ids=ids, sampling_params=GREEDY, **kw):
                    last = chunk
                return last

            embed = engine.generate_stream(input_ids=PROMPTS[1], sampling_params={"max_new_tokens": 0}, embed=True)

            async def embedding():
                async for chunk in embed:
                    last = chunk
                return last

            return await asyncio.gather(one(PROMPTS[0], return_hidden_states=True), one(PROMPTS[1]),
                                        one(PROMPTS[2], return_hidden_states=True), embedding())

        first, plain, third, embedded = asyncio.run(together())
        prefill_only = engine.generate(input_ids=PROMPTS[2], sampling_params={"max_new_tokens": 0},
                                       return_hidden_states=True)
        engine.check_accounting()
    _check_against(hf, PROMPTS[0], first)
    _check_against(hf, PROMPTS[2], third)
    assert first["meta_info"]["cached_tokens"] == 0 and plain["meta_info"]["cached_tokens"] > 0
    assert "hidden_states" not in plain["meta_info"] and embedded["embedding"] is not None
    # a prefill-only request: its prompt's block alone
    torch.testing.assert_close(torch.tensor(prefill_only["meta_info"]["hidden_states"][0]), _hf_hidden(hf, PROMPTS[2]),
                               rtol=1e-4, atol=1e-5)
    assert len(prefill_only["meta_info"]["hidden_states"]) == 1


@pytest.mark.parametrize("cache", [{}, {"disable_radix_cache": True}], ids=["cached", "no-cache"])
def test_a_preempted_request_keeps_each_position_once(llama, cache):
    """Retracted for a request of higher priority and readmitted, it takes what the cache kept
    of its positions, or (no cache) computes them again: each is kept once, and the states
    equal the ones it gets alone."""
    model_dir, hf = llama
    long = {**GREEDY, "max_new_tokens": 24}
    with Engine(model_dir, dtype="float32", kv_cache_tokens=512, max_num_seqs=1, enable_priority_scheduling=True,
                enable_return_hidden_states=True, **cache) as engine:
        alone = engine.generate(input_ids=PROMPTS[0], sampling_params=long, return_hidden_states=True)

        async def run():
            async def one(ids, params, priority):
                last = None
                async for chunk in engine.generate_stream(input_ids=ids, sampling_params=params, priority=priority,
                                                          return_hidden_states=True):
                    last = chunk
                return last

            low = asyncio.create_task(one(PROMPTS[0], long, 0))
            while engine.stats().num_running == 0:
                await asyncio.sleep(0.002)
            while True:  # some of its output decoded before it is preempted
                await asyncio.sleep(0.002)
                if engine.stats().generated_tokens >= 3:
                    break
            high = asyncio.create_task(one(PROMPTS[1], GREEDY, 50))
            return await low, await high

        low, high = asyncio.run(run())
        assert engine.stats().num_preemptions == 1
        engine.check_accounting()
    assert low["output_ids"] == alone["output_ids"]
    torch.testing.assert_close(_stacked(low), _stacked(alone), rtol=1e-4, atol=1e-5)
    _check_against(hf, PROMPTS[0], low)
    _check_against(hf, PROMPTS[1], high)


@pytest.mark.parametrize("config", [{"enable_overlap": True}, {"speculative_algorithm": "ngram"}],
                         ids=["overlap", "ngram"])
def test_overlap_and_speculative_engines_give_the_same_states(llama, config):
    """Its steps do not overlap and it is not drafted for: the states and the output are those
    of plain steps."""
    model_dir, hf = llama
    repeat = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]  # text the n-gram lookup drafts for
    with Engine(model_dir, dtype="float32", kv_cache_tokens=512, enable_return_hidden_states=True, **config) as engine:
        alone = engine.generate(input_ids=repeat, sampling_params={**GREEDY, "max_new_tokens": 12})
        results = engine.generate(input_ids=[repeat, PROMPTS[1]], sampling_params={**GREEDY, "max_new_tokens": 12},
                                  return_hidden_states=True)
        engine.check_accounting()
    assert results[0]["output_ids"] == alone["output_ids"]
    for ids, result in zip([repeat, PROMPTS[1]], results):
        _check_against(hf, ids, result)
        assert "spec_verify_ct" not in result["meta_info"]


def test_through_the_core_process(llama):
    model_dir, hf = llama
    with EngineClient(model_dir, dtype="float32", kv_cache_tokens=512, enable_return_hidden_states=True) as client:
        result = client.generate(input_ids=PROMPTS[0], sampling_params=GREEDY, return_hidden_states=True)

        async def stream():
            chunks = []
            async for chunk in client.generate_stream(input_ids=PROMPTS[1], sampling_params=GREEDY,
                                                      return_hidden_states=True):
                chunks.append(chunk)
            return chunks

        chunks = asyncio.run(stream())
        client.check_accounting()
    _check_against(hf, PROMPTS[0], result)
    assert all("hidden_states" not in c["meta_info"] for c in chunks[:-1])  # the last chunk carries them
    _check_against(hf, PROMPTS[1], chunks[-1])


class _NoSink:
    def post(self, step) -> None:
        raise AssertionError("a refused request has no outputs")


def test_refused_without_the_flag_and_for_a_non_boolean():
    from radixflow.runtime.model.demo import demo_model

    with Engine(demo_model("tiny")) as engine:
        with pytest.raises(ValueError, match="--enable-return-hidden-states"):
            engine.generate("hi", {"max_new_tokens": 1}, return_hidden_states=True)

        async def stream():
            async for _ in engine.generate_stream("hi", {"max_new_tokens": 1}, return_hidden_states=True):
                pass

        with pytest.raises(ValueError, match="--enable-return-hidden-states"):
            asyncio.run(stream())
        with pytest.raises(ValueError, match="return_hidden_states"):
            engine.generate("hi", {"max_new_tokens": 1}, return_hidden_states="yes")
        with pytest.raises(ValueError, match="--enable-return-hidden-states"):  # the core process's way in
            engine.start_stream([5, 6], SamplingParams.from_dict({"max_new_tokens": 1}),
                                OutputOptions(return_hidden_states=True), None, None, None, _NoSink())
        out = engine.generate("hi", {"max_new_tokens": 1}, return_hidden_states=False)
        assert "hidden_states" not in out["meta_info"]
        engine.check_accounting()


def test_prompt_logprobs_beside_hidden_states_are_unchanged(llama):
    """Hidden states kept for every prompt row beside prompt logprobs: the logprobs read their own rows."""
    model_dir, hf = llama
    with Engine(model_dir, dtype="float32", kv_cache_tokens=512, chunked_prefill_size=4,
                enable_return_hidden_states=True) as engine:
        kw = {"return_logprob": True, "logprob_start_len": 3, "top_logprobs_num": 2}
        plain = engine.generate(input_ids=PROMPTS[2], sampling_params=GREEDY, **kw)
        both = engine.generate(input_ids=PROMPTS[2], sampling_params=GREEDY, return_hidden_states=True, **kw)
        engine.check_accounting()
    _check_against(hf, PROMPTS[2], both)
    for key in ("input_token_logprobs", "input_top_logprobs", "output_token_logprobs"):
        got, want = _entries(both["meta_info"][key]), _entries(plain["meta_info"][key])
        assert [token for token, _ in got] == [token for token, _ in want] and len(got) > 0, key
        torch.testing.assert_close(torch.tensor([lp for _, lp in got]), torch.tensor([lp for _, lp in want]))


def _entries(values: list) -> list[tuple[int, float]]:
    """[(token, logprob)] of a logprob list, or of a top-logprob list's lists, in order (a null
    logprob, the first prompt token's, as 0)."""
    flat = [e for v in values if v for e in (v if isinstance(v[0], list) else [v])]
    return [(token, 0.0 if lp is None else lp) for lp, token, _ in flat]


def test_hidden_states_project_no_extra_logit_rows(llama):
    """Hidden states are kept for every new token, but only the rows sampled or scored are projected
    onto the vocabulary: a 9-token prompt's prefill projects 1 row, as a plain request's does
    (all 9 would be a [prompt, vocab] fp32 tensor, gigabytes for a long prompt of a large model)."""
    model_dir, hf = llama
    with Engine(model_dir, dtype="float32", kv_cache_tokens=512, enable_return_hidden_states=True,
                disable_radix_cache=True) as engine:
        model, projected = engine.runner.model, []
        forward = model.forward

        def counting(fb, attn):
            logits = forward(fb, attn)
            projected.append(logits.shape[0])
            return logits

        model.forward = counting
        result = engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY, return_hidden_states=True)
        engine.check_accounting()
    _check_against(hf, PROMPTS[0], result)
    assert projected == [1] * GREEDY["max_new_tokens"]
