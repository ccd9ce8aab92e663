"""A config.json's RoPE read as transformers 5 reads it: the base, the scaling (linear, llama3,
yarn, Phi-3's longrope, dynamic within max_position_embeddings, HunYuan's NTK alpha) with its
fields filled in and checked, Gemma 3's and OLMo 3's per-layer-type bases, and the head dims it
rotates (runtime/model/model_config.py builds ModelArgs from them)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from radixflow.runtime.model.config_families import GLM_ARCHITECTURES
from radixflow.runtime.model.config_fields import check_positive_int, check_positive_number, optional

_DEFAULT_THETAS = {"Ernie4_5ForCausalLM": 500_000.0, "Ernie4_5_MoeForCausalLM": 500_000.0,
                   "MixtralForCausalLM": 1_000_000.0,
                   "SmolLM3ForCausalLM": 2_000_000.0, "GptOssForCausalLM": 150_000.0,
                   "MiniMaxM2ForCausalLM": 5_000_000.0, "Llama4ForCausalLM": 500_000.0,
                   "CohereForCausalLM": 500_000.0}


def default_rope_theta(arch: str) -> float:
    return _DEFAULT_THETAS.get(arch, 10_000.0)


@dataclass(frozen=True)
class RopeFields:
    """ModelArgs' RoPE fields: rope_theta, rope_scaling, local_rope_theta, rotary_dim."""

    theta: float
    scaling: dict[str, Any] | None
    local_theta: float | None
    rotary_dim: int


# the scalings computed here (kernels/rope.py); another is refused
_KINDS = ("default", "llama3", "linear", "yarn", "longrope", "ntk_alpha", "dynamic")


def read_rope(cfg: dict[str, Any], arch: str, head_dim: int) -> RopeFields:
    """The RoPE of config `cfg` (over the family's defaults) of architecture `arch`; ValueError naming
    a field that is malformed or asks for what is not computed here."""
    rope = cfg.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ValueError(f"rope_parameters must be an object, got {rope!r}")  # newer transformers keep theta and scaling here
    if arch in ("Gemma3ForCausalLM", "Olmo3ForCausalLM"):  # the window layers with RoPE of their own
        theta, scaling, local_theta = layer_type_rope(cfg, rope, arch)
    else:  # as transformers 5 reads it: a legacy rope_scaling replaces rope_parameters, whose keys win
        rope = cfg.get("rope_scaling") or rope
        if not isinstance(rope, dict):
            raise ValueError(f"rope_scaling must be an object or null, got {rope!r}")
        theta, local_theta = rope.get("rope_theta", optional(cfg, "rope_theta", default_rope_theta(arch))), None
        scaling = rope if rope.get("rope_type", rope.get("type", "default")) != "default" else None
    check_positive_number("rope_theta", theta)
    if scaling is not None and not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be an object or null, got {scaling!r}")
    dims = rotary_dim(cfg, rope, head_dim, arch)
    return RopeFields(theta, None if scaling is None else _scaling(cfg, scaling, arch, dims), local_theta, dims)


def _scaling(cfg: dict[str, Any], scaling: dict[str, Any], arch: str, dims: int) -> dict[str, Any]:
    """A rope_scaling of a computed kind, its fields filled in and checked."""
    kind = scaling.get("rope_type", scaling.get("type"))
    if arch == "Phi3ForCausalLM" and kind in ("su", "yarn"):  # Phi-3's old names for longrope
        kind = "longrope"
    if kind == "dynamic" and arch in ("HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM") and scaling.get("alpha"):
        kind = "ntk_alpha"  # HunYuan's: the base stretched by a fixed alpha (not by the sequence's length)
        scaling = ntk_alpha_scaling(scaling)
    elif kind == "dynamic":  # dynamic NTK stretches the base only past max_position_embeddings: within
        # it, plain RoPE (runtime/core/model_runner.py keeps the context there)
        scaling = {**scaling, "rope_type": "dynamic"}
    if kind not in _KINDS:
        raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: llama3, linear, yarn, "
                         "longrope (Phi-3), dynamic (within max_position_embeddings; with alpha: HunYuan)")
    for name in ("mscale", "mscale_all_dim"):  # YaRN's (and latent attention's softmax scale: ModelArgs.sm_scale)
        value = scaling.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value < math.inf):
            raise ValueError(f"rope_scaling {name} must be a number >= 0, got {value!r}")
    if kind == "longrope" and arch != "Phi3ForCausalLM":
        raise ValueError(f"rope_scaling longrope is supported for Phi3ForCausalLM only, not {arch}")
    if kind == "yarn":
        return yarn_scaling(cfg, scaling)
    if kind == "longrope":
        return longrope_scaling(cfg, scaling, dims)
    if kind in ("linear", "llama3", "dynamic"):
        return scaled_rope(cfg, scaling, kind)
    return scaling


def rotary_dim(cfg: dict[str, Any], rope: dict[str, Any], head_dim: int, arch: str) -> int:
    """The head dims RoPE rotates: head_dim * partial_rotary_factor (Phi-4-mini: 3/4, GLM: 1/2 by
    default), as transformers' Phi-3 and GLM rotate them (the other families' transformers code
    rotates whole heads)."""
    glm = arch in GLM_ARCHITECTURES + ("Glm4MoeForCausalLM",)  # GLM-4.5 rotates half too (rotate-half pairs)
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.5 if glm else 1.0))
    if (arch == "MiniMaxM2ForCausalLM" and "partial_rotary_factor" not in rope and cfg.get("partial_rotary_factor") is None
            and cfg.get("rotary_dim") is not None):
        check_positive_int("rotary_dim", cfg["rotary_dim"])  # its released configs' name for it
        partial = cfg["rotary_dim"] / head_dim
    if partial == 1.0 and not isinstance(partial, bool):
        return head_dim
    if not glm and arch not in ("Phi3ForCausalLM", "MiniMaxM2ForCausalLM"):
        raise ValueError(f"partial_rotary_factor {partial!r} is supported for Phi3ForCausalLM and GLM only "
                         "(RoPE over the whole head here)")
    check_positive_number("partial_rotary_factor", partial)
    rotary_dim = int(head_dim * partial)
    if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
        raise ValueError(f"partial_rotary_factor {partial!r} rotates {rotary_dim} of {head_dim} head dims; "
                         "an even count from 2 to head_dim is supported")
    return rotary_dim


def yarn_scaling(cfg: dict[str, Any], scaling: dict[str, Any]) -> dict[str, Any]:
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
        check_positive_number(f"rope_scaling {name}", value)
    return {**scaling, "factor": factor, "original_max_position_embeddings": old_len}


def longrope_scaling(cfg: dict[str, Any], scaling: dict[str, Any], rotary_dim: int) -> dict[str, Any]:
    """Phi-3's LongRoPE `rope_scaling` (Phi-3.5, the 128K Phi-3 models) as transformers 5 reads it:
    the top-level original_max_position_embeddings (4096 when absent) is the context the short
    factors serve; an absent `factor` is max_position_embeddings over it; `short_factor` and
    `long_factor` each divide one of the rotary_dim / 2 frequencies."""
    head_dim = rotary_dim
    old_len = optional(cfg, "original_max_position_embeddings", 4096)
    check_positive_int("original_max_position_embeddings", old_len)
    factor = scaling.get("factor")
    factor = optional(cfg, "max_position_embeddings", 4096) / old_len if factor is None else factor
    check_positive_number("rope_scaling factor", factor)
    for name in ("short_factor", "long_factor"):
        values = scaling.get(name)
        if (not isinstance(values, list) or len(values) != head_dim // 2
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf
                       for v in values)):
            raise ValueError(f"rope_scaling {name} must list {head_dim // 2} positive numbers (one per RoPE "
                             f"frequency), got {values!r}")
    return {**scaling, "rope_type": "longrope", "factor": factor, "original_max_position_embeddings": old_len}


def scaled_rope(cfg: dict[str, Any], scaling: dict[str, Any], kind: str) -> dict[str, Any]:
    """A `linear`, `llama3` or `dynamic` rope_scaling checked, and llama3's original context filled in
    as transformers fills it (max_position_embeddings where the scaling names none)."""
    factor = scaling.get("factor")
    if kind != "dynamic" or factor is not None:
        check_positive_number("rope_scaling factor", factor)
    if kind != "llama3":
        return scaling
    old_len = scaling.get("original_max_position_embeddings") or cfg.get("max_position_embeddings")
    check_positive_int("rope_scaling original_max_position_embeddings", old_len)
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    for name, value in (("low_freq_factor", low), ("high_freq_factor", high)):
        check_positive_number(f"rope_scaling {name}", value)
    if not low <= high:  # equal (Llama 4's): a hard cut, no band between
        raise ValueError(f"rope_scaling low_freq_factor {low!r} must not be above high_freq_factor {high!r}")
    return {**scaling, "original_max_position_embeddings": old_len}


def ntk_alpha_scaling(scaling: dict[str, Any]) -> dict[str, Any]:
    """HunYuan's `dynamic` scaling with an `alpha`: the RoPE base times alpha ** (d / (d - 2))."""
    check_positive_number("rope_scaling alpha", scaling.get("alpha"))
    return {**scaling, "rope_type": "ntk_alpha"}


def layer_type_rope(cfg: dict[str, Any], rope: dict[str, Any], arch: str) -> tuple[float, dict[str, Any] | None, float]:
    """Gemma 3's and OLMo 3's (global theta, global scaling, local theta): from `rope_theta` and
    `rope_scaling` (Gemma 3: and `rope_local_base_freq`), or from newer transformers'
    `rope_parameters` keyed by layer type ("full_attention", "sliding_attention"). The window
    layers' RoPE is never scaled. NOTE: OLMo 3's config gives the top-level rope_theta to the full
    layers only; its window layers take their nested theta, else 500,000 (as transformers reads it)."""
    full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
    if not isinstance(full, dict) or not isinstance(local, dict):
        raise ValueError(f"rope_parameters must map full_attention / sliding_attention to objects, got {rope!r}")
    default = 500_000.0 if arch == "Olmo3ForCausalLM" else 1_000_000.0
    # the nested thetas win over the top-level ones, as transformers reads them
    theta = full.get("rope_theta") or cfg.get("rope_theta") or default
    scaling = cfg.get("rope_scaling") or (full if full.get("rope_type", "default") != "default" else None)
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"a scaled RoPE in the sliding-window layers ({local!r}) is not supported")
    local_default = default if arch == "Olmo3ForCausalLM" else cfg.get("rope_local_base_freq") or 10_000.0
    return theta, scaling, local.get("rope_theta") or local_default
