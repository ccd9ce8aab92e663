"""Quantized linear weights turned back into float [out, in] matrices at load, and the checkpoint
reader that serves them under their plain `.weight` names (runtime/model/weights.py)."""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from radixflow.runtime.model.quant_config import Quantization, WeightScheme

log = logging.getLogger(__name__)

# a quantized layer's tensors beside (or instead of) its `weight`, by what marks the layer as quantized
_MARKERS = ("weight_scale", "weight_scale_inv", "weight_packed", "qweight")
_PARTS = {"weight", "weight_scale", "weight_scale_inv", "weight_zero_point", "weight_packed", "weight_shape",
          "weight_g_idx", "input_scale", "input_zero_point", "input_scale_ub", "qweight", "qzeros", "scales",
          "g_idx"}
# AWQ packs output column 8w + AWQ_ORDER[p] into nibble p of word w
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# MXFP4's 4-bit codes (E2M1: sign, 2 exponent bits, 1 mantissa bit) and the values they stand for
FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
MXFP4_BLOCK = 32  # values per shared scale
MXFP4_CHUNK_ROWS = 4096  # output rows dequantized at a time
# where gpt-oss stores MXFP4: its experts' stacked projections (x @ W order: runtime/model/weights.py)
MXFP4_TENSORS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
FLOAT8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz") if hasattr(torch, n))


def unpack_int32(words: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Unsigned `bits`-bit codes packed low bits first into int32 `words` along `dim`: code i of a
    row sits in word i // (32 / bits) at bit bits * (i % (32 / bits)). Returns int32 codes, the
    packed dim 32 / bits times as long."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    words = words.to(torch.int32).movedim(dim, -1)
    codes = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [..., num_words, per_word]
    return codes.flatten(-2).movedim(-1, dim).contiguous()


def expand_groups(values: torch.Tensor, num_rows: int, num_cols: int, scheme: WeightScheme,
                  g_idx: torch.Tensor | None, what: str) -> torch.Tensor:
    """A per-tensor, per-row, per-group (scheme.group_size input columns, or each column's group
    in `g_idx`) or per-block `values` (scales or zero points) broadcast to the [num_rows,
    num_cols] weight; ValueError naming `what` when its shape is none of these."""
    values = values.float()
    if values.numel() == 1:
        return values.reshape(1, 1)
    if scheme.block is not None:
        rows, cols = scheme.block
        grid = (-(-num_rows // rows), -(-num_cols // cols))
        if tuple(values.shape) != grid:
            raise ValueError(f"{what} has shape {tuple(values.shape)}; a [{num_rows}, {num_cols}] weight in "
                             f"{rows}x{cols} blocks needs {grid}")
        return values.repeat_interleave(rows, 0)[:num_rows].repeat_interleave(cols, 1)[:, :num_cols]
    if values.dim() == 1 and values.shape[0] == num_rows:
        return values.unsqueeze(1)
    grouped = g_idx is not None or scheme.group_size is not None
    if values.dim() != 2 or values.shape[0] != num_rows or (values.shape[1] > 1 and not grouped):
        raise ValueError(f"{what} has shape {tuple(values.shape)}, which fits no scaling of a "
                         f"[{num_rows}, {num_cols}] weight (per tensor, row, group or block)")
    if values.shape[1] == 1:
        return values
    if g_idx is not None:
        return values[:, _checked_g_idx(g_idx, num_cols, values.shape[1], what)]
    size = scheme.group_size
    assert size is not None
    _check_groups(values.shape[1], num_cols, size, what)
    return values.repeat_interleave(size, 1)[:, :num_cols]


def _check_groups(num_groups: int, num_cols: int, size: int, what: str) -> None:
    need = -(-num_cols // size)
    if num_groups != need:
        raise ValueError(f"{what} has {num_groups} groups; {num_cols} input columns in groups of {size} need {need}")


def _checked_g_idx(g_idx: torch.Tensor, num_cols: int, num_groups: int, what: str) -> torch.Tensor:
    g_idx = g_idx.long().flatten()
    if g_idx.numel() != num_cols or (num_cols and (int(g_idx.min()) < 0 or int(g_idx.max()) >= num_groups)):
        raise ValueError(f"the group index beside {what} does not give each of {num_cols} input columns one "
                         f"of {num_groups} groups")
    return g_idx


def dequantize_scaled(t: dict[str, torch.Tensor], scheme: WeightScheme, name: str) -> torch.Tensor:
    """An fp8 or int8 `weight` × its scale (`weight_scale`, or DeepSeek-style `weight_scale_inv`,
    which multiplies too), less its zero point."""
    weight = t["weight"]
    if weight.dtype not in FLOAT8 + (torch.int8,):
        raise ValueError(f"{name}.weight is {str(weight.dtype).removeprefix('torch.')} beside a weight scale; a "
                         "quantized checkpoint stores fp8 or int8 weights there")
    if weight.dim() != 2:
        raise ValueError(f"{name}.weight has {weight.dim()} dims; quantized weights are dequantized as 2-D matrices")
    rows, cols = weight.shape
    scale = t["weight_scale_inv"] if "weight_scale_inv" in t else t["weight_scale"]
    g_idx = t.get("weight_g_idx")
    values = weight.float()
    if "weight_zero_point" in t:
        values = values - expand_groups(t["weight_zero_point"], rows, cols, scheme, g_idx, f"{name}.weight_zero_point")
    return values * expand_groups(scale, rows, cols, scheme, g_idx, f"{name}.weight_scale")


def dequantize_packed(t: dict[str, torch.Tensor], scheme: WeightScheme, name: str) -> torch.Tensor:
    """compressed-tensors' pack-quantized weight: signed codes stored offset by 2^(bits-1), packed
    along the input dim (`weight_packed` [out, ceil(in * bits / 32)]); its zero points, where
    stored, packed the same way along the output dim for group and channel scales, else stored
    as they are."""
    if t["weight_shape"].is_floating_point():
        raise ValueError(f"{name}.weight_shape is {_dtype(t['weight_shape'])}; a shape is integers")
    shape = t["weight_shape"].flatten().tolist()
    if len(shape) != 2:
        raise ValueError(f"{name}.weight_shape {shape} is not a 2-D shape")
    rows, cols = shape
    words = _int32(t, "weight_packed", name)
    if words.dim() != 2 or words.shape[0] != rows or words.shape[1] != -(-cols * scheme.bits // 32):
        raise ValueError(f"{name}.weight_packed {tuple(words.shape)} does not hold a {shape} weight of "
                         f"{scheme.bits}-bit codes")
    offset = 1 << (scheme.bits - 1)
    values = (unpack_int32(words, scheme.bits, 1)[:, :cols] - offset).float()
    g_idx = t.get("weight_g_idx")
    if "weight_zero_point" in t:
        zeros = t["weight_zero_point"]
        if scheme.packed_zeros:
            zeros = unpack_int32(_int32(t, "weight_zero_point", name), scheme.bits, 0)[:rows] - offset
        values = values - expand_groups(zeros, rows, cols, scheme, g_idx, f"{name}.weight_zero_point")
    return values * expand_groups(t["weight_scale"], rows, cols, scheme, g_idx, f"{name}.weight_scale")


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _int32(t: dict[str, torch.Tensor], part: str, name: str) -> torch.Tensor:
    if t[part].dtype != torch.int32:
        raise ValueError(f"{name}.{part} is {_dtype(t[part])}; packed codes are int32")
    return t[part]


def _scales(t: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    scales = t["scales"]
    if scales.dim() != 2:
        raise ValueError(f"{name}.scales has shape {tuple(scales.shape)}; GPTQ and AWQ scales are [groups, out]")
    return scales.float()


def dequantize_gptq(t: dict[str, torch.Tensor], scheme: WeightScheme, name: str) -> torch.Tensor:
    """GPTQ: `qweight` [in * bits / 32, out] packed along the input dim, `qzeros` [groups, out * bits
    / 32] along the output dim (the original format stores zero - 1), `scales` [groups, out],
    `g_idx` [in] (each input column's group; in // group_size when absent)."""
    codes = unpack_int32(_int32(t, "qweight", name), scheme.bits, 0)       # [in, out]
    scales = _scales(t, name)                                              # [groups, out]
    zeros = unpack_int32(_int32(t, "qzeros", name), scheme.bits, 1)[:, :scales.shape[1]] + int(scheme.gptq_v1_zeros)
    return _grouped(codes, zeros, scales, scheme, t.get("g_idx"), name)


def dequantize_awq(t: dict[str, torch.Tensor], scheme: WeightScheme, name: str) -> torch.Tensor:
    """AWQ (GEMM): `qweight` [in, out / 8] and `qzeros` [groups, out / 8], packed along the output dim
    with AWQ_ORDER interleaving each word's eight columns, `scales` [groups, out]."""
    order = torch.tensor(AWQ_ORDER).argsort()  # column j of a word's eight sits at nibble order[j]

    def columns(part: str) -> torch.Tensor:
        codes = unpack_int32(_int32(t, part, name), scheme.bits, 1)
        return codes.view(codes.shape[0], -1, 8)[:, :, order].flatten(1)

    return _grouped(columns("qweight"), columns("qzeros"), _scales(t, name), scheme, None, name)


def _grouped(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, scheme: WeightScheme,
             g_idx: torch.Tensor | None, name: str) -> torch.Tensor:
    """(codes - zero) * scale by each input row's group, transposed to [out, in]."""
    num_in, num_out = codes.shape
    if scales.shape[1] != num_out or zeros.shape != scales.shape:
        raise ValueError(f"{name}: qweight ({num_in} x {num_out} codes), qzeros {tuple(zeros.shape)} and scales "
                         f"{tuple(scales.shape)} do not fit together")
    if g_idx is None:
        size = scheme.group_size or num_in
        _check_groups(scales.shape[0], num_in, size, f"{name}.scales")
        g_idx = torch.arange(num_in) // size
    elif g_idx.numel() != num_in:
        raise ValueError(f"{name}: qweight ({num_in} x {num_out} codes), g_idx ({g_idx.numel()} columns) do not "
                         "fit together")
    g_idx = _checked_g_idx(g_idx, num_in, scales.shape[0], f"{name}.scales")
    return ((codes - zeros[g_idx]).float() * scales[g_idx]).t().contiguous()


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, name: str) -> torch.Tensor:
    """gpt-oss's MXFP4 tensor `name` ([..., out, in] as `<name>_blocks` [..., out, in / 32, 16]
    bytes, two E2M1 codes each, low nibble first, and `<name>_scales` [..., out, in / 32], each an
    E8M0 power of two 2^(s - 127) for its 32 values) as float32, in the layout its float checkpoint
    stores: [..., in, out] (gpt-oss keeps x @ W; runtime/model/weights.py turns it back)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 tensor {name!r} must be stored as uint8 blocks and scales, got "
                         f"{_dtype(blocks)} and {_dtype(scales)}")
    if blocks.dim() < 3 or blocks.shape[-1] != MXFP4_BLOCK // 2 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(f"MXFP4 tensor {name!r}: blocks {tuple(blocks.shape)} must be scales' shape "
                         f"{tuple(scales.shape)} plus {MXFP4_BLOCK // 2} bytes")
    table = torch.tensor(FP4_E2M1, dtype=torch.float32)
    *lead, out, groups, half = blocks.shape
    values = torch.empty((*lead, out, groups * 2 * half), dtype=torch.float32)
    flat_blocks, flat_values = blocks.reshape(-1, groups, half), values.view(-1, groups, 2 * half)
    flat_scales = scales.reshape(-1, groups, 1).to(torch.int32) - 127
    # NOTE: rows in chunks: the codes' int64 indices take 16 bytes per value, 32x the blocks' size
    for a in range(0, flat_blocks.shape[0], MXFP4_CHUNK_ROWS):
        rows = flat_blocks[a:a + MXFP4_CHUNK_ROWS]
        codes = torch.stack([rows & 0x0F, rows >> 4], dim=-1).long()  # [rows, G, 16, 2]: low nibble first
        # ldexp of each value (not value * 2^e): a zero code stays 0 at the top scale, as transformers reads it
        torch.ldexp(table[codes].flatten(-2), flat_scales[a:a + MXFP4_CHUNK_ROWS], out=flat_values[a:a + MXFP4_CHUNK_ROWS])
    return values.transpose(-1, -2)


_DEQUANTIZERS: dict[str, Callable[[dict[str, torch.Tensor], WeightScheme, str], torch.Tensor]] = {
    "scaled": dequantize_scaled, "packed": dequantize_packed, "gptq": dequantize_gptq, "awq": dequantize_awq}
# the tensors each kind needs
_REQUIRED = {"scaled": ("weight",), "packed": ("weight_packed", "weight_scale", "weight_shape"),
             "gptq": ("qweight", "qzeros", "scales"), "awq": ("qweight", "qzeros", "scales")}


class DequantizingReader:
    """A checkpoint reader (names() / get() / raw()) over a quantized checkpoint: each quantized
    layer's tensors are hidden and its `<layer>.weight` is served dequantized to float32; every
    other tensor passes through. The scales of activations (`input_scale`) are read by nothing:
    activations are not quantized here."""

    def __init__(self, reader, quantization: Quantization) -> None:  # reader: weights.CheckpointReader
        self.reader, self.quantization = reader, quantization
        self.bare = reader.bare
        stored = reader.names()
        self.layers: dict[str, list[str]] = {}  # quantized layer → its stored parts' names
        for name in stored:
            layer, _, part = name.rpartition(".")
            if part in _MARKERS:
                self.layers[layer] = [f"{layer}.{p}" for p in _PARTS if f"{layer}.{p}" in stored]
        # gpt-oss's MXFP4 tensors: `<name>_blocks` and `<name>_scales` stand for float `<name>`
        self.mxfp4 = {name.removesuffix("_blocks") for name in stored if name.endswith("_blocks")
                      and quantization.method == "mxfp4"}
        hidden = {n for parts in self.layers.values() for n in parts} | {
            f"{name}_{part}" for name in self.mxfp4 for part in ("blocks", "scales")}
        self._names = (stored - hidden) | {f"{layer}.weight" for layer in self.layers} | self.mxfp4
        log.info("%s checkpoint: %d quantized layers dequantized at load (weights held in the engine dtype)",
                 quantization.method, len(self.layers))

    def names(self) -> set[str]:
        return set(self._names)

    def get(self, name: str) -> torch.Tensor:
        if name in self.mxfp4:
            if not name.endswith(MXFP4_TENSORS):
                raise ValueError(f"tensor {name!r} is stored as MXFP4 (`_blocks` / `_scales`): MXFP4 is read for "
                                 "gpt-oss's experts only (mlp.experts.gate_up_proj / down_proj)")
            if f"{name}_scales" not in self.reader.names():
                raise ValueError(f"MXFP4 tensor {name!r} has blocks but no {name}_scales")
            return dequantize_mxfp4(self.reader.raw(f"{name}_blocks"), self.reader.raw(f"{name}_scales"), name)
        layer = name.removesuffix(".weight")
        if name.endswith(".weight") and layer in self.layers:
            return self._dequantized(layer)
        return self.reader.get(name)

    def _dequantized(self, layer: str) -> torch.Tensor:
        # the config's targets name layers as the checkpoint stores them (a multimodal or bare
        # checkpoint's names differ from the ones the model reads)
        stored = self.reader.stored_name(self.layers[layer][0]).rpartition(".")[0]
        scheme = self.quantization.scheme_for(stored)
        parts = {n.rpartition(".")[2]: self.reader.raw(n) for n in self.layers[layer]}
        missing = [p for p in _REQUIRED[scheme.kind] if p not in parts]
        if scheme.kind == "scaled" and "weight_scale" not in parts and "weight_scale_inv" not in parts:
            missing.append("weight_scale")
        if missing:
            raise ValueError(f"quantized layer {layer!r} ({self.quantization.method}) lacks "
                             f"{', '.join(layer + '.' + p for p in missing)}")
        return _DEQUANTIZERS[scheme.kind](parts, scheme, layer)
