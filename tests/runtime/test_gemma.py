"""Gemma 1, 2 and 3 (text); Gemma 2 and 3: sliding-window layers (Gemma 3's with their own RoPE base), norms around
both branches, GELU-tanh MLP, scaled embeddings, soft-capped logits (Gemma 2: and attention
scores). Parity with transformers on the plain prefill and greedy paths is in
test_model_parity.py (FAMILIES); here the engine's other paths (cached prefixes, chunks, the
Triton ops and attention, speculative decoding, bf16, decode graphs) and the config."""
from __future__ import annotations

import json
import random

import pytest
import torch

from radixflow.runtime import Engine
from radixflow.runtime.core.model_runner import derive_shape
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.model.model_config import load_model_args
from engine_runs import assert_triton_as_torch
from test_model_parity import _hf_greedy

GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
GEMMAS = ["gemma", "gemma2", "gemma3"]


def _prompts(vocab: int) -> tuple[list[int], list[list[int]]]:
    """A warm-up prompt, then prompts on a cached prefix of it (past the 4-token window) and fresh ones."""
    rng = random.Random(3)
    shared = [rng.randrange(vocab) for _ in range(23)]
    batch = [shared + [rng.randrange(vocab) for _ in range(6)], [rng.randrange(vocab) for _ in range(13)],
             shared[:9] + [rng.randrange(vocab) for _ in range(2)]]
    return shared + [rng.randrange(vocab) for _ in range(3)], batch


@pytest.mark.parametrize("family", GEMMAS)
def test_cached_prefixes_and_chunks_match_transformers(hf_checkpoint, family):
    """A window reaches back into a cached prefix and across prefill chunks: the engine's greedy
    tokens are transformers' on the whole sequence."""
    model_dir, hf = hf_checkpoint(family)
    warm, batch = _prompts(hf.config.vocab_size)
    with Engine(model_dir, dtype="float32", kv_cache_tokens=1024, chunked_prefill_size=8) as engine:
        engine.generate(input_ids=warm, sampling_params=GREEDY)
        outs = engine.generate(input_ids=batch, sampling_params=GREEDY)
    assert [o["meta_info"]["cached_tokens"] for o in outs][0] >= 23
    for prompt, out in zip(batch, outs):
        assert out["output_ids"] == _hf_greedy(hf, prompt, GREEDY["max_new_tokens"])


@pytest.mark.parametrize("family", GEMMAS)
def test_triton_ops_and_attention_equal_the_torch_path(hf_checkpoint, family, monkeypatch):
    """The model as CUDA runs it (fused norms, RoPE, GELU-and-mul; the Triton extend with its
    window and decode on the cut table), here in the Triton interpreter, gives the torch path's
    greedy tokens and logprobs."""
    model_dir, hf = hf_checkpoint(family)
    warm, batch = _prompts(hf.config.vocab_size)
    assert_triton_as_torch(model_dir, monkeypatch, GREEDY, 6, warm, batch)


@pytest.mark.parametrize("family", GEMMAS)
def test_speculative_decoding_keeps_the_greedy_tokens(hf_checkpoint, family):
    """Verify rows run as decode rows, each through its own window."""
    model_dir, _ = hf_checkpoint(family)
    prompt = [7, 8, 9, 10, 11, 7, 8, 9, 10, 11, 7, 8, 9]  # repeats, so drafts are proposed
    outs = []
    for spec in ({}, {"speculative_algorithm": "ngram"}):
        with Engine(model_dir, dtype="float32", kv_cache_tokens=512, **spec) as engine:
            outs.append(engine.generate(input_ids=[prompt, prompt[2:]], sampling_params={**GREEDY, "max_new_tokens": 20}))
    assert [o["output_ids"] for o in outs[1]] == [o["output_ids"] for o in outs[0]]
    assert sum(o["meta_info"].get("spec_verify_ct", 0) for o in outs[1]) > 0


@pytest.mark.parametrize("family", GEMMAS)
def test_bf16_stays_close_to_fp32(hf_checkpoint, family):
    """bf16 on CPU takes the layer-by-layer path (the one-call native layers decline Gemma), its
    decode the native kernel through the window's cut table: the prompt's logprobs, and those of
    12 tokens decoded past the window, within 0.1 of fp32 scoring the same tokens."""
    model_dir, _ = hf_checkpoint(family)
    prompt = list(range(3, 40))
    with Engine(model_dir, dtype="bfloat16", kv_cache_tokens=512) as engine:
        out = engine.generate(input_ids=prompt, return_logprob=True, logprob_start_len=0,
                              sampling_params={"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True})
    meta = out["meta_info"]
    ours = [lp for lp, _, _ in meta["input_token_logprobs"][1:] + meta["output_token_logprobs"]]
    with Engine(model_dir, dtype="float32", kv_cache_tokens=512) as engine:  # every token scored at prefill
        ref = engine.generate(input_ids=prompt + out["output_ids"], return_logprob=True, logprob_start_len=0,
                              sampling_params={"max_new_tokens": 0})["meta_info"]["input_token_logprobs"][1:]
    torch.testing.assert_close(torch.tensor(ours), torch.tensor([lp for lp, _, _ in ref]), rtol=0, atol=0.1)


def _config(tmp_path, **fields) -> str:
    cfg = {"architectures": ["Gemma3ForCausalLM"], "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 1, **fields}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def test_a_hub_style_config_reads_as_transformers_reads_it(tmp_path):
    """gemma-3-1b-it's config.json: rope_theta / rope_local_base_freq / rope_scaling at the top, the
    window layers from sliding_window_pattern (every sixth layer global), head_dim 256 by default."""
    args = load_model_args(_config(tmp_path, sliding_window=512, sliding_window_pattern=6, rope_theta=1e6,
                                   rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0},
                                   query_pre_attn_scalar=256, max_position_embeddings=32768))
    assert args.window_layers == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10) and args.layer_windows[0] == 512
    assert (args.rope_theta, args.local_rope_theta, args.rope_scaling["factor"]) == (1e6, 1e4, 8.0)
    assert args.head_dim == 256 and args.sm_scale == 256 ** -0.5 and args.hidden_act == "gelu_tanh"
    assert args.tie_word_embeddings and args.qk_norm and args.pre_norms and args.post_norms
    assert args.embedding_multiplier == 32 ** 0.5 and args.norm_weight_offset == 1.0
    # the window is attended, not a cap on the context
    assert derive_shape(EngineConfig(device="cpu"), args).max_context_len == 32768


def test_a_multimodal_checkpoint_serves_its_language_model(tmp_path):
    """Gemma 3 4B and up (Gemma3ForConditionalGeneration): the text config nested, the language
    model's tensors under language_model., a vision tower beside them that is not loaded. Text
    in, the same logits and greedy tokens as transformers' multimodal model given no image."""
    import shutil

    import transformers as tf

    from conftest import TOKENIZER_FILES
    from radixflow.runtime.model.demo import demo_model
    from test_model_parity import _our_logits

    text = dict(vocab_size=300, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=8,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-5, sliding_window=4,
                layer_types=["sliding_attention", "full_attention"])
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    cfg = tf.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=299,
                          boi_token_index=297, eoi_token_index=298)
    torch.manual_seed(0)
    hf = tf.Gemma3ForConditionalGeneration(cfg).float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.08 if p.dim() >= 2 else 0.1)
    hf.save_pretrained(str(tmp_path))
    for f in TOKENIZER_FILES:
        shutil.copy(f"{demo_model('tiny')}/{f}", tmp_path)
    args = load_model_args(str(tmp_path))
    assert args.architecture == "Gemma3ForCausalLM" and args.window_layers == (0,) and args.vocab_size == 300
    prompt = torch.randint(0, 297, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([prompt])).logits[0].float()
    assert (_our_logits(str(tmp_path), [prompt])[0] - ref).abs().max().item() < 1e-4
    with Engine(str(tmp_path), dtype="float32", kv_cache_tokens=256) as engine:
        out = engine.generate(input_ids=prompt[:7], sampling_params=GREEDY)
    assert out["output_ids"] == _hf_greedy(hf, prompt[:7], GREEDY["max_new_tokens"])


def test_a_hub_multimodal_config_takes_transformers_defaults(tmp_path):
    """gemma-3-4b-it's config.json names only what differs from Gemma3TextConfig's defaults, and
    its end tokens (<end_of_turn> 106 too) at the top level."""
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "eos_token_id": [1, 106], "torch_dtype": "bfloat16",
           "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                           "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                           "sliding_window": 1024},
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    args = load_model_args(str(tmp_path))
    assert (args.vocab_size, args.num_heads, args.num_kv_heads, args.head_dim) == (262_208, 8, 4, 256)
    assert (args.hidden_size, args.num_layers, args.sliding_window) == (2560, 34, 1024)
    assert args.window_layers == tuple(i for i in range(34) if (i + 1) % 6)
    assert args.rope_scaling["factor"] == 8.0 and args.local_rope_theta == 10_000.0 and args.rope_theta == 1e6
    assert set(args.eos_token_ids) == {1, 106} and args.bos_token_id == 2 and args.torch_dtype == "bfloat16"


def test_a_hub_gemma_2_config_reads_as_transformers_reads_it(tmp_path):
    """gemma-2-2b-it's config.json; absent soft-caps take Gemma 2's defaults (50, 30), null ones are off."""
    fields = dict(architectures=["Gemma2ForCausalLM"], hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
                  sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                  hidden_activation="gelu_pytorch_tanh", vocab_size=256000, max_position_embeddings=8192,
                  cache_implementation="hybrid", eos_token_id=[1, 107])
    args = load_model_args(_config(tmp_path, **fields))
    assert args.window_layers == tuple(range(0, 26, 2)) and args.sliding_window == 4096
    assert (args.attn_logit_softcapping, args.final_logit_softcapping) == (50.0, 30.0)
    assert args.local_rope_theta is None and not args.qk_norm and args.pre_norms and args.post_norms
    assert args.rope_theta == 10_000.0 and args.norm_weight_offset == 1.0 and args.tie_word_embeddings
    fields.pop("attn_logit_softcapping"), fields.pop("final_logit_softcapping")
    assert load_model_args(_config(tmp_path, **fields)).attn_logit_softcapping == 50.0
    args = load_model_args(_config(tmp_path, **fields, attn_logit_softcapping=None, final_logit_softcapping=None))
    assert args.attn_logit_softcapping is None and args.final_logit_softcapping is None


def test_a_hub_gemma_1_config_reads_as_transformers_reads_it(tmp_path):
    """gemma-2b's config.json: its legacy `hidden_act: "gelu"` is GELU's tanh form, the head tied, no
    windows, soft-caps or norms after the branches, the attention scale head_dim ** -0.5."""
    fields = dict(architectures=["GemmaForCausalLM"], hidden_act="gelu", hidden_size=2048, intermediate_size=16384,
                  num_attention_heads=8, num_hidden_layers=18, num_key_value_heads=1, head_dim=256,
                  vocab_size=256000, max_position_embeddings=8192, rms_norm_eps=1e-06, rope_theta=10000.0,
                  bos_token_id=2, eos_token_id=1, pad_token_id=0, torch_dtype="bfloat16")
    args = load_model_args(_config(tmp_path, **fields))
    assert args.hidden_act == "gelu_tanh" and args.tie_word_embeddings and args.sm_scale == 256 ** -0.5
    assert args.window_layers == () and args.sliding_window is None and args.final_logit_softcapping is None
    assert args.pre_norms and not args.post_norms and not args.qk_norm and args.attn_logit_softcapping is None
    assert args.embedding_multiplier == 2048 ** 0.5 and args.embedding_multiplier_in_dtype
    assert args.norm_weight_offset == 1.0 and args.eos_token_ids == (1,)
    fields.pop("head_dim"), fields.pop("hidden_act")  # GemmaConfig's defaults
    args = load_model_args(_config(tmp_path, **fields))
    assert args.head_dim == 256 and args.hidden_act == "gelu_tanh"
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        load_model_args(_config(tmp_path, **fields, use_bidirectional_attention=True))


@pytest.mark.parametrize("fields, match", [
    ({"architectures": ["Gemma2ForCausalLM"], "attn_logit_softcapping": -1.0}, "attn_logit_softcapping"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"hidden_activation": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"layer_types": ["sliding_attention"]}, "layer_types"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}}, "sliding-window layers"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"text_config": [1]}, "text_config"),
])
def test_what_gemma_3_computes_differently_is_refused(tmp_path, fields, match):
    if "text_config" in fields:
        fields["architectures"] = ["Gemma3ForConditionalGeneration"]
    with pytest.raises(ValueError, match=match):
        load_model_args(_config(tmp_path, **fields))


@pytest.mark.parametrize("arch", ["Gemma2ForCausalLM", "Gemma3ForCausalLM"])
def test_a_null_window_is_refused(tmp_path, arch):
    """sliding_window null: transformers fails on such a model, so there is nothing to match."""
    with pytest.raises(ValueError, match="sliding_window"):
        load_model_args(_config(tmp_path, architectures=[arch], sliding_window=None))


@pytest.mark.parametrize("family", GEMMAS)
def test_decode_graph_static_buffers_read_the_windows(hf_checkpoint, family):
    """A decode graph's static buffers (padding rows of length 0 included) through the windowed
    layers: on CPU an eager stand-in replays the forward over them (test_cuda_graph.py)."""
    from radixflow.runtime.core.cuda_graph import DecodeGraphRunner
    from test_cuda_graph import EagerCapture

    model_dir, hf = hf_checkpoint(family)
    _, batch = _prompts(hf.config.vocab_size)
    config = dict(device="cpu", dtype="float32", attention_backend="torch", kv_cache_tokens=512, max_num_seqs=8)
    with Engine(model_dir, **config) as eager:
        want = [o["output_ids"] for o in eager.generate(input_ids=batch, sampling_params=GREEDY)]
    capture = EagerCapture()
    with Engine(model_dir, **config) as engine:
        runner = engine.runner
        runner.graph_runner = DecodeGraphRunner(runner.model, runner.attention, runner.req_pool.table, 4, capture)
        got = [o["output_ids"] for o in engine.generate(input_ids=batch, sampling_params=GREEDY)]
    assert got == want
    assert capture.replays[4] == GREEDY["max_new_tokens"] - 1  # 3 rows padded to 4


@pytest.mark.parametrize("family", GEMMAS)
@pytest.mark.gpu
def test_gpu_cuda_graphs_through_the_windows(hf_checkpoint, family):
    """On CUDA: the Triton kernels and decode graphs (the cut table recorded in the graph) give
    transformers' greedy tokens, as eager decoding does."""
    model_dir, hf = hf_checkpoint(family)
    _, batch = _prompts(hf.config.vocab_size)
    config = dict(device="cuda", dtype="float32", kv_cache_tokens=2048, max_num_seqs=8, cuda_graph_max_bs=4)
    runs = []
    for graphs in (False, True):
        with Engine(model_dir, disable_cuda_graph=not graphs, **config) as engine:
            assert (engine.runner.graph_runner is not None) == graphs
            runs.append([o["output_ids"] for o in engine.generate(input_ids=batch, sampling_params=GREEDY)])
    assert runs[0] == runs[1] == [_hf_greedy(hf, p, GREEDY["max_new_tokens"]) for p in batch]


@pytest.mark.parametrize("family", GEMMAS)
def test_a_lora_adapter_equals_its_merged_weights(hf_checkpoint, tmp_path, family):
    """PEFT adapters on every projection (the GELU-tanh MLP's included) of a model with windows."""
    from lora_adapters import ALL, assert_adapter_equals_merged, write_adapter

    model_dir, hf = hf_checkpoint(family)
    _, batch = _prompts(hf.config.vocab_size)
    adapter = write_adapter(str(tmp_path / "a"), model_dir, targets=ALL)
    assert_adapter_equals_merged(model_dir, adapter, batch, str(tmp_path / "merged"), GREEDY)


def _mm_config(tmp_path, top: dict, text: dict) -> str:
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], **top,
           "text_config": {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 6,
                           "num_attention_heads": 4, "num_key_value_heads": 1, **text}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def test_a_multimodal_config_reads_as_transformers_multimodal_model_runs(tmp_path):
    """Gemma3ForConditionalGeneration ties its head by the top-level flag (default true), whatever
    the text config says, and its head is not soft-capped (only Gemma3ForCausalLM's is)."""
    args = load_model_args(_mm_config(tmp_path, {"tie_word_embeddings": False}, {"final_logit_softcapping": 3.0}))
    assert not args.tie_word_embeddings and args.final_logit_softcapping is None
    args = load_model_args(_mm_config(tmp_path, {}, {"tie_word_embeddings": False}))
    assert args.tie_word_embeddings


def test_what_transformers_gemma_3_ignores_is_ignored(tmp_path):
    """Gemma 3's attention never applies attn_logit_softcapping (Gemma 2's does); Gemma's MLPs read
    hidden_activation only (a stray hidden_act is not theirs); nested rope_parameters win over
    the top-level thetas."""
    args = load_model_args(_config(tmp_path, attn_logit_softcapping=2.0, hidden_act="silu", rope_theta=99999.0,
                                   rope_local_base_freq=555.0, rope_parameters={
                                       "full_attention": {"rope_type": "default", "rope_theta": 50000.0},
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 777.0}}))
    assert args.attn_logit_softcapping is None and args.hidden_act == "gelu_tanh"
    assert (args.rope_theta, args.local_rope_theta) == (50000.0, 777.0)
    gemma2 = load_model_args(_config(tmp_path, architectures=["Gemma2ForCausalLM"], hidden_act="silu"))
    assert gemma2.hidden_act == "gelu_tanh" and gemma2.attn_logit_softcapping == 50.0
