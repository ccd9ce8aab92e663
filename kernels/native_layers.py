"""The native kernels of a layer's dense work (kernels/native.py builds and loads the library):
RMSNorm, RoPE and SiLU-and-mul in one pass each (cpu_elementwise.c, cpu_silu.c), bf16 linear
layers on a packed weight layout (cpu_linear.c), and the descriptions of a step's attention that
the fused forward through every layer (cpu_layers.c, runtime/model/fused_layers.py) reads.
Each wrapper returns None (or says False) where its kernel does not apply; callers keep their
torch twins (runtime/model/model.py).
"""
from __future__ import annotations

import ctypes
import logging

import torch

from . import native
from .native import ELEMENTWISE_SUFFIX

log = logging.getLogger(__name__)


# forward_layers_bf16's description of a step's attention (kernels/cpu_layers.c `step`)
FUSED_DECODE, FUSED_EXTEND = 0, 1


def fused_decode_step(slots: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(the step description, the tensors it points into) for a decode step whose request b reads
    slots[offsets[b]:offsets[b + 1]] (int64, contiguous): keep the tuple alive over the call."""
    step = torch.tensor([FUSED_DECODE, offsets.shape[0] - 1, slots.data_ptr(), offsets.data_ptr()], dtype=torch.int64)
    return step, slots, offsets


def fused_extend_step(req_to_token: torch.Tensor, index: tuple[torch.Tensor, ...], num_tokens: int,
                      num_slots: int) -> tuple[torch.Tensor, ...]:
    """The same for an extend step; index = (rows, prefix_lens, extend_lens, q starts), as for
    extend_attention_native (the kernel checks the layout before it reads)."""
    table, index_t, bounds = native._extend_layout(req_to_token, index, num_tokens, num_slots)
    step = torch.tensor([FUSED_EXTEND, index_t[0].shape[0], table.data_ptr(), table.stride(0),
                         int(table.dtype == torch.int64), *(t.data_ptr() for t in index_t), bounds.data_ptr()],
                        dtype=torch.int64)
    return step, table, *index_t, bounds


def _elementwise(x: torch.Tensor, name: str) -> ctypes._CFuncPtr | None:
    """The `name` pass for x's dtype, or None (not a CPU fp32 / bf16 tensor, or no library)."""
    if x.device.type != "cpu" or x.dtype not in ELEMENTWISE_SUFFIX:
        return None
    lib = native.library()
    return None if lib is None else getattr(lib, f"{name}_{ELEMENTWISE_SUFFIX[x.dtype]}")


def sum_lanes() -> int:
    """How many lanes torch's CPU sum of a contiguous fp32 row adds side by side (8 or 16, by its
    build and this CPU), found once by comparing the kernels' copy of that order
    (cpu_elementwise.c `torch_sum_squares`) with `h.pow(2).mean(-1)` bit for bit on random rows;
    0 where neither matches (or no library): RMSNorm then keeps torch's mean of squares."""
    if "lanes" not in native._loaded:
        lib = native.library()
        native._loaded["lanes"] = 0 if lib is None else _find_sum_lanes(lib)
    return native._loaded["lanes"]


def _find_sum_lanes(lib: ctypes.CDLL) -> int:
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randn(64, dim, generator=gen) * torch.rand(64, 1, generator=gen) * 8
            for dim in (16, 17, 64, 100, 576, 2048, 4100)]
    for lanes in (8, 16):
        for h in rows:
            got = torch.empty(h.shape[0])
            lib.mean_squares(h.data_ptr(), h.shape[0], h.shape[1], lanes, got.data_ptr())
            if not torch.equal(got, h.pow(2).mean(-1)):
                break
        else:
            return lanes
    log.info("torch's row sums run in an order the native RMSNorm does not copy: it keeps torch's mean")
    return 0


def rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
            eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(norm(h), h) for x [T, dim] (rows may be strided), h = x + residual in fp32 (residual fp32
    [T, dim] or None), norm(h) = weight * round(h * rsqrt(mean(h^2) + eps)) in x's dtype: the
    model's RMSNorm (runtime/model/model.py rmsnorm_cpu) bit for bit, in one native pass with
    torch's summation order (sum_lanes), else four (the add and the mean of squares in torch, the
    scaling native). None where the kernel does not apply."""
    fn = _elementwise(x, "rmsnorm_scale")
    if (fn is None or x.dim() != 2 or x.stride(1) != 1 or weight.dtype != x.dtype or not weight.is_contiguous()
            or weight.shape != x.shape[1:]
            or residual is not None and (residual.dtype != torch.float32 or residual.shape != x.shape)):
        return None
    rows, dim = x.shape
    lanes = sum_lanes()
    if lanes and dim >= lanes and (residual is None or residual.is_contiguous()):
        out, h = torch.empty(rows, dim, dtype=x.dtype), torch.empty(rows, dim, dtype=torch.float32)
        getattr(native.library(), f"rmsnorm_{ELEMENTWISE_SUFFIX[x.dtype]}")(
            x.data_ptr(), x.stride(0), None if residual is None else residual.data_ptr(), weight.data_ptr(), eps,
            rows, dim, lanes, out.data_ptr(), h.data_ptr(), torch.get_num_threads())
        return out, h
    h = x.float() if residual is None else residual + x  # the same sums as x.float() + residual
    h = h if h.stride(1) == 1 else h.contiguous()
    var = h.pow(2).mean(-1)  # [T] fp32: torch's summation order, as rmsnorm_cpu
    out = torch.empty(rows, dim, dtype=x.dtype)
    fn(h.data_ptr(), h.stride(0), var.data_ptr(), weight.data_ptr(), eps, rows, dim, out.data_ptr(),
       torch.get_num_threads())
    return out, h


def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor | None:
    """x [T, heads, D] (rows may be strided, heads dense) rotated: x * cos + swap_halves(x) *
    sin_signed with cos, sin_signed fp32 [T, 1, D]; a new contiguous tensor of x's dtype, bit for
    bit the torch path's (runtime/model/model.py rotate_cpu). None where the kernel does not apply."""
    fn = _elementwise(x, "rope")
    if (fn is None or x.dim() != 3 or x.stride(2) != 1 or x.stride(1) != x.shape[2] or x.shape[2] % 2
            or any(t.dtype != torch.float32 or not t.is_contiguous() or t.shape != (x.shape[0], 1, x.shape[2])
                   for t in (cos, sin_signed))):
        return None
    rows, heads, head_dim = x.shape
    out = torch.empty(rows, heads, head_dim, dtype=x.dtype)
    fn(x.data_ptr(), x.stride(0), cos.data_ptr(), sin_signed.data_ptr(), rows, heads, head_dim, out.data_ptr(),
       torch.get_num_threads())
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """silu(gate) * up for gate_up [T, 2 * inter] = | gate | up | (contiguous), silu rounded to
    the dtype before the product, as the torch path; [T, inter]. None where it does not apply."""
    fn = _elementwise(gate_up, "silu_mul")
    if fn is None or gate_up.dim() != 2 or not gate_up.is_contiguous() or gate_up.shape[1] % 2:
        return None
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype)
    fn(gate_up.data_ptr(), rows, inter, out.data_ptr(), torch.get_num_threads())
    return out


def linear_supports(weight: torch.Tensor) -> bool:
    """Whether linear_bf16 takes this [out, in] weight: a bf16 CPU tensor, out a multiple of 16,
    in even, and a build with AVX512-BF16 (cpu_linear.c)."""
    out_features, in_features = weight.shape
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or out_features % 16 or in_features % 2:
        return False
    lib = native.library()
    return lib is not None and bool(lib.linear_lanes())


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] in linear_bf16's layout: [N / 16, K / 2, 16, 2], each lane a pair of one
    output column's entries (cpu_linear.c)."""
    n, k = weight.shape
    return weight.detach().reshape(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def unpack_linear_weight(packed: torch.Tensor) -> torch.Tensor:
    """The [N, K] weight back from pack_linear_weight's layout."""
    blocks, pairs = packed.shape[:2]
    return packed.permute(0, 2, 1, 3).reshape(blocks * 16, pairs * 2)


def linear_bf16(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] bf16 @ W.T (+ bias, fp32 [N]) with W packed by pack_linear_weight, as bf16
    [..., N]: exact products, fp32 sums, one rounding. Only where linear_supports(W)."""
    lib = native.library()
    assert lib is not None and x.dtype == torch.bfloat16
    n = packed.shape[0] * 16
    k = x.shape[-1]
    assert k == packed.shape[1] * 2, (k, tuple(packed.shape))
    rows = x.reshape(-1, k).contiguous()
    y = torch.empty(rows.shape[0], n, dtype=torch.bfloat16)
    if rows.shape[0]:
        lib.linear_bf16(packed.data_ptr(), rows.data_ptr(), rows.shape[0], k, n,
                        None if bias is None else bias.data_ptr(), y.data_ptr(), torch.get_num_threads())
    return y.view(*x.shape[:-1], n)
