"""Llama 4 (Llama4ForCausalLM, and the text model of Llama4ForConditionalGeneration checkpoints)
beyond test_model_parity's prefill and greedy checks: the multimodal checkpoint's layout, the
released configs, the context kept within one attention chunk, the engine's other attention paths
against transformers' greedy tokens, and what is refused."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixflow.runtime import Engine
from radixflow.runtime.model.model_config import load_model_args
# tests/runtime is on sys.path (conftest)
from engine_runs import assert_greedy_as_transformers, assert_triton_as_torch  # noqa: E402
from test_model_parity import _our_logits  # noqa: E402

GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
# the text config of the released Llama-4-Scout-17B-16E-Instruct (its fields that shape the model)
SCOUT_TEXT = {"attention_chunk_size": 8192, "attn_scale": 0.1, "attn_temperature_tuning": 4, "floor_scale": 8192,
              "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 8192,
              "intermediate_size_mlp": 16384, "interleave_moe_layer_step": 1, "max_position_embeddings": 10485760,
              "model_type": "llama4_text", "no_rope_layers": [], "num_attention_heads": 40, "num_experts_per_tok": 1,
              "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 16, "rms_norm_eps": 1e-05,
              "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"},
              "rope_theta": 500000.0, "use_qk_norm": True, "vocab_size": 202048}


def _args(tmp_path, cfg: dict):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return load_model_args(str(tmp_path))


def test_the_released_scout_config_reads_as_its_shape(tmp_path):
    args = _args(tmp_path, {"architectures": ["Llama4ForConditionalGeneration"], "text_config": SCOUT_TEXT,
                            "vision_config": {"hidden_size": 1408}, "tie_word_embeddings": False})
    assert args.architecture == "Llama4ForCausalLM" and args.moe_layers == tuple(range(48))
    assert (args.intermediate_size, args.moe_intermediate_size, args.shared_expert_intermediate_size) == (16384, 8192,
                                                                                                           8192)
    assert args.nope_layers == tuple(range(3, 48, 4)) and args.qk_norm_weightless and args.rope_interleaved
    assert args.attn_temperature == (8192.0, 0.1, 1.0) and args.attention_chunk_size == 8192
    assert args.expert_input_scaled and args.num_experts_per_tok == 1 and not args.shared_expert_gate
    maverick = _args(tmp_path, {"architectures": ["Llama4ForCausalLM"], **SCOUT_TEXT, "interleave_moe_layer_step": 2,
                                "num_local_experts": 128, "use_qk_norm": False})
    assert maverick.moe_layers == tuple(range(1, 48, 2)) and not maverick.qk_norm_weightless


@pytest.mark.parametrize("fields, match", [
    ({"num_experts_per_tok": 2}, "num_experts_per_tok 2 is not supported for Llama4ForCausalLM"),
    ({"attention_chunk_size": 0}, "attention_chunk_size must be a positive integer"),
    ({"attn_temperature_tuning": "yes"}, "attn_temperature_tuning must be true or false"),
    ({"floor_scale": 0}, "floor_scale must be a positive number"),
    ({"moe_layers": "all"}, "moe_layers must list layer numbers"),
])
def test_fields_not_computed_are_refused(tmp_path, fields, match):
    with pytest.raises(ValueError, match=match):
        _args(tmp_path, {"architectures": ["Llama4ForCausalLM"], **SCOUT_TEXT, **fields})


def test_a_multimodal_checkpoint_serves_its_text_model(hf_checkpoint, tmp_path):
    """Llama4ForConditionalGeneration's layout: the text config under text_config, the language model's
    tensors under language_model., the vision model's and projector's skipped: its logits are the
    text model's."""
    src, hf = hf_checkpoint("llama4")
    text = {k: v for k, v in json.load(open(os.path.join(src, "config.json"))).items() if k != "architectures"}
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": text,
        "vision_config": {"hidden_size": 32}, "tie_word_embeddings": False}))
    tensors = {("language_model." + name): t for name, t in load_file(os.path.join(src, "model.safetensors")).items()}
    tensors["vision_model.patch_embedding.linear.weight"] = torch.ones(4, 4)
    tensors["multi_modal_projector.linear_1.weight"] = torch.ones(4, 4)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    for f in os.listdir(src):
        if f.startswith(("tokenizer", "generation")):
            shutil.copy(os.path.join(src, f), tmp_path)
    prompts = [[5, 77, 300, 12], [901, 44, 2, 17, 17, 250, 9]]
    for mine, want in zip(_our_logits(str(tmp_path), prompts), _our_logits(src, prompts)):
        assert torch.equal(mine, want)


@pytest.mark.parametrize("chunk", [4, 8])
def test_attention_within_chunks_matches_transformers(hf_checkpoint, chunk):
    """The RoPE layers attend within chunks of attention_chunk_size positions: prompts of several
    chunks, each query seeing its own chunk up to itself (the layers without RoPE see everything)."""
    model_dir, hf = hf_checkpoint("llama4", attention_chunk_size=chunk)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, hf.config.vocab_size, (n,), generator=g).tolist() for n in (3, 9, 17, 40)]
    with torch.no_grad():
        for prompt, mine in zip(prompts, _our_logits(model_dir, prompts)):
            assert (mine - hf(torch.tensor([prompt])).logits[0].float()).abs().max().item() < 1e-4


def test_the_chunks_matter(hf_checkpoint):
    """A 40-token prompt's logits past the first chunk differ with and without chunks (so the test
    above checks the chunks), and within the first chunk they do not."""
    prompt = [[(7 * i) % 300 + 3 for i in range(40)]]
    chunked = _our_logits(hf_checkpoint("llama4", attention_chunk_size=8)[0], prompt)[0]
    whole = _our_logits(hf_checkpoint("llama4")[0], prompt)[0]
    assert torch.allclose(chunked[:8], whole[:8], atol=1e-5) and not torch.allclose(chunked[8:], whole[8:], atol=1e-2)


def test_chunk_context_cuts_each_context_at_its_chunk():
    from radixflow import kernels

    table = torch.arange(40, dtype=torch.int32).view(2, 20)
    cut, rows, lens = kernels.chunk_context(table, torch.tensor([1, 0]), torch.tensor([9, 16]), 8)
    assert lens.tolist() == [1, 8] and rows.tolist() == [0, 1]
    assert cut[0, :1].tolist() == [28] and cut[1].tolist() == list(range(8, 16))  # row 1 from 8; row 0 from 8


@pytest.mark.parametrize("options", [
    dict(chunked_prefill_size=8),                      # prompts in chunks: extends over a cached prefix
    dict(enable_overlap=True),
    dict(speculative_algorithm="ngram", speculative_ngram_min=1, speculative_ngram_max=2),
])
def test_engine_paths_give_transformers_greedy_tokens(hf_checkpoint, options):
    """Attention within 8-token chunks, and the temperature of the layers without RoPE, read each
    token's absolute position through a cached prefix, prefill chunks, mixed steps and drafts, with
    decode crossing chunks; each request's greedy tokens equal transformers'."""
    assert_greedy_as_transformers(*hf_checkpoint("llama4", attention_chunk_size=8), GREEDY, **options)


def test_triton_attention_equals_the_torch_path(hf_checkpoint, monkeypatch):
    """The Triton extend and decode kernels over the chunk-cut tables (in the interpreter) give the torch
    path's greedy tokens and logprobs, through a cached prefix and prefill chunks, decode crossing a chunk."""
    assert_triton_as_torch(hf_checkpoint("llama4", attention_chunk_size=8)[0], monkeypatch, GREEDY, 4,
                           chunked_prefill_size=5)


def test_bf16_stays_close_to_fp32(hf_checkpoint):
    """CPU bf16 (packed projections and experts, the scaled expert input rounded as transformers
    rounds it): the first tokens and their logprobs as fp32 gives them."""
    model_dir, _ = hf_checkpoint("llama4")
    runs = []
    for dtype in ("float32", "bfloat16"):
        with Engine(model_dir, kv_cache_tokens=512, dtype=dtype) as engine:
            out = engine.generate(input_ids=[5, 77, 300, 12, 9, 9, 41, 7], return_logprob=True,
                                  sampling_params={**GREEDY, "max_new_tokens": 3})
        runs.append((out["output_ids"], [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]))
    assert runs[1][0] == runs[0][0]
    torch.testing.assert_close(torch.tensor(runs[1][1]), torch.tensor(runs[0][1]), rtol=0, atol=0.1)


def test_lora_is_refused(hf_checkpoint):
    model_dir, _ = hf_checkpoint("llama4")
    with pytest.raises(ValueError, match="LoRA adapters are not supported on Llama4ForCausalLM"):
        Engine(model_dir, kv_cache_tokens=256, dtype="float32", enable_lora=True)


def test_llama3_scaling_with_equal_frequency_factors(hf_checkpoint):
    """Llama 4's released RoPE: llama3 scaling with low_freq_factor = high_freq_factor (1.0), a hard cut
    between the slowed and the kept frequencies with no band between: as transformers computes it."""
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
            "high_freq_factor": 1.0, "original_max_position_embeddings": 64}
    model_dir, hf = hf_checkpoint("llama4", rope_parameters=rope)
    prompts = [list(range(3, 43))]
    with torch.no_grad():
        want = hf(torch.tensor(prompts)).logits[0].float()
    assert (_our_logits(model_dir, prompts)[0] - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("top, text, tied", [(None, True, True), (True, False, False), (False, True, True),
                                             (None, None, False)])
def test_the_multimodal_heads_tie_by_the_text_config(tmp_path, top, text, tied):
    """transformers ties Llama4ForConditionalGeneration's language-model head by its text config's
    tie_word_embeddings (false when absent); the top-level flag does not decide it."""
    text_cfg = dict(SCOUT_TEXT) if text is None else {**SCOUT_TEXT, "tie_word_embeddings": text}
    cfg = {"architectures": ["Llama4ForConditionalGeneration"], "text_config": text_cfg}
    if top is not None:
        cfg["tie_word_embeddings"] = top
    assert _args(tmp_path, cfg).tie_word_embeddings is tied


def test_intermediate_size_mlp_is_checked(tmp_path):
    for value in (0, "16384"):
        with pytest.raises(ValueError, match="intermediate_size_mlp must be a positive integer"):
            _args(tmp_path, {"architectures": ["Llama4ForCausalLM"], **SCOUT_TEXT, "intermediate_size_mlp": value})


def test_a_huge_context_is_capped_unless_asked_for(hf_checkpoint):
    """Scout's 10,485,760 positions: without --max-model-len the context is capped (the slot table and RoPE
    tables grow with it), and an explicit max_model_len is taken as given."""
    from radixflow.runtime.core.model_runner import DEFAULT_MAX_CONTEXT

    model_dir, _ = hf_checkpoint("llama4", max_position_embeddings=10485760)
    with Engine(model_dir, kv_cache_tokens=256, dtype="float32", max_num_seqs=2) as engine:
        assert engine.runner.shape.max_context_len == DEFAULT_MAX_CONTEXT == 262144
    with Engine(model_dir, kv_cache_tokens=256, dtype="float32", max_num_seqs=2, max_model_len=300000) as engine:
        assert engine.runner.shape.max_context_len == 300000
