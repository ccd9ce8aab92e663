"""Each family's part of a Hugging Face config.json, read as transformers 5 reads it: its config
class's defaults, biases, sliding windows, mixture-of-experts layers, Granite's multipliers,
Gemma's fields (runtime/model/model_config.py builds ModelArgs from them; RoPE: rope_config.py)."""
from __future__ import annotations

import math
from typing import Any

from radixflow.runtime.model.config_fields import (
    check_nonnegative_int, check_positive_int, check_positive_number, flag, optional, required,
)

GEMMA_ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
# mixture-of-experts families: a router sends each token to its top-k experts' MLPs
MOE_ARCHITECTURES = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "GraniteMoeForCausalLM",
                     "OlmoeForCausalLM", "GptOssForCausalLM", "Glm4MoeForCausalLM", "MiniMaxM2ForCausalLM",
                     "Ernie4_5_MoeForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
                     "Llama4ForCausalLM", "HunYuanMoEV1ForCausalLM", "Dots1ForCausalLM")
# Command R / R+ and Command R7B / A: one LayerNorm (no bias) before attention and MLP side by side
COHERE_ARCHITECTURES = ("CohereForCausalLM", "Cohere2ForCausalLM")
# multi-head latent attention (DeepSeek-V2 / V3, Kimi K2, Moonlight): see mla_fields
DEEPSEEK_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
GRANITE_ARCHITECTURES = ("GraniteForCausalLM", "GraniteMoeForCausalLM")
# a config's activation name → ModelArgs.hidden_act: of the gated MLPs (act(gate) * up), and of the
# MLPs without a gate (act(up): Arcee's squared ReLU, Apertus' xIELU with its learned scalars)
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
UNGATED_ACTIVATIONS = {"relu2": "relu2", "xielu": "xielu", "gelu_pytorch_tanh": "gelu_tanh"}
UNGATED_ARCHITECTURES = ("ArceeForCausalLM", "ApertusForCausalLM", "Starcoder2ForCausalLM")


# GLM 4 (glm-4-9b-chat-hf: GlmForCausalLM; GLM-4-0414: Glm4ForCausalLM, norms around both branches):
# half of each head rotated by interleaved RoPE pairs, gate | up stored fused, q / k / v biases
GLM_ARCHITECTURES = ("GlmForCausalLM", "Glm4ForCausalLM")
# what transformers' config classes default to where config.json is silent, where that is not
# the reader's own default (KV heads as many as query heads, rms_norm_eps 1e-6, 4096 positions,
# head_dim hidden / heads, RoPE base 10,000); Gemma's are in _GEMMA_DEFAULTS
_GLM_DEFAULTS = {"num_key_value_heads": 2, "rms_norm_eps": 1.5625e-07, "max_position_embeddings": 131072,
                 "head_dim": 128, "attention_bias": True}
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": {"max_position_embeddings": 2048},
    "MistralForCausalLM": {"num_key_value_heads": 8, "max_position_embeddings": 131072},
    "MixtralForCausalLM": {"num_key_value_heads": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072},
    "Qwen2ForCausalLM": {"max_position_embeddings": 32768},
    "Qwen3ForCausalLM": {"max_position_embeddings": 32768, "head_dim": 128},
    "Qwen2MoeForCausalLM": {"num_key_value_heads": 16, "max_position_embeddings": 32768},
    "Qwen3MoeForCausalLM": {"num_key_value_heads": 4, "max_position_embeddings": 32768},
    "SmolLM3ForCausalLM": {"num_key_value_heads": 4, "max_position_embeddings": 32768},
    "GraniteForCausalLM": {"max_position_embeddings": 2048},
    "GraniteMoeForCausalLM": {"max_position_embeddings": 2048},
    "Phi3ForCausalLM": {"rms_norm_eps": 1e-5},
    "Olmo2ForCausalLM": {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048},
    "Olmo3ForCausalLM": {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048},
    "OlmoeForCausalLM": {"rms_norm_eps": 1e-5},
    "SeedOssForCausalLM": {"num_key_value_heads": 8, "max_position_embeddings": 524288, "head_dim": 128,
                           "attention_bias": True},
    "InternLM3ForCausalLM": {"num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 32768,
                             "head_dim": 128},
    "Ernie4_5ForCausalLM": {"num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
                            "head_dim": 128, "tie_word_embeddings": True},
    "GlmForCausalLM": _GLM_DEFAULTS,
    "Glm4ForCausalLM": _GLM_DEFAULTS,
    "Exaone4ForCausalLM": {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048},
    "HunYuanDenseV1ForCausalLM": {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048},
    "HunYuanMoEV1ForCausalLM": {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048},
    "Dots1ForCausalLM": {"max_position_embeddings": 2048, "moe_intermediate_size": 1408},
    "ArceeForCausalLM": {"rms_norm_eps": 1e-5},
    "ApertusForCausalLM": {"rms_norm_eps": 1e-5, "max_position_embeddings": 65536},
    "Starcoder2ForCausalLM": {"num_key_value_heads": 2, "use_bias": True, "tie_word_embeddings": True},
    "Glm4MoeForCausalLM": {"num_key_value_heads": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
                           "n_routed_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 1408},
    "Ernie4_5_MoeForCausalLM": {"num_key_value_heads": 4, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
                                "tie_word_embeddings": True},
    "MiniMaxM2ForCausalLM": {"num_key_value_heads": 8, "max_position_embeddings": 196608, "head_dim": 128,
                             "num_experts_per_tok": 8},
    "CohereForCausalLM": {"max_position_embeddings": 8192, "bos_token_id": 5, "eos_token_id": 255001},
    "Cohere2ForCausalLM": {"max_position_embeddings": 8192, "bos_token_id": 5, "eos_token_id": 255001},
    "MinistralForCausalLM": {"num_key_value_heads": 8, "max_position_embeddings": 131072},
    "Ministral3ForCausalLM": {"num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
                              "max_position_embeddings": 262144, "vocab_size": 131072},
    "Llama4ForCausalLM": {"num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
                          "max_position_embeddings": 131072, "intermediate_size_mlp": 16384, "num_local_experts": 16,
                          "bos_token_id": 1, "eos_token_id": 2},
    "DeepseekV2ForCausalLM": {"max_position_embeddings": 2048, "n_routed_experts": 64, "moe_intermediate_size": 1407},
    "DeepseekV3ForCausalLM": {"n_routed_experts": 256, "moe_intermediate_size": 2048, "num_experts_per_tok": 8,
                              "bos_token_id": 0, "eos_token_id": 1},
    "GptOssForCausalLM": {"num_key_value_heads": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
                          "head_dim": 64, "attention_bias": True, "sliding_window": 128, "num_experts_per_tok": 4},
}
# ApertusConfig's RoPE where the config names none
_APERTUS_ROPE = {"rope_type": "llama3", "rope_theta": 12_000_000.0, "factor": 8.0,
                 "original_max_position_embeddings": 8192, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


# GptOssConfig's (its base, 150,000, is rope_config's default for the family)
_GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                 "original_max_position_embeddings": 4096}
# Ministral3Config's
_MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 16.0, "original_max_position_embeddings": 16384,
                    "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}
_DEFAULT_ROPES = {"ApertusForCausalLM": _APERTUS_ROPE, "GptOssForCausalLM": _GPT_OSS_ROPE,
                  "Ministral3ForCausalLM": _MINISTRAL3_ROPE}


def with_family_defaults(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """`cfg` over the defaults of `arch`'s transformers config class (a null stays null)."""
    cfg = {**_FAMILY_DEFAULTS.get(arch, {}), **cfg}
    rope = _DEFAULT_ROPES.get(arch)
    if rope is not None and cfg.get("rope_parameters") is None and cfg.get("rope_scaling") is None:
        cfg = {**cfg, "rope_parameters": dict(rope)}
    return cfg


def bias_fields(cfg: dict[str, Any], arch: str) -> dict[str, bool]:
    """Which projections carry biases, each family as transformers builds it: Qwen2 q / k / v
    (Qwen2-MoE: `qkv_bias`, true unless set); `attention_bias` q / k / v and o (Llama, Qwen3,
    Granite, OLMo, InternLM3 alias `qkv_bias`), q / k / v only (GLM, Seed-OSS: o by
    `attention_out_bias`); ERNIE 4.5's `use_bias` every projection; `mlp_bias` (Llama, SmolLM3,
    Granite, Seed-OSS, InternLM3 alias `bias`) the MLP's. Mistral, Mixtral and Phi-3 have none."""
    intern = arch == "InternLM3ForCausalLM"  # its config's old names: qkv_bias, bias
    attention_bias = flag(cfg, "attention_bias", flag(cfg, "qkv_bias", False) if intern else False)
    mlp_bias = flag(cfg, "mlp_bias", flag(cfg, "bias", False) if intern else False)
    if intern and attention_bias != mlp_bias:  # transformers refuses it: Llama's layer has one setting for both
        raise ValueError(f"InternLM3 with attention_bias (qkv_bias) {attention_bias} and mlp_bias (bias) {mlp_bias} "
                         "is not supported: they must be equal")
    if arch in ("MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM"):
        return {"qkv_bias": False, "o_bias": False, "mlp_bias": False}
    if arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM"):
        qkv = flag(cfg, "qkv_bias", True) if arch == "Qwen2MoeForCausalLM" else True
        return {"qkv_bias": qkv, "o_bias": False, "mlp_bias": False}
    if arch in ("Ernie4_5ForCausalLM", "Ernie4_5_MoeForCausalLM", "Starcoder2ForCausalLM"):
        use_bias = flag(cfg, "use_bias", False)
        return {"qkv_bias": use_bias, "o_bias": use_bias, "mlp_bias": use_bias}
    if arch in GLM_ARCHITECTURES + ("Glm4MoeForCausalLM",):
        return {"qkv_bias": attention_bias, "o_bias": False, "mlp_bias": False}
    if arch == "SeedOssForCausalLM":
        return {"qkv_bias": attention_bias, "o_bias": flag(cfg, "attention_out_bias", False),
                "mlp_bias": mlp_bias}
    with_mlp = arch in ("LlamaForCausalLM", "SmolLM3ForCausalLM", "GraniteForCausalLM", "InternLM3ForCausalLM",
                        "ArceeForCausalLM")
    return {"qkv_bias": attention_bias, "o_bias": attention_bias, "mlp_bias": mlp_bias and with_mlp}


# Gemma2Config's and Gemma3TextConfig's defaults (transformers 5): their checkpoints' configs leave many
# fields out; a null in these (_GEMMA_NULLABLE) turns the feature off rather than taking the default
_GEMMA_DEFAULTS = {"hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                   "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
                   "bos_token_id": 2, "eos_token_id": 1, "tie_word_embeddings": True, "query_pre_attn_scalar": 256,
                   "sliding_window": 4096}
_GEMMA_DEFAULTS_BY_ARCH = {
    "Gemma2ForCausalLM": {"vocab_size": 256_000, "max_position_embeddings": 8192, "final_logit_softcapping": 30.0,
                          "attn_logit_softcapping": 50.0},
    "Gemma3ForCausalLM": {"vocab_size": 262_208, "max_position_embeddings": 131_072},
}
_GEMMA_NULLABLE = ("sliding_window", "final_logit_softcapping", "attn_logit_softcapping")
# GemmaConfig's defaults (Gemma 1, CodeGemma): no windows, soft-caps or norms after the branches
_GEMMA1_DEFAULTS = {"vocab_size": 256_000, "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
                    "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
                    "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
                    "bos_token_id": 2, "eos_token_id": 1, "tie_word_embeddings": True}


def with_gemma_defaults(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """`cfg` over transformers' defaults for Gemma `arch` (a null in _GEMMA_NULLABLE stays null)."""
    return {**_GEMMA_DEFAULTS, **_GEMMA_DEFAULTS_BY_ARCH[arch],
            **{k: v for k, v in cfg.items() if v is not None or k in _GEMMA_NULLABLE}}


def gemma1_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A Gemma 1 config over GemmaConfig's defaults, its released `hidden_act: "gelu"` read as GELU's
    tanh form (as transformers reads it: the released weights were trained with it)."""
    merged = {**_GEMMA1_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}
    if merged["hidden_act"] == "gelu":
        merged["hidden_act"] = "gelu_pytorch_tanh"
    if merged.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention is not supported (attention here is causal)")
    return merged


def gemma1_fields(hidden: int) -> dict[str, Any]:
    """Gemma 1's ModelArgs fields: embeddings scaled by sqrt(hidden_size) rounded to the model's
    dtype, norm weights stored as weight - 1."""
    check_positive_int("hidden_size", hidden)
    return {"embedding_multiplier": math.sqrt(hidden), "embedding_multiplier_in_dtype": True,
            "norm_weight_offset": 1.0}


def gemma3_text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config of a Gemma 3 multimodal config: its `text_config`, with the
    top level's token ids and dtype where the text config lacks them, and the top level's end
    tokens added to the text config's (gemma-3-4b-it ends turns with <end_of_turn> there)."""
    text = cfg.get("text_config") or {}
    if not isinstance(text, dict):
        raise ValueError(f"text_config must be an object, got {text!r}")
    merged = {**{k: cfg[k] for k in ("bos_token_id", "torch_dtype", "dtype") if cfg.get(k) is not None}, **text}
    ends = [e for src in (text, cfg) for e in _as_list(src.get("eos_token_id"))]
    if ends:
        merged["eos_token_id"] = list(dict.fromkeys(ends))
    # the multimodal model's own head: tied by its top-level flag (true unless set), never soft-capped
    merged["tie_word_embeddings"] = cfg.get("tie_word_embeddings", True)
    merged["final_logit_softcapping"] = None
    return merged


# vision-language models served as their language models (Qwen2/2.5/3-VL, Mistral 3: Mistral-Small-3.x):
# the architecture each one's text model runs as, and the text config class's defaults that differ
VL_TEXT_ARCHITECTURES = {"Qwen2VLForConditionalGeneration": "Qwen2ForCausalLM",
                         "Qwen2_5_VLForConditionalGeneration": "Qwen2ForCausalLM",
                         "Qwen3VLForConditionalGeneration": "Qwen3ForCausalLM",
                         "Qwen3VLMoeForConditionalGeneration": "Qwen3MoeForCausalLM",
                         "Mistral3ForConditionalGeneration": "MistralForCausalLM",
                         "Llama4ForConditionalGeneration": "Llama4ForCausalLM",
                         "Glm4vForConditionalGeneration": "Glm4ForCausalLM",
                         "Glm4vMoeForConditionalGeneration": "Glm4MoeForCausalLM"}
_QWEN2_VL_TEXT = {"rope_theta": 1_000_000.0, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
                  "num_key_value_heads": 8}
_VL_TEXT_DEFAULTS = {"Llama4ForConditionalGeneration": {},
                     "Glm4vForConditionalGeneration": {"num_key_value_heads": 2, "rms_norm_eps": 1e-5,
                                                       "max_position_embeddings": 32768},
                     "Glm4vMoeForConditionalGeneration": {
                         "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 65536,
                         "attention_bias": True, "moe_intermediate_size": 1408, "num_experts_per_tok": 8,
                         "n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1,
                         "topk_group": 1, "first_k_dense_replace": 1, "norm_topk_prob": True},
                     "Qwen2VLForConditionalGeneration": _QWEN2_VL_TEXT, "Qwen2_5_VLForConditionalGeneration": _QWEN2_VL_TEXT,
                     "Qwen3VLForConditionalGeneration": {"rope_theta": 500_000.0, "max_position_embeddings": 128_000,
                                                         "num_key_value_heads": 32, "head_dim": 128},
                     "Qwen3VLMoeForConditionalGeneration": {"rope_theta": 500_000.0, "max_position_embeddings": 128_000,
                                                            "num_key_value_heads": 16, "num_experts": 60,
                                                            "num_experts_per_tok": 4, "moe_intermediate_size": 1408},
                     "Mistral3ForConditionalGeneration": {}}


def vl_text_config(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """The language model's config of a Qwen2-VL / Qwen2.5-VL / Qwen3-VL, Mistral 3, Llama 4 or
    GLM-4.1V / 4.5V config: its `text_config`
    (transformers 5) or the top level itself (the released Qwen2-VL / 2.5-VL configs), over the text
    config class's defaults, with the top level's token ids, dtype and head tie; its multimodal
    RoPE read as plain RoPE (text-only positions make them one)."""
    text = cfg.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ValueError(f"text_config must be an object, got {text!r}")
    base = {k: v for k, v in (text or cfg).items() if k not in ("vision_config", "text_config", "architectures")}
    merged = {**_VL_TEXT_DEFAULTS[arch],
              **{k: cfg[k] for k in ("bos_token_id", "eos_token_id", "torch_dtype", "dtype") if cfg.get(k) is not None},
              **{k: v for k, v in base.items() if v is not None or k == "sliding_window"}}  # a null window: none
    # the head ties by the top-level flag; without one, Qwen2(.5)-VL's and Mistral 3's by the text config's
    # (Mistral-Small-3.x's released configs have none, and store the head), Qwen3-VL's not
    text_tie = base.get("tie_word_embeddings", False) if arch.startswith(("Qwen2", "Mistral3", "Llama4")) else False
    # Llama 4's language model ties by its text config alone (transformers builds it from that config)
    merged["tie_word_embeddings"] = text_tie if arch.startswith("Llama4") else cfg.get("tie_word_embeddings", text_tie)
    if arch.startswith("Glm4v"):  # GLM-4.1V / 4.5V: the part of each head rotated, when neither names it
        rope = merged.get("rope_parameters") or merged.get("rope_scaling") or {}
        if "partial_rotary_factor" not in rope and merged.get("partial_rotary_factor") is None:
            merged["partial_rotary_factor"] = 0.5 if arch.startswith("Glm4vMoe") else 1.0
    if arch == "Glm4vForConditionalGeneration":  # its attention: hidden / heads per head, q / k / v biases always
        hidden, heads = merged.get("hidden_size"), merged.get("num_attention_heads")
        if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
            merged["head_dim"] = hidden // heads
        merged["attention_bias"] = True
    for field in ("rope_parameters", "rope_scaling"):  # the multimodal RoPE: with text alone a token's three
        rope = merged.get(field)  # positions are one, and its rotation is plain RoPE's (mrope_section unread)
        if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) == "mrope":
            merged[field] = {**{k: v for k, v in rope.items() if k != "type"}, "rope_type": "default"}
    return merged


def _as_list(value: Any) -> list[Any]:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def gemma_fields(cfg: dict[str, Any], hidden: int, arch: str) -> dict[str, Any]:
    """Gemma 2's and 3's ModelArgs fields: windows in the layers `layer_types` names
    "sliding_attention" (else Gemma 2 every other layer from the first, Gemma 3 all but every
    `sliding_window_pattern`-th, 6 by default), the embedding scale sqrt(hidden_size), the
    attention scale query_pre_attn_scalar ** -0.5, the attention-score and final soft-caps.
    Gemma 3's attention never soft-caps (transformers' ignores attn_logit_softcapping there).
    Refused: bidirectional attention (EmbeddingGemma), and a null window where layers slide
    (transformers fails on it)."""
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention is not supported (attention here is causal)")
    num_layers = required(cfg, "num_hidden_layers")
    check_positive_int("num_hidden_layers", num_layers)
    check_positive_int("hidden_size", hidden)
    layer_types = layer_types_of(cfg, num_layers, 2 if arch == "Gemma2ForCausalLM"
                                 else optional(cfg, "sliding_window_pattern", 6))
    scalar = optional(cfg, "query_pre_attn_scalar", 256)
    check_positive_number("query_pre_attn_scalar", scalar)
    window = cfg.get("sliding_window")
    window_layers = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    if window is None and window_layers:
        raise ValueError("sliding_window null is not supported where layers slide (layer_types names "
                         "sliding_attention layers)")
    return {"sliding_window": window if window_layers else None, "window_layers": window_layers,
            "embedding_multiplier": math.sqrt(hidden), "embedding_multiplier_in_dtype": True,
            "attention_multiplier": scalar ** -0.5, "norm_weight_offset": 1.0,
            "final_logit_softcapping": cfg.get("final_logit_softcapping"),
            "attn_logit_softcapping": cfg.get("attn_logit_softcapping") if arch == "Gemma2ForCausalLM" else None}


def _norm_topk_prob(cfg: dict[str, Any]) -> bool:
    norm = optional(cfg, "norm_topk_prob", False)
    if not isinstance(norm, bool):
        raise ValueError(f"norm_topk_prob must be true or false, got {norm!r}")
    return norm


def granite_fields(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """Granite's multipliers, each 1 when absent (transformers' defaults)."""
    if arch not in GRANITE_ARCHITECTURES:
        return {}
    return {name: optional(cfg, name, 1.0)
            for name in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")}


def nope_layers(cfg: dict[str, Any]) -> tuple[int, ...]:
    """SmolLM3's layers without RoPE: `no_rope_layers` (1: RoPE, 0: none, per layer), else every
    `no_rope_layer_interval`-th layer (4 by default)."""
    num_layers = required(cfg, "num_hidden_layers")
    check_positive_int("num_hidden_layers", num_layers)
    flags = cfg.get("no_rope_layers")
    if flags is None:
        interval = optional(cfg, "no_rope_layer_interval", 4)
        check_positive_int("no_rope_layer_interval", interval)
        return tuple(i for i in range(num_layers) if (i + 1) % interval == 0)
    if not isinstance(flags, list) or len(flags) != num_layers or any(f not in (0, 1) or isinstance(f, float)
                                                                       for f in flags):
        raise ValueError(f"no_rope_layers must list 0 or 1 for each of the {num_layers} layers, got {flags!r}")
    return tuple(i for i, flag in enumerate(flags) if not flag)


def sliding_window_fields(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """The sliding window and the layers that attend through it, each family as transformers 5
    reads its config (none: attention over the whole context).

    Mistral (4096 when the key is absent), Mixtral, Phi-3: every layer, when `sliding_window` is
    set. Under `use_sliding_window` only: Qwen3-MoE every layer; Qwen2/3 the layers from
    `max_window_layers` on; Qwen2-MoE every other layer (the first, third, ...) below
    `max_window_layers`; SmolLM3 the layers without RoPE. Qwen2/3, Qwen2-MoE and SmolLM3 take an
    explicit `layer_types` instead where the config has one. Llama, Granite and OLMo 2 never slide.
    """
    num_layers = required(cfg, "num_hidden_layers")
    check_positive_int("num_hidden_layers", num_layers)
    if arch == "Olmo3ForCausalLM":  # three of four layers slide unless layer_types says otherwise
        return _layer_type_windows(cfg, num_layers, 4)
    if arch == "GptOssForCausalLM":  # every other layer from the first slides unless layer_types says otherwise
        return _layer_type_windows(cfg, num_layers, 2)
    if arch == "MinistralForCausalLM":  # the layers layer_types names, else every layer where a window is set
        window = cfg.get("sliding_window", 4096)
        types = cfg.get("layer_types") or ["sliding_attention" if window is not None else "full_attention"] * num_layers
        return _layer_type_windows({**cfg, "layer_types": types}, num_layers, 1)
    if arch == "Ministral3ForCausalLM":  # every layer when sliding_window is set
        window = cfg.get("sliding_window")
        return {"sliding_window": window, "window_layers": tuple(range(num_layers))} if window is not None else {}
    if arch == "Dots1ForCausalLM":  # the layers layer_types names, else those from max_window_layers (62) on
        if cfg.get("sliding_window", 4096) is None and not cfg.get("layer_types"):
            return {}
        first = optional(cfg, "max_window_layers", 62)
        check_nonnegative_int("max_window_layers", first)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
        return _layer_type_windows({**cfg, "layer_types": cfg.get("layer_types") or types}, num_layers, 1)
    if arch in ("MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM", "Starcoder2ForCausalLM"):
        window = cfg.get("sliding_window", 4096 if arch == "MistralForCausalLM" else None)
        layers = range(num_layers)
    elif arch.startswith("Qwen") or arch == "SmolLM3ForCausalLM":  # Qwen's default window: 4096
        default = None if arch == "SmolLM3ForCausalLM" else 4096
        window = cfg.get("sliding_window", default) if cfg.get("use_sliding_window") else None
        layer_types = cfg.get("layer_types")
        if arch == "Qwen3MoeForCausalLM":
            layers = range(num_layers)
        elif isinstance(layer_types, list) and len(layer_types) == num_layers:
            layers = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
        elif arch == "SmolLM3ForCausalLM":
            layers = nope_layers(cfg)
        else:
            first = optional(cfg, "max_window_layers", 28)
            check_nonnegative_int("max_window_layers", first)
            if arch == "Qwen2MoeForCausalLM":
                layers = [i for i in range(min(first, num_layers)) if i % 2 == 0]
            else:
                layers = range(first, num_layers)
    else:
        return {}
    if window is None or not layers:
        return {}
    return {"sliding_window": window, "window_layers": tuple(layers)}


def _glm4_moe_fields(cfg: dict[str, Any], num_layers: int, dots: bool = False) -> dict[str, Any]:
    """GLM-4.5's experts (Glm4MoeConfig's fields): `n_routed_experts` (or num_local_experts) of
    `moe_intermediate_size` from layer `first_k_dense_replace` on (dense MLPs of intermediate_size
    before), `n_shared_experts` of that width as one ungated shared expert, sigmoid scores with the
    router's correction bias choosing within `topk_group` of `n_group` groups, renormalized when
    `norm_topk_prob` and scaled by `routed_scaling_factor`; `num_nextn_predict_layers` (or
    num_mtp_layers; 1 when absent) MTP layers stored after the decoder's (not run). dots.llm1
    (`dots`): the same experts with Dots1Config's defaults (every layer's, not renormalized, no MTP)."""
    experts = cfg.get("n_routed_experts", cfg.get("num_local_experts"))
    inter, shared = required(cfg, "moe_intermediate_size"), optional(cfg, "n_shared_experts", 1)
    first = optional(cfg, "first_k_dense_replace", 0 if dots else 1)
    mtp = 0 if dots else optional(cfg, "num_nextn_predict_layers", optional(cfg, "num_mtp_layers", 1))  # transformers': 1
    for name, value in (("n_routed_experts", experts), ("moe_intermediate_size", inter)):
        check_positive_int(name, value)
    for name, value in (("n_shared_experts", shared), ("first_k_dense_replace", first),
                        ("num_nextn_predict_layers", mtp)):
        check_nonnegative_int(name, value)
    return {"num_experts": experts, "num_experts_per_tok": required(cfg, "num_experts_per_tok"),
            "moe_intermediate_size": inter, "norm_topk_prob": flag(cfg, "norm_topk_prob", not dots),
            "moe_layers": tuple(range(first, num_layers)), "shared_expert_intermediate_size": inter * shared,
            "shared_expert_gate": False, "router_scoring": "sigmoid", "router_correction": True,
            "n_group": optional(cfg, "n_group", 1),
            "topk_group": optional(cfg, "topk_group", 1),
            "routed_scaling_factor": optional(cfg, "routed_scaling_factor", 1.0), "extra_layers": mtp}


def _ernie_moe_fields(cfg: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """ERNIE 4.5 MoE's experts (Ernie4_5_MoeConfig's fields, its aliases num_experts and
    num_experts_per_tok too): `moe_num_experts` of `moe_intermediate_size` in the layers i with
    (i + 1) % moe_layer_interval == 0 from moe_layer_start_index to moe_layer_end_index (-1: the
    last), dense MLPs elsewhere; `moe_num_shared_experts` of that width as one ungated shared
    expert; softmax scores, the correction bias
    (moe_statics) choosing, the chosen renormalized; `num_nextn_predict_layers` MTP layers after."""
    experts = optional(cfg, "moe_num_experts", optional(cfg, "num_experts", 64))
    top_k = optional(cfg, "moe_k", optional(cfg, "num_experts_per_tok", 6))
    inter, shared = required(cfg, "moe_intermediate_size"), optional(cfg, "moe_num_shared_experts", 2)
    start, end = optional(cfg, "moe_layer_start_index", 1), optional(cfg, "moe_layer_end_index", -1)
    interval, mtp = optional(cfg, "moe_layer_interval", 1), optional(cfg, "num_nextn_predict_layers", 0)
    for name, value in (("moe_num_experts", experts), ("moe_k", top_k), ("moe_intermediate_size", inter),
                        ("moe_layer_interval", interval)):
        check_positive_int(name, value)
    for name, value in (("moe_num_shared_experts", shared), ("moe_layer_start_index", start),
                        ("num_nextn_predict_layers", 0 if mtp is None else mtp)):
        check_nonnegative_int(name, value)
    if isinstance(end, bool) or not isinstance(end, int) or end < -1:
        raise ValueError(f"moe_layer_end_index must be an integer >= -1, got {end!r}")
    if flag(cfg, "use_bias", False):  # transformers gives the LM head a bias then, which is not served here
        raise ValueError("use_bias true is not supported for Ernie4_5_MoeForCausalLM (its LM head's bias)")
    end = num_layers - 1 if end == -1 else end
    return {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": inter,
            "norm_topk_prob": True, "moe_layers": tuple(i for i in range(num_layers)
                                                        if (i + 1) % interval == 0 and start <= i <= end),
            "shared_expert_intermediate_size": inter * shared, "shared_expert_gate": False, "router_correction": True,
            "extra_layers": mtp or 0}


def layer_types_of(cfg: dict[str, Any], num_layers: int, pattern: Any) -> list[str]:
    """Each layer's attention, "sliding_attention" or "full_attention": the config's `layer_types`,
    else every `pattern`-th layer full and the others sliding (EXAONE 4's string form: L for a
    sliding layer, G for a full one, repeated from layer 0); ValueError naming a malformed one."""
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        if isinstance(pattern, str):
            if not pattern or not set(pattern) <= {"L", "G"}:
                raise ValueError(f"sliding_window_pattern {pattern!r} must be a positive integer or a string of L "
                                 "(a sliding layer) and G (a full one)")
            return ["sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention"
                    for i in range(num_layers)]
        check_positive_int("sliding_window_pattern", pattern)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    if (not isinstance(layer_types, list) or len(layer_types) != num_layers
            or any(t not in ("sliding_attention", "full_attention") for t in layer_types)):
        raise ValueError(f"layer_types must name sliding_attention or full_attention for each of the {num_layers} "
                         f"layers, got {layer_types!r}")
    return layer_types


def exaone4_layers(cfg: dict[str, Any]) -> dict[str, Any]:
    """EXAONE 4, as transformers reads its config: with a `sliding_window` (4096 when absent), the
    layers `layer_types` names "sliding_attention" (else `sliding_window_pattern`: every n-th layer
    global, 4 when absent, or a string of L (local) and G (global) repeated from layer 0) attend
    through the window with RoPE, and the global layers take no RoPE; with a null window every
    layer is global, with RoPE."""
    num_layers = required(cfg, "num_hidden_layers")
    check_positive_int("num_hidden_layers", num_layers)
    window = cfg.get("sliding_window", 4096)
    if window is None:
        return {}
    layer_types = layer_types_of(cfg, num_layers, optional(cfg, "sliding_window_pattern", 4))
    window_layers = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    nope = tuple(i for i, t in enumerate(layer_types) if t == "full_attention")
    return {"sliding_window": window, "window_layers": window_layers, "nope_layers": nope} if window_layers else {
        "nope_layers": nope}  # no layer slides: every layer global, without RoPE


def _layer_type_windows(cfg: dict[str, Any], num_layers: int, pattern: int) -> dict[str, Any]:
    """OLMo 3 and gpt-oss: a `sliding_window` (OLMo 3: 4096 when absent; gpt-oss's default, 128,
    is in its family defaults) in the layers `layer_types` names "sliding_attention", else in all
    but every `pattern`-th (OLMo 3: 4, gpt-oss: 2)."""
    layer_types = layer_types_of(cfg, num_layers, pattern)
    window = cfg.get("sliding_window", 4096)
    layers = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    if window is None and layers:
        raise ValueError("sliding_window null is not supported where layers slide (layer_types names "
                         "sliding_attention layers)")
    return {"sliding_window": window, "window_layers": layers} if layers else {}


def moe_fields(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """ModelArgs' mixture-of-experts fields of a config.json (none for a dense family).

    Mixtral, GraniteMoE, OLMoE: every layer's MLP is experts of `intermediate_size`, top-k weights
    renormalized (OLMoE: when `norm_topk_prob`). Qwen2/3-MoE: experts of `moe_intermediate_size`
    in every `decoder_sparse_step`-th layer outside `mlp_only_layers` (dense MLPs of
    `intermediate_size` there), renormalized when `norm_topk_prob`; Qwen2-MoE adds a shared expert
    gated by a sigmoid.
    """
    if arch not in MOE_ARCHITECTURES:
        return {}
    num_layers = required(cfg, "num_hidden_layers")
    check_positive_int("num_hidden_layers", num_layers)
    if arch in ("Glm4MoeForCausalLM", "Dots1ForCausalLM"):
        return _glm4_moe_fields(cfg, num_layers, arch == "Dots1ForCausalLM")
    if arch == "Ernie4_5_MoeForCausalLM":
        return _ernie_moe_fields(cfg, num_layers)
    if arch in DEEPSEEK_ARCHITECTURES:
        return _deepseek_moe_fields(cfg, arch, num_layers)
    if arch == "Llama4ForCausalLM":
        return _llama4_moe_fields(cfg, num_layers)
    if arch == "HunYuanMoEV1ForCausalLM":
        return _hunyuan_moe_fields(cfg, num_layers)
    experts = cfg.get("num_local_experts")
    experts = cfg.get("num_experts") if experts is None else experts  # GptOssConfig's alias, others' name
    if experts is None and arch in ("GptOssForCausalLM", "MiniMaxM2ForCausalLM"):
        experts = {"GptOssForCausalLM": 128, "MiniMaxM2ForCausalLM": 256}[arch]  # their config classes' defaults
    if experts is None:
        raise ValueError("the required field num_local_experts (or num_experts) is missing")
    if experts == 0 and arch.startswith("Qwen"):  # Qwen-MoE without experts: every MLP dense
        return {}
    fields: dict[str, Any] = {"num_experts": experts, "num_experts_per_tok": required(cfg, "num_experts_per_tok")}
    if arch in ("MixtralForCausalLM", "GraniteMoeForCausalLM", "OlmoeForCausalLM", "GptOssForCausalLM",
                "MiniMaxM2ForCausalLM"):
        # every MLP: experts. Mixtral, GraniteMoE and gpt-oss always renormalize (Granite and gpt-oss:
        # a softmax over the top-k logits, the same weights)
        norm = _norm_topk_prob(cfg) if arch == "OlmoeForCausalLM" else True
        fields.update(moe_intermediate_size=required(cfg, "intermediate_size"), norm_topk_prob=norm,
                      moe_layers=tuple(range(num_layers)))
        if arch == "MiniMaxM2ForCausalLM":  # sigmoid scores with a correction bias choose; `num_mtp_modules` MTP layers
            mtp = optional(cfg, "num_mtp_modules", 0)  # stored after the decoder's (not run)
            check_nonnegative_int("num_mtp_modules", mtp)
            fields.update(router_scoring="sigmoid", router_correction=True, extra_layers=mtp)
        if arch == "GptOssForCausalLM":  # biases on the router and the experts; the clamped SwiGLU
            fields.update(router_bias=True, expert_bias=True, expert_act="swiglu_clamped",
                          swiglu_alpha=optional(cfg, "swiglu_alpha", 1.702),
                          swiglu_limit=optional(cfg, "swiglu_limit", 7.0))
        return fields
    step, dense = optional(cfg, "decoder_sparse_step", 1), optional(cfg, "mlp_only_layers", [])
    check_positive_int("decoder_sparse_step", step)
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise ValueError(f"mlp_only_layers must list layer numbers, got {dense!r}")
    fields.update(moe_intermediate_size=required(cfg, "moe_intermediate_size"), norm_topk_prob=_norm_topk_prob(cfg),
                  moe_layers=tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0))
    if arch == "Qwen2MoeForCausalLM":
        fields["shared_expert_intermediate_size"] = required(cfg, "shared_expert_intermediate_size")
    return fields


def _deepseek_moe_fields(cfg: dict[str, Any], arch: str, num_layers: int) -> dict[str, Any]:
    """DeepSeek-V2's and V3's experts (their config classes' fields and defaults): `n_routed_experts`
    of `moe_intermediate_size` in the layers i >= first_k_dense_replace with i % moe_layer_freq == 0
    (dense MLPs elsewhere; transformers' classes ignore the frequency, every released config has 1),
    `n_shared_experts` of that width as one ungated shared expert, weights times routed_scaling_factor.
    V3 (Kimi K2, Moonlight): sigmoid scores with the router's correction bias choosing within
    `topk_group` of `n_group` groups (ranked by the sum of their top two), renormalized when
    `norm_topk_prob`; `num_nextn_predict_layers` MTP layers stored after the decoder's (not run).
    V2: softmax scores, `topk_method` greedy (all experts) or group_limited_greedy (the groups
    ranked by their best score), renormalized when `norm_topk_prob` and top-k > 1 (false in its
    configs; as the reference code reads it: transformers' V2 router never renormalizes).
    `n_shared_experts` null: none."""
    v3 = arch == "DeepseekV3ForCausalLM"
    scoring = optional(cfg, "scoring_func", "sigmoid" if v3 else "softmax")
    if scoring != ("sigmoid" if v3 else "softmax"):  # the one each family's routing computes
        raise ValueError(f"scoring_func {scoring!r} is not supported for {arch}; supported: "
                         f"{'sigmoid' if v3 else 'softmax'}")
    experts, inter = required(cfg, "n_routed_experts"), required(cfg, "moe_intermediate_size")
    for name, value in (("n_routed_experts", experts), ("moe_intermediate_size", inter)):
        check_positive_int(name, value)
    # absent: the class's default; null: none (as DeepSeek's code reads it)
    shared = cfg.get("n_shared_experts", 1 if v3 else 2) or 0
    if flag(cfg, "mlp_bias", False):  # transformers' V2 MLPs would carry biases; no released model has them
        raise ValueError(f"mlp_bias true is not supported for {arch}")
    first = optional(cfg, "first_k_dense_replace", 3 if v3 else 0)
    check_nonnegative_int("n_shared_experts", shared)
    check_nonnegative_int("first_k_dense_replace", first)
    freq = optional(cfg, "moe_layer_freq", 1)
    check_positive_int("moe_layer_freq", freq)
    fields: dict[str, Any] = {
        "num_experts": experts, "num_experts_per_tok": required(cfg, "num_experts_per_tok"),
        "moe_intermediate_size": inter,
        # V2's reference code renormalizes several chosen experts only (one keeps its score)
        "norm_topk_prob": flag(cfg, "norm_topk_prob", v3) and (v3 or required(cfg, "num_experts_per_tok") != 1),
        "moe_layers": tuple(i for i in range(first, num_layers) if i % freq == 0),
        "shared_expert_intermediate_size": inter * shared, "shared_expert_gate": False,
        "routed_scaling_factor": optional(cfg, "routed_scaling_factor", 2.5 if v3 else 1.0)}
    if v3:
        mtp = optional(cfg, "num_nextn_predict_layers", optional(cfg, "num_mtp_layers", 1))
        check_nonnegative_int("num_nextn_predict_layers", mtp)
        fields.update(router_scoring="sigmoid", router_correction=True, n_group=optional(cfg, "n_group", 8),
                      topk_group=optional(cfg, "topk_group", 4), extra_layers=mtp)
        return fields
    method = optional(cfg, "topk_method", "greedy")
    if method not in ("greedy", "group_limited_greedy"):
        raise ValueError(f"topk_method {method!r} is not supported for DeepseekV2ForCausalLM; supported: greedy, "
                         "group_limited_greedy")
    if method == "group_limited_greedy":
        fields.update(n_group=required(cfg, "n_group"), topk_group=required(cfg, "topk_group"), group_score="max")
    return fields


def mla_fields(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """Multi-head latent attention's shape (DeepSeek-V2 / V3): each head's query of
    qk_nope_head_dim + qk_rope_head_dim dims, from x (`q_lora_rank` null) or through a
    `q_lora_rank` bottleneck; keys and values from one `kv_lora_rank` latent per token plus a
    qk_rope_head_dim key shared by every head. The KV pool keeps the latent and the rotated key
    (one KV head of kv_lora_rank + qk_rope_head_dim dims); values have v_head_dim dims. RoPE pairs
    interleaved dims (V3's `rope_interleave`, true unless set; V2 always)."""
    fields = {"kv_lora_rank": optional(cfg, "kv_lora_rank", 512),
              "qk_nope_head_dim": optional(cfg, "qk_nope_head_dim", 128),
              "qk_rope_head_dim": optional(cfg, "qk_rope_head_dim", 64),
              "v_head_dim": optional(cfg, "v_head_dim", 128)}
    for name, value in fields.items():
        check_positive_int(name, value)
    q_lora = cfg.get("q_lora_rank", 1536)  # null: q straight from x (DeepSeek-V2-Lite)
    if q_lora is not None:
        check_positive_int("q_lora_rank", q_lora)
    if fields["qk_rope_head_dim"] % 2:
        raise ValueError(f"qk_rope_head_dim {fields['qk_rope_head_dim']} must be even (RoPE rotates pairs)")
    interleaved = flag(cfg, "rope_interleave", True) if arch == "DeepseekV3ForCausalLM" else True
    return {**fields, "q_lora_rank": q_lora or 0, "rope_interleaved": interleaved}


def _llama4_moe_fields(cfg: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """Llama 4's experts (Llama4TextConfig's fields): `num_local_experts` of `intermediate_size` in
    the layers `moe_layers` lists (else every `interleave_moe_layer_step`-th, from the step's last),
    dense MLPs of `intermediate_size_mlp` elsewhere; one expert per token, chosen by its router
    logit, whose sigmoid scales the expert's input (not its output); an ungated shared expert of
    intermediate_size beside them. Only one expert per token is computed so."""
    experts, top_k = required(cfg, "num_local_experts"), optional(cfg, "num_experts_per_tok", 1)
    inter = required(cfg, "intermediate_size")
    for name, value in (("num_local_experts", experts), ("intermediate_size", inter)):
        check_positive_int(name, value)
    if top_k != 1:  # the input scaling of several experts per token is not computed here
        raise ValueError(f"num_experts_per_tok {top_k!r} is not supported for Llama4ForCausalLM; supported: 1")
    layers = cfg.get("moe_layers")
    if layers is None:
        step = optional(cfg, "interleave_moe_layer_step", 1)
        check_positive_int("interleave_moe_layer_step", step)
        layers = list(range(step - 1, num_layers, step))
    if not isinstance(layers, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in layers):
        raise ValueError(f"moe_layers must list layer numbers, got {layers!r}")
    return {"num_experts": experts, "num_experts_per_tok": 1, "moe_intermediate_size": inter,
            "moe_layers": tuple(sorted(set(layers))), "shared_expert_intermediate_size": inter,
            "shared_expert_gate": False, "expert_input_scaled": True}


def llama4_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """Llama 4's attention (Llama4TextConfig's fields): every `no_rope_layer_interval`-th layer (or
    as `no_rope_layers` lists) without RoPE, its queries scaled by log1p(floor((pos + 1) /
    floor_scale)) * attn_scale + 1 (`attn_temperature_tuning`, true unless set); the other layers'
    q and k normed after RoPE without a weight (`use_qk_norm`, true unless set), attending within
    chunks of `attention_chunk_size` tokens (8192 unless set; null: no chunks)."""
    chunk = cfg.get("attention_chunk_size", 8192)
    if chunk is not None:
        check_positive_int("attention_chunk_size", chunk)
    # an empty no_rope_layers (the released configs') is the default interval's, as transformers reads it
    layers = nope_layers({**cfg, "no_rope_layers": cfg.get("no_rope_layers") or None})
    fields: dict[str, Any] = {"nope_layers": layers, "qk_norm_weightless": flag(cfg, "use_qk_norm", True),
                              "attention_chunk_size": chunk}
    tuning = optional(cfg, "attn_temperature_tuning", True)  # some released configs give it as a number (4)
    if isinstance(tuning, str) or not isinstance(tuning, (bool, int, float)):
        raise ValueError(f"attn_temperature_tuning must be true or false, got {tuning!r}")
    if tuning:
        floor_scale, attn_scale = optional(cfg, "floor_scale", 8192), optional(cfg, "attn_scale", 0.1)
        check_positive_number("floor_scale", floor_scale)
        check_positive_number("attn_scale", attn_scale)
        fields["attn_temperature"] = (float(floor_scale), float(attn_scale), 1.0)
    return fields


def cohere2_layers(cfg: dict[str, Any]) -> dict[str, Any]:
    """Command R7B / A, as transformers reads its config: the layers `layer_types` names
    "sliding_attention" (else all but every `sliding_window_pattern`-th, 4 when absent) attend
    through a `sliding_window` (4096 when absent) with RoPE, the others globally without RoPE (a null
    window where layers slide is refused, as transformers refuses it)."""
    num_layers = required(cfg, "num_hidden_layers")
    check_positive_int("num_hidden_layers", num_layers)
    window = cfg.get("sliding_window", 4096)
    layer_types = layer_types_of(cfg, num_layers, optional(cfg, "sliding_window_pattern", 4))
    window_layers = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    if window is None and window_layers:
        raise ValueError("sliding_window null is not supported where layers slide (layer_types names "
                         "sliding_attention layers)")
    nope = tuple(i for i in range(num_layers) if i not in window_layers)
    return {"sliding_window": window, "window_layers": window_layers, "nope_layers": nope} if window_layers else {
        "nope_layers": nope}


def _per_layer(cfg: dict[str, Any], name: str, default: int, num_layers: int) -> int:
    """A field given once or per layer (HunYuan's num_experts, moe_topk): one positive integer for
    every layer; ValueError for layers that differ."""
    value = optional(cfg, name, default)
    values = value if isinstance(value, list) else [value]
    if isinstance(value, list) and len(value) != num_layers or not values:
        raise ValueError(f"{name} must be one integer or one per each of the {num_layers} layers, got {value!r}")
    for v in values:
        check_positive_int(name, v)
    if len(set(values)) != 1:
        raise ValueError(f"{name} differing between layers ({value!r}) is not supported")
    return values[0]


def _hunyuan_moe_fields(cfg: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """Hunyuan MoE's experts (HunYuanMoEV1Config, as transformers builds them): in every layer,
    `num_experts` of `intermediate_size` chosen `moe_topk` per token by a softmax over the fp32
    router's logits, renormalized, beside an ungated shared MLP of intermediate_size. A per-layer
    list must give every layer the same value."""
    inter = required(cfg, "intermediate_size")
    check_positive_int("intermediate_size", inter)
    return {"num_experts": _per_layer(cfg, "num_experts", 1, num_layers),
            "num_experts_per_tok": _per_layer(cfg, "moe_topk", 1, num_layers), "moe_intermediate_size": inter,
            "norm_topk_prob": True, "moe_layers": tuple(range(num_layers)),
            "shared_expert_intermediate_size": inter, "shared_expert_gate": False}


def ministral3_temperature(scaling: dict[str, Any] | None) -> dict[str, Any]:
    """Ministral 3's query temperature in every layer: 1 + llama_4_scaling_beta *
    log(1 + floor(position / original_max_position_embeddings)), both from its rope_parameters
    (none without a beta)."""
    scaling = scaling or {}
    beta, length = scaling.get("llama_4_scaling_beta"), scaling.get("original_max_position_embeddings")
    if beta is None:
        return {}
    check_positive_number("llama_4_scaling_beta", beta)
    check_positive_int("rope_parameters original_max_position_embeddings", length)
    return {"attn_temperature": (float(length), float(beta), 0.0), "temperature_all_layers": True}
