"""LongRoPE (Phi-3.5, the 128K Phi-3 models): a sequence is rotated with the short factors while it
fits the original context and wholly with the long ones past it, as transformers' Phi-3 computes
it (a forward over the whole sequence; its generate drops the cache when a sequence first passes
the original context). Greedy output through the engine equals transformers' on prompts either
side of the switch, on sequences that cross it while decoding, and on every engine path that
touches it: chunked prefill, the radix cache, batching, overlap, n-gram drafts, mixed steps."""
from __future__ import annotations

import os
import random

import pytest
import torch

from radixflow.runtime import Engine
from radixflow.runtime.model.model_config import load_model_args
from test_model_parity import _args_of, _hf_greedy

SWITCH = 16  # original_max_position_embeddings: sequences longer than this use the long factors
GREEDY = {"temperature": 0.0, "max_new_tokens": 14, "ignore_eos": True}


def _factors(seed: int, low: float, high: float) -> list[float]:
    rng = random.Random(seed)
    return [round(rng.uniform(low, high), 3) for _ in range(8)]  # head_dim 16: 8 frequencies


def save_tiny_phi3(out: str, seed: int, **config):
    """A tiny random Phi-3 (original context SWITCH, 64 positions) with `config` saved at `out` with
    the demo tokenizer; returns the transformers model."""
    import transformers as tf

    from conftest import TOKENIZER_FILES
    from radixflow.runtime.model.demo import demo_model
    from radixflow.runtime.text.tokenizer import Tokenizer

    demo = demo_model("tiny")
    torch.manual_seed(seed)
    cfg = tf.Phi3Config(**{"vocab_size": Tokenizer.from_dir(demo).vocab_size, "hidden_size": 64,
                           "intermediate_size": 112, "num_hidden_layers": 2, "num_attention_heads": 4,
                           "num_key_value_heads": 2, "max_position_embeddings": 64,
                           "original_max_position_embeddings": SWITCH, "sliding_window": None,
                           "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None,
                           "pad_token_id": None, **config})
    hf = tf.Phi3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    hf.save_pretrained(out)
    for f in TOKENIZER_FILES:
        with open(os.path.join(demo, f), "rb") as src, open(os.path.join(out, f), "wb") as dst:
            dst.write(src.read())
    return hf


@pytest.fixture(scope="module")
def phi3_longrope(tmp_path_factory):
    """A tiny Phi-3 whose long factors differ strongly from its short ones (and a twin whose long
    factors equal the short ones: what never switching would compute)."""
    made = {}
    for name, long_factor in (("switching", _factors(2, 4.0, 40.0)), ("never", _factors(1, 1.0, 3.0))):
        out = str(tmp_path_factory.mktemp(f"phi3-longrope-{name}"))
        made[name] = (out, save_tiny_phi3(out, seed=7, rope_scaling={
            "type": "longrope", "short_factor": _factors(1, 1.0, 3.0), "long_factor": long_factor}))
    return made


def _prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed + n)
    return [rng.randrange(3, 400) for _ in range(n)]


# prompt lengths: decoding crosses the switch (5, 10), meets it (16: the first decode step's token
# is the 17th), starts past it (17, 30)
LENGTHS = [5, 10, 16, 17, 30]


def test_greedy_matches_transformers_either_side_of_the_switch(phi3_longrope):
    model_dir, hf = phi3_longrope["switching"]
    assert load_model_args(model_dir).long_rope_len == SWITCH
    prompts = [_prompt(n) for n in LENGTHS]
    with Engine(model_dir, dtype="float32", kv_cache_tokens=1024) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        assert engine.stats().num_preemptions == 0  # computing a sequence again at the switch is not one
    for p, out in zip(prompts, outs):
        assert out["output_ids"] == _hf_greedy(hf, p, GREEDY["max_new_tokens"]), len(p)
    # the switch changes these outputs (else this test could not see it)
    never = phi3_longrope["never"][1]
    assert any(_hf_greedy(never, p, GREEDY["max_new_tokens"]) != out["output_ids"] for p, out in zip(prompts, outs))


@pytest.mark.parametrize("options", [
    {"chunked_prefill_size": 8},
    {"enable_overlap": True},
    {"speculative_algorithm": "ngram", "speculative_ngram_min": 1, "speculative_ngram_max": 2},
    {"enable_mixed_chunk": True, "chunked_prefill_size": 8},
    {"disable_radix_cache": True},
    {"dtype": "bfloat16"},
])
def test_every_engine_path_switches_alike(phi3_longrope, options):
    """One engine, requests one after another and together: cached prefixes cross from short to
    long sequences and back (a long sequence's KV is cached apart: the same tokens' short KV
    differs), chunks, overlap, drafts (none past the switch while short), mixed steps."""
    model_dir, _ = phi3_longrope["switching"]
    long_prompt = _prompt(30, seed=5)
    repeat = long_prompt[:9] + _prompt(3)  # a short request on the long one's first tokens
    prompts = [long_prompt, repeat, long_prompt[:12] + long_prompt[:12], _prompt(10, seed=8)]
    options = {"dtype": "float32", **options}
    with Engine(model_dir, kv_cache_tokens=1024, **options) as engine:
        alone = [engine.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in prompts]
        together = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
    with Engine(model_dir, kv_cache_tokens=1024, dtype=options["dtype"], disable_radix_cache=True) as engine:
        fresh = [engine.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in prompts]
    assert alone == fresh and together == fresh
    if options["dtype"] == "float32":
        hf = phi3_longrope["switching"][1]
        assert fresh == [_hf_greedy(hf, p, GREEDY["max_new_tokens"]) for p in prompts]


class _Oracle:
    """A drafter proposing each request's true next tokens (transformers' greedy continuation), so
    that every step verifies drafts, past the switch too: a draft's verify row computed with the
    wrong factors gives another argmax than the draft, and the output changes."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]]) -> None:
        self.continuations = continuations

    def propose(self, reqs, room):
        out = []
        for req in reqs:
            truth = self.continuations[tuple(req.prompt_ids)]
            mine = truth[len(req.output_ids): len(req.output_ids) + min(3, room)] if req.sample_row else []
            room -= len(mine)
            out.append(mine)
        return out


def test_drafts_are_verified_with_the_factors_of_their_positions(phi3_longrope):
    model_dir, hf = phi3_longrope["switching"]
    prompts = [_prompt(n, seed=11) for n in (9, 13, 15)]
    params = {**GREEDY, "max_new_tokens": 12}
    truth = {tuple(p): _hf_greedy(hf, p, 16) for p in prompts}
    with Engine(model_dir, dtype="float32", kv_cache_tokens=1024, speculative_algorithm="ngram") as engine:
        engine.scheduler.drafter = _Oracle(truth)
        for p in prompts:
            assert engine.generate(input_ids=p, sampling_params=params)["output_ids"] == truth[tuple(p)][:12], len(p)


def test_prompt_logprobs_of_a_long_prompt_are_computed_with_the_long_factors(phi3_longrope):
    """A prompt past the switch is scored as transformers' one forward over it scores it."""
    model_dir, hf = phi3_longrope["switching"]
    prompt = _prompt(24, seed=3)
    with Engine(model_dir, dtype="float32", kv_cache_tokens=1024) as engine:
        meta = engine.generate(input_ids=prompt, return_logprob=True, logprob_start_len=0,
                               sampling_params={"max_new_tokens": 0})["meta_info"]
    ours = torch.tensor([lp for lp, _, _ in meta["input_token_logprobs"][1:]])
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), -1)
    want = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-4)


def test_longrope_config_is_read_as_transformers_reads_it(tmp_path):
    """Phi-3.5-mini's form: `type: longrope` with factors, the top-level
    original_max_position_embeddings (4096 when absent), factor max / original when absent."""
    scaling = {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}
    args = _args_of(tmp_path, "Phi3ForCausalLM", rope_scaling=scaling, max_position_embeddings=131072,
                    original_max_position_embeddings=4096)
    assert args.long_rope_len == 4096 and args.rope_scaling["factor"] == 32.0
    args = _args_of(tmp_path, "Phi3ForCausalLM", rope_scaling={**scaling, "original_max_position_embeddings": 64},
                    max_position_embeddings=8192)
    assert args.long_rope_len == 4096  # the nested one is not read (transformers 5)


@pytest.mark.parametrize("fields, match", [
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 3, "long_factor": [2.0] * 4}},
     r"short_factor must list 4 positive numbers"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0, 0, 1, 1]}},
     r"long_factor must list 4 positive numbers"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4},
      "original_max_position_embeddings": 0}, r"original_max_position_embeddings must be a positive integer"),
])
def test_a_malformed_longrope_is_refused(tmp_path, fields, match):
    with pytest.raises(ValueError, match=match):
        _args_of(tmp_path, "Phi3ForCausalLM", **fields)


def test_longrope_outside_phi3_is_refused(tmp_path):
    """transformers switches the factors mid-generation only in Phi-3's own generate."""
    cfg = {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}
    with pytest.raises(ValueError, match="longrope is supported for Phi3ForCausalLM only"):
        _args_of(tmp_path, "LlamaForCausalLM", rope_scaling=cfg)


def test_an_unloaded_adapters_long_sequences_kv_is_freed_too(phi3_longrope, tmp_path):
    """The KV of an adapter's long sequences lives in a namespace of its own: unloading the adapter
    frees it with the short sequences'."""
    from lora_adapters import write_adapter

    model_dir, _ = phi3_longrope["switching"]
    adapter = write_adapter(str(tmp_path / "a"), model_dir, rank=4)
    with Engine(model_dir, dtype="float32", kv_cache_tokens=1024, lora_modules=[f"a={adapter}"]) as engine:
        engine.generate(input_ids=_prompt(6), sampling_params=GREEDY)
        base_cached = engine.scheduler.cache.total_size()
        engine.generate(input_ids=[_prompt(30), _prompt(6, seed=1)], sampling_params=GREEDY, lora="a")
        assert engine.scheduler.cache.total_size() > base_cached
        engine.unload_lora_adapter("a")
        assert engine.scheduler.cache.total_size() == base_cached  # the base's KV stays


def test_decode_graphs_read_each_rows_table(phi3_longrope):
    """A decode graph's static buffers carry each row's RoPE table row (long sequences past the
    short rows): on CPU an eager stand-in replays the forward over them (test_cuda_graph.py)."""
    from radixflow.runtime.core.cuda_graph import DecodeGraphRunner
    from test_cuda_graph import EagerCapture

    model_dir, hf = phi3_longrope["switching"]
    prompts = [_prompt(n) for n in LENGTHS]
    capture = EagerCapture()
    config = dict(device="cpu", dtype="float32", attention_backend="torch", kv_cache_tokens=1024, max_num_seqs=8)
    with Engine(model_dir, **config) as engine:
        runner = engine.runner
        runner.graph_runner = DecodeGraphRunner(runner.model, runner.attention, runner.req_pool.table, 8, capture)
        outs = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
    assert outs == [_hf_greedy(hf, p, GREEDY["max_new_tokens"]) for p in prompts]
    assert sum(capture.replays.values()) >= GREEDY["max_new_tokens"] - 2  # the decode steps went through it


@pytest.mark.gpu
def test_gpu_triton_kernels_and_graphs_read_the_long_rows(phi3_longrope):
    """On CUDA (the Triton RoPE kernel reading the doubled table; decode graphs on and off): fp32
    greedy output equals transformers' either side of the switch and across it."""
    model_dir, hf = phi3_longrope["switching"]
    prompts = [_prompt(n) for n in LENGTHS]
    for graphs in (False, True):
        with Engine(model_dir, device="cuda", dtype="float32", kv_cache_tokens=1024, cuda_graph_max_bs=8,
                    disable_cuda_graph=not graphs) as engine:
            assert (engine.runner.graph_capture is not None) == graphs
            outs = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
        assert outs == [_hf_greedy(hf, p, GREEDY["max_new_tokens"]) for p in prompts]
