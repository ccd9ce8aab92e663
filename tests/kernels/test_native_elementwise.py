"""The native elementwise passes (kernels/cpu_elementwise.c, cpu_silu.c through kernels/native_layers.py)
against the torch ops they replace in the CPU forward (runtime/model/model.py): RMSNorm and RoPE
bit for bit (SmolLM2's greedy answers turn on near-ties a bf16 unit decides), SiLU-and-mul within
a bf16 unit or two; where they do not apply, None."""
from __future__ import annotations

import pytest
import torch

from radixflow.kernels import native, native_layers
from radixflow.runtime.model.model import rmsnorm_cpu, rotate_cpu, silu_mul_cpu

DTYPES = [torch.float32, torch.bfloat16]
# bf16: one unit in the last place of a rounded factor, two of the product
ULP = {torch.float32: dict(rtol=2e-6, atol=1e-6), torch.bfloat16: dict(rtol=2 / 128, atol=1e-3)}


@pytest.fixture(autouse=True)
def built(native_built):
    """The native kernels are built (or, without a compiler, every test here skipped)."""


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_one_pass_rmsnorm_finds_torchs_summation_order():
    """On x86 torch sums a row's lanes 8 (or 16) at a time; the kernels' copy of that order is
    found (else RMSNorm would take the four-pass path everywhere), and it is torch's bit for bit
    over row lengths from one vector to many thousands."""
    lanes = native_layers.sum_lanes()
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert lanes in (8, 16)
    if not lanes:
        pytest.skip("torch's summation order is not the one the kernels copy")
    gen = _gen(5)
    for dim in (lanes, lanes + 1, 63, 576, 960, 1536, 4096, 8191, 65536 + 40):
        h = torch.randn(9, dim, generator=gen) * torch.rand(9, 1, generator=gen) * 30
        got = torch.empty(9)
        native.library().mean_squares(h.data_ptr(), 9, dim, lanes, got.data_ptr())
        assert torch.equal(got, h.pow(2).mean(-1)), dim


@pytest.mark.parametrize("one_pass", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, dim, with_residual, strided", [(1, 64, False, False), (37, 576, True, False),
                                                               (5, 96, True, True), (0, 64, True, False)])
def test_rmsnorm_is_the_torch_path_bit_for_bit(monkeypatch, on_threads, one_pass, threads, dtype, rows, dim,
                                               with_residual, strided):
    """Both ways: one native pass (torch's summation order copied), and torch's mean of squares
    with the native scaling (where the order is not known: sum_lanes() 0)."""
    if one_pass and not native_layers.sum_lanes():
        pytest.skip("torch's summation order is not the one the kernels copy")
    if not one_pass:
        monkeypatch.setitem(native._loaded, "lanes", 0)
    x = torch.randn(rows, dim * (2 if strided else 1), generator=_gen()).to(dtype) * 3
    x = x[:, :dim] if strided else x  # a view of wider rows (q / k heads of a qkv row)
    residual = torch.randn(rows, dim, generator=_gen(1)) if with_residual else None
    weight = (torch.rand(dim, generator=_gen(2)) + 0.5).to(dtype)
    got = on_threads(threads, native_layers.rmsnorm, x, residual, weight, 1e-5)
    assert got is not None
    out, h = got
    ref_out, ref_h = rmsnorm_cpu(x, residual, weight, 1e-5)
    assert out.dtype == dtype and h.dtype == torch.float32
    assert torch.equal(h, ref_h) and torch.equal(out, ref_out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, heads, head_dim, strided", [(1, 1, 64, False), (19, 12, 64, True),
                                                            (7, 3, 128, False), (4, 2, 80, True)])
def test_rope_is_the_torch_path_bit_for_bit(monkeypatch, dtype, rows, heads, head_dim, strided):
    width = heads * head_dim * (3 if strided else 1)  # strided: q and k heads inside a qkv row
    x = torch.randn(rows, width, generator=_gen()).to(dtype)[:, :heads * head_dim].view(rows, heads, head_dim)
    angles = torch.rand(rows, 1, head_dim, generator=_gen(3)) * 6
    cos, sin = angles.cos(), angles.sin()
    sin[..., :head_dim // 2] *= -1
    out = native_layers.rope(x, cos, sin)
    assert out is not None and out.is_contiguous()
    monkeypatch.setenv(native.ENV_SWITCH, "0")  # rotate_cpu's torch ops
    assert torch.equal(out, rotate_cpu(x, cos, sin))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, inter", [(1, 64), (33, 1536), (0, 16)])
def test_silu_mul_matches_torch(on_threads, threads, dtype, rows, inter):
    gate_up = (torch.randn(rows, 2 * inter, generator=_gen()) * 4).to(dtype)
    out = on_threads(threads, native_layers.silu_mul, gate_up)
    assert out is not None and out.shape == (rows, inter) and out.dtype == dtype
    torch.testing.assert_close(out, silu_mul_cpu(gate_up), **ULP[dtype])


def test_where_they_do_not_apply_they_return_none(monkeypatch):
    x = torch.randn(4, 64)
    w = torch.ones(64)
    assert native_layers.rmsnorm(x.half(), None, w.half(), 1e-5) is None  # fp16: the torch path
    assert native_layers.rmsnorm(x, None, w.bfloat16(), 1e-5) is None  # weight of another dtype
    assert native_layers.rmsnorm(x.t().contiguous().t(), None, w, 1e-5) is None  # column-strided rows
    assert native_layers.rmsnorm(x, torch.randn(4, 64).bfloat16(), w, 1e-5) is None  # a bf16 residual
    cos = torch.ones(4, 1, 64)
    assert native_layers.rope(x.view(4, 1, 64).half(), cos, cos) is None
    assert native_layers.rope(x.view(4, 1, 64), cos.bfloat16(), cos) is None
    assert native_layers.silu_mul(x[:, :63]) is None  # not contiguous
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    assert native_layers.rmsnorm(x, None, w, 1e-5) is None and native_layers.silu_mul(x) is None
