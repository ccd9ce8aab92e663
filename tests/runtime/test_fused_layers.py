"""A CPU bf16 forward through every decoder layer in one native call (runtime/model/fused_layers.py):
the layer-by-layer path's tokens and logprobs bit for bit on decode and extend steps, taken where
it applies, left (the layer path runs) where it does not, and a bad slot or layout refused before
anything is written."""
from __future__ import annotations

import random

import pytest
import torch

from radixflow.kernels import native, native_layers, torch_decode
from radixflow.runtime.engine import Engine
from radixflow.runtime.model import fused_layers
from radixflow.runtime.model.demo import demo_model

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture
def fused_runs(monkeypatch):
    """A list that grows by (is it a decode step, its token count) per fused step; skips where the
    kernels cannot run it (no compiler, no AVX512-BF16 projections, or torch's summation order
    unknown)."""
    lib = native.library()
    if lib is None or not lib.linear_lanes() or not native_layers.sum_lanes():
        pytest.skip("the fused decode step needs the native kernels with AVX512-BF16")
    runs: list[tuple[bool, int]] = []
    real = fused_layers.FusedLayers.run

    def spy(self, x, cos, sin, out_slots, step, *args):
        runs.append((int(step[0]) == native_layers.FUSED_DECODE, x.shape[0]))
        return real(self, x, cos, sin, out_slots, step, *args)

    monkeypatch.setattr(fused_layers.FusedLayers, "run", spy)
    return runs


def _prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 60) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 250) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def _both_ways(monkeypatch, model: str, prompts, runs: list[int], new_tokens: int = 12, **engine_kw):
    """{fused on: results, off: results} of one greedy batch with logprobs; runs cleared between."""
    got, taken = {}, {}
    for on in (True, False):
        monkeypatch.setattr(fused_layers, "ENABLED", on)
        runs.clear()
        with Engine(model, dtype="bfloat16", kv_cache_tokens=8192, **engine_kw) as e:
            got[on] = e.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": new_tokens},
                                 return_logprob=True)
        taken[on] = list(runs)
    assert not taken[False]
    return got, taken[True]


def _tokens_and_logprobs(results):
    return [(r["output_ids"], [e[:2] for e in r["meta_info"]["output_token_logprobs"]]) for r in results]


@pytest.mark.parametrize("threads", [1, 2])
def test_the_tiny_model_decodes_the_same_fused(monkeypatch, on_threads, fused_runs, threads):
    prompts = _prompts(6)
    got, taken = on_threads(threads, _both_ways, monkeypatch, demo_model("tiny"), prompts, fused_runs)
    assert (True, 6) in taken  # decode steps of the full batch went through it
    # and every prompt token's prefill (one step, or more where the loop woke before the batch's
    # last request arrived: Engine.generate submits the prompts one by one)
    assert sum(n for decode, n in taken if not decode) == sum(len(p) for p in prompts)
    assert _tokens_and_logprobs(got[True]) == _tokens_and_logprobs(got[False])
    assert all(len(r["output_ids"]) == 12 for r in got[True])


def test_a_model_with_qkv_bias_decodes_the_same_fused(monkeypatch, hf_checkpoint, fused_runs):
    model_dir, _ = hf_checkpoint("qwen2")
    got, taken = _both_ways(monkeypatch, model_dir, _prompts(4, seed=1), fused_runs)
    assert taken
    assert _tokens_and_logprobs(got[True]) == _tokens_and_logprobs(got[False])


@pytest.mark.parametrize("chunk", [None, 16])
def test_extend_steps_over_cached_prefixes_are_the_same_fused(monkeypatch, fused_runs, chunk):
    """Turns extending cached contexts (and, chunked, prompts prefilled 16 tokens a step)."""
    rng = random.Random(6)
    first = _prompts(4, seed=6, lo=20, hi=70)
    turns = [p + [rng.randrange(5, 250) for _ in range(rng.randrange(1, 30))] for p in first]
    got, taken = {}, {}
    for on in (True, False):
        monkeypatch.setattr(fused_layers, "ENABLED", on)
        fused_runs.clear()
        kw = {} if chunk is None else {"chunked_prefill_size": chunk}
        with Engine(demo_model("tiny"), dtype="bfloat16", kv_cache_tokens=4096, **kw) as e:
            e.generate(input_ids=first, sampling_params={**GREEDY, "max_new_tokens": 2})
            got[on] = e.generate(input_ids=turns, sampling_params={**GREEDY, "max_new_tokens": 5},
                                 return_logprob=True, logprob_start_len=0)
        taken[on] = list(fused_runs)
    assert not taken[False] and [t for t in taken[True] if not t[0]]
    assert _tokens_and_logprobs(got[True]) == _tokens_and_logprobs(got[False])
    prompt_logprobs = [[e[:2] for e in r["meta_info"]["input_token_logprobs"]] for r in got[True]]
    assert prompt_logprobs == [[e[:2] for e in r["meta_info"]["input_token_logprobs"]] for r in got[False]]


def test_mixed_steps_keep_the_layer_path(monkeypatch, fused_runs):
    """Prefill chunks of a long prompt beside short ones decoding (mixed steps): those steps run
    layer by layer, the batch's tokens and logprobs the same either way."""
    steps = []  # (a mixed step, it took the native call)
    real = fused_layers.run_layers

    def spy(model, fb, *args):
        out = real(model, fb, *args)
        steps.append((fb.parts is not None, out is not None))
        return out

    monkeypatch.setattr(fused_layers, "run_layers", spy)
    prompts = _prompts(3, seed=7, lo=4, hi=9) + _prompts(1, seed=8, lo=200, hi=201)
    got, taken = _both_ways(monkeypatch, demo_model("tiny"), prompts, fused_runs, 16, enable_mixed_chunk=True,
                            chunked_prefill_size=32)
    assert (True, False) in steps and (True, True) not in steps and (False, True) in steps
    assert _tokens_and_logprobs(got[True]) == _tokens_and_logprobs(got[False])


def test_a_model_with_qk_norm_keeps_the_layer_path(monkeypatch, hf_checkpoint, fused_runs):
    model_dir, _ = hf_checkpoint("qwen3")
    got, taken = _both_ways(monkeypatch, model_dir, _prompts(3, seed=2), fused_runs, new_tokens=4)
    assert not taken
    assert _tokens_and_logprobs(got[True]) == _tokens_and_logprobs(got[False])


def test_steps_with_a_shared_prefix_read_once_keep_the_layer_path(monkeypatch, fused_runs):
    """A group whose shared prefix the decode kernel reads once for all members (the threshold
    lowered so this small group splits): those steps run layer by layer, with the same tokens."""
    monkeypatch.setattr(torch_decode, "NATIVE_SHARED_MIN_READS", 0)
    rng = random.Random(3)
    prefix = [rng.randrange(5, 250) for _ in range(100)]
    prompts = [prefix + [rng.randrange(5, 250) for _ in range(4)] for _ in range(3)]
    got, taken = {}, {}
    for on in (True, False):
        monkeypatch.setattr(fused_layers, "ENABLED", on)
        fused_runs.clear()
        with Engine(demo_model("tiny"), dtype="bfloat16", kv_cache_tokens=4096) as e:
            e.generate(input_ids=prompts[:1], sampling_params={**GREEDY, "max_new_tokens": 0})  # cache the prefix
            got[on] = e.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 6},
                                 return_logprob=True)
        taken[on] = list(fused_runs)
    assert (True, 3) not in taken[True]  # no decode step of the three sharing requests took it
    assert _tokens_and_logprobs(got[True]) == _tokens_and_logprobs(got[False])


def test_contexts_cut_into_pieces_for_idle_threads_keep_the_layer_path(monkeypatch, on_threads, fused_runs):
    """One request, two threads, a context long enough to be read in two pieces at once."""
    monkeypatch.setattr(torch_decode, "SPLIT_PIECE_TOKENS", 64)
    prompt = _prompts(1, seed=4, lo=300, hi=301)
    got, taken = on_threads(2, _both_ways, monkeypatch, demo_model("tiny"), prompt, fused_runs, 4)
    assert taken and not [t for t in taken if t[0]]  # the prefill only
    assert _tokens_and_logprobs(got[True]) == _tokens_and_logprobs(got[False])


def test_lora_rows_keep_the_layer_path(monkeypatch, fused_runs, tmp_path):
    from lora_adapters import write_adapter

    model = demo_model("tiny")
    adapter = write_adapter(str(tmp_path / "a"), model, seed=3)
    monkeypatch.setattr(fused_layers, "ENABLED", True)
    with Engine(model, dtype="bfloat16", kv_cache_tokens=4096, lora_modules=[f"a={adapter}"]) as e:
        prompt = _prompts(1, seed=5)[0]
        with_lora = e.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 6}, lora="a")
        assert not fused_runs
        base = e.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 6})
        assert fused_runs  # the same engine's base rows take it
    monkeypatch.setattr(fused_layers, "ENABLED", False)
    with Engine(model, dtype="bfloat16", kv_cache_tokens=4096, lora_modules=[f"a={adapter}"]) as e:
        assert e.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 6},
                          lora="a")["output_ids"] == with_lora["output_ids"]
        assert e.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 6})["output_ids"] \
            == base["output_ids"]


def test_a_bad_slot_or_layout_is_refused_before_any_write(fused_runs):
    with Engine(demo_model("tiny"), dtype="bfloat16", kv_cache_tokens=1024) as e:
        e.generate(input_ids=[5, 6, 7], sampling_params={**GREEDY, "max_new_tokens": 3})
        model, pool = e.runner.model, e.runner.kv_pool
        fused = model.fused_layers[1]
        assert isinstance(fused, fused_layers.FusedLayers)
        num_slots = pool.k_caches[0].shape[0]
        before = [c.clone() for c in pool.k_caches + pool.v_caches]
        x = torch.zeros(2, model.args.hidden_size, dtype=torch.bfloat16)
        rope = torch.zeros(2, model.args.head_dim)
        decode = native_layers.fused_decode_step(torch.tensor([1, 2]), torch.tensor([0, 1, 2]))
        for bad in (num_slots, -1):
            with pytest.raises(ValueError, match="out of the pool's range"):
                fused.run(x, rope, rope, torch.tensor([1, bad]), decode[0], 0.25)
        table = torch.zeros(4, 8, dtype=torch.int32)
        table[0, :2] = torch.tensor([1, 2])
        one = torch.tensor([0])
        # a row past the table, then a slot past the pool
        for rows, table_slot in ((torch.tensor([4]), 1), (one, num_slots)):
            table[0, 1] = table_slot
            extend = native_layers.fused_extend_step(table, (rows, one, torch.tensor([2]), one), 2, num_slots)
            with pytest.raises(ValueError, match="out of range"):
                fused.run(x, rope, rope, torch.tensor([1, 2]), extend[0], 0.25)
        assert all(torch.equal(a, b) for a, b in zip(before, pool.k_caches + pool.v_caches))
