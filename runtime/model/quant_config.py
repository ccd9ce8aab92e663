"""A quantized checkpoint's `quantization_config` read into the weight schemes radixflow
dequantizes at load (runtime/model/dequantize.py): FP8 (vLLM's, fbgemm's, ModelOpt's),
compressed-tensors (float-, int-, naive- and pack-quantized), GPTQ, AWQ and gpt-oss's MXFP4 experts."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from radixflow.runtime.text_files import read_json_object

SUPPORTED_METHODS = ("fp8", "fbgemm_fp8", "modelopt", "compressed-tensors", "gptq", "awq", "mxfp4")
# vLLM's and SGLang's `--quantization` names of those methods (their kernels' variants read the same files)
FLAG_METHODS = {**{m: m for m in SUPPORTED_METHODS}, "gptq_marlin": "gptq", "awq_marlin": "awq",
                "compressed_tensors": "compressed-tensors"}
# compressed-tensors formats whose weights are stored one value per element, scaled
_CT_SCALED_FORMATS = ("float-quantized", "int-quantized", "naive-quantized")


@dataclass(frozen=True)
class WeightScheme:
    """How one linear layer's weight is stored.

    kind: "scaled" (an fp8 or int8 `weight` times `weight_scale` / `weight_scale_inv`, minus a
    `weight_zero_point` where one is stored), "packed" (compressed-tensors' signed ints packed
    into int32 words along the input dim: `weight_packed`, `weight_scale`, `weight_shape`),
    "gptq" (`qweight` packed along the input dim, `qzeros`, `scales`, `g_idx`) or "awq"
    (`qweight` and `qzeros` packed along the output dim in AWQ's interleaved order, `scales`).
    """

    kind: str
    bits: int = 8
    group_size: int | None = None          # input columns per scale and zero point (None: no groups)
    block: tuple[int, int] | None = None   # (output rows, input columns) per scale of a block-scaled weight
    gptq_v1_zeros: bool = False            # GPTQ's original format stores each zero point minus one
    packed_zeros: bool = True              # compressed-tensors packs group and channel zero points only


@dataclass(frozen=True)
class Quantization:
    """A checkpoint's quantization: the method's name and the scheme of each targeted layer.

    `groups` are (targets, scheme) pairs; a layer takes the scheme of the group naming it exactly,
    else the first whose `re:` pattern matches it, else the first targeting the class `Linear`.
    """

    method: str
    groups: tuple[tuple[tuple[str, ...], WeightScheme], ...]

    def scheme_for(self, module: str) -> WeightScheme:
        """The scheme of the layer `module` (its checkpoint name without `.weight`); ValueError when
        no group targets it."""
        for targets, scheme in self.groups:
            if module in targets:
                return scheme
        for targets, scheme in self.groups:
            if any(t.startswith("re:") and re.match(t[3:], module) for t in targets):
                return scheme
        for targets, scheme in self.groups:
            if "Linear" in targets:
                return scheme
        raise ValueError(f"quantized tensors of {module!r} match none of the quantization_config's targets")


def read_quantization(model_dir: str) -> Quantization | None:
    """The quantization a safetensors checkpoint declares, or None: config.json's
    `quantization_config` (or `compression_config`), else AutoGPTQ's `quantize_config.json` or
    AutoAWQ's `quant_config.json` or ModelOpt's `hf_quant_config.json` beside it. ValueError naming the file for a method, format or
    setting radixflow cannot dequantize."""
    config_path = os.path.join(model_dir, "config.json")
    cfg = read_json_object(config_path) if os.path.isfile(config_path) else {}
    found = cfg.get("quantization_config") or cfg.get("compression_config")
    path = config_path
    if found is None:
        for name, method in (("quantize_config.json", "gptq"), ("quant_config.json", "awq"),
                             ("hf_quant_config.json", "modelopt")):
            if os.path.isfile(os.path.join(model_dir, name)):
                path = os.path.join(model_dir, name)
                found = {"quant_method": method, **read_json_object(path)}  # these may omit quant_method
                break
    if found is None:
        return None
    if not isinstance(found, dict):
        raise ValueError(f"{path}: quantization_config must be an object, got {found!r}")
    try:
        return quantization_from_dict(found)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def quantization_from_dict(qc: dict[str, Any]) -> Quantization:
    """A parsed `quantization_config`; ValueError naming what is not supported."""
    method = str(qc.get("quant_method", "")).lower().replace("_", "-") if qc.get("quant_method") else ""
    method = {"fbgemm-fp8": "fbgemm_fp8"}.get(method, method)
    if method in ("fp8", "fbgemm_fp8"):
        block = qc.get("weight_block_size")
        return Quantization(method, ((("Linear",), WeightScheme("scaled", block=_block(block))),))
    if method == "modelopt":
        nested = qc.get("quantization") or {}
        if not isinstance(nested, dict):
            raise ValueError(f"ModelOpt quantization must be an object, got {nested!r}")
        algo = qc.get("quant_algo") or nested.get("quant_algo")
        if str(algo).upper() != "FP8":
            raise ValueError(f"ModelOpt quant_algo {algo!r} is not supported (FP8 only)")
        return Quantization(method, ((("Linear",), WeightScheme("scaled")),))
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method == "gptq":
        return Quantization(method, ((("Linear",), _gptq(qc)),))
    if method == "awq":
        return Quantization(method, ((("Linear",), _awq(qc)),))
    if method == "mxfp4":  # gpt-oss's experts (`_blocks` and `_scales` tensors); no per-layer schemes
        return Quantization(method, ())
    raise ValueError(f"quant_method {qc.get('quant_method')!r} is not supported; supported: "
                     f"{', '.join(SUPPORTED_METHODS)} (dequantized at load)")


def _block(block: Any) -> tuple[int, int] | None:
    if block is None:
        return None
    if (not isinstance(block, (list, tuple)) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise ValueError(f"weight_block_size must be two positive integers, got {block!r}")
    return int(block[0]), int(block[1])


def _bits(value: Any, allowed: tuple[int, ...], what: str) -> int:
    if value not in allowed or isinstance(value, bool):
        raise ValueError(f"{what} bits {value!r} is not supported; supported: {', '.join(map(str, allowed))}")
    return int(value)


def _group_size(value: Any) -> int | None:
    if value is None or value == -1:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"group_size must be a positive integer or -1, got {value!r}")
    return value


def _gptq(qc: dict[str, Any]) -> WeightScheme:
    fmt = qc.get("checkpoint_format") or qc.get("format") or "gptq"
    if fmt not in ("gptq", "gptq_v2"):
        raise ValueError(f"GPTQ checkpoint_format {fmt!r} is not supported; supported: gptq, gptq_v2")
    return WeightScheme("gptq", bits=_bits(qc.get("bits", 4), (2, 4, 8), "GPTQ"),
                        group_size=_group_size(qc.get("group_size", 128)), gptq_v1_zeros=fmt == "gptq")


def _awq(qc: dict[str, Any]) -> WeightScheme:
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise ValueError(f"AWQ version {qc.get('version')!r} is not supported (gemm only)")
    zero_point = qc.get("zero_point", True)
    if not isinstance(zero_point, bool):
        raise ValueError(f"AWQ zero_point must be true or false, got {zero_point!r}")
    if not zero_point:
        raise ValueError("AWQ without zero points (zero_point false) is not supported")
    bits = _bits(qc.get("bits", qc.get("w_bit", 4)), (4,), "AWQ")
    return WeightScheme("awq", bits=bits, group_size=_group_size(qc.get("group_size", qc.get("q_group_size", 128))))


def _compressed_tensors(qc: dict[str, Any]) -> Quantization:
    if qc.get("transform_config"):
        raise ValueError("compressed-tensors transforms (transform_config) are not supported")
    sparsity = qc.get("sparsity_config") or {}
    if not isinstance(sparsity, dict):
        raise ValueError(f"sparsity_config must be an object, got {sparsity!r}")
    if sparsity.get("format") not in (None, "dense"):
        raise ValueError(f"compressed-tensors sparsity format {sparsity.get('format')!r} is not supported")
    top_format = qc.get("format")
    config_groups = qc.get("config_groups") or {}
    if not isinstance(config_groups, dict):
        raise ValueError(f"config_groups must be an object of named groups, got {config_groups!r}")
    groups = []
    for name, group in config_groups.items():
        if not isinstance(group, dict):
            raise ValueError(f"config_groups.{name} must be an object")
        targets = group.get("targets") or []
        targets = [targets] if isinstance(targets, str) else targets
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise ValueError(f"config_groups.{name}.targets must be a list of names, got {targets!r}")
        weights = group.get("weights")
        if weights is None:  # activations only (no weight quantization): nothing to dequantize
            continue
        if not isinstance(weights, dict):
            raise ValueError(f"config_groups.{name}.weights must be an object, got {weights!r}")
        groups.append((tuple(targets), _ct_scheme(name, group.get("format") or top_format, weights)))
    if not groups:
        raise ValueError("compressed-tensors config has no config_groups quantizing weights")
    return Quantization("compressed-tensors", tuple(groups))


def _ct_scheme(name: str, fmt: Any, weights: dict[str, Any]) -> WeightScheme:
    kind, bits = weights.get("type", "int"), weights.get("num_bits", 8)
    strategy = weights.get("strategy", "tensor")
    where = f"config_groups.{name}"
    if strategy not in ("tensor", "channel", "group", "block"):
        raise ValueError(f"{where}: weight strategy {strategy!r} is not supported; supported: tensor, channel, "
                         "group, block")
    group_size = _group_size(weights.get("group_size")) if strategy == "group" else None
    if strategy == "group" and group_size is None:
        raise ValueError(f"{where}: strategy group needs a positive group_size, got {weights.get('group_size')!r}")
    if strategy == "block" and weights.get("block_structure") is None:
        raise ValueError(f"{where}: strategy block needs a block_structure")
    block = _block(weights.get("block_structure")) if strategy == "block" else None
    if fmt == "pack-quantized":
        if kind != "int":
            raise ValueError(f"{where}: pack-quantized {kind} weights are not supported (int only)")
        return WeightScheme("packed", bits=_bits(bits, (2, 4, 8), f"{where}: pack-quantized"), group_size=group_size,
                            block=block, packed_zeros=strategy in ("group", "channel"))
    if fmt in _CT_SCALED_FORMATS:
        if bits != 8 or kind not in ("int", "float"):
            raise ValueError(f"{where}: {fmt} {bits}-bit {kind} weights are not supported (8-bit int or float only)")
        return WeightScheme("scaled", group_size=group_size, block=block)
    raise ValueError(f"{where}: compressed-tensors format {fmt!r} is not supported; supported: pack-quantized, "
                     f"{', '.join(_CT_SCALED_FORMATS)}")


def check_quantization_flag(flag: str | None, model_dir: str) -> None:
    """`--quantization` (vLLM's and SGLang's flag) names the method the checkpoint is quantized
    with, which is read from its config anyway; ValueError when the checkpoint is not quantized
    (quantizing float weights at load is not done here) or is quantized otherwise."""
    if flag is None:
        return
    if os.path.isfile(model_dir):
        if flag != "gguf":
            raise ValueError(f"--quantization {flag}: {model_dir} is a GGUF file (--quantization gguf, or none)")
        return
    found = read_quantization(model_dir)
    if found is None:
        raise ValueError(f"--quantization {flag}: {model_dir} holds no quantized checkpoint (no quantization_config); "
                         "quantizing float weights at load is not supported")
    if FLAG_METHODS.get(flag) != found.method:
        raise ValueError(f"--quantization {flag}: the checkpoint in {model_dir} is quantized with {found.method}")
