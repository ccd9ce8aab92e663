"""A served model's weights replaced in place by another checkpoint of the same model.

An RL loop serves a policy, trains it, and hands the server the new checkpoint
(`Engine.update_weights_from_disk`, SGLang's `/update_weights_from_disk`). The new weights are
loaded into a second model built exactly as the served one was (same loader, same dtype, the same
CPU packing), on the host, while the engine keeps serving; then, between steps, every tensor of
the served model is overwritten with its twin's (`StagedWeights.apply`). In place, because kernels
and captures hold the tensors' addresses: CUDA graphs, the native layer call's pointer table
(runtime/model/fused_layers.py). Nothing of the served model changes unless the whole new model
loaded and every tensor matched in name, shape and dtype.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

import torch
from torch import nn

from radixflow.runtime.model.model_config import ModelArgs, load_model_args
from radixflow.runtime.model.model_path import resolve_model_path
from radixflow.runtime.model.packed_linear import can_prepack, prepack_linears
from radixflow.runtime.model.quant_config import check_quantization_flag
from radixflow.runtime.model.weights import (
    VISION_PREFIXES, Source, TensorReader, build_model, checkpoint_names, text_name,
)

log = logging.getLogger(__name__)

# ModelArgs fields a new checkpoint may change: the dtype it was saved in (the engine's stays)
FREE_FIELDS = frozenset({"torch_dtype"})
# model attributes that are not weights, left as they are: what a forward leaves (the latest hidden
# states; the native layer call's addresses, whose weights' stay valid through an in-place update), and
# the RoPE tables, a function of the config the two models share (on CUDA the served ones were computed
# on the device, the new ones on the host)
NOT_WEIGHTS = frozenset({"last_hidden", "kept_hidden", "fused_layers", "rope_cos", "rope_sin", "rope_sin_signed",
                         "local_rope"})


@dataclasses.dataclass
class StagedWeights:
    """A checkpoint loaded beside the served model: `pairs` (served tensor, new tensor) to copy;
    `swaps` (module, attribute, new tensor) for tensors in an opaque layout (oneDNN's packed
    weights), which only torch's own ops read, put in place of the served ones; the checkpoint's
    fp8 KV scales (k, v), if any."""

    model_path: str
    pairs: list[tuple[torch.Tensor, torch.Tensor]]
    swaps: list[tuple[nn.Module, str, torch.Tensor]]
    num_bytes: int
    kv_scales: tuple[list[float], list[float]] | None = None

    @torch.no_grad()
    def apply(self) -> None:
        """Overwrite the served tensors; only between steps (a forward reads them)."""
        for served, new in self.pairs:
            served.copy_(new)
        for module, name, new in self.swaps:
            setattr(module, name, new)


def stage_weights(served: nn.Module, served_args: ModelArgs, model_path: str, dtype: torch.dtype,
                  device: torch.device, max_len: int, quantization: str | None = None) -> StagedWeights:
    """Load `model_path` as the served model was loaded (ValueError: a missing or malformed
    checkpoint, another architecture or shape, a config field that differs). On a CUDA device the
    new model is built in host memory: the device holds one copy of the weights throughout."""
    path = resolve_model_path(model_path)
    args = load_model_args(path)
    check_same_model(served_args, args)
    check_quantization_flag(quantization, path)
    return stage_model(served, served_args, path, dtype, device, max_len)  # the served config builds the twin


def stage_model(served: nn.Module, args: ModelArgs, source: Source, dtype: torch.dtype, device: torch.device,
                max_len: int) -> StagedWeights:
    """The served model's twin loaded from `source` (a checkpoint path or a reader of tensors)."""
    start = time.perf_counter()
    staging = device if device.type == "cpu" else torch.device("cpu")
    model = build_model(args, source, dtype, staging, max_len)
    if can_prepack(device, dtype):  # the served model's projections are packed: pack these the same way
        prepack_linears(model)
    pairs, swaps = match_tensors(_slots(served), model_tensors(model))
    num_bytes = sum(new.numel() * new.element_size() for _, new in pairs)
    name = source if isinstance(source, str) else "tensors"
    log.info("weights of %s staged in %.2f s (%.1f MiB)", name, time.perf_counter() - start, num_bytes / 2**20)
    return StagedWeights(name, pairs, swaps, num_bytes)


class PendingTensors:
    """Named tensors sent in parts (`update_weights_from_tensor`'s buckets), kept until every
    tensor the model is loaded from has arrived. Names as in a checkpoint; a later tensor of a
    name replaces an earlier one."""

    def __init__(self, args: ModelArgs) -> None:
        self.required = checkpoint_names(args)
        self.tensors: dict[str, torch.Tensor] = {}

    def add(self, named: Any) -> None:
        """Take (name, tensor) pairs or a name → tensor dict, copied to host memory (the caller
        may reuse its buffers once this returns); a vision tower's are skipped, as a checkpoint's
        are. ValueError (none taken) for a pair that is not a str and a tensor with data, or a
        name the model is not loaded from."""
        items = list(named.items()) if isinstance(named, dict) else list(named)
        for item in items:
            if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], torch.Tensor)):
                raise ValueError(f"named_tensors must be (name, tensor) pairs or a name -> tensor dict, got {item!r:.80}")
            if item[1].is_meta:
                raise ValueError(f"tensor {item[0]!r} is on the meta device: it holds no values")
        items = [(text_name(name), tensor) for name, tensor in items if not name.startswith(VISION_PREFIXES)]
        unknown = sorted({name for name, _ in items} - self.required - {"lm_head.weight"})
        if unknown:
            raise ValueError(f"tensor(s) {', '.join(map(repr, unknown[:4]))} are not among the served model's "
                             "checkpoint tensors (names as in its Hugging Face checkpoint)")
        self.tensors.update((name, tensor.detach().to("cpu", copy=True)) for name, tensor in items)

    def discard(self) -> None:
        """Forget what was kept (the weights changed another way)."""
        self.tensors = {}

    @property
    def num_missing(self) -> int:
        return len(self.required - set(self.tensors))

    def take(self) -> TensorReader:
        """Every tensor received, as a checkpoint reader; the pending set starts over."""
        tensors, self.tensors = self.tensors, {}
        return TensorReader(tensors)


def check_same_model(served: ModelArgs, new: ModelArgs) -> None:
    """ValueError naming every config field (other than FREE_FIELDS) where `new` differs. Floats
    compare to 1e-6 (a GGUF file keeps them as float32) and a rotary_dim of 0 means the whole
    head, so a GGUF file and a safetensors directory of one model count as the same."""
    a, b = _effective(served), _effective(new)
    differ = [f.name for f in dataclasses.fields(ModelArgs) if f.name not in FREE_FIELDS
              and not _same(getattr(a, f.name), getattr(b, f.name))]
    if differ:
        shown = ", ".join(f"{name} ({getattr(served, name)!r} served, {getattr(new, name)!r} new)"
                          for name in differ[:6])
        more = f" and {len(differ) - 6} more" if len(differ) > 6 else ""
        raise ValueError(f"the new checkpoint's config differs from the served model's in {shown}{more}; weights "
                         "can be updated only with a checkpoint of the same model and config")


@dataclasses.dataclass(frozen=True)
class _Slot:
    """A tensor of a model and, when it is a module's plain attribute, that module and name."""

    tensor: torch.Tensor
    module: nn.Module | None = None
    name: str = ""


def _effective(args: ModelArgs) -> ModelArgs:
    return dataclasses.replace(args, rotary_dim=args.rotary_dim or args.head_dim)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def match_tensors(served: dict[str, _Slot], new: dict[str, torch.Tensor]
                  ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[nn.Module, str, torch.Tensor]]]:
    """(served, new) to copy and (module, attribute, new) to swap, for every tensor of the new
    model; ValueError where the two models differ. Placeholders that hold no memory (stacked
    experts emptied once packed) are left out."""
    missing = sorted(set(served) - set(new))
    extra = sorted(set(new) - set(served))
    if missing or extra:
        raise ValueError(f"the new checkpoint's model does not match the served one: "
                         f"missing {missing[:5]}, unexpected {extra[:5]}")
    pairs, swaps = [], []
    for name, t in new.items():
        slot = served[name]
        s = slot.tensor
        if s.shape != t.shape or s.dtype != t.dtype or s.layout != t.layout:
            raise ValueError(f"tensor {name}: {tuple(t.shape)} {t.dtype} in the new checkpoint, "
                             f"{tuple(s.shape)} {s.dtype} served")
        if s.layout != torch.strided:  # oneDNN's packed weight: no storage to write in place
            if slot.module is None:
                raise ValueError(f"tensor {name} is held in a layout that cannot be updated")
            swaps.append((slot.module, slot.name, t))
        elif _holds_memory(t) != _holds_memory(s):
            raise ValueError(f"tensor {name} is stored differently in the new checkpoint's model")
        elif _holds_memory(t):
            pairs.append((s, t))
    return pairs, swaps


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight tensor a model holds, by a dotted name: parameters, buffers, and plain
    attributes (packed projections), also inside lists, tuples and dicts (packed experts)."""
    return {name: slot.tensor for name, slot in _slots(model).items()}


def _slots(model: nn.Module) -> dict[str, _Slot]:
    out: dict[str, _Slot] = {}
    _collect(model, "", out, set())
    return out


def _collect(obj: Any, name: str, out: dict[str, _Slot], seen: set[int], owner: nn.Module | None = None,
             key: str = "") -> None:
    if isinstance(obj, torch.Tensor):
        out[name] = _Slot(obj, owner, key)
    elif isinstance(obj, nn.Module):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        for attr, value in vars(obj).items():
            if attr in ("_parameters", "_buffers", "_modules"):
                for sub, item in value.items():
                    _collect(item, _join(name, sub), out, seen)
            elif not attr.startswith("_") and attr not in NOT_WEIGHTS:
                _collect(value, _join(name, attr), out, seen, obj, attr)
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _collect(item, _join(name, str(i)), out, seen)
    elif isinstance(obj, dict):
        for sub, item in obj.items():
            _collect(item, _join(name, str(sub)), out, seen)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _holds_memory(t: torch.Tensor) -> bool:
    """False for a view whose elements share storage (a zero-stride placeholder); strided only."""
    return t.numel() == 0 or t.untyped_storage().nbytes() >= t.numel() * t.element_size()
