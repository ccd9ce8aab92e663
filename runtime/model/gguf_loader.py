"""GGUF checkpoints: model shape from the metadata, weights dequantized tensor by tensor at load.

llama.cpp's names map onto ours as

    token_embd.weight              embed_tokens.weight
    output_norm.weight / output.weight   norm.weight / lm_head.weight (absent: tied to token_embd)
    blk.N.attn_norm / ffn_norm     layers.N.input_layernorm / post_attention_layernorm
    blk.N.attn_{q,k,v}(.bias)      layers.N.self_attn.qkv_proj (rows concatenated q | k | v)
    blk.N.attn_{q,k}_norm          layers.N.self_attn.{q,k}_norm (qwen3)
    blk.N.attn_output              layers.N.self_attn.o_proj
    blk.N.ffn_{gate,up} / ffn_down layers.N.mlp.gate_up_proj (gate | up) / mlp.down_proj
    blk.N.ffn_gate_inp             layers.N.mlp.gate (a mixture of experts' router)
    blk.N.ffn_{gate,up}_exps       layers.N.mlp.experts_gate_up ([E, I, H] each, joined on dim 1)
    blk.N.ffn_down_exps            layers.N.mlp.experts_down
    blk.N.ffn_{gate,up,down}_shexp layers.N.mlp.shared_expert (qwen2moe; ffn_gate_inp_shexp its gate)
    blk.N.attn_qkv / ffn_up        layers.N.self_attn.qkv_proj / mlp.gate_up_proj (phi3: stored fused)
    rope_factors_long / _short     Phi-3's LongRoPE factors (rope_scaling longrope)
    blk.N.post_attention_norm      layers.N.post_attention_layernorm (gemma2 / gemma3, whose ffn_norm
    blk.N.post_ffw_norm            layers.N.post_feedforward_layernorm   is pre_feedforward_layernorm)

Gemma files store each norm's weight with the 1 its RMSNorm adds (llama.cpp's converter adds it),
so they load as they are; what llama.cpp fixes in code rather than metadata is fixed here alike
(gemma_fields).

NOTE: for `llama` files, llama.cpp's converter permutes the rows of Q and K within each head from
the Hugging Face rotate-half layout to interleaved pairs (its RoPE kernel's layout); we undo that.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import torch

from radixflow.runtime.model.gguf_file import GGUFFile
from radixflow.runtime.model.model import CausalLM
from radixflow.runtime.model.model_config import ModelArgs
from radixflow.runtime.model.rope_layout import to_model_layout
from radixflow.runtime.model.weights import check_all_used, join_parts, misfit_error

log = logging.getLogger(__name__)

# general.architecture -> (our architecture, Q/K rows permuted by the converter); a `llama` file
# with experts (`llama.expert_count`) is Mixtral
GGUF_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", True),
    "qwen2": ("Qwen2ForCausalLM", False),
    "qwen3": ("Qwen3ForCausalLM", False),
    "qwen2moe": ("Qwen2MoeForCausalLM", False),
    "qwen3moe": ("Qwen3MoeForCausalLM", False),
    "gemma2": ("Gemma2ForCausalLM", False),
    "gemma3": ("Gemma3ForCausalLM", False),
    "phi3": ("Phi3ForCausalLM", False),
}
GEMMA_ARCHS = ("gemma2", "gemma3")
# llama.cpp's Gemma constants: every `pattern`-th layer global, the others through the window (a file
# may say otherwise: attention.sliding_window_pattern); Gemma 3's window layers' RoPE base; the
# block count of each 27B, whose attention scale is 1 / sqrt(hidden / heads), not 1 / sqrt(head_dim)
_GEMMA_PATTERNS = {"gemma2": 2, "gemma3": 6}
_GEMMA3_LOCAL_BASE = 10_000.0
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
_FLOAT_FILE_DTYPES = {0: "float32", 1: "float16", 30: "bfloat16"}  # general.file_type -> dtype

Transform = Callable[[torch.Tensor], torch.Tensor]


def model_args_from_gguf(f: GGUFFile) -> ModelArgs:
    """ModelArgs from `<arch>.*` metadata; ValueError naming the file for an unsupported
    architecture or feature, a missing or mistyped key, or a shape that cannot be built."""
    try:
        return _model_args(f)
    except ValueError as e:
        raise ValueError(f"{f.path}: {e}") from e


def _model_args(f: GGUFFile) -> ModelArgs:
    arch = f.architecture
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(GGUF_ARCHITECTURES)}")
    meta = f.metadata

    def key(name: str, default: object = None) -> object:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{name}")
        return value

    def int_key(name: str, default: int | None = None) -> int:
        value = key(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"GGUF metadata {arch}.{name} must be a positive integer, got {value!r}")
        return value

    def float_key(name: str, default: float | None = None, positive: bool = False) -> float:
        value = key(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and not 0 < value < math.inf):
            raise ValueError(f"GGUF metadata {arch}.{name} must be a {'positive ' if positive else ''}number, "
                             f"got {value!r}")
        return float(value)

    hidden, num_heads = int_key("embedding_length"), int_key("attention.head_count")
    head_dim = int_key("attention.key_length", hidden // num_heads)
    rot_dim = int_key("rope.dimension_count", head_dim)
    if rot_dim > head_dim or rot_dim % 2 or (rot_dim != head_dim and arch != "phi3"):
        raise ValueError(f"GGUF metadata {arch}.rope.dimension_count {rot_dim}: a partial rotary embedding ({rot_dim} of "
                         f"{head_dim} dims) is not supported" + ("" if arch != "phi3" else ": an even count up to "
                                                                 "head_dim is"))
    if "rope_freqs.weight" in f.tensors:
        raise ValueError("per-dimension RoPE frequency factors (rope_freqs.weight) are not supported")
    if "token_embd.weight" not in f.tensors:
        raise ValueError("GGUF file is missing tensor 'token_embd.weight'")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise ValueError(f"unsupported RoPE scaling {scaling!r}; supported: none, linear")
    rope_scaling = None
    # a factor of 0 is no scaling, as llama.cpp reads it
    if scaling == "linear" and meta.get(f"{arch}.rope.scaling.factor") != 0:
        rope_scaling = {"rope_type": "linear", "factor": float_key("rope.scaling.factor", positive=True)}
    if arch == "phi3" and "rope_factors_long.weight" in f.tensors:
        rope_scaling = _longrope(f, float_key, int_key, rot_dim)
    eos = meta.get("tokenizer.ggml.eos_token_id")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    our_arch, _ = GGUF_ARCHITECTURES[arch]
    num_layers = int_key("block_count")
    moe: dict[str, object] = {}
    if "blk.0.ffn_gate.0.weight" in f.tensors:
        raise ValueError("experts stored one tensor each (blk.N.ffn_gate.E.weight, an older llama.cpp layout) "
                         "are not supported; convert the model again to get stacked ffn_*_exps tensors")
    if arch.endswith("moe") or meta.get(f"{arch}.expert_count") is not None or any(
            name.endswith("ffn_gate_inp.weight") for name in f.tensors):
        our_arch = "MixtralForCausalLM" if arch == "llama" else our_arch
        # llama.cpp renormalizes the top-k weights for Mixtral and Qwen3-MoE, not for Qwen2-MoE
        width = int_key("expert_feed_forward_length" if arch.endswith("moe") else "feed_forward_length")
        moe = {"num_experts": int_key("expert_count"), "num_experts_per_tok": int_key("expert_used_count"),
               "moe_intermediate_size": width, "norm_topk_prob": arch != "qwen2moe",
               "moe_layers": tuple(i for i in range(num_layers) if f"blk.{i}.ffn_gate_inp.weight" in f.tensors)}
        if arch == "qwen2moe":
            moe["shared_expert_intermediate_size"] = int_key("expert_shared_feed_forward_length")
    # the dense MLPs' width: required where any layer has one, else the experts'
    all_experts = len(moe.get("moe_layers", ())) == num_layers  # type: ignore[arg-type]
    dense_width = int_key("feed_forward_length", moe["moe_intermediate_size"] if all_experts else None)  # type: ignore[arg-type]
    family = _gemma_fields(meta, arch, num_layers, hidden, num_heads, head_dim, float_key) if arch in GEMMA_ARCHS else {}
    if arch == "phi3" and meta.get("phi3.attention.sliding_window"):  # every layer, as transformers' Phi-3
        family = {"sliding_window": int_key("attention.sliding_window"), "window_layers": tuple(range(num_layers))}
    return ModelArgs(
        architecture=our_arch,
        vocab_size=f.tensors["token_embd.weight"].shape[0],
        hidden_size=hidden,
        intermediate_size=dense_width,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int_key("attention.head_count_kv", num_heads),
        head_dim=head_dim,
        rms_norm_eps=float_key("attention.layer_norm_rms_epsilon"),
        rope_theta=float_key("rope.freq_base", 10000.0),
        rope_scaling=rope_scaling,
        max_position_embeddings=int_key("context_length", 4096),
        tie_word_embeddings="output.weight" not in f.tensors,
        qkv_bias="blk.0.attn_q.bias" in f.tensors,
        o_bias="blk.0.attn_output.bias" in f.tensors,
        mlp_bias="blk.0.ffn_down.bias" in f.tensors,
        qk_norm=arch in ("qwen3", "qwen3moe", "gemma3"),
        rotary_dim=rot_dim if rot_dim != head_dim else 0,
        fused_qkv=arch == "phi3",
        fused_gate_up=arch == "phi3",
        torch_dtype=_FLOAT_FILE_DTYPES.get(int(meta.get("general.file_type", 0)), "float32"),
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=(int(eos),) if eos is not None else (),
        **moe,  # type: ignore[arg-type]
        **family,  # type: ignore[arg-type]
    )


def _longrope(f: GGUFFile, float_key: Callable[..., float], int_key: Callable[..., int], rot_dim: int) -> dict:
    """Phi-3's LongRoPE from a phi3 file: the factor tensors (one per rotated pair), the original
    context (rope.scaling.original_context_length) and the attention factor the converter computed
    (rope.scaling.attn_factor; else transformers' sqrt(1 + ln(s) / ln(original)))."""
    factors = {}
    for kind in ("long", "short"):
        name = f"rope_factors_{kind}.weight"
        if name not in f.tensors:
            raise ValueError(f"GGUF file has rope_factors_long.weight but not {name!r}")
        values = f.dequantize(name).flatten()
        if values.numel() != rot_dim // 2:
            raise ValueError(f"GGUF tensor {name!r} holds {values.numel()} factors; RoPE rotates {rot_dim // 2} pairs")
        factors[f"{kind}_factor"] = values.tolist()
    original, context = int_key("rope.scaling.original_context_length"), int_key("context_length")
    scaling = {"rope_type": "longrope", **factors, "original_max_position_embeddings": original,
               "factor": context / original}
    if f.metadata.get("phi3.rope.scaling.attn_factor") is not None:
        scaling["attention_factor"] = float_key("rope.scaling.attn_factor", positive=True)
    return scaling


def _gemma_fields(meta: dict, arch: str, num_layers: int, hidden: int, num_heads: int, head_dim: int,
                  float_key: Callable[..., float]) -> dict[str, object]:
    """A gemma2 / gemma3 file's ModelArgs fields as llama.cpp runs it: norms before and after
    attention and MLP, a GELU-tanh MLP, embeddings scaled by sqrt(hidden) in the model's dtype, the
    window layers (attention.sliding_window_pattern, else every 2nd / 6th layer global; a gemma3
    file without attention.sliding_window has none), the soft-caps (Gemma 3: the final one only),
    Gemma 3's window layers on RoPE base 10,000 (rope.freq_base_swa where the file has it) and its
    q / k norms; the attention scale 1 / sqrt(head_dim), 1 / sqrt(hidden / heads) for
    the 27Bs (by block count, as llama.cpp tells them apart), attention.scale where the file has it."""
    window = meta.get(f"{arch}.attention.sliding_window")
    if window is None and arch == "gemma3":  # the converter leaves it out where no layer slides
        pattern_default = 1
    elif isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ValueError(f"GGUF metadata {arch}.attention.sliding_window must be a positive integer, got {window!r}")
    else:
        pattern_default = _GEMMA_PATTERNS[arch]
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", pattern_default)
    if isinstance(pattern, list):  # a flag per layer: true where the layer slides
        if len(pattern) != num_layers or not all(isinstance(x, bool) for x in pattern):
            raise ValueError(f"GGUF metadata {arch}.attention.sliding_window_pattern must hold a flag per layer")
        window_layers = tuple(i for i, slides in enumerate(pattern) if slides)
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        window_layers = tuple(i for i in range(num_layers) if i % pattern < pattern - 1)
    else:
        raise ValueError(f"GGUF metadata {arch}.attention.sliding_window_pattern must be a positive integer or "
                         f"a list of flags, got {pattern!r}")
    scalar = hidden // num_heads if num_layers == _GEMMA_27B_LAYERS[arch] else head_dim
    scale = float_key("attention.scale", scalar ** -0.5, positive=True)  # a file that states the scale
    fields: dict[str, object] = {
        "hidden_act": "gelu_tanh", "post_norms": True, "pre_norms": True,
        "sliding_window": window if window_layers else None, "window_layers": window_layers,
        "embedding_multiplier": hidden ** 0.5, "embedding_multiplier_in_dtype": True, "attention_multiplier": scale}
    for name in ("attn_logit_softcapping", "final_logit_softcapping") if arch == "gemma2" else (
            "final_logit_softcapping",):  # Gemma 3's attention is never capped
        if meta.get(f"{arch}.{name}") is not None:
            fields[name] = float_key(name, positive=True)
    if arch == "gemma3":
        fields["local_rope_theta"] = float_key("rope.freq_base_swa", _GEMMA3_LOCAL_BASE, positive=True)
    return fields


def unpermute_rope_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Invert llama.cpp's Q/K permutation: per head, interleaved (x0, y0, x1, y1, ...) rows back to
    rotate-half (x0, x1, ..., y0, y1, ...). Works for a weight [rows, in] and a bias [rows]."""
    rows = w.shape[0]
    half = rows // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def gguf_sources(args: ModelArgs, permuted: bool) -> dict[str, list[tuple[str, Transform | None]]]:
    """Our parameter name → the GGUF tensors (with a row transform) concatenated on dim 0 to form it."""
    q_fix = (lambda w: unpermute_rope_rows(w, args.num_heads)) if permuted else None
    k_fix = (lambda w: unpermute_rope_rows(w, args.num_kv_heads)) if permuted else None
    src: dict[str, list[tuple[str, Transform | None]]] = {
        "embed_tokens.weight": [("token_embd.weight", None)], "norm.weight": [("output_norm.weight", None)]}
    if not args.tie_word_embeddings:
        src["lm_head.weight"] = [("output.weight", None)]
    for i in range(args.num_layers):
        b, ours = f"blk.{i}.", f"layers.{i}."
        for kind in ("weight", "bias") if args.qkv_bias else ("weight",):
            src[ours + f"self_attn.qkv_proj.{kind}"] = [(b + f"attn_qkv.{kind}", None)] if args.fused_qkv else [
                (b + f"attn_q.{kind}", q_fix), (b + f"attn_k.{kind}", k_fix), (b + f"attn_v.{kind}", None)]
        for kind in ("weight", "bias") if args.o_bias else ("weight",):
            src[ours + f"self_attn.o_proj.{kind}"] = [(b + f"attn_output.{kind}", None)]
        if args.qk_norm:
            src[ours + "self_attn.q_norm.weight"] = [(b + "attn_q_norm.weight", None)]
            src[ours + "self_attn.k_norm.weight"] = [(b + "attn_k_norm.weight", None)]
        if i in args.moe_layers:
            src[ours + "mlp.gate.weight"] = [(b + "ffn_gate_inp.weight", None)]
            src[ours + "mlp.experts_gate_up"] = [(b + "ffn_gate_exps.weight", None), (b + "ffn_up_exps.weight", None)]
            src[ours + "mlp.experts_down"] = [(b + "ffn_down_exps.weight", None)]
            if args.shared_expert_intermediate_size:  # qwen2moe
                shared = ours + "mlp.shared_expert."
                src[shared + "gate_up_proj.weight"] = [(b + "ffn_gate_shexp.weight", None),
                                                       (b + "ffn_up_shexp.weight", None)]
                src[shared + "down_proj.weight"] = [(b + "ffn_down_shexp.weight", None)]
                # [1, H]: llama.cpp's converter keeps the row as a vector [H]
                src[ours + "mlp.shared_expert_gate.weight"] = [(b + "ffn_gate_inp_shexp.weight", _as_row)]
        else:
            for kind in ("weight", "bias") if args.mlp_bias else ("weight",):
                src[ours + f"mlp.gate_up_proj.{kind}"] = [(b + f"ffn_up.{kind}", None)] if args.fused_gate_up else [
                    (b + f"ffn_gate.{kind}", None), (b + f"ffn_up.{kind}", None)]
                src[ours + f"mlp.down_proj.{kind}"] = [(b + f"ffn_down.{kind}", None)]
        src[ours + "input_layernorm.weight"] = [(b + "attn_norm.weight", None)]
        if args.post_norms:  # gemma2 / gemma3
            src[ours + "post_attention_layernorm.weight"] = [(b + "post_attention_norm.weight", None)]
            src[ours + "pre_feedforward_layernorm.weight"] = [(b + "ffn_norm.weight", None)]
            src[ours + "post_feedforward_layernorm.weight"] = [(b + "post_ffw_norm.weight", None)]
        else:
            src[ours + "post_attention_layernorm.weight"] = [(b + "ffn_norm.weight", None)]
    return src


def _as_row(w: torch.Tensor) -> torch.Tensor:
    return w.reshape(1, -1)


def _read(f: GGUFFile, name: str, fix: Transform | None, dtype: torch.dtype) -> torch.Tensor:
    if name not in f.tensors:
        raise ValueError(f"{f.path}: GGUF file is missing tensor {name!r}")
    t = f.dequantize(name)  # fp32, a fresh tensor
    if fix is not None:
        t = fix(t)
    return t.to(dtype)


def load_gguf_weights(model: CausalLM, f: GGUFFile, dtype: torch.dtype, device: torch.device) -> None:
    """Assign every parameter of a meta-device `model`, dequantizing one GGUF tensor at a time.

    Peak extra memory is one parameter's fp32 copy; a progress bar shows on a terminal.
    """
    from tqdm.auto import tqdm

    _, permuted = GGUF_ARCHITECTURES[f.architecture]
    expected = dict(model.named_parameters())
    sources = gguf_sources(model.args, permuted)
    used = {s for parts in sources.values() for s, _ in parts}
    if model.args.long_rope_len is not None:  # read into ModelArgs.rope_scaling (_longrope)
        used |= {"rope_factors_long.weight", "rope_factors_short.weight"}
    check_all_used(set(f.tensors), used, f"{f.path}: GGUF")
    state: dict[str, torch.Tensor] = {}
    start = time.perf_counter()
    for name, parts in tqdm(sources.items(), desc="dequantizing GGUF", unit="tensor", disable=None, leave=False):
        keep = torch.float32 if name.endswith(model.args.fp32_parameters) else dtype  # Gemma's norms
        tensors = [_read(f, src, fix, keep) for src, fix in parts]
        want = tuple(expected[name].shape)
        tensor = join_parts(tensors, want)
        if tensor is None:
            raise misfit_error("GGUF", [s for s, _ in parts], tensors, name, want)
        state[name] = to_model_layout(model.args, name, tensor).to(device)  # phi3's partial RoPE
    model.load_state_dict(state, strict=True, assign=True)
    types = sorted({f.type_name(s) for parts in sources.values() for s, _ in parts})
    log.info("loaded %d GGUF tensors (%s) from %s in %.2f s", len(state), ", ".join(types), f.path,
             time.perf_counter() - start)
