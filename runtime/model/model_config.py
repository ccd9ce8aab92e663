"""The decoder's shape, read from a Hugging Face `config.json` (or GGUF metadata) for the supported architectures."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from radixflow.runtime.model.config_families import (
    ACTIVATIONS, COHERE_ARCHITECTURES, DEEPSEEK_ARCHITECTURES, GEMMA_ARCHITECTURES, GLM_ARCHITECTURES, UNGATED_ACTIVATIONS, UNGATED_ARCHITECTURES, bias_fields,
    VL_TEXT_ARCHITECTURES, exaone4_layers, gemma1_config, gemma1_fields, gemma3_text_config, gemma_fields,
    granite_fields, moe_fields, nope_layers, sliding_window_fields, vl_text_config, with_family_defaults,
    cohere2_layers, llama4_fields, ministral3_temperature, mla_fields, with_gemma_defaults,
)
from radixflow.runtime.model.config_fields import check_positive_int, check_positive_number, flag, optional, required
from radixflow.runtime.model.rope_config import read_rope
from radixflow.runtime.text_files import read_json_object

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                           "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                           "SmolLM3ForCausalLM", "GraniteForCausalLM", "GraniteMoeForCausalLM", "Phi3ForCausalLM",
                           "Olmo2ForCausalLM", "Olmo3ForCausalLM", "OlmoeForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM",
                           "Gemma3ForCausalLM", "SeedOssForCausalLM", "InternLM3ForCausalLM", "Ernie4_5ForCausalLM",
                           "GlmForCausalLM", "Glm4ForCausalLM", "Exaone4ForCausalLM", "HunYuanDenseV1ForCausalLM",
                           "ArceeForCausalLM", "ApertusForCausalLM", "Starcoder2ForCausalLM", "GptOssForCausalLM",
                           "Glm4MoeForCausalLM", "MiniMaxM2ForCausalLM", "Ernie4_5_MoeForCausalLM",
                           "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Llama4ForCausalLM",
                           "CohereForCausalLM", "Cohere2ForCausalLM", "HunYuanMoEV1ForCausalLM", "Dots1ForCausalLM",
                           "MinistralForCausalLM", "Ministral3ForCausalLM")


# OLMo 2 and 3: norms after attention and MLP (none before), q / k normed over the whole projection
OLMO_ARCHITECTURES = ("Olmo2ForCausalLM", "Olmo3ForCausalLM")
# EXAONE 4: OLMo 2's norms after attention and MLP, with Qwen3's per-head q / k norms


@dataclass(frozen=True)
class ModelArgs:
    """Everything the decoder needs to be built; differences between families are flags here."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool          # Qwen2: q/k/v projections carry a bias
    qk_norm: bool           # Qwen3: RMSNorm over head_dim on q and k before RoPE
    torch_dtype: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # the head dims RoPE rotates (Phi-4-mini: 3/4 of them, GLM half; runtime/model/rope_layout.py); 0: all
    rotary_dim: int = 0
    rope_interleaved: bool = False  # GLM, ERNIE 4.5: RoPE pairs dims (2i, 2i + 1), not (i, i + rotary_dim / 2)
    qk_norm_after_rope: bool = False  # HunYuan: the per-head q / k norms apply to the rotated q and k
    # Arcee, Apertus, StarCoder2: the MLP is down(act(up(x))), without a gate (its gate_up_proj holds up alone)
    gated_mlp: bool = True
    layer_norm: bool = False  # StarCoder2, Cohere: LayerNorm (rms_norm_eps its epsilon), not RMSNorm
    norm_bias: bool = True  # the LayerNorms carry a bias (StarCoder2; Cohere's do not)
    # Cohere: the layer's one norm feeds attention and the MLP side by side, both added to the stream
    parallel_block: bool = False
    qk_layer_norm: bool = False  # Command R+: q and k LayerNormed over head_dim, each head its own weights
    fused_qkv: bool = False         # Phi-3: the checkpoint stores q | k | v as one qkv_proj
    fused_gate_up: bool = False     # Phi-3, GLM: the checkpoint stores gate | up as one gate_up_proj
    # mixture of experts (Mixtral, Qwen2/3-MoE, GraniteMoE, OLMoE); no moe_layers: every MLP is dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0       # each expert's MLP width
    norm_topk_prob: bool = True          # the top-k routing weights renormalized to sum to 1
    moe_layers: tuple[int, ...] = ()     # the layers whose MLP is the experts (the rest: dense MLPs)
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: a gated dense MLP beside the experts
    # gpt-oss: the router and every expert's projections carry biases, and the experts' activation is
    # the clamped SwiGLU (up + 1) * g * sigmoid(alpha * g), g = min(gate, limit), up clamped to ±limit
    router_bias: bool = False
    expert_bias: bool = False
    expert_act: str = "silu"  # or "swiglu_clamped"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    attention_sinks: bool = False  # gpt-oss: each query head's learned logit joins its softmax's denominator
    # Llama 4: the expert's input scaled by its router weight (one expert per token), not its output
    expert_input_scaled: bool = False
    # Llama 4: q and k normed per head after RoPE, without a weight, in the layers with RoPE
    qk_norm_weightless: bool = False
    # (floor_scale, scale, offset): queries scaled by log1p(floor((position + offset) / floor_scale)) * scale + 1
    # in the layers without RoPE (Llama 4: offset 1), or in every layer (Ministral 3: offset 0)
    attn_temperature: tuple[float, float, float] | None = None
    temperature_all_layers: bool = False
    # Llama 4: the layers with RoPE attend within chunks of this many tokens (PoolAttention's chunks)
    attention_chunk_size: int | None = None
    # GLM-4.5 (DeepSeek-V3's routing): each expert scored by a sigmoid; with a correction bias added,
    # the best `topk_group` of `n_group` expert groups (by the sum of each group's top two) hold the
    # candidates, of which the top-k are taken; their plain scores renormalized and scaled by
    # routed_scaling_factor. Its shared expert has no gate (Qwen2-MoE's: shared_expert_gate).
    router_scoring: str = "softmax"  # or "sigmoid"
    router_correction: bool = False  # a correction bias chooses the experts (GLM-4.5, MiniMax-M2, ERNIE 4.5 MoE)
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    shared_expert_gate: bool = True
    group_score: str = "top2"  # how expert groups are ranked: the sum of their top two scores, or "max" (DeepSeek-V2)
    extra_layers: int = 0  # layers stored after the decoder's that it does not run (GLM-4.5's MTP layer)
    stacked_experts: bool = False  # Qwen3-VL-MoE: a layer's experts stored as one gate | up and one down tensor
    # OLMo 2: each attention / MLP output normed before its residual add and nothing normed before them
    post_norms: bool = False
    qk_norm_whole: bool = False  # OLMo 2, OLMoE: RMSNorm over the whole q and k projections (all heads at once)
    nope_layers: tuple[int, ...] = ()  # layers whose attention takes no RoPE (SmolLM3's `no_rope_layers`)
    o_bias: bool = False    # o_proj carries a bias (Llama / Qwen3 `attention_bias`)
    mlp_bias: bool = False  # gate / up / down carry biases (Llama `mlp_bias`)
    # Granite's multipliers: of the embeddings, of each attention / MLP output before its residual
    # add, the attention's softmax scale (else 1 / sqrt(head_dim)), and a divisor of the logits
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None
    logits_scaling: float = 1.0
    # the keys a query sees in the layers that attend through a sliding window (Mistral-7B-v0.1,
    # Phi-3, Gemma 3's local layers, Qwen under use_sliding_window): its own and the window - 1 before it
    sliding_window: int | None = None
    window_layers: tuple[int, ...] = ()
    local_rope_theta: float | None = None  # Gemma 3: the window layers' RoPE base (no scaling there)
    # Gemma 2 and 3: the MLP's activation (gelu_tanh: GELU's tanh form); norms both before and after the
    # attention and the MLP (post_norms with pre_norms); norm weights stored as weight - 1 (added
    # back at load); embeddings scaled by embedding_multiplier rounded to the model's dtype; the
    # logits soft-capped to (-cap, cap) by cap * tanh(logits / cap)
    hidden_act: str = "silu"
    pre_norms: bool = True
    norm_weight_offset: float = 0.0
    embedding_multiplier_in_dtype: bool = False
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None  # Gemma 2: each attention score s → cap * tanh(s / cap)
    # DeepSeek-V2 / V3's multi-head latent attention (config_families.mla_fields; model.LatentAttention);
    # kv_lora_rank 0: none. With it the KV pool holds one head of head_dim = kv_lora_rank + qk_rope_head_dim
    # (num_kv_heads 1): the latent and the rotated key, read as keys and values alike
    kv_lora_rank: int = 0
    q_lora_rank: int = 0  # 0: q projected from x directly
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        """ValueError naming the field (by its config.json name) when the shape cannot be built."""
        for name, value in (("vocab_size", self.vocab_size), ("hidden_size", self.hidden_size),
                            ("intermediate_size", self.intermediate_size),
                            ("num_hidden_layers", self.num_layers), ("num_attention_heads", self.num_heads),
                            ("num_key_value_heads", self.num_kv_heads), ("head_dim", self.head_dim),
                            ("max_position_embeddings", self.max_position_embeddings)):
            check_positive_int(name, value)
        multipliers = (("embedding_multiplier", self.embedding_multiplier),
                       ("residual_multiplier", self.residual_multiplier), ("logits_scaling", self.logits_scaling),
                       ("attention_multiplier", 1.0 if self.attention_multiplier is None else self.attention_multiplier))
        for name, value in (("rms_norm_eps", self.rms_norm_eps), ("rope_theta", self.rope_theta), *multipliers):
            check_positive_number(name, value)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_key_value_heads {self.num_kv_heads} must divide num_attention_heads "
                             f"{self.num_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (RoPE rotates pairs)")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise ValueError(f"rope_scaling must be an object or null, got {self.rope_scaling!r}")
        if self.moe_layers:
            self._check_moe()
        if self.kv_lora_rank and (self.num_kv_heads != 1 or self.head_dim != self.kv_lora_rank + self.qk_rope_head_dim
                                  or self.rotary_dim != self.qk_rope_head_dim):
            raise ValueError("a latent-attention model's KV pool holds one head of kv_lora_rank + qk_rope_head_dim dims")
        if self.sliding_window is not None:
            check_positive_int("sliding_window", self.sliding_window)
        if (self.sliding_window is None) != (not self.window_layers) or any(
                not 0 <= i < self.num_layers for i in self.window_layers):
            raise ValueError(f"sliding_window {self.sliding_window!r} needs layers to slide in, and its layers "
                             f"{list(self.window_layers)} must lie inside the model's {self.num_layers} layers")
        acts = ("silu", "gelu_tanh") if self.gated_mlp else ("relu2", "xielu", "gelu_tanh")
        if self.hidden_act not in acts:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported {'with' if self.gated_mlp else 'without'} "
                             f"a gated MLP; supported: {', '.join(acts)}")
        for name, value in (("final_logit_softcapping", self.final_logit_softcapping),
                            ("attn_logit_softcapping", self.attn_logit_softcapping),
                            ("rope_local_base_freq", self.local_rope_theta)):
            check_positive_number(name, value, nullable=True)
        for token_id in (*self.eos_token_ids, *(() if self.bos_token_id is None else (self.bos_token_id,))):
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise ValueError(f"bos_token_id / eos_token_id must be token ids, got {token_id!r}")

    def _check_moe(self) -> None:
        if self.hidden_act != "silu":  # the experts' kernels compute SiLU-and-mul
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported in a mixture of experts; "
                             "supported: silu")
        if self.expert_act not in ("silu", "swiglu_clamped"):
            raise ValueError(f"experts' activation {self.expert_act!r} is not supported; supported: silu, "
                             "swiglu_clamped")
        check_positive_number("swiglu_alpha", self.swiglu_alpha)
        check_positive_number("swiglu_limit", self.swiglu_limit)
        for name, value in (("num_experts", self.num_experts), ("num_experts_per_tok", self.num_experts_per_tok),
                            ("moe_intermediate_size", self.moe_intermediate_size)):
            check_positive_int(name, value)
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} is more than num_experts "
                             f"{self.num_experts}")
        if self.shared_expert_intermediate_size:
            check_positive_int("shared_expert_intermediate_size", self.shared_expert_intermediate_size)
        if self.expert_input_scaled and self.num_experts_per_tok != 1:
            raise ValueError("experts whose input the router weight scales take one expert per token")
        if self.group_score not in ("top2", "max"):
            raise ValueError(f"expert group score {self.group_score!r} is not supported; supported: top2, max")
        if self.router_scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"router scoring {self.router_scoring!r} is not supported; supported: softmax, sigmoid")
        check_positive_int("n_group", self.n_group)
        check_positive_int("topk_group", self.topk_group)
        check_positive_number("routed_scaling_factor", self.routed_scaling_factor)
        per_group, left = divmod(self.num_experts, self.n_group)
        if left or self.topk_group > self.n_group or (self.n_group > 1 and per_group < 2) \
                or self.num_experts_per_tok > self.topk_group * per_group:
            raise ValueError(f"n_group {self.n_group} must divide the {self.num_experts} experts into groups of two or "
                             f"more, topk_group {self.topk_group} be at most n_group, and those groups hold the "
                             f"num_experts_per_tok {self.num_experts_per_tok}")
        if any(not 0 <= i < self.num_layers for i in self.moe_layers):
            raise ValueError(f"mixture-of-experts layers {list(self.moe_layers)} are outside the model's "
                             f"{self.num_layers} layers")

    @property
    def fp32_parameters(self) -> tuple[str, ...]:
        """Endings of the parameters kept fp32 whatever the model's dtype, as transformers keeps
        them: GLM-4.5's, ERNIE 4.5 MoE's, DeepSeek's and Hunyuan MoE's routers and correction biases; the norms' weights where
        transformers multiplies by them in fp32 (Gemma's 1 + w, gpt-oss's), which RMSNorm then does."""
        if self.architecture in ("Glm4MoeForCausalLM", "Ernie4_5_MoeForCausalLM", "HunYuanMoEV1ForCausalLM",
                                 "Dots1ForCausalLM") + DEEPSEEK_ARCHITECTURES:
            return (".mlp.gate.weight", ".mlp.router_correction")
        if self.architecture in ("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "GptOssForCausalLM"):
            return ("norm.weight",)
        return ()

    @property
    def sm_scale(self) -> float:
        """The attention's softmax scale: Granite's attention_multiplier, else 1 / sqrt(head_dim);
        latent attention: 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim), times YaRN's mscale(factor,
        mscale_all_dim) squared where the scaling names one (as transformers' yarn_apply_mscale)."""
        if self.kv_lora_rank:
            scale = 1.0 / math.sqrt(self.qk_nope_head_dim + self.qk_rope_head_dim)
            rope = self.rope_scaling or {}
            factor = rope.get("factor", 1.0)
            if rope.get("rope_type", rope.get("type", "default")) != "default" and rope.get("mscale_all_dim") \
                    and factor > 1:
                mscale = 0.1 * rope["mscale_all_dim"] * math.log(factor) + 1.0
                scale *= mscale * mscale
            return scale
        return 1.0 / math.sqrt(self.head_dim) if self.attention_multiplier is None else self.attention_multiplier

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2 / V3)."""
        return self.kv_lora_rank > 0

    @property
    def layer_windows(self) -> dict[int, int]:
        """Layer → the sliding window its attention reads (the layers in window_layers)."""
        return {i: self.sliding_window for i in self.window_layers if self.sliding_window is not None}

    @property
    def layer_chunks(self) -> dict[int, int]:
        """Layer → the chunk size it attends within (Llama 4's layers with RoPE)."""
        if self.attention_chunk_size is None:
            return {}
        return {i: self.attention_chunk_size for i in range(self.num_layers) if i not in self.nope_layers}

    @property
    def rope_dim(self) -> int:
        """The head dims RoPE rotates (runtime/model/rope_layout.py: fewer than head_dim)."""
        return self.rotary_dim or self.head_dim

    @property
    def reorders_rope(self) -> bool:
        """Whether q and k heads are reordered at load (runtime/model/rope_layout.py)."""
        return self.rope_dim < self.head_dim or self.rope_interleaved

    @property
    def rope_table_dim(self) -> int:
        """The width of the RoPE tables: the head's (partial RoPE passes dims through), or the rotated
        part's alone where latent attention rotates it apart."""
        return self.rope_dim if self.mla else self.head_dim

    @property
    def long_rope_len(self) -> int | None:
        """LongRoPE (Phi-3): the longest sequence rotated with the short factors; a longer one is
        rotated wholly with the long factors. None for other RoPE."""
        scaling = self.rope_scaling or {}
        return scaling["original_max_position_embeddings"] if scaling.get("rope_type") == "longrope" else None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def load_model_args(model_dir: str) -> ModelArgs:
    """Parse `model_dir/config.json` (or a GGUF file's metadata); ValueError naming the file for a
    missing or malformed file, a missing or invalid field, or an unsupported architecture."""
    if os.path.isfile(model_dir):
        from radixflow.runtime.model.gguf_file import read_gguf
        from radixflow.runtime.model.gguf_loader import model_args_from_gguf

        return model_args_from_gguf(read_gguf(model_dir))
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"no config.json in {model_dir!r}: not a Hugging Face model directory")
    cfg = read_json_object(path)
    try:
        return model_args_from_dict(cfg)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def model_args_from_dict(cfg: dict[str, Any]) -> ModelArgs:
    """ModelArgs of a parsed config.json; ValueError naming a missing or invalid field."""
    archs = cfg.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ValueError(f"architectures must be a list of class names, got {archs!r}")
    if "Gemma3ForConditionalGeneration" in archs:  # Gemma 3 4B and up: served as its language model
        cfg, archs = gemma3_text_config(cfg), ["Gemma3ForCausalLM"]
    vl = next((a for a in archs if a in VL_TEXT_ARCHITECTURES), None)
    if vl is not None:  # Qwen2-VL, 2.5-VL, 3-VL (and its MoE): served as their language models, text only
        text_type = (cfg.get("text_config") or {}).get("model_type") if isinstance(cfg.get("text_config"), dict) else None
        archs = ["Ministral3ForCausalLM" if text_type == "ministral3" else VL_TEXT_ARCHITECTURES[vl]]  # Ministral 3's
        cfg = vl_text_config(cfg, vl)
    gemma = next((a for a in archs if a in GEMMA_ARCHITECTURES), None)
    if gemma is not None:  # transformers' defaults for what the config leaves out
        cfg = with_gemma_defaults(cfg, gemma)
    elif "GemmaForCausalLM" in archs:
        cfg = gemma1_config(cfg)
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ValueError(f"unsupported architecture {archs or cfg.get('model_type')!r}; "
                         f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    cfg = with_family_defaults(cfg, arch)
    num_heads, hidden = required(cfg, "num_attention_heads"), required(cfg, "hidden_size")
    is_gemma = arch in GEMMA_ARCHITECTURES
    head_dim = None if arch == "Cohere2ForCausalLM" else cfg.get("head_dim")  # Cohere2Config sets hidden / heads
    if head_dim is None:
        check_positive_int("num_attention_heads", num_heads)
        check_positive_int("hidden_size", hidden)
        if hidden % num_heads:
            raise ValueError(f"hidden_size {hidden} is not a multiple of num_attention_heads {num_heads} "
                             "and there is no head_dim")
        head_dim = hidden // num_heads
    mla = mla_fields(cfg, arch) if arch in DEEPSEEK_ARCHITECTURES else {}
    if mla:  # the pool's one head: the latent and the rotated key
        head_dim = mla["kv_lora_rank"] + mla["qk_rope_head_dim"]
    rope = read_rope(cfg, arch, mla["qk_rope_head_dim"] if mla else head_dim)
    interleaved = mla.pop("rope_interleaved") if mla else arch in GLM_ARCHITECTURES + COHERE_ARCHITECTURES + (
        "Ernie4_5ForCausalLM", "Ernie4_5_MoeForCausalLM", "Llama4ForCausalLM")
    if cfg.get("clip_qkv") is not None:  # OLMo(E) checkpoints trained with clamped q, k, v
        raise ValueError(f"clip_qkv {cfg['clip_qkv']!r} is not supported (q, k and v are not clamped here)")
    # Gemma's MLPs read hidden_activation (a hidden_act there is ignored, as transformers does), the
    # others hidden_act; SiLU's other name is swish, GELU's tanh form gelu_pytorch_tanh
    gated = arch not in UNGATED_ARCHITECTURES
    default_act = "gelu_pytorch_tanh" if is_gemma else "silu" if gated else {
        "ArceeForCausalLM": "relu2", "ApertusForCausalLM": "xielu", "Starcoder2ForCausalLM": "gelu_pytorch_tanh"}[arch]
    act = cfg.get("hidden_activation" if is_gemma else "hidden_act") or default_act
    if arch == "GptOssForCausalLM":  # its experts take the clamped SwiGLU whatever hidden_act says (as transformers)
        act = "silu"
    activations = ACTIVATIONS if gated else UNGATED_ACTIVATIONS
    if not isinstance(act, str) or act not in activations:
        raise ValueError(f"hidden_act {act!r} is not supported for {arch}; supported: {', '.join(activations)}")
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    if is_gemma:
        family = gemma_fields(cfg, hidden, arch)
    elif arch == "GemmaForCausalLM":
        family = gemma1_fields(hidden)
    elif arch == "Exaone4ForCausalLM":
        family = exaone4_layers(cfg)
    elif arch in COHERE_ARCHITECTURES:
        family = cohere2_layers(cfg) if arch == "Cohere2ForCausalLM" else {}
        scale = optional(cfg, "logit_scale", 0.0625)  # logits times it, as a divisor (Granite's logits_scaling)
        check_positive_number("logit_scale", scale)
        family.update(logits_scaling=1.0 / scale, layer_norm=True, norm_bias=False, parallel_block=True,
                      qk_layer_norm=arch == "CohereForCausalLM" and flag(cfg, "use_qk_norm", False))
    else:
        family = {**sliding_window_fields(cfg, arch), **granite_fields(cfg, arch), **moe_fields(cfg, arch)}
        if arch == "Llama4ForCausalLM":  # its dense MLPs are intermediate_size_mlp wide (its experts intermediate_size)
            check_positive_int("intermediate_size_mlp", required(cfg, "intermediate_size_mlp"))
            family.update(llama4_fields(cfg), intermediate_size=cfg["intermediate_size_mlp"])
        if arch == "Ministral3ForCausalLM":
            family.update(ministral3_temperature(rope.scaling))
        if vl == "Qwen3VLMoeForConditionalGeneration" and family.get("moe_layers"):  # its router always
            family.update(stacked_experts=True, norm_topk_prob=True)  # renormalizes (no norm_topk_prob field)
    return ModelArgs(
        architecture=arch,
        vocab_size=required(cfg, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=family.pop("intermediate_size", None) or required(cfg, "intermediate_size"),
        num_layers=required(cfg, "num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=1 if mla else cfg.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=optional(cfg, "norm_epsilon", 1e-5) if arch == "Starcoder2ForCausalLM" else optional(
            cfg, "layer_norm_eps", 1e-5) if arch in COHERE_ARCHITECTURES else optional(cfg, "rms_norm_eps", 1e-6),
        layer_norm=family.pop("layer_norm", arch == "Starcoder2ForCausalLM"),
        rope_theta=rope.theta,
        rope_scaling=rope.scaling,
        rotary_dim=mla["qk_rope_head_dim"] if mla else rope.rotary_dim,
        local_rope_theta=rope.local_theta,
        hidden_act=activations[act],
        gated_mlp=gated,
        max_position_embeddings=optional(cfg, "max_position_embeddings", 4096),
        # transformers' defaults
        tie_word_embeddings=flag(cfg, "tie_word_embeddings", arch in ("SmolLM3ForCausalLM",) + COHERE_ARCHITECTURES
                                 or is_gemma),
        **bias_fields(cfg, arch),
        rope_interleaved=interleaved,
        fused_qkv=arch == "Phi3ForCausalLM",
        fused_gate_up=arch in GLM_ARCHITECTURES + ("Phi3ForCausalLM",),
        nope_layers=nope_layers(cfg) if arch == "SmolLM3ForCausalLM" else family.pop("nope_layers", ()),  # before **family
        post_norms=arch in OLMO_ARCHITECTURES + ("Glm4ForCausalLM", "Exaone4ForCausalLM") or is_gemma,
        pre_norms=arch not in OLMO_ARCHITECTURES + ("Exaone4ForCausalLM",),
        qk_norm_whole=arch in OLMO_ARCHITECTURES + ("OlmoeForCausalLM", "MiniMaxM2ForCausalLM"),
        qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM", "Exaone4ForCausalLM",
                         "HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM", "ApertusForCausalLM",
                         "Dots1ForCausalLM") or (
            arch == "Glm4MoeForCausalLM" and flag(cfg, "use_qk_norm", False)),
        qk_norm_after_rope=arch in ("HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM"),
        attention_sinks=arch == "GptOssForCausalLM",
        torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype") or "float32",
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
        **family,
        **mla,
    )
