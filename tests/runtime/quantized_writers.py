"""Test helper: quantized copies of a float safetensors checkpoint in the formats radixflow reads
(FP8 block and per-tensor, compressed-tensors, GPTQ, AWQ), each with the float weights its
codes stand for.

GPTQ and AWQ codes are packed here one code at a time with Python ints, as their formats lay
them out, so the loader's vectorized unpacking is checked against an independent packer;
compressed-tensors checkpoints are written and read back by the compressed-tensors library.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable

import torch
from safetensors.torch import load_file, save_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble p of a word holds the word's column AWQ_ORDER[p]
# a writer: (layer name, float weight [out, in]) → (its stored tensors by suffix, the float weight they stand for)
Writer = Callable[[str, torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]]


def quantized_copy(src: str, dst: str, writer: Writer, quantization_config: dict | None,
                   config_file: str = "config.json", layers: Callable[[str], bool] | None = None
                   ) -> dict[str, torch.Tensor]:
    """Copy the checkpoint `src` to `dst` with each layer weight `layers` picks (default: every
    projection inside model.layers) stored by `writer`, and `quantization_config` in
    `config_file` (config.json's `quantization_config`, or a file of its own). Returns the
    float weight each quantized layer's tensors stand for, by `<layer>.weight`."""
    layers = layers or (lambda name: name.startswith("model.layers.") and name.endswith("_proj.weight"))
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f != "model.safetensors":
            shutil.copy(os.path.join(src, f), dst)
    stored, meant = {}, {}
    for name, tensor in load_file(os.path.join(src, "model.safetensors")).items():
        if not layers(name):
            stored[name] = tensor
            continue
        layer = name.removesuffix(".weight")
        parts, meant[name] = writer(layer, tensor.float())
        stored.update({f"{layer}.{part}": t.contiguous() for part, t in parts.items()})
    save_file(stored, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    if quantization_config is not None:
        if config_file == "config.json":
            with open(os.path.join(dst, "config.json")) as f:
                cfg = json.load(f)
            cfg["quantization_config"] = quantization_config
        else:
            cfg = quantization_config
        with open(os.path.join(dst, config_file), "w") as f:
            json.dump(cfg, f)
    return meant


def float_copy(src: str, dst: str, weights: dict[str, torch.Tensor]) -> str:
    """`src` with `weights` replacing its tensors of those names: the float model a quantized copy means."""
    shutil.copytree(src, dst)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    tensors.update({name: w.to(tensors[name].dtype) for name, w in weights.items()})
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return dst


def fp8_block(block: tuple[int, int], inverse_name: bool = True) -> Writer:
    """e4m3 weights with one scale per `block` (rows, cols), as DeepSeek / Qwen FP8 checkpoints
    store them (`weight_scale_inv`, which multiplies)."""
    rows, cols = block

    def write(layer: str, w: torch.Tensor):
        n, k = w.shape
        grid = torch.zeros(-(-n // rows), -(-k // cols))
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                grid[i, j] = w[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols].abs().max() / 448
        full = grid.repeat_interleave(rows, 0)[:n].repeat_interleave(cols, 1)[:, :k]
        q = (w / full).to(torch.float8_e4m3fn)
        return {"weight": q, "weight_scale_inv" if inverse_name else "weight_scale": grid}, q.float() * full

    return write


def fp8_per_tensor(layer: str, w: torch.Tensor):
    """e4m3 weights with one scale (vLLM's and ModelOpt's per-tensor FP8), and a static input scale."""
    scale = w.abs().max() / 448
    q = (w / scale).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale": scale.reshape(()), "input_scale": torch.tensor(0.02)}, q.float() * scale


def _codes(w: torch.Tensor, bits: int, g_idx: torch.Tensor, min_zero: int = 0) -> tuple[torch.Tensor, ...]:
    """Asymmetric codes of w.T ([in, out]) per group: (codes [in, out], zeros [groups, out] at least
    `min_zero`, scales [groups, out]), each input row in group g_idx[row]."""
    wt = w.t()
    groups = int(g_idx.max()) + 1
    top = (1 << bits) - 1
    lo = torch.stack([wt[g_idx == g].min(0).values for g in range(groups)]).clamp(max=0)
    hi = torch.stack([wt[g_idx == g].max(0).values for g in range(groups)]).clamp(min=0)
    scales = ((hi - lo) / top).clamp(min=1e-8).half().float()
    zeros = torch.round(-lo / scales).clamp(min_zero, top)
    codes = torch.round(wt / scales[g_idx] + zeros[g_idx]).clamp(0, top)
    return codes.long(), zeros.long(), scales


def _pack(codes: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Codes packed low bits first into int32 words along `dim`, one code at a time; `order`: the
    position within its word each code's place takes (AWQ's interleave)."""
    per_word = 32 // bits
    values = codes.tolist() if dim == 1 else codes.t().tolist()
    words = []
    for row in values:
        packed = []
        for w in range(len(row) // per_word):
            word = 0
            for p in range(per_word):
                col = w * per_word + (order[p] if order else p)
                word |= (row[col] & ((1 << bits) - 1)) << (bits * p)
            packed.append(word - (1 << 32) if word >= 1 << 31 else word)
        words.append(packed)
    out = torch.tensor(words, dtype=torch.int32)
    return out if dim == 1 else out.t()


def gptq(bits: int, group: int, desc_act: bool = False, v1: bool = True) -> Writer:
    """GPTQ codes: qweight packed along the input dim, qzeros (zero - 1 in the original format) along
    the output dim, fp16 scales; with desc_act, input rows go to groups out of order (g_idx)."""

    def write(layer: str, w: torch.Tensor):
        k = w.shape[1]
        size = k if group == -1 else group
        g_idx = torch.arange(k) // size
        if desc_act:
            g_idx = g_idx[torch.randperm(k, generator=torch.Generator().manual_seed(k + len(layer)))]
        # the original format stores zero - 1 in `bits` bits, so it cannot hold a zero point of 0
        codes, zeros, scales = _codes(w, bits, g_idx, min_zero=int(v1))
        meant = ((codes - zeros[g_idx]).float() * scales[g_idx]).t()
        parts = {"qweight": _pack(codes, bits, 0), "qzeros": _pack(zeros - int(v1), bits, 1),
                 "scales": scales.half(), "g_idx": g_idx.int()}
        return parts, meant

    return write


def awq(group: int) -> Writer:
    """AWQ (GEMM) codes: qweight and qzeros packed along the output dim in AWQ's interleaved order."""

    def write(layer: str, w: torch.Tensor):
        g_idx = torch.arange(w.shape[1]) // group
        codes, zeros, scales = _codes(w, 4, g_idx)
        meant = ((codes - zeros[g_idx]).float() * scales[g_idx]).t()
        return {"qweight": _pack(codes, 4, 1, AWQ_ORDER), "qzeros": _pack(zeros, 4, 1, AWQ_ORDER),
                "scales": scales.half()}, meant

    return write


def compressed_tensors(fmt: str, weights: dict) -> tuple[Writer, dict]:
    """A compressed-tensors writer for `weights` (QuantizationArgs fields) stored in `fmt`, and its
    quantization_config; both the codes and the float weight they mean come from the library."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(**weights)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    compressor = BaseCompressor.load_from_registry(fmt)
    config = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, quantization_status="compressed",
                                ignore=["lm_head"]).model_dump(mode="json")

    def write(layer: str, w: torch.Tensor):
        n, k = w.shape
        if args.strategy == "group":
            view, shape = w.reshape(n, k // args.group_size, args.group_size), (n, k // args.group_size)
        elif args.strategy == "block":
            rows, cols = args.block_structure
            view = w.reshape(n // rows, rows, k // cols, cols).transpose(1, 2).reshape(n // rows, k // cols, -1)
            shape = (n // rows, k // cols)
        elif args.strategy == "channel":
            view, shape = w.reshape(n, 1, k), (n, 1)
        else:
            view, shape = w.reshape(1, 1, -1), (1,)
        scale, zero = calculate_qparams(view.amin(-1), view.amax(-1), args)
        state = {"weight": w, "weight_scale": scale.reshape(shape), "weight_zero_point": zero.reshape(shape)}
        parts = compressor.compress(state, scheme)
        meant = compressor.decompress(dict(parts), scheme)["weight"]
        return parts, meant.float()

    return write, config
