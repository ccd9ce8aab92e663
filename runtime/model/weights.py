"""Checkpoint loading: safetensors (single file or sharded) or GGUF into a meta-built CausalLM."""
from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from radixflow.runtime.model.dequantize import FLOAT8, DequantizingReader
from radixflow.runtime.model.model import CausalLM
from radixflow.runtime.model.model_config import ModelArgs
from radixflow.runtime.model.rope_layout import to_model_layout
from radixflow.runtime.model.quant_config import read_quantization
from radixflow.runtime.text_files import read_json_object

log = logging.getLogger(__name__)

# Checkpoint tensors that carry nothing we need.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_INIT_FNS = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
             "xavier_normal_", "trunc_normal_", "zeros_", "ones_", "constant_")


@contextlib.contextmanager
def skip_weight_init() -> Iterator[None]:
    """Construct modules without running their random init: the checkpoint overwrites every
    parameter, and on the meta device the init alone costs seconds (it imports torch._dynamo)."""
    saved = {name: getattr(nn.init, name) for name in _INIT_FNS}
    for name in saved:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


# A multimodal checkpoint (Gemma 3, 4B and up) keeps its language model under a prefix, read here as
# a text model's tensors; its vision tower and projector are not loaded (images are not served).
_TEXT_PREFIXES = (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                  ("model.language_model.", "model."))
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.",
                    "visual.", "model.visual.", "vision_model.", "model.vision_model.")  # Gemma 3's; Qwen-VL's; Llama 4's


def text_name(name: str) -> str:
    for prefix, ours in _TEXT_PREFIXES:
        if name.startswith(prefix):
            return ours + name[len(prefix):]
    return name


class CheckpointReader:
    """Name → file index over a checkpoint's safetensors files; opens each file lazily. A
    multimodal checkpoint's language-model tensors are named as a text model's (_TEXT_PREFIXES)."""

    def __init__(self, model_dir: str) -> None:
        index_path = os.path.join(model_dir, "model.safetensors.index.json")
        single = os.path.join(model_dir, "model.safetensors")
        if os.path.isfile(index_path):
            stored = {name: os.path.join(model_dir, fn) for name, fn in _weight_map(index_path).items()}
        elif os.path.isfile(single):
            stored = {name: single for name in self._open(single).keys()}
        else:
            raise ValueError(f"no model.safetensors or model.safetensors.index.json in {model_dir!r}")
        vision = [name for name in stored if name.startswith(VISION_PREFIXES)]
        if vision:
            log.info("%d vision-tower tensors not loaded: radixflow serves this model's text only", len(vision))
        # a base model saved without its LM wrapper (an embedding model such as Qwen3-Embedding):
        # `layers.0...`, `embed_tokens.weight`, read as the wrapped model's
        bare = self.bare = "embed_tokens.weight" in stored and not any(name.startswith("model.") for name in stored)
        self._stored = {("model." + name if bare and not name.startswith("lm_head.") else text_name(name)): name
                        for name in stored if not name.startswith(VISION_PREFIXES)}
        self.files = {ours: stored[name] for ours, name in self._stored.items()}
        self._handles: dict[str, object] = {}

    def names(self) -> set[str]:
        return set(self.files)

    def get(self, name: str) -> torch.Tensor:
        """Tensor `name` as stored; ValueError naming the file when it is missing, unreadable or
        not floating point."""
        tensor = self.raw(name)
        if tensor.dtype in FLOAT8:  # its codes are not its values
            raise ValueError(f"checkpoint tensor {name!r} in {self.files[name]!r} is "
                             f"{str(tensor.dtype).removeprefix('torch.')} with no scale beside it (an fp8 weight "
                             "loads with its weight_scale under a quantization_config)")
        if not tensor.is_floating_point():
            raise ValueError(f"checkpoint tensor {name!r} in {self.files[name]!r} is "
                             f"{str(tensor.dtype).removeprefix('torch.')}; radixflow loads floating-point weights "
                             "here (a quantized checkpoint needs its quantization_config in config.json)")
        return tensor

    def stored_name(self, name: str) -> str:
        """The checkpoint's own name of tensor `name` (a multimodal or bare checkpoint's differs)."""
        return self._stored[name]

    def raw(self, name: str) -> torch.Tensor:
        """Tensor `name` as stored, of any dtype; ValueError naming the file when it is missing or
        unreadable."""
        if name not in self.files:
            raise ValueError(f"checkpoint is missing tensor {name!r}")
        path = self.files[name]
        if path not in self._handles:
            if not os.path.isfile(path):
                raise ValueError(f"checkpoint shard {path!r} (holding {name!r}) does not exist")
            self._handles[path] = self._open(path)
        handle, stored = self._handles[path], self._stored[name]
        if stored not in handle.keys():
            raise ValueError(f"checkpoint shard {path!r} lacks tensor {stored!r}, which the index places there")
        try:
            return handle.get_tensor(stored)
        except SafetensorError as e:
            raise ValueError(f"cannot read tensor {name!r} from {path!r}: {e}") from e

    @staticmethod
    def _open(path: str) -> Any:
        try:
            return safe_open(path, framework="pt")
        except SafetensorError as e:
            raise ValueError(f"{path} is not a readable safetensors file: {e}") from e


class TensorReader(CheckpointReader):
    """A reader over tensors in memory, named as in a checkpoint (`update_weights_from_tensor`)."""

    def __init__(self, named: dict[str, torch.Tensor]) -> None:
        self._named = {text_name(name): tensor for name, tensor in named.items()}
        self._stored = {name: name for name in self._named}
        self.files = {name: "the tensors given" for name in self._named}
        self.bare = False

    def raw(self, name: str) -> torch.Tensor:
        if name not in self._named:
            raise ValueError(f"the tensors given lack {name!r}")
        return self._named[name]


def checkpoint_names(args: ModelArgs) -> set[str]:
    """Every checkpoint tensor name the model of `args` is loaded from."""
    return {source for sources in _checkpoint_sources(args).values() for source in sources}


Source = str | CheckpointReader | DequantizingReader  # a model directory, or a reader of one's tensors


def checkpoint_reader(model_dir: str) -> CheckpointReader | DequantizingReader:
    """The reader of a safetensors checkpoint: one that dequantizes its quantized layers when its
    config declares a quantization (runtime/model/quant_config.py), else the plain one."""
    reader = CheckpointReader(model_dir)
    quantization = read_quantization(model_dir)
    return reader if quantization is None else DequantizingReader(reader, quantization)


def _weight_map(index_path: str) -> dict[str, str]:
    """The tensor name → shard file map of a sharded checkpoint's index; ValueError naming the file."""
    weight_map = read_json_object(index_path).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index_path} must hold an object with a \"weight_map\" of tensor name to shard file")
    return weight_map


def _checkpoint_sources(args: ModelArgs) -> dict[str, list[str]]:
    """Our parameter name → the checkpoint tensors concatenated (dim 0) to form it."""
    src: dict[str, list[str]] = {"embed_tokens.weight": ["model.embed_tokens.weight"],
                                 "norm.weight": ["model.norm.weight"]}
    if not args.tie_word_embeddings:
        src["lm_head.weight"] = ["lm_head.weight"]
    for i in range(args.num_layers):
        p, ours = f"model.layers.{i}.", f"layers.{i}."
        attn = p + "self_attn."
        if args.mla:
            src.update(_latent_attention_sources(args, attn, ours + "self_attn."))
        else:
            src.update(_attention_sources(args, attn, ours + "self_attn."))
        src.update(_expert_sources(args, p, ours) if i in args.moe_layers else _mlp_sources(args, p, ours))
        # Llama's before the MLP; OLMo 2's and Gemma 3's after attention; none in Cohere's parallel layer
        norms = [] if args.parallel_block else ["post_attention_layernorm"]
        if args.pre_norms:
            norms.append("input_layernorm")
        if args.post_norms:
            norms += ["post_feedforward_layernorm", "pre_feedforward_layernorm"] if args.pre_norms else [
                "post_feedforward_layernorm"]
        stored = _NORM_NAMES.get(args.architecture, {})
        for norm in norms:
            for kind in ("weight", "bias") if args.layer_norm and args.norm_bias else ("weight",):
                src[ours + f"{norm}.{kind}"] = [p + f"{stored.get(norm, norm)}.{kind}"]
    if args.layer_norm and args.norm_bias:
        src["norm.bias"] = ["model.norm.bias"]
    return src


def _attention_sources(args: ModelArgs, attn: str, ours: str) -> dict[str, list[str]]:
    """A layer's attention parameters (`ours`: their prefix): q | k | v fused (stored apart, or as
    Phi-3's qkv_proj), o, their biases, gpt-oss's sinks and the q / k norms."""
    src: dict[str, list[str]] = {}
    src[ours + "qkv_proj.weight"] = [attn + "qkv_proj.weight"] if args.fused_qkv else [
        attn + f"{x}_proj.weight" for x in "qkv"]
    if args.qkv_bias:
        src[ours + "qkv_proj.bias"] = [attn + f"{x}_proj.bias" for x in "qkv"]
    src[ours + "o_proj.weight"] = [attn + "o_proj.weight"]
    if args.attention_sinks:
        src[ours + "sinks"] = [attn + "sinks"]
    if args.o_bias:
        src[ours + "o_proj.bias"] = [attn + "o_proj.bias"]
    if args.qk_norm or args.qk_norm_whole or args.qk_layer_norm:
        q_norm, k_norm = _QK_NORM_NAMES.get(args.architecture, ("q_norm", "k_norm"))
        src[ours + "q_norm.weight"] = [attn + f"{q_norm}.weight"]
        src[ours + "k_norm.weight"] = [attn + f"{k_norm}.weight"]
    return src


def _latent_attention_sources(args: ModelArgs, attn: str, ours: str) -> dict[str, list[str]]:
    """A latent-attention layer's parameters (model.LatentAttention), named as stored."""
    names = ["kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight"]
    names += ["q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"] if args.q_lora_rank else ["q_proj.weight"]
    if args.qkv_bias:  # attention_bias: the down-projections'
        names += ["kv_a_proj_with_mqa.bias"] + (["q_a_proj.bias"] if args.q_lora_rank else [])
    if args.o_bias:
        names.append("o_proj.bias")
    return {ours + name: [attn + name] for name in names}


# a family's names for its MLP's up and down projections, where they are not Llama's
_MLP_NAMES = {"Starcoder2ForCausalLM": ("c_fc", "c_proj")}


def _mlp_sources(args: ModelArgs, p: str, ours: str) -> dict[str, list[str]]:
    """A dense layer's MLP parameters: gate | up (stored apart, or fused as Phi-3's and GLM's; up
    alone in an MLP without a gate), down, their biases, and Apertus' xIELU scalars."""
    up, down = _MLP_NAMES.get(args.architecture, ("up_proj", "down_proj"))
    mlp = p + ("feed_forward." if args.architecture == "Llama4ForCausalLM" else "mlp.")  # the layer's block
    src = {}
    for kind in ("weight", "bias") if args.mlp_bias else ("weight",):
        if not args.gated_mlp:  # Arcee, Apertus, StarCoder2
            src[ours + f"mlp.gate_up_proj.{kind}"] = [mlp + f"{up}.{kind}"]
        elif args.fused_gate_up:
            src[ours + f"mlp.gate_up_proj.{kind}"] = [mlp + f"gate_up_proj.{kind}"]
        else:
            src[ours + f"mlp.gate_up_proj.{kind}"] = [mlp + f"gate_proj.{kind}", mlp + f"up_proj.{kind}"]
        src[ours + f"mlp.down_proj.{kind}"] = [mlp + f"{down}.{kind}"]
    if args.hidden_act == "xielu":
        for scalar in ("alpha_p", "alpha_n", "beta", "eps"):
            src[ours + f"mlp.act_{scalar}"] = [mlp + f"act_fn.{scalar}"]
    return src


# a family's names for the norms around a layer's branches, where they are not Gemma's
_NORM_NAMES = {"Glm4ForCausalLM": {"post_attention_layernorm": "post_self_attn_layernorm",
                                   "pre_feedforward_layernorm": "post_attention_layernorm",
                                   "post_feedforward_layernorm": "post_mlp_layernorm"},
               "ApertusForCausalLM": {"input_layernorm": "attention_layernorm",
                                      "post_attention_layernorm": "feedforward_layernorm"}}
# a family's names for the per-head q / k norms, where they are not Qwen3's
_QK_NORM_NAMES = {"HunYuanDenseV1ForCausalLM": ("query_layernorm", "key_layernorm"),
                  "HunYuanMoEV1ForCausalLM": ("query_layernorm", "key_layernorm")}


# each family's names for a layer's experts block and an expert's (gate, up, down) projections
_EXPERT_NAMES = {"MixtralForCausalLM": ("block_sparse_moe", ("w1", "w3", "w2")),
                 "MiniMaxM2ForCausalLM": ("block_sparse_moe", ("w1", "w3", "w2"))}
# where a sigmoid router's correction bias is kept, beside the experts' block: GLM-4.5's on its router
_CORRECTION_NAMES = {"MiniMaxM2ForCausalLM": "e_score_correction_bias",
                     "Ernie4_5_MoeForCausalLM": "moe_statics.e_score_correction_bias"}  # ERNIE's [1, E]
# GraniteMoE stores its experts stacked: gate | up as input_linear [E, 2I, H], down as output_linear
_QWEN_EXPERT_NAMES = ("mlp", ("gate_proj", "up_proj", "down_proj"))


def _expert_sources(args: ModelArgs, p: str, ours: str) -> dict[str, list[str]]:
    """A mixture-of-experts layer's parameters: the router, every expert's gate | up stacked (one
    [2I, H] block per expert) and its down, and Qwen2-MoE's shared expert with its gate."""
    if args.architecture == "GptOssForCausalLM":  # stacked, with biases (layout: _from_stored_layout)
        moe = f"{p}mlp."
        return {ours + f"mlp.{name}": [moe + stored] for name, stored in (
            ("gate.weight", "router.weight"), ("gate.bias", "router.bias"),
            ("experts_gate_up", "experts.gate_up_proj"), ("experts_gate_up_bias", "experts.gate_up_proj_bias"),
            ("experts_down", "experts.down_proj"), ("experts_down_bias", "experts.down_proj_bias"))}
    if args.architecture == "Llama4ForCausalLM":  # stacked as x @ W (layout: _from_stored_layout), a shared expert
        moe, shared = f"{p}feed_forward.", f"{p}feed_forward.shared_expert."
        return {ours + "mlp.gate.weight": [moe + "router.weight"],
                ours + "mlp.experts_gate_up": [moe + "experts.gate_up_proj"],
                ours + "mlp.experts_down": [moe + "experts.down_proj"],
                ours + "mlp.shared_expert.gate_up_proj.weight": [shared + "gate_proj.weight", shared + "up_proj.weight"],
                ours + "mlp.shared_expert.down_proj.weight": [shared + "down_proj.weight"]}
    if args.stacked_experts:  # Qwen3-VL-MoE: gate | up and down each one tensor [E, ...]
        return {ours + "mlp.gate.weight": [f"{p}mlp.gate.weight"],
                ours + "mlp.experts_gate_up": [f"{p}mlp.experts.gate_up_proj"],
                ours + "mlp.experts_down": [f"{p}mlp.experts.down_proj"]}
    if args.architecture == "GraniteMoeForCausalLM":
        moe = f"{p}block_sparse_moe."
        return {ours + "mlp.gate.weight": [moe + "router.layer.weight"],
                ours + "mlp.experts_gate_up": [moe + "input_linear.weight"],
                ours + "mlp.experts_down": [moe + "output_linear.weight"]}
    block, (gate, up, down) = _EXPERT_NAMES.get(args.architecture, _QWEN_EXPERT_NAMES)
    experts = [f"{p}{block}.experts.{e}." for e in range(args.num_experts)]
    router = "gate.wg" if args.architecture == "HunYuanMoEV1ForCausalLM" else "gate"
    src = {ours + "mlp.gate.weight": [f"{p}{block}.{router}.weight"],
           ours + "mlp.experts_gate_up": [e + f"{w}.weight" for e in experts for w in (gate, up)],
           ours + "mlp.experts_down": [e + f"{down}.weight" for e in experts]}
    if args.router_correction:  # the correction bias beside the router (GLM-4.5) or in the block (MiniMax-M2, ERNIE)
        stored = _CORRECTION_NAMES.get(args.architecture, "gate.e_score_correction_bias")
        src[ours + "mlp.router_correction"] = [f"{p}{block}.{stored}"]
    if args.shared_expert_intermediate_size:  # Qwen2-MoE's shared_expert, GLM-4.5's shared_experts, Hunyuan's shared_mlp
        shared = f"{p}mlp.shared_expert{'' if args.shared_expert_gate else 's'}."
        if args.architecture == "HunYuanMoEV1ForCausalLM":
            shared = f"{p}mlp.shared_mlp."
        src[ours + "mlp.shared_expert.gate_up_proj.weight"] = [shared + "gate_proj.weight", shared + "up_proj.weight"]
        src[ours + "mlp.shared_expert.down_proj.weight"] = [shared + "down_proj.weight"]
        if args.shared_expert_gate:
            src[ours + "mlp.shared_expert_gate.weight"] = [f"{p}mlp.shared_expert_gate.weight"]
    return src


def _from_stored_layout(args: ModelArgs, name: str, tensor: torch.Tensor, want: tuple[int, ...]) -> torch.Tensor:
    """Checkpoint tensor `tensor` for our parameter `name` (of shape `want`) in our layout. gpt-oss
    stores its experts as x @ W (gate_up [E, H, 2I], down [E, I, H]; ours are [E, out, in]) with
    gate and up interleaved (columns 2j, 2j + 1; ours | gate | up |), their biases likewise.
    Qwen3-VL-MoE's stacked experts come as x @ W in its released files and as ours where
    transformers saved them: turned when their shape is not ours (as transformers does)."""
    if name.endswith(".mlp.router_correction"):  # ERNIE 4.5 MoE keeps it as one group's row [1, E]
        return tensor.reshape(-1) if tensor.dim() == 2 and tensor.shape[0] == 1 else tensor
    if args.stacked_experts and ".mlp.experts_" in name and tensor.dim() == 3 and tuple(tensor.shape) != want:
        return tensor.transpose(1, 2).contiguous()
    if args.architecture == "Llama4ForCausalLM" and ".mlp.experts_" in name and tensor.dim() == 3:
        return tensor.transpose(1, 2).contiguous()  # x @ W: gate | up [E, H, 2I], down [E, I, H]
    if args.architecture != "GptOssForCausalLM" or ".mlp.experts_" not in name:
        return tensor
    if tensor.dim() == 3:
        tensor = tensor.transpose(1, 2).contiguous()
    if "gate_up" in name and tensor.dim() >= 2:
        tensor = torch.cat([tensor[:, 0::2], tensor[:, 1::2]], dim=1)
    return tensor


def join_parts(parts: list[torch.Tensor], want: tuple[int, ...]) -> torch.Tensor | None:
    """The parameter of shape `want` the checkpoint tensors `parts` form, or None when they do not fit.

    Parts of a parameter's own rank join on dim 0 (q | k | v, gate | up), except that 3-D parts
    join on dim 1 and must be of one shape (GGUF's stacked experts: gate [E, I, H] | up [E, I, H] →
    [E, 2I, H]); 2-D parts of a 3-D parameter are its experts' blocks in order, all of one shape
    ([2I, H] from gate | up pairs, [H, I] from downs; one part for a single expert).
    """
    want = tuple(want)
    if len(want) == 3 and all(t.dim() == 2 for t in parts):
        rows = want[0] * want[1]
        if rows % len(parts) or any(tuple(t.shape) != (rows // len(parts), want[2]) for t in parts):
            return None
        return torch.cat(parts, dim=0).view(want)
    if any(t.dim() != len(want) for t in parts):
        return None
    if len(parts) == 1:
        joined = parts[0]
    else:
        dim, first = (1 if len(want) == 3 else 0), parts[0].shape
        if len(want) == 3 and any(t.shape != first for t in parts):
            return None
        if any(t.shape[:dim] != first[:dim] or t.shape[dim + 1:] != first[dim + 1:] for t in parts):
            return None
        joined = torch.cat(parts, dim=dim)
    return joined if tuple(joined.shape) == want else None


def misfit_error(what: str, names: list[str], parts: list[torch.Tensor], param: str,
                 want: tuple[int, ...]) -> ValueError:
    """The error for checkpoint tensors that do not form `param`: a few of them with their shapes,
    those unlike the most common shape first (a layer has 2E expert tensors)."""
    shapes = [tuple(t.shape) for t in parts]
    common = max(set(shapes), key=shapes.count)
    listed = sorted(zip(names, shapes), key=lambda item: item[1] == common)[:4]
    shown = ", ".join(f"{n} {shape}" for n, shape in listed)
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return ValueError(f"{what} tensor(s) {shown}{more} do not fit {param} of shape {tuple(want)}")


def load_weights(model: CausalLM, model_dir: Source, dtype: torch.dtype, device: torch.device,
                 on_tensor: Callable[[str, torch.Tensor], None] | None = None) -> None:
    """Assign every parameter of a meta-device `model` from the checkpoint in `model_dir` (or
    from a reader's tensors).

    Raises ValueError naming the tensor when one is missing or has the wrong shape.
    """
    reader = checkpoint_reader(model_dir) if isinstance(model_dir, str) else model_dir
    expected = dict(model.named_parameters())
    all_sources = _checkpoint_sources(model.args)
    names = reader.names()
    if reader.bare and "lm_head.weight" in all_sources and "lm_head.weight" not in names:
        raise ValueError(f"{model_dir} holds a bare base model (no `model.` prefix) with no LM head, and its config "
                         "does not tie the head to the embeddings (tie_word_embeddings false): such an embedding "
                         "checkpoint is not supported (a tied one is)")
    outside = sorted(n for n in names if not n.startswith(("model.", "lm_head.")))
    if outside:  # a value head, Medusa heads: saved beside the LM, not part of it
        log.info("checkpoint tensors outside the model skipped: %s", ", ".join(outside[:8]))
    check_all_used(set(names) - set(outside) - _ignorable(model.args, names),
                   {s for sources in all_sources.values() for s in sources}, "checkpoint")
    state: dict[str, torch.Tensor] = {}
    for name, sources in all_sources.items():
        want = tuple(expected[name].shape)
        parts = [_from_stored_layout(model.args, name, reader.get(s), want) for s in sources]
        tensor = join_parts(parts, want)
        if tensor is None:
            raise misfit_error("checkpoint", sources, parts, name, want)
        if model.args.norm_weight_offset and name.endswith("norm.weight"):  # Gemma 3 stores weight - 1
            tensor = tensor.float() + model.args.norm_weight_offset
        tensor = to_model_layout(model.args, name, tensor)  # Phi-4-mini, GLM, ERNIE 4.5: rope_layout.py
        # copy=True: a tensor already in `dtype` would stay a view of the file's memory map, which then
        # stays mapped (and, once read, resident) beside the copies packing makes (packed_linear.py)
        keep = torch.float32 if name.endswith(model.args.fp32_parameters) else dtype
        state[name] = tensor.to(device=device, dtype=keep, copy=True)
        if on_tensor is not None:
            on_tensor(name, state[name])
    model.load_state_dict(state, strict=True, assign=True)


def _ignorable(args: ModelArgs, names: set[str]) -> set[str]:
    """Checkpoint tensors that may go unused: RoPE's frequencies, fp8 KV scales (read_kv_scales
    reads them), an LM head the config ties to the embeddings, the layers stored after the
    decoder's that it does not run (GLM-4.5's MTP layer: ModelArgs.extra_layers), and the empty
    shared expert of a model without one."""
    kv_scales = {f"model.layers.{i}.{s}" for i in range(args.num_layers)
                 for suffixes in _KV_SCALE_NAMES.values() for s in suffixes}
    tied = {"lm_head.weight"} if args.tie_word_embeddings else set()
    extra = tuple(f"model.layers.{i}." for i in range(args.num_layers, args.num_layers + args.extra_layers))
    # GLM-4.5 and DeepSeek with n_shared_experts 0: transformers saves the shared expert anyway, as empty tensors
    unshared = ".mlp.shared_experts." if (args.router_correction or args.mla) and not \
        args.shared_expert_intermediate_size else None
    return {n for n in names if n.endswith(_IGNORED_SUFFIXES) or n in kv_scales or n in tied
            or (extra and n.startswith(extra)) or (unshared is not None and unshared in n)}


def check_all_used(names: set[str], used: set[str], what: str) -> None:
    """ValueError naming the tensors in `names` the model does not use: each is a feature not
    served (a quantized checkpoint's scales, a bias or a layer the config does not declare), and
    loading without it would give wrong outputs silently."""
    unused = sorted(names - used)
    if unused:
        shown = ", ".join(repr(n) for n in unused[:4]) + (f" and {len(unused) - 4} more" if len(unused) > 4 else "")
        raise ValueError(f"{what} tensor(s) {shown} are not used by the model: they belong to something radixflow "
                         "does not serve (quantization scales where config.json declares no quantization_config, or "
                         "biases or layers the config does not declare)")


# Where checkpoints keep a layer's fp8 KV-cache scales, by writer: vLLM/llm-compressor
# (self_attn.k_scale, or self_attn.attn.k_scale before its renaming), ModelOpt (on the
# projections), and the older single kv_scale for both.
_KV_SCALE_NAMES = {
    "k": ("self_attn.k_scale", "self_attn.attn.k_scale", "self_attn.k_proj.k_scale", "self_attn.kv_scale"),
    "v": ("self_attn.v_scale", "self_attn.attn.v_scale", "self_attn.v_proj.v_scale", "self_attn.kv_scale"),
}


def read_kv_scales(model_dir: str, num_layers: int) -> tuple[list[float], list[float]] | None:
    """Per-layer fp8 KV scales (k, v) a safetensors checkpoint carries, or None when it has none.

    A scale dequantizes as the KV pool's do (stored e4m3 * scale). A scale of several entries
    (per head) is reduced to its largest, which keeps every head in range. Raises ValueError
    when only some layers have scales.
    """
    if not os.path.isdir(model_dir):
        return None  # GGUF: no KV scales
    reader = CheckpointReader(model_dir)
    names = reader.names()
    found: dict[str, list[float | None]] = {"k": [], "v": []}
    for which, suffixes in _KV_SCALE_NAMES.items():
        for i in range(num_layers):
            name = next((f"model.layers.{i}.{s}" for s in suffixes if f"model.layers.{i}.{s}" in names), None)
            found[which].append(None if name is None else float(reader.get(name).float().max()))
    present = [x is not None for x in found["k"] + found["v"]]
    if not any(present):
        return None
    if not all(present):
        missing = [f"{w}_scale of layer {i}" for w in "kv" for i, x in enumerate(found[w]) if x is None]
        raise ValueError(f"checkpoint {model_dir!r} has fp8 KV scales for some layers only; missing "
                         f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    return [float(x) for x in found["k"]], [float(x) for x in found["v"]]  # type: ignore[arg-type]


def build_model(args: ModelArgs, model_dir: Source, dtype: torch.dtype, device: torch.device,
                max_len: int) -> CausalLM:
    """Construct on meta, load the checkpoint (a safetensors directory or a GGUF file, or a
    reader's tensors), build RoPE tables for `max_len` positions."""
    start = time.perf_counter()
    with torch.device("meta"), skip_weight_init():
        model = CausalLM(args)
    if isinstance(model_dir, str) and os.path.isfile(model_dir):
        from radixflow.runtime.model.gguf_file import read_gguf
        from radixflow.runtime.model.gguf_loader import load_gguf_weights

        load_gguf_weights(model, read_gguf(model_dir), dtype, device)
    else:
        load_weights(model, model_dir, dtype, device)
    model.init_rope(max_len, device)
    log.info("model %s (%s, %d layers) loaded in %.2f s", model_dir if isinstance(model_dir, str) else "tensors",
             dtype, args.num_layers,
             time.perf_counter() - start)
    return model.eval()
