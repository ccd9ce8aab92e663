"""DeepSeek-V2 / V3 (multi-head latent attention) beyond test_model_parity's prefill and greedy
checks: the released configs read as their shapes, the KV pool holding one latent per token, the
engine's other attention paths against transformers' greedy tokens, and what is refused."""
from __future__ import annotations

import json
import math

import pytest
import torch

from radixflow.runtime import Engine
from radixflow.runtime.core.kv_pool import KVPool
from radixflow.runtime.model.model_config import load_model_args
# tests/runtime is on sys.path (conftest)
from engine_runs import assert_greedy_as_transformers, assert_triton_as_torch  # noqa: E402

GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}

# the fields of the released config.json files that shape the model (tokens and quantization left out)
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
               "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048,
               "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
               "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
               "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
               "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                                "original_max_position_embeddings": 4096, "type": "yarn"},
               "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
               "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "v_head_dim": 128,
               "vocab_size": 129280, "first_k_dense_replace": 3}
DEEPSEEK_V2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 2048, "intermediate_size": 10944,
                    "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 1408,
                    "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2,
                    "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6,
                    "num_hidden_layers": 27, "num_key_value_heads": 16, "q_lora_rank": None, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
                    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"},
                    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "topk_group": 1,
                    "topk_method": "greedy", "v_head_dim": 128, "vocab_size": 102400, "first_k_dense_replace": 1,
                    "tie_word_embeddings": False}


def _args(tmp_path, cfg: dict):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return load_model_args(str(tmp_path))


def test_the_released_v3_config_reads_as_its_shape(tmp_path):
    args = _args(tmp_path, DEEPSEEK_V3)
    assert (args.num_kv_heads, args.head_dim, args.rotary_dim) == (1, 576, 64)  # the pool's one latent head
    assert (args.q_lora_rank, args.kv_lora_rank, args.qk_nope_head_dim, args.v_head_dim) == (1536, 512, 128, 128)
    assert args.moe_layers == tuple(range(3, 61)) and args.extra_layers == 1  # the MTP layer, not run
    assert (args.router_scoring, args.router_correction, args.n_group, args.topk_group) == ("sigmoid", True, 8, 4)
    assert args.shared_expert_intermediate_size == 2048 and not args.shared_expert_gate
    assert args.rope_interleaved and args.rope_scaling["type"] == "yarn"
    mscale = 0.1 * math.log(40) + 1.0  # transformers' yarn_get_mscale(40, 1.0), squared into the scale
    assert args.sm_scale == pytest.approx(mscale * mscale / math.sqrt(192), rel=1e-12)
    # 61 layers x 576 bf16 numbers per token, once: keys and values are the same latent
    assert KVPool.bytes_per_token(61, 1, 576, torch.bfloat16, False, shared_kv=True) == 61 * 576 * 2


def test_the_released_v2_lite_config_reads_as_its_shape(tmp_path):
    args = _args(tmp_path, DEEPSEEK_V2_LITE)
    assert (args.q_lora_rank, args.head_dim, args.num_kv_heads) == (0, 576, 1)  # q straight from x
    assert args.moe_layers == tuple(range(1, 27)) and args.shared_expert_intermediate_size == 2 * 1408
    assert (args.router_scoring, args.router_correction, args.n_group, args.norm_topk_prob) == ("softmax", False, 1,
                                                                                                 False)
    mscale = 0.1 * 0.707 * math.log(40) + 1.0
    assert args.sm_scale == pytest.approx(mscale * mscale / math.sqrt(192), rel=1e-12)


@pytest.mark.parametrize("fields, match", [
    ({"topk_method": "noaux_tc"}, "topk_method 'noaux_tc' is not supported for DeepseekV2ForCausalLM"),
    ({"scoring_func": "sigmoid"}, "scoring_func 'sigmoid' is not supported for DeepseekV2ForCausalLM"),
    ({"qk_rope_head_dim": 63}, "qk_rope_head_dim 63 must be even"),
    ({"kv_lora_rank": 0}, "kv_lora_rank must be a positive integer"),
    ({"q_lora_rank": -1}, "q_lora_rank must be a positive integer"),
    ({"moe_layer_freq": 0}, "moe_layer_freq must be a positive integer"),
    ({"topk_method": "group_limited_greedy", "n_group": None}, "the required field n_group is missing"),
])
def test_v2_fields_not_computed_are_refused(tmp_path, fields, match):
    with pytest.raises(ValueError, match=match):
        _args(tmp_path, {**DEEPSEEK_V2_LITE, **fields})


def test_a_v3_config_with_softmax_scoring_is_refused(tmp_path):
    with pytest.raises(ValueError, match="scoring_func 'softmax' is not supported for DeepseekV3ForCausalLM"):
        _args(tmp_path, {**DEEPSEEK_V3, "scoring_func": "softmax"})


def test_moe_layer_freq_places_the_experts(tmp_path):
    args = _args(tmp_path, {**DEEPSEEK_V2_LITE, "num_hidden_layers": 7, "moe_layer_freq": 2})
    assert args.moe_layers == (2, 4, 6)


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
@pytest.mark.parametrize("options", [
    dict(chunked_prefill_size=8),                      # prompts in chunks: extends over a cached prefix
    dict(enable_overlap=True),
    dict(speculative_algorithm="ngram", speculative_ngram_min=1, speculative_ngram_max=2),
])
def test_engine_paths_give_transformers_greedy_tokens(hf_checkpoint, family, options):
    """The latent KV through every attention path the engine takes: prefill chunks and a second
    request on a cached prefix, batched decode, mixed steps, verify rows of drafts; each request's
    greedy tokens equal transformers'. The pool stores each layer's latent once (V is K)."""
    def latent_pool(engine) -> None:
        pool = engine.runner.kv_pool
        assert pool.shared_kv and all(v is k for k, v in zip(pool.k_caches, pool.v_caches))
        assert pool.k_caches[0].shape[1:] == (1, 32 + 8)  # the latent and the rotated key
    assert_greedy_as_transformers(*hf_checkpoint(family), GREEDY, inspect=latent_pool, **options)


def _logprobs(model_dir: str, prompt: list[int], **options) -> tuple[list[int], list[float]]:
    with Engine(model_dir, kv_cache_tokens=1024, **options) as engine:
        out = engine.generate(input_ids=prompt, return_logprob=True, sampling_params={**GREEDY, "max_new_tokens": 6})
    return out["output_ids"], [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]


@pytest.mark.parametrize("options", [dict(dtype="bfloat16"), dict(dtype="float32", kv_cache_dtype="fp8_e4m3")])
def test_bf16_and_the_fp8_latent_cache_stay_close_to_fp32(hf_checkpoint, options):
    """CPU bf16 (the prepacked projections) and an fp8 latent cache (one scale per layer: its keys
    and values are one tensor) give fp32's greedy tokens with logprobs close to its."""
    model_dir, _ = hf_checkpoint("deepseek_v3")
    prompt = [5, 77, 300, 12, 9, 9, 41, 7, 3, 88]
    want_ids, want = _logprobs(model_dir, prompt, dtype="float32")
    ids, got = _logprobs(model_dir, prompt, **options)
    assert ids == want_ids
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=0.1)


def test_shared_kv_scales_are_one_per_layer():
    pool = KVPool(8, 2, 1, 8, torch.float32, torch.device("cpu"), fp8=True, shared_kv=True)
    assert pool.v_caches is pool.k_caches
    pool.set_scales([1.0, 3.0], [2.0, 0.5])
    assert pool.k_scales == pool.v_scales == [2.0, 3.0]  # the larger of each layer's pair keeps both in range


def test_lora_is_refused_on_latent_attention(hf_checkpoint):
    model_dir, _ = hf_checkpoint("deepseek_v2")
    with pytest.raises(ValueError, match="LoRA adapters are not supported on DeepseekV2ForCausalLM"):
        Engine(model_dir, kv_cache_tokens=256, dtype="float32", enable_lora=True)


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
def test_triton_ops_and_attention_equal_the_torch_path(hf_checkpoint, family, monkeypatch):
    """The model as CUDA runs it (fused norms and RoPE on the rotated parts, the grouped experts; the
    Triton extend over a cached prefix and decode on the one 40-dim latent head all 8 query heads
    share), here in the Triton interpreter, gives the torch path's greedy tokens and logprobs."""
    assert_triton_as_torch(hf_checkpoint(family)[0], monkeypatch, GREEDY, 6)


def _max_logit_diff(model_dir: str, hf) -> float:
    from test_model_parity import _our_logits

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, hf.config.vocab_size, (n,), generator=g).tolist() for n in (5, 23)]
    with torch.no_grad():
        return max((mine - hf(torch.tensor([p])).logits[0].float()).abs().max().item()
                   for p, mine in zip(prompts, _our_logits(model_dir, prompts)))


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
def test_the_latent_norms_take_eps_1e6_whatever_rms_norm_eps_says(hf_checkpoint, family):
    """q_a_layernorm and kv_a_layernorm are built with eps 1e-6 (transformers' and DeepSeek's own code;
    Moonlight's rms_norm_eps is 1e-5): a large rms_norm_eps shows it."""
    model_dir, hf = hf_checkpoint(family, rms_norm_eps=1e-2)
    assert _max_logit_diff(model_dir, hf) < 1e-4


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
def test_no_shared_experts(hf_checkpoint, family):
    """n_shared_experts 0: transformers saves the shared experts as empty tensors, which are skipped."""
    model_dir, hf = hf_checkpoint(family, n_shared_experts=0)
    assert load_model_args(model_dir).shared_expert_intermediate_size == 0
    assert _max_logit_diff(model_dir, hf) < 1e-4


def test_v2_renormalizes_only_several_experts_when_norm_topk_prob(hf_checkpoint, tmp_path):
    """DeepSeek-V2's reference code renormalizes the chosen weights when norm_topk_prob and
    top_k > 1 (transformers' V2 router never does); with one expert per token the weight stays its
    softmax score, as transformers gives it."""
    model_dir, hf = hf_checkpoint("deepseek_v2", norm_topk_prob=True, num_experts_per_tok=1)
    assert _max_logit_diff(model_dir, hf) < 1e-4
    cfg = {**DEEPSEEK_V2_LITE, "norm_topk_prob": True}
    assert _args(tmp_path, cfg).norm_topk_prob and not _args(tmp_path, {**cfg, "num_experts_per_tok": 1}).norm_topk_prob


@pytest.mark.parametrize("fields, match", [
    ({"rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "mscale_all_dim": "1.0"}}, "mscale_all_dim must be a number"),
    ({"rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "mscale_all_dim": True}}, "mscale_all_dim must be a number"),
    ({"rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "mscale_all_dim": -30}}, "mscale_all_dim must be a number"),
    ({"rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "mscale": "1"}}, "mscale must be a number"),
    ({"mlp_bias": True}, "mlp_bias true is not supported for DeepseekV3ForCausalLM"),
])
def test_malformed_scale_fields_are_refused_at_load(tmp_path, fields, match):
    with pytest.raises(ValueError, match=match):
        _args(tmp_path, {**DEEPSEEK_V3, **fields})


def test_the_softmax_scale_takes_mscale_all_dim_under_any_scaled_rope(tmp_path):
    """transformers' yarn_apply_mscale: any rope type but the default (linear here) with an
    mscale_all_dim scales the softmax by mscale(factor, mscale_all_dim)^2."""
    scaling = {"rope_type": "linear", "factor": 4.0, "mscale_all_dim": 1.0}
    args = _args(tmp_path, {**DEEPSEEK_V3, "rope_scaling": scaling})
    mscale = 0.1 * math.log(4.0) + 1.0
    assert args.sm_scale == pytest.approx(mscale * mscale / math.sqrt(192), rel=1e-12)


def test_null_shared_experts_are_none(tmp_path):
    assert _args(tmp_path, {**DEEPSEEK_V3, "n_shared_experts": None}).shared_expert_intermediate_size == 0


def test_random_weights_keep_the_fp32_parameters(hf_checkpoint):
    """load_format dummy keeps the router (and its correction) fp32 in a bf16 model, as a checkpoint load does."""
    from radixflow.runtime.model.random_weights import build_random_model

    args = load_model_args(hf_checkpoint("deepseek_v3")[0])
    model = build_random_model(args, torch.bfloat16, torch.device("cpu"), 64)
    moe = model.layers[1].mlp
    assert moe.gate.weight.dtype == moe.router_correction.dtype == torch.float32
    assert model.layers[1].self_attn.kv_b_proj.weight.dtype == torch.bfloat16
