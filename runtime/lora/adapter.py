"""A LoRA adapter in PEFT format: parse, validate against the base model, and name it by its content."""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from radixflow.runtime.config import FUSED_LORA_TARGETS, lora_parts
from radixflow.runtime.model.model_config import ModelArgs
from radixflow.runtime.model.rope_layout import to_rotary_order

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# PEFT target module -> (fused base projection it adds to, its part index within that projection)
TARGETS: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv", 0), "k_proj": ("qkv", 1), "v_proj": ("qkv", 2), "o_proj": ("o", 0),
    "gate_proj": ("gate_up", 0), "up_proj": ("gate_up", 1), "down_proj": ("down", 0),
}
# |lora_alpha / r| (the scale folded into B) above this is no trained adapter's: it is fp16's
# largest value, past which the folded weights or the deltas overflow half precision.
MAX_ABS_SCALE = 65504.0
_TENSOR_NAME = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


def module_dims(args: ModelArgs, module: str) -> tuple[int, int]:
    """(in_features, out_features) of a base-model module named as in PEFT (a fused one's out: its parts')."""
    if module in FUSED_LORA_TARGETS:  # served as its parts: the one lora_A, each part's rows of lora_B
        parts = [module_dims(args, m) for m in lora_parts(module)]
        return parts[0][0], sum(d_out for _, d_out in parts)
    return {
        "q_proj": (args.hidden_size, args.q_size), "k_proj": (args.hidden_size, args.kv_size),
        "v_proj": (args.hidden_size, args.kv_size), "o_proj": (args.q_size, args.hidden_size),
        "gate_proj": (args.hidden_size, args.intermediate_size),
        "up_proj": (args.hidden_size, args.intermediate_size),
        "down_proj": (args.intermediate_size, args.hidden_size),
    }[module]


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter's weights on the host, fp32. `namespace` is its identity: a hash of the
    config that matters (rank, scale, targets) and of every tensor's bytes, so equal content
    means equal namespace whatever the name or path (the radix cache keys its KV by it)."""

    path: str
    rank: int
    scale: float
    targets: frozenset[str]
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # (layer, module) -> A [r, in], B [out, r]
    namespace: str

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())


def check_path(path: str, lora_dir: str | None) -> str:
    """The adapter directory's real path; ValueError when `lora_dir` is set and it lies outside."""
    real = os.path.realpath(path)
    if lora_dir is not None:
        root = os.path.realpath(lora_dir)
        if os.path.commonpath([root, real]) != root:
            raise ValueError(f"adapter path {path!r} is outside --lora-dir {lora_dir!r}")
    if not os.path.isfile(os.path.join(real, CONFIG_FILE)):
        raise ValueError(f"adapter path {path!r} has no {CONFIG_FILE}")
    if not os.path.isfile(os.path.join(real, WEIGHTS_FILE)):
        raise ValueError(f"adapter path {path!r} has no {WEIGHTS_FILE} (only safetensors adapters load)")
    return real


def load_adapter(path: str, args: ModelArgs, max_rank: int, allowed_targets: frozenset[str],
                 lora_dir: str | None = None) -> LoraAdapter:
    """Read a PEFT adapter directory; ValueError naming the cause when it cannot be served."""
    real = check_path(path, lora_dir)
    with open(os.path.join(real, CONFIG_FILE), encoding="utf-8") as f:
        try:
            cfg = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"adapter {path!r}: {CONFIG_FILE} is not valid JSON: {exc}") from exc
    rank, scale, targets = parse_config(cfg, path, max_rank, allowed_targets)
    weights = _collect(_read_tensors(real, path), path, args, rank, targets)
    return LoraAdapter(real, rank, scale, targets, weights, content_namespace(rank, scale, targets, weights))


def _read_tensors(real: str, path: str) -> dict[str, torch.Tensor]:
    """The weights file's tensors; ValueError naming the file when it is not safetensors
    (empty, truncated, corrupt) or cannot be read."""
    try:
        return load_file(os.path.join(real, WEIGHTS_FILE))
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"adapter {path!r}: {WEIGHTS_FILE} cannot be read: {exc}") from exc


def parse_config(cfg: dict, path: str, max_rank: int, allowed: frozenset[str]) -> tuple[int, float, frozenset[str]]:
    """(rank, scale, target modules) of an adapter_config.json, rejecting what is not served."""
    if not isinstance(cfg, dict):
        raise ValueError(f"adapter {path!r}: {CONFIG_FILE} must hold an object")
    if cfg.get("use_dora"):
        raise ValueError(f"adapter {path!r}: DoRA adapters (use_dora) are not supported")
    if cfg.get("modules_to_save"):
        raise ValueError(f"adapter {path!r}: modules_to_save {cfg['modules_to_save']} is not supported "
                         "(only low-rank deltas are)")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise ValueError(f"adapter {path!r}: per-module rank_pattern / alpha_pattern is not supported")
    if cfg.get("bias", "none") != "none":
        raise ValueError(f"adapter {path!r}: bias={cfg['bias']!r} is not supported (only 'none')")
    rank = cfg.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"adapter {path!r}: r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise ValueError(f"adapter {path!r}: rank {rank} is above max_lora_rank={max_rank}")
    names = cfg.get("target_modules")
    names = [names] if isinstance(names, str) else names
    if not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"adapter {path!r}: target_modules must list module names, got {cfg.get('target_modules')!r}")
    unknown = sorted(set(names) - set(TARGETS) - set(FUSED_LORA_TARGETS))
    if unknown and set(unknown) <= {"w1", "w2", "w3"}:
        raise ValueError(f"adapter {path!r}: target modules {unknown} are Mixtral's expert projections: adapters on "
                         "experts are not supported (attention projections and dense MLPs are)")
    if unknown:
        raise ValueError(f"adapter {path!r}: unknown target modules {unknown}; supported: "
                         f"{sorted(TARGETS) + sorted(FUSED_LORA_TARGETS)}")
    names = [part for n in names for part in lora_parts(n)]
    outside = sorted(set(names) - allowed)
    if outside:
        raise ValueError(f"adapter {path!r}: target modules {outside} are not in the engine's "
                         f"lora_target_modules {sorted(allowed)}")
    return rank, _scale(cfg, path, rank), frozenset(names)


def _scale(cfg: dict, path: str, rank: int) -> float:
    """lora_alpha / r (/ sqrt(r) with use_rslora): finite and at most MAX_ABS_SCALE in size, since
    NaN, Infinity (Python's json reads both) or a huge alpha would make every request's logits NaN."""
    alpha = cfg.get("lora_alpha", rank)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise ValueError(f"adapter {path!r}: lora_alpha must be a finite number, got {alpha!r}")
    scale = float(alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank)
    if not abs(scale) <= MAX_ABS_SCALE:
        raise ValueError(f"adapter {path!r}: the scale lora_alpha / r is {scale:g}; "
                         f"at most {MAX_ABS_SCALE:g} in size is served")
    return scale


def _collect(tensors: dict[str, torch.Tensor], path: str, args: ModelArgs, rank: int,
             targets: frozenset[str]) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """Pair lora_A / lora_B per (layer, module), checking names and shapes against the base."""
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        m = _TENSOR_NAME.match(name)
        if m is None and re.search(r"\.(experts|shared_experts?|block_sparse_moe)\.", name):
            raise ValueError(f"adapter {path!r}: tensor {name!r} adapts a mixture of experts: adapters on "
                             "experts are not supported (attention projections and dense MLPs are)")
        if m is None or not set(lora_parts(m.group(2))) <= targets:
            raise ValueError(f"adapter {path!r}: unexpected tensor {name!r}")
        layer = int(m.group(1))
        if layer >= args.num_layers:
            raise ValueError(f"adapter {path!r}: tensor {name!r} is for layer {layer}, the base has {args.num_layers}")
        if layer in args.moe_layers and m.group(2) in ("gate_proj", "up_proj", "down_proj", "gate_up_proj"):
            raise ValueError(f"adapter {path!r}: tensor {name!r} adapts layer {layer}'s MLP, which is a "
                             "mixture of experts here: adapters on experts are not supported (attention "
                             "projections and dense MLPs are)")
        if not args.gated_mlp and m.group(2) in ("gate_proj", "up_proj", "gate_up_proj"):
            raise ValueError(f"adapter {path!r}: tensor {name!r} adapts the MLP's up projection, which has no gate "
                             "here (Arcee, Apertus, StarCoder2): adapters on it are not supported (down_proj and attention are)")
        halves.setdefault((layer, m.group(2)), {})[m.group(3)] = t
    out = {}
    for (layer, module), pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            raise ValueError(f"adapter {path!r}: layer {layer} {module} has lora_{''.join(pair)} only")
        d_in, d_out = module_dims(args, module)
        a, b = pair["A"], pair["B"]
        if tuple(a.shape) != (rank, d_in) or tuple(b.shape) != (d_out, rank):
            raise ValueError(f"adapter {path!r}: layer {layer} {module} has lora_A {tuple(a.shape)} and lora_B "
                             f"{tuple(b.shape)}; the base needs ({rank}, {d_in}) and ({d_out}, {rank})")
        a, b = a.float().contiguous(), b.float().contiguous()
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise ValueError(f"adapter {path!r}: layer {layer} {module} has values that are not finite (NaN or Inf)")
        row = 0
        for part in lora_parts(module):
            rows = module_dims(args, part)[1]
            if (layer, part) in out:
                raise ValueError(f"adapter {path!r}: layer {layer} {part} is adapted twice (itself and in a fused module)")
            b_part = b[row:row + rows].contiguous()
            if part in ("q_proj", "k_proj") and args.reorders_rope:  # as the base's rows (rope_layout.py)
                b_part = to_rotary_order(b_part, args.head_dim, args.rope_dim, args.rope_interleaved)
            out[(layer, part)] = (a, b_part)
            row += rows
    return out


def content_namespace(rank: int, scale: float, targets: frozenset[str],
                      weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]) -> str:
    """`lora:<sha256>` of what the adapter computes; never None (None is the base model's)."""
    h = hashlib.sha256(json.dumps({"r": rank, "scale": scale, "targets": sorted(targets)}).encode())
    for (layer, module), (a, b) in sorted(weights.items()):
        h.update(f"{layer}.{module}".encode())
        h.update(a.numpy().tobytes())
        h.update(b.numpy().tobytes())
    return "lora:" + h.hexdigest()
