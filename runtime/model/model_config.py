"""The decoder's shape, read from a Hugging Face `config.json` (or GGUF metadata) for the supported architectures."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from radixflow.runtime.text_files import read_json_object

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                           "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                           "SmolLM3ForCausalLM", "GraniteForCausalLM", "GraniteMoeForCausalLM", "Phi3ForCausalLM",
                           "Olmo2ForCausalLM", "OlmoeForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM")
GEMMA_ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
# mixture-of-experts families: a router sends each token to its top-k experts' MLPs
MOE_ARCHITECTURES = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "GraniteMoeForCausalLM",
                     "OlmoeForCausalLM")
GRANITE_ARCHITECTURES = ("GraniteForCausalLM", "GraniteMoeForCausalLM")


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
    # mixture of experts (Mixtral, Qwen2/3-MoE, GraniteMoE, OLMoE); no moe_layers: every MLP is dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0       # each expert's MLP width
    norm_topk_prob: bool = True          # the top-k routing weights renormalized to sum to 1
    moe_layers: tuple[int, ...] = ()     # the layers whose MLP is the experts (the rest: dense MLPs)
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: a gated dense MLP beside the experts
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

    def __post_init__(self) -> None:
        """ValueError naming the field (by its config.json name) when the shape cannot be built."""
        for name, value in (("vocab_size", self.vocab_size), ("hidden_size", self.hidden_size),
                            ("intermediate_size", self.intermediate_size),
                            ("num_hidden_layers", self.num_layers), ("num_attention_heads", self.num_heads),
                            ("num_key_value_heads", self.num_kv_heads), ("head_dim", self.head_dim),
                            ("max_position_embeddings", self.max_position_embeddings)):
            _check_positive_int(name, value)
        multipliers = (("embedding_multiplier", self.embedding_multiplier),
                       ("residual_multiplier", self.residual_multiplier), ("logits_scaling", self.logits_scaling),
                       ("attention_multiplier", 1.0 if self.attention_multiplier is None else self.attention_multiplier))
        for name, value in (("rms_norm_eps", self.rms_norm_eps), ("rope_theta", self.rope_theta), *multipliers):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_key_value_heads {self.num_kv_heads} must divide num_attention_heads "
                             f"{self.num_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (RoPE rotates pairs)")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise ValueError(f"rope_scaling must be an object or null, got {self.rope_scaling!r}")
        if self.moe_layers:
            self._check_moe()
        if self.sliding_window is not None:
            _check_positive_int("sliding_window", self.sliding_window)
        if (self.sliding_window is None) != (not self.window_layers) or any(
                not 0 <= i < self.num_layers for i in self.window_layers):
            raise ValueError(f"sliding_window {self.sliding_window!r} needs layers to slide in, and its layers "
                             f"{list(self.window_layers)} must lie inside the model's {self.num_layers} layers")
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; supported: silu, gelu_pytorch_tanh")
        for name, value in (("final_logit_softcapping", self.final_logit_softcapping),
                            ("attn_logit_softcapping", self.attn_logit_softcapping),
                            ("rope_local_base_freq", self.local_rope_theta)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value < math.inf):
                raise ValueError(f"{name} must be a positive number or null, got {value!r}")
        for token_id in (*self.eos_token_ids, *(() if self.bos_token_id is None else (self.bos_token_id,))):
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise ValueError(f"bos_token_id / eos_token_id must be token ids, got {token_id!r}")

    def _check_moe(self) -> None:
        if self.hidden_act != "silu":  # the experts' kernels compute SiLU-and-mul
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported in a mixture of experts; "
                             "supported: silu")
        for name, value in (("num_experts", self.num_experts), ("num_experts_per_tok", self.num_experts_per_tok),
                            ("moe_intermediate_size", self.moe_intermediate_size)):
            _check_positive_int(name, value)
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} is more than num_experts "
                             f"{self.num_experts}")
        if self.shared_expert_intermediate_size:
            _check_positive_int("shared_expert_intermediate_size", self.shared_expert_intermediate_size)
        if any(not 0 <= i < self.num_layers for i in self.moe_layers):
            raise ValueError(f"mixture-of-experts layers {list(self.moe_layers)} are outside the model's "
                             f"{self.num_layers} layers")

    @property
    def sm_scale(self) -> float:
        """The attention's softmax scale: Granite's attention_multiplier, else 1 / sqrt(head_dim)."""
        return 1.0 / math.sqrt(self.head_dim) if self.attention_multiplier is None else self.attention_multiplier

    @property
    def layer_windows(self) -> dict[int, int]:
        """Layer → the sliding window its attention reads (the layers in window_layers)."""
        return {i: self.sliding_window for i in self.window_layers if self.sliding_window is not None}

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


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


def _required(cfg: dict[str, Any], name: str) -> Any:
    if cfg.get(name) is None:
        raise ValueError(f"the required field {name} is missing")
    return cfg[name]


def _optional(cfg: dict[str, Any], name: str, default: Any) -> Any:
    return default if cfg.get(name) is None else cfg[name]


def model_args_from_dict(cfg: dict[str, Any]) -> ModelArgs:
    """ModelArgs of a parsed config.json; ValueError naming a missing or invalid field."""
    archs = cfg.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if "Gemma3ForConditionalGeneration" in archs:  # Gemma 3 4B and up: served as its language model
        cfg, archs = _gemma3_text_config(cfg), ["Gemma3ForCausalLM"]
    gemma = next((a for a in archs if a in GEMMA_ARCHITECTURES), None)
    if gemma is not None:  # transformers' defaults for what the config leaves out (null: off, for these)
        cfg = {**_GEMMA_DEFAULTS, **_GEMMA_DEFAULTS_BY_ARCH[gemma],
               **{k: v for k, v in cfg.items() if v is not None or k in _GEMMA_NULLABLE}}
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ValueError(f"unsupported architecture {archs or cfg.get('model_type')!r}; "
                         f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    num_heads, hidden = _required(cfg, "num_attention_heads"), _required(cfg, "hidden_size")
    is_gemma, is_gemma3 = arch in GEMMA_ARCHITECTURES, arch == "Gemma3ForCausalLM"
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        _check_positive_int("num_attention_heads", num_heads)
        _check_positive_int("hidden_size", hidden)
        if hidden % num_heads:
            raise ValueError(f"hidden_size {hidden} is not a multiple of num_attention_heads {num_heads} "
                             "and there is no head_dim")
        head_dim = hidden // num_heads
    rope = cfg.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ValueError(f"rope_parameters must be an object, got {rope!r}")  # newer transformers keep theta and scaling here
    if is_gemma3:
        rope_theta, rope_scaling, local_theta = _gemma_rope(cfg, rope)
    else:
        rope_theta, local_theta = cfg.get("rope_theta") or rope.get("rope_theta", 10000.0), None
        rope_scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    if rope_scaling is not None and not isinstance(rope_scaling, dict):
        raise ValueError(f"rope_scaling must be an object or null, got {rope_scaling!r}")
    partial = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    if partial != 1.0:  # Phi-4-mini, Phi-3-small: RoPE here rotates the whole head
        raise ValueError(f"partial_rotary_factor {partial!r} is not supported (RoPE over the whole head only)")
    if rope_scaling is not None:
        kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
        if arch == "Phi3ForCausalLM" and kind in ("su", "yarn"):  # Phi-3's old names for longrope
            kind = "longrope"
        if kind not in ("default", "llama3", "linear", "yarn"):
            raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: llama3, linear, yarn")
        if kind == "yarn":
            rope_scaling = _yarn_scaling(cfg, rope_scaling)
    if cfg.get("clip_qkv") is not None:  # OLMo(E) checkpoints trained with clamped q, k, v
        raise ValueError(f"clip_qkv {cfg['clip_qkv']!r} is not supported (q, k and v are not clamped here)")
    # Gemma's MLPs read hidden_activation (a hidden_act there is ignored, as transformers does), the
    # others hidden_act; SiLU's other name is swish, GELU's tanh form gelu_pytorch_tanh
    act = (cfg.get("hidden_activation") or "gelu_pytorch_tanh") if is_gemma else (cfg.get("hidden_act") or "silu")
    if act not in _ACTIVATIONS:
        raise ValueError(f"hidden_act {act!r} is not supported; supported: silu, gelu_pytorch_tanh")
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    is_qwen2 = arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM")
    # Qwen2 / Qwen2-MoE: q, k, v biases (Qwen2-MoE's `qkv_bias`, true unless set), never o_proj's;
    # the others: `attention_bias` puts biases on q, k, v and o_proj alike (Mixtral has none)
    attention_bias = bool(cfg.get("attention_bias", False)) and arch not in (  # their projections have none
        "MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM")
    if arch == "Qwen2MoeForCausalLM":
        qkv_bias = cfg.get("qkv_bias", True)
    else:
        qkv_bias = attention_bias or is_qwen2
    if is_gemma:
        family = _gemma_fields(cfg, hidden, arch)
    else:
        family = {**_sliding_window(cfg, arch), **_granite_fields(cfg, arch), **_moe_fields(cfg, arch)}
    return ModelArgs(
        architecture=arch,
        vocab_size=_required(cfg, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_required(cfg, "intermediate_size"),
        num_layers=_required(cfg, "num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=_optional(cfg, "rms_norm_eps", 1e-6),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        local_rope_theta=local_theta,
        hidden_act=_ACTIVATIONS[act],
        max_position_embeddings=_optional(cfg, "max_position_embeddings", 4096),
        # transformers' defaults
        tie_word_embeddings=cfg.get("tie_word_embeddings", arch == "SmolLM3ForCausalLM" or is_gemma),
        qkv_bias=bool(qkv_bias),
        o_bias=attention_bias and not is_qwen2,
        mlp_bias=bool(cfg.get("mlp_bias", False)) and arch in ("LlamaForCausalLM", "SmolLM3ForCausalLM",
                                                                "GraniteForCausalLM"),
        nope_layers=_nope_layers(cfg) if arch == "SmolLM3ForCausalLM" else (),
        post_norms=arch == "Olmo2ForCausalLM" or is_gemma,
        pre_norms=arch != "Olmo2ForCausalLM",
        qk_norm_whole=arch in ("Olmo2ForCausalLM", "OlmoeForCausalLM"),
        qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM"),
        torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype") or "float32",
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
        **family,
    )


def _yarn_scaling(cfg: dict[str, Any], scaling: dict[str, Any]) -> dict[str, Any]:
    """A YaRN `rope_scaling` with its original context and factor filled in as transformers
    fills them: the config's top-level original_max_position_embeddings first, else the
    scaling's own, else max_position_embeddings; an absent factor is the ratio of the two.
    Without any of those the family's default would decide: refused."""
    longest = cfg.get("max_position_embeddings")
    old_len = cfg.get("original_max_position_embeddings") or scaling.get("original_max_position_embeddings") or longest
    if old_len is None:
        raise ValueError("rope_scaling yarn needs original_max_position_embeddings (or max_position_embeddings)")
    longest = old_len if longest is None else longest
    factor = scaling.get("factor")
    factor = longest / old_len if factor is None else factor
    for name, value in (("factor", factor), ("original_max_position_embeddings", old_len)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ValueError(f"rope_scaling {name} must be a positive number, got {value!r}")
    return {**scaling, "factor": factor, "original_max_position_embeddings": old_len}


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


def _gemma3_text_config(cfg: dict[str, Any]) -> dict[str, Any]:
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


def _as_list(value: Any) -> list[Any]:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


# a config's activation name → ModelArgs.hidden_act
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def _gemma_rope(cfg: dict[str, Any], rope: dict[str, Any]) -> tuple[float, dict[str, Any] | None, float]:
    """Gemma 3's (global theta, global scaling, local theta): from `rope_theta`, `rope_scaling`
    and `rope_local_base_freq`, or from newer transformers' `rope_parameters` keyed by layer type
    ("full_attention", "sliding_attention"). The window layers' RoPE is never scaled."""
    full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
    if not isinstance(full, dict) or not isinstance(local, dict):
        raise ValueError(f"rope_parameters must map full_attention / sliding_attention to objects, got {rope!r}")
    # the nested thetas win over the top-level ones, as transformers reads them
    theta = full.get("rope_theta") or cfg.get("rope_theta") or 1_000_000.0
    scaling = cfg.get("rope_scaling") or (full if full.get("rope_type", "default") != "default" else None)
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"a scaled RoPE in the sliding-window layers ({local!r}) is not supported")
    return theta, scaling, local.get("rope_theta") or cfg.get("rope_local_base_freq") or 10_000.0


def _gemma_fields(cfg: dict[str, Any], hidden: int, arch: str) -> dict[str, Any]:
    """Gemma 2's and 3's ModelArgs fields: windows in the layers `layer_types` names
    "sliding_attention" (else Gemma 2 every other layer from the first, Gemma 3 all but every
    `sliding_window_pattern`-th, 6 by default), the embedding scale sqrt(hidden_size), the
    attention scale query_pre_attn_scalar ** -0.5, the attention-score and final soft-caps.
    Gemma 3's attention never soft-caps (transformers' ignores attn_logit_softcapping there).
    Refused: bidirectional attention (EmbeddingGemma), and a null window where layers slide
    (transformers fails on it)."""
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention is not supported (attention here is causal)")
    num_layers = _required(cfg, "num_hidden_layers")
    _check_positive_int("num_hidden_layers", num_layers)
    _check_positive_int("hidden_size", hidden)
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        pattern = 2 if arch == "Gemma2ForCausalLM" else _optional(cfg, "sliding_window_pattern", 6)
        _check_positive_int("sliding_window_pattern", pattern)
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    if (not isinstance(layer_types, list) or len(layer_types) != num_layers
            or any(t not in ("sliding_attention", "full_attention") for t in layer_types)):
        raise ValueError(f"layer_types must name sliding_attention or full_attention for each of the {num_layers} "
                         f"layers, got {layer_types!r}")
    scalar = _optional(cfg, "query_pre_attn_scalar", 256)
    if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or not 0 < scalar < math.inf:
        raise ValueError(f"query_pre_attn_scalar must be a positive number, got {scalar!r}")
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
    norm = _optional(cfg, "norm_topk_prob", False)
    if not isinstance(norm, bool):
        raise ValueError(f"norm_topk_prob must be true or false, got {norm!r}")
    return norm


def _granite_fields(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """Granite's multipliers, each 1 when absent (transformers' defaults)."""
    if arch not in GRANITE_ARCHITECTURES:
        return {}
    return {name: _optional(cfg, name, 1.0)
            for name in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")}


def _nope_layers(cfg: dict[str, Any]) -> tuple[int, ...]:
    """SmolLM3's layers without RoPE: `no_rope_layers` (1: RoPE, 0: none, per layer), else every
    `no_rope_layer_interval`-th layer (4 by default)."""
    num_layers = _required(cfg, "num_hidden_layers")
    _check_positive_int("num_hidden_layers", num_layers)
    flags = cfg.get("no_rope_layers")
    if flags is None:
        interval = _optional(cfg, "no_rope_layer_interval", 4)
        _check_positive_int("no_rope_layer_interval", interval)
        return tuple(i for i in range(num_layers) if (i + 1) % interval == 0)
    if not isinstance(flags, list) or len(flags) != num_layers or any(f not in (0, 1) or isinstance(f, float)
                                                                       for f in flags):
        raise ValueError(f"no_rope_layers must list 0 or 1 for each of the {num_layers} layers, got {flags!r}")
    return tuple(i for i, flag in enumerate(flags) if not flag)


def _sliding_window(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """The sliding window and the layers that attend through it, each family as transformers 5
    reads its config (none: attention over the whole context).

    Mistral (4096 when the key is absent), Mixtral, Phi-3: every layer, when `sliding_window` is
    set. Under `use_sliding_window` only: Qwen3-MoE every layer; Qwen2/3 the layers from
    `max_window_layers` on; Qwen2-MoE every other layer (the first, third, ...) below
    `max_window_layers`; SmolLM3 the layers without RoPE. Qwen2/3, Qwen2-MoE and SmolLM3 take an
    explicit `layer_types` instead where the config has one. Llama, Granite and OLMo 2 never slide.
    """
    num_layers = _required(cfg, "num_hidden_layers")
    _check_positive_int("num_hidden_layers", num_layers)
    if arch in ("MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM"):
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
            layers = _nope_layers(cfg)
        else:
            first = _optional(cfg, "max_window_layers", 28)
            if isinstance(first, bool) or not isinstance(first, int) or first < 0:
                raise ValueError(f"max_window_layers must be an integer >= 0, got {first!r}")
            if arch == "Qwen2MoeForCausalLM":
                layers = [i for i in range(min(first, num_layers)) if i % 2 == 0]
            else:
                layers = range(first, num_layers)
    else:
        return {}
    if window is None or not layers:
        return {}
    return {"sliding_window": window, "window_layers": tuple(layers)}


def _moe_fields(cfg: dict[str, Any], arch: str) -> dict[str, Any]:
    """ModelArgs' mixture-of-experts fields of a config.json (none for a dense family).

    Mixtral, GraniteMoE, OLMoE: every layer's MLP is experts of `intermediate_size`, top-k weights
    renormalized (OLMoE: when `norm_topk_prob`). Qwen2/3-MoE: experts of `moe_intermediate_size`
    in every `decoder_sparse_step`-th layer outside `mlp_only_layers` (dense MLPs of
    `intermediate_size` there), renormalized when `norm_topk_prob`; Qwen2-MoE adds a shared expert
    gated by a sigmoid.
    """
    if arch not in MOE_ARCHITECTURES:
        return {}
    num_layers = _required(cfg, "num_hidden_layers")
    _check_positive_int("num_hidden_layers", num_layers)
    experts = cfg.get("num_local_experts")
    experts = cfg.get("num_experts") if experts is None else experts
    if experts is None:
        raise ValueError("the required field num_local_experts (or num_experts) is missing")
    if experts == 0 and arch.startswith("Qwen"):  # Qwen-MoE without experts: every MLP dense
        return {}
    fields: dict[str, Any] = {"num_experts": experts, "num_experts_per_tok": _required(cfg, "num_experts_per_tok")}
    if arch in ("MixtralForCausalLM", "GraniteMoeForCausalLM", "OlmoeForCausalLM"):  # every MLP: experts
        # Mixtral and GraniteMoE always renormalize (Granite: a softmax over the top-k logits)
        norm = _norm_topk_prob(cfg) if arch == "OlmoeForCausalLM" else True
        return {**fields, "moe_intermediate_size": _required(cfg, "intermediate_size"), "norm_topk_prob": norm,
                "moe_layers": tuple(range(num_layers))}
    step, dense = _optional(cfg, "decoder_sparse_step", 1), _optional(cfg, "mlp_only_layers", [])
    _check_positive_int("decoder_sparse_step", step)
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        raise ValueError(f"mlp_only_layers must list layer numbers, got {dense!r}")
    fields.update(moe_intermediate_size=_required(cfg, "moe_intermediate_size"), norm_topk_prob=_norm_topk_prob(cfg),
                  moe_layers=tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0))
    if arch == "Qwen2MoeForCausalLM":
        fields["shared_expert_intermediate_size"] = _required(cfg, "shared_expert_intermediate_size")
    return fields
