"""bf16 linear layers on the native kernel (kernels/cpu_linear.c through kernels/native_layers.py):
exact products, fp32 sums in a fixed order per row, one rounding; taken where it applies, and
oneDNN's layout kept where it does not."""
from __future__ import annotations

import subprocess

import pytest
import torch

from radixflow.kernels import native, native_layers
from radixflow.runtime.model.packed_linear import PackedLinear


@pytest.fixture
def lanes(native_built):
    """A build with the kernel (the compiler targets AVX512-BF16), else the test skipped."""
    macros = subprocess.run([native._compiler(), "-march=native", "-dM", "-E", "-"], input="", capture_output=True,
                            text=True, timeout=60).stdout
    if "__AVX512BF16__" not in macros:
        pytest.skip("the C compiler does not target AVX512-BF16 here")
    assert native_layers.linear_supports(torch.zeros(16, 2, dtype=torch.bfloat16))


def _ulps_off(y: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|y - ref| in units of the bf16 spacing at ref."""
    spacing = torch.finfo(torch.bfloat16).eps * ref.abs().clamp_min(1e-30).log2().floor().exp2()
    return (y.double() - ref).abs() / spacing


# (rows, in, out, bias): one row (a decode step), 2-8 rows (one register tile), past 8 (tiles of
# 8 rows and a rest), column counts not a multiple of 64 (tiles of 1-3 blocks of 16)
CASES = [(1, 96, 208, False), (3, 576, 960, True), (8, 64, 48, False), (13, 130, 1504, True), (300, 64, 80, False)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, k, n, bias", CASES)
def test_matches_fp64_rounded_once(lanes, on_threads, threads, rows, k, n, bias):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, generator=gen).to(torch.bfloat16) if bias else None
    y = on_threads(threads, native_layers.linear_bf16, x, native_layers.pack_linear_weight(w), None if b is None else b.float())
    ref = x.double() @ w.double().T + (0 if b is None else b.double())
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    off = _ulps_off(y, ref)
    assert off.max() <= 1.0  # the fp32 sum's own error can move a rounding by one place, no more
    assert (y == ref.to(torch.bfloat16)).float().mean() > 0.99


def test_a_row_is_the_same_whatever_the_batch(lanes):
    """Each row's sum runs in one order whatever rows share the call (decode, prefill, jump-forward)."""
    gen = torch.Generator().manual_seed(1)
    w = native_layers.pack_linear_weight(torch.randn(96, 576, generator=gen).to(torch.bfloat16))
    x = torch.randn(37, 576, generator=gen).to(torch.bfloat16)
    whole = native_layers.linear_bf16(x, w, None)
    for i in (0, 5, 36):
        assert torch.equal(native_layers.linear_bf16(x[i:i + 1], w, None), whole[i:i + 1])
    assert torch.equal(native_layers.linear_bf16(x[3:12], w, None), whole[3:12])


def test_packing_round_trips_and_what_it_takes(lanes):
    w = torch.randn(48, 10).to(torch.bfloat16)
    assert torch.equal(native_layers.unpack_linear_weight(native_layers.pack_linear_weight(w)), w)
    assert not native_layers.linear_supports(torch.zeros(40, 8, dtype=torch.bfloat16))  # out not a multiple of 16
    assert not native_layers.linear_supports(torch.zeros(16, 7, dtype=torch.bfloat16))  # in odd
    assert not native_layers.linear_supports(torch.zeros(16, 8))  # fp32


def test_packed_linear_takes_it_and_reads_strided_inputs(lanes):
    """A fused projection's slice (a strided view) and 3-d inputs; an fp32 input (not a bf16
    model's) gets the same products through torch."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 64, bias=True).to(torch.bfloat16)
    packed = PackedLinear.of(linear)
    assert packed.lanes is not None and packed.packed is None
    x = torch.randn(8, 130).to(torch.bfloat16)[:, 17:113]
    ref = x.double() @ linear.weight.double().T + linear.bias.double()
    assert _ulps_off(packed(x), ref).max() <= 1.0
    x3 = torch.randn(2, 5, 96).to(torch.bfloat16)
    assert torch.equal(packed(x3), packed(x3.reshape(10, 96)).view(2, 5, 64))
    xf = torch.randn(4, 96)
    torch.testing.assert_close(packed(xf), torch.nn.functional.linear(xf, linear.weight.float(), linear.bias.float()))


def test_without_avx512_bf16_projections_keep_onednn(build_without):
    build_without("-mno-avx512bf16")
    assert native.library() is not None
    w = torch.randn(32, 16).to(torch.bfloat16)
    assert not native_layers.linear_supports(w)
    if torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        packed = PackedLinear(w)
        assert packed.lanes is None and packed.packed is not None
        x = torch.randn(3, 16).to(torch.bfloat16)
        assert torch.equal(packed(x), torch.nn.functional.linear(x, w))


def test_switched_off_after_load_the_projections_go_through_torch(lanes, monkeypatch):
    """RADIXFLOW_NATIVE_KERNELS=0 is read on every call: a layer packed while the kernels were on
    then runs torch's linear on its weight (cpu_prefill.py compares the two settings on one engine)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 64, bias=True).to(torch.bfloat16)
    packed = PackedLinear.of(linear)
    assert packed.lanes is not None
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    x = torch.randn(3, 96).to(torch.bfloat16)
    assert torch.equal(packed(x), torch.nn.functional.linear(x, linear.weight, linear.bias))
