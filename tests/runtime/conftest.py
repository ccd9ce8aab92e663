"""Fixtures for runtime tests: small Hugging Face checkpoints of each supported family."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
import torch

from radixflow.runtime.model.demo import demo_model

# test helpers beside this file (gguf_writer.py, test_model_parity's functions) import by name
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# families transformers computes with another family's class (InternLM3: Llama's), and the
# architecture their hub config.json names
SAVED_ARCHITECTURES = {"internlm3": "InternLM3ForCausalLM"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def _hf_config(family: str, vocab_size: int, heads: int = 8):
    import transformers as tf

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                  num_attention_heads=heads, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                  rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if family == "llama3":
        return tf.LlamaConfig(**common, tie_word_embeddings=False, rope_scaling={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if family == "mistral":
        return tf.MistralConfig(**common, sliding_window=None)
    if family == "qwen2":
        return tf.Qwen2Config(**common, tie_word_embeddings=True)
    if family == "qwen3":
        return tf.Qwen3Config(**common, tie_word_embeddings=False)
    if family == "olmo2":  # norms after attention and MLP, none before; q/k normed over the whole projection
        return tf.Olmo2Config(**common, tie_word_embeddings=False)
    if family == "olmo3":  # OLMo 2's layer with a 4-token window in layer 0; linear scaling in the full layer only;
        # the window layer's RoPE base is 500,000 whatever rope_theta says (transformers reads the config so)
        return tf.Olmo3Config(**common, tie_word_embeddings=False, sliding_window=4,
                              layer_types=["sliding_attention", "full_attention"], rope_theta=10000.0,
                              rope_scaling={"rope_type": "linear", "factor": 2.0})
    if family == "seed_oss":  # q / k / v biases, and o's and the MLP's by their own flags
        return tf.SeedOssConfig(**common, attention_bias=True, attention_out_bias=True, mlp_bias=True,
                                tie_word_embeddings=False)
    if family == "internlm3":  # Llama's layer, biases on every projection
        return tf.InternLM3Config(**common, attention_bias=True, mlp_bias=True, tie_word_embeddings=False)
    if family == "ernie4_5":  # interleaved RoPE pairs, biases on every projection, tied head
        return tf.Ernie4_5Config(**common, use_bias=True, tie_word_embeddings=True)
    if family == "glm":  # half of each head rotated in interleaved pairs, gate | up fused, q / k / v biases
        return tf.GlmConfig(**common, tie_word_embeddings=False)
    if family == "glm4":  # GLM's attention and MLP, norms before and after both branches
        return tf.Glm4Config(**common, tie_word_embeddings=False)
    if family == "exaone4":  # OLMo 2's norms after, per-head q / k norms; layer 0 windowed with RoPE, layer 1 global
        # without RoPE
        return tf.Exaone4Config(**common, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                                tie_word_embeddings=False)
    if family == "hunyuan":  # per-head q / k norms after RoPE, the base stretched by a fixed NTK alpha
        return tf.HunYuanDenseV1Config(**common, attention_bias=True, tie_word_embeddings=False,
                                       rope_scaling={"type": "dynamic", "alpha": 50.0, "factor": 1.0})
    if family == "arcee":  # Llama's attention, an MLP without a gate: down(relu(up(x)) ** 2)
        return tf.ArceeConfig(**common, tie_word_embeddings=False)
    if family == "apertus":  # per-head q / k norms, an MLP without a gate through xIELU's learned scalars
        return tf.ApertusConfig(**common, tie_word_embeddings=False)
    if family == "starcoder2":  # LayerNorm with biases, a GELU MLP without a gate, biases on every projection
        return tf.Starcoder2Config(**{k: v for k, v in common.items() if k != "rms_norm_eps"}, norm_epsilon=1e-5,
                                   use_bias=True, sliding_window=None, tie_word_embeddings=True)
    if family == "olmoe":  # OLMoE: OLMo's whole-projection q/k norms before a mixture of experts
        return tf.OlmoeConfig(**{**common, "intermediate_size": 48, "head_dim": 8}, num_experts=4, num_experts_per_tok=2,
                              norm_topk_prob=False, clip_qkv=None, tie_word_embeddings=False)
    if family == "phi3":  # fused qkv_proj and gate_up_proj in the checkpoint (Phi-3, Phi-4)
        return tf.Phi3Config(**common, tie_word_embeddings=False, sliding_window=None)
    if family == "phi3_partial":  # Phi-4-mini's form: RoPE over part of each head (3/4 there), tied head
        return tf.Phi3Config(**common, tie_word_embeddings=True, sliding_window=None, partial_rotary_factor=0.5)
    if family == "smollm3":  # every second layer without RoPE (SmolLM3-3B: every fourth)
        return tf.SmolLM3Config(**common, no_rope_layer_interval=2, tie_word_embeddings=True)
    if family == "gemma":  # Gemma 1: GELU-tanh MLP, scaled embeddings, norms stored as weight - 1
        return tf.GemmaConfig(**common, tie_word_embeddings=True)
    if family == "gemma2":  # layer 0 through a 4-token window; attention scores and logits soft-capped (small
        # caps, so that they bend the values)
        return tf.Gemma2Config(**common, sliding_window=4, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                               final_logit_softcapping=5.0, tie_word_embeddings=True)
    if family == "gemma3":  # a 4-token window in layer 0 (own RoPE base), full attention with linear RoPE in layer 1
        return tf.Gemma3TextConfig(**common, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                                   query_pre_attn_scalar=24, final_logit_softcapping=30.0, rope_theta=20000.0,
                                   rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_local_base_freq=500.0,
                                   tie_word_embeddings=True)
    # Granite 3's multipliers (its 8B's values): embeddings, attention scale, residual branches, logits
    granite = dict(embedding_multiplier=12.0, attention_multiplier=0.0078125, residual_multiplier=0.22,
                   logits_scaling=16.0, tie_word_embeddings=True)
    if family == "granite":
        return tf.GraniteConfig(**common, **granite)
    if family == "granitemoe":
        return tf.GraniteMoeConfig(**{**common, "intermediate_size": 48}, **granite, num_local_experts=4,
                                   num_experts_per_tok=2)
    moe = dict(num_experts_per_tok=2, tie_word_embeddings=False)
    if family == "gpt_oss":  # attention sinks, a window in every other layer, experts with biases whose clamped
        # SwiGLU clamps at this scale (limit 0.5: the random gate / up values reach past it)
        return tf.GptOssConfig(**{**common, "intermediate_size": 64}, num_local_experts=4, num_experts_per_tok=2,
                               sliding_window=8, swiglu_limit=0.5, tie_word_embeddings=False)
    if family == "glm4_moe":  # GLM-4.5: layer 0 dense, layer 1 experts in 4 groups (2 kept), sigmoid scores with a
        # correction bias, scaled; an ungated shared expert; q / k biases and norms; half of each head rotated
        return tf.Glm4MoeConfig(**common, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3,
                                n_shared_experts=1, n_group=4, topk_group=2, first_k_dense_replace=1,
                                routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True,
                                tie_word_embeddings=False)
    if family == "ernie4_5_moe":  # ERNIE 4.5 MoE: layer 0 dense, then experts chosen by softmax score plus a
        # correction bias, an ungated shared expert; RoPE in interleaved pairs
        return tf.Ernie4_5_MoeConfig(**{**common, "num_hidden_layers": 3}, moe_intermediate_size=32, moe_num_experts=8,
                                     moe_k=2, moe_num_shared_experts=1, moe_layer_start_index=1, use_bias=False,
                                     tie_word_embeddings=False)
    if family == "minimax_m2":  # sigmoid routing with a correction bias; q / k normed over the whole projection,
        # 3/4 of each head rotated (the released configs' rotary_dim)
        cfg = tf.MiniMaxM2Config(**{**common, "intermediate_size": 32}, num_local_experts=8, num_experts_per_tok=2,
                                 rotary_dim=12, tie_word_embeddings=False)
        return cfg
    # DeepSeek's latent attention (as many KV heads as query heads, as its configs give them): a 32-dim latent,
    # 8 rotated dims in interleaved pairs; YaRN whose mscale_all_dim scales the softmax
    mla = dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, moe_intermediate_size=32,
               n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1, tie_word_embeddings=False)
    mla_common = {**{k: v for k, v in common.items() if k != "head_dim"}, "num_key_value_heads": heads}
    if family == "deepseek_v2":  # q straight from x; softmax routing limited to the 2 groups of best expert
        return tf.DeepseekV2Config(**mla_common, **mla, q_lora_rank=None, num_experts_per_tok=2,
                                   topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                   routed_scaling_factor=1.5, rope_scaling={
                                       "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                                       "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1})
    if family == "deepseek_v3":  # q through a bottleneck; GLM-4.5's grouped sigmoid routing
        return tf.DeepseekV3Config(**mla_common, **mla, q_lora_rank=24, num_experts_per_tok=3, n_group=4, topk_group=2,
                                   routed_scaling_factor=2.5, rope_scaling={
                                       "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                                       "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1})
    # Cohere: one LayerNorm (no bias) feeding attention and the MLP side by side, RoPE in interleaved pairs, logits
    # scaled, a tied head; head_dim is hidden / heads
    cohere = {**{k: v for k, v in common.items() if k not in ("head_dim", "rms_norm_eps")}, "layer_norm_eps": 1e-5,
              "tie_word_embeddings": True}
    if family == "cohere":  # Command R+'s per-head q / k LayerNorms
        return tf.CohereConfig(**cohere, use_qk_norm=True, logit_scale=0.25)
    if family == "cohere2":  # layer 0 through a 4-token window with RoPE, layer 1 global without RoPE
        return tf.Cohere2Config(**cohere, sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    if family == "hunyuan_moe":  # Hunyuan's attention; 4 experts (2 a token, softmax renormalized) beside a shared MLP
        return tf.HunYuanMoEV1Config(**{**common, "intermediate_size": 32}, attention_bias=True, num_experts=4,
                                     moe_topk=2, tie_word_embeddings=False,
                                     rope_scaling={"type": "dynamic", "alpha": 50.0, "factor": 1.0})
    if family == "dots1":  # dots.llm1: Qwen3's attention, layer 1 through a 4-token window (max_window_layers 1);
        # GLM-4.5's experts from layer 1 (4 groups, 2 kept, sigmoid scores with a correction bias) and a shared expert
        return tf.Dots1Config(**common, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3,
                              n_shared_experts=1, n_group=4, topk_group=2, first_k_dense_replace=1,
                              routed_scaling_factor=2.5, norm_topk_prob=True, sliding_window=4, max_window_layers=1,
                              tie_word_embeddings=False)
    if family == "ministral":  # Ministral-8B: layer 0 through a 4-token window, layer 1 global
        return tf.MinistralConfig(**common, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                                  tie_word_embeddings=False)
    if family == "ministral3":  # Ministral 3: YaRN over 8 positions, every query scaled from position 8 on
        return tf.Ministral3Config(**common, tie_word_embeddings=False, rope_parameters={
            "rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 4.0, "original_max_position_embeddings": 8,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.5})
    if family == "llama4":  # Llama 4 text: experts in layers 0 and 3 (one per token, its input scaled) beside a shared
        # expert, dense MLPs of intermediate_size_mlp between; layers 1 and 3 without RoPE and with their queries'
        # temperature (floor_scale 4: it changes from position 3 on), 0 and 2 with RoPE in interleaved pairs and
        # unweighted q / k norms; chunks longer than any test context
        return tf.Llama4TextConfig(**{**common, "num_hidden_layers": 4, "intermediate_size": 32}, intermediate_size_mlp=112,
                                   num_local_experts=4, num_experts_per_tok=1, moe_layers=[0, 3],
                                   no_rope_layers=[1, 0, 1, 0], attention_chunk_size=512, floor_scale=4, attn_scale=0.5,
                                   tie_word_embeddings=False, rope_scaling={
                                       "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64})
    if family == "mixtral":  # every layer's MLP is 4 experts of intermediate_size
        return tf.MixtralConfig(**{**common, "intermediate_size": 48}, **moe, num_local_experts=4, sliding_window=None)
    if family == "qwen3_moe":  # layer 0 experts, layer 1 a dense MLP
        return tf.Qwen3MoeConfig(**common, **moe, num_experts=4, moe_intermediate_size=48, mlp_only_layers=[1],
                                 norm_topk_prob=True)
    if family == "qwen2_moe":  # experts beside a gated shared expert; weights not renormalized
        return tf.Qwen2MoeConfig(**common, **moe, num_experts=4, moe_intermediate_size=48,
                                 shared_expert_intermediate_size=32, norm_topk_prob=False)
    raise KeyError(family)


_CLASSES = {"llama3": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM",
            "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
            "smollm3": "SmolLM3ForCausalLM", "granite": "GraniteForCausalLM",
            "granitemoe": "GraniteMoeForCausalLM", "phi3": "Phi3ForCausalLM", "phi3_partial": "Phi3ForCausalLM",
            "seed_oss": "SeedOssForCausalLM", "internlm3": "LlamaForCausalLM", "ernie4_5": "Ernie4_5ForCausalLM",
            "glm": "GlmForCausalLM", "glm4": "Glm4ForCausalLM", "exaone4": "Exaone4ForCausalLM",
            "hunyuan": "HunYuanDenseV1ForCausalLM", "arcee": "ArceeForCausalLM", "apertus": "ApertusForCausalLM",
            "starcoder2": "Starcoder2ForCausalLM", "gpt_oss": "GptOssForCausalLM", "glm4_moe": "Glm4MoeForCausalLM",
            "minimax_m2": "MiniMaxM2ForCausalLM", "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
            "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM", "llama4": "Llama4ForCausalLM",
            "cohere": "CohereForCausalLM", "cohere2": "Cohere2ForCausalLM", "hunyuan_moe": "HunYuanMoEV1ForCausalLM",
            "dots1": "Dots1ForCausalLM", "ministral": "MinistralForCausalLM", "ministral3": "Ministral3ForCausalLM",
            "olmo2": "Olmo2ForCausalLM", "olmo3": "Olmo3ForCausalLM", "olmoe": "OlmoeForCausalLM", "gemma": "GemmaForCausalLM",
            "gemma2": "Gemma2ForCausalLM",
            "gemma3": "Gemma3ForCausalLM"}


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """factory(family, shard=False, heads=8, **fields) -> (dir, transformers model): random weights saved
    as a Hugging Face checkpoint with the demo tokenizer, so the Engine can serve it too; `fields`
    set on the family's config before the model is built."""
    import transformers as tf

    demo = demo_model("tiny")
    made: dict[tuple[str, bool], tuple[str, object]] = {}

    def make(family: str, shard: bool = False, heads: int = 8, **fields):
        key = (family, shard, heads, repr(sorted(fields.items())))
        if key in made:
            return made[key]
        from radixflow.runtime.text.tokenizer import Tokenizer

        vocab = Tokenizer.from_dir(demo).vocab_size
        torch.manual_seed(1234)
        cfg = _hf_config(family, vocab, heads)
        for name, value in fields.items():
            setattr(cfg, name, value)
        if family.startswith("gemma") or family == "gpt_oss":  # transformers' SDPA path drops Gemma 2's attention
            cfg._attn_implementation = "eager"  # soft-cap and gpt-oss's sinks
        model = getattr(tf, _CLASSES[family])(cfg).float().eval()
        with torch.no_grad():  # widen the random init so greedy argmax has clear margins
            for name, b in model.named_buffers():  # GLM-4.5's router correction: a bias that changes the choice
                if name.endswith("e_score_correction_bias"):
                    b.normal_(0.0, 0.5)
            for name, p in model.named_parameters():
                if p.dim() >= 2:  # matrices, and MoE models' stacked experts
                    p.normal_(0.0, 0.08)
                elif "bias" in name:
                    p.normal_(0.0, 0.05)
                elif family.startswith("gemma"):  # its norms compute 1 + weight, which starts at 0
                    p.normal_(0.0, 0.1)
                elif family in ("hunyuan", "hunyuan_moe", "exaone4", "starcoder2", "minimax_m2", "cohere", "cohere2"):  # norms whose weights must not be all alike (HunYuan's
                    p.normal_(1.0, 0.3)  # q / k norms after RoPE would commute with it)
                elif family == "apertus" and "act_fn" in name:  # xIELU's learned scalars, away from their init
                    p.add_(torch.randn_like(p) * 0.3)
                elif name.endswith("sinks"):  # gpt-oss: logits beside the scores', some above them, some below
                    p.normal_(0.0, 1.5)
        out = str(tmp_path_factory.mktemp(f"{family}{'-sharded' if shard else ''}-h{heads}{'-fields' if fields else ''}"))
        model.save_pretrained(out, safe_serialization=True, max_shard_size="100KB" if shard else "5GB")
        if family in SAVED_ARCHITECTURES:  # transformers runs it on another family's class
            with open(os.path.join(out, "config.json")) as f:
                saved = json.load(f)
            saved["architectures"] = [SAVED_ARCHITECTURES[family]]
            with open(os.path.join(out, "config.json"), "w") as f:
                json.dump(saved, f)
        for f in TOKENIZER_FILES:
            shutil.copy(os.path.join(demo, f), out)
        made[key] = (out, model)
        return made[key]

    return make
