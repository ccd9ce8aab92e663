"""rmsnorm / rope / silu_and_mul (Triton, the interpreter on CPU) against their torch references."""
from __future__ import annotations

import math

import pytest
import torch

from radixflow.kernels.activation import gelu_tanh_and_mul, gelu_tanh_and_mul_ref, silu_and_mul, silu_and_mul_ref
from radixflow.kernels.rmsnorm import rmsnorm, rmsnorm_ref
from radixflow.kernels.rope import rope, rope_cos_sin, rope_inv_freq, rope_ref

# NOTE: fp16/fp32 only: the interpreter's bf16 support is broken; bf16 runs under `pytest -m gpu`.
DTYPES = [torch.float16, torch.float32]
# fp16 results may round one ulp apart (the kernel's fp32 sums run in another order)
TOL = {torch.float16: dict(rtol=2e-3, atol=2e-3), torch.float32: dict(rtol=1e-5, atol=1e-5)}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def _randn(*shape, dtype, device, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, hidden", [(1, 64), (7, 80), (3, 576), (13, 1000)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_rmsnorm_matches_ref(device, dtype, num_tokens, hidden, with_residual):
    x = _randn(num_tokens, hidden, dtype=dtype, device=device)
    residual = _randn(num_tokens, hidden, dtype=dtype, device=device, seed=1) if with_residual else None
    weight = _randn(hidden, dtype=dtype, device=device, seed=2)
    out, h = rmsnorm(x, residual, weight, 1e-6)
    want_out, want_h = rmsnorm_ref(x, residual, weight, 1e-6)
    torch.testing.assert_close(h, want_h, rtol=0, atol=0)  # one add either way
    torch.testing.assert_close(out, want_out, **TOL[dtype])
    rms = want_h.float().pow(2).mean(-1, keepdim=True).sqrt()
    torch.testing.assert_close(want_out.float(), (want_h.float() / rms * weight.float()), rtol=5e-3, atol=5e-3)


def test_rmsnorm_strided_rows_and_errors(device):
    x = _randn(5, 2 * 48, dtype=torch.float32, device=device)[:, :48]  # row stride 96
    weight = torch.ones(48, device=device)
    torch.testing.assert_close(rmsnorm(x, None, weight, 1e-5)[0], rmsnorm_ref(x, None, weight, 1e-5)[0])
    with pytest.raises(ValueError, match="weight"):
        rmsnorm(x, None, torch.ones(47, device=device), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        rmsnorm(x, x.half(), weight, 1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, d", [(1, 8), (5, 40), (9, 1536), (2, 1025)])
def test_silu_and_mul_matches_ref(device, dtype, num_tokens, d):
    x = _randn(num_tokens, 2 * d, dtype=dtype, device=device) * 4
    out = silu_and_mul(x)
    assert out.shape == (num_tokens, d)
    torch.testing.assert_close(out, silu_and_mul_ref(x), **TOL[dtype])
    g, u = x.float()[:, :d], x.float()[:, d:]
    torch.testing.assert_close(out.float(), g * torch.sigmoid(g) * u, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, d", [(1, 8), (5, 40), (2, 1025)])
def test_gelu_tanh_and_mul_matches_ref(device, dtype, num_tokens, d):
    """Gemma 3's MLP: GELU's tanh form, large |gate| included (exp overflows to inf there)."""
    x = _randn(num_tokens, 2 * d, dtype=dtype, device=device) * 4
    x[0, 0], x[0, 1] = 60.0, -60.0
    out = gelu_tanh_and_mul(x)
    assert out.shape == (num_tokens, d)
    torch.testing.assert_close(out, gelu_tanh_and_mul_ref(x), **TOL[dtype])
    g, u = x.float()[:, :d], x.float()[:, d:]
    exact = 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3))) * u
    torch.testing.assert_close(out.float(), exact, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, num_heads, num_kv_heads, head_dim, scaling", [
    (1, 2, 2, 16, None), (7, 9, 3, 64, None), (5, 8, 1, 80, LLAMA3), (3, 4, 4, 128, {"type": "linear", "factor": 2.0}),
])
def test_rope_matches_ref_in_place_on_qkv_views(device, dtype, num_tokens, num_heads, num_kv_heads, head_dim, scaling):
    inv_freq = rope_inv_freq(head_dim, 10000.0, scaling)
    cos, sin = rope_cos_sin(inv_freq, 300, device)
    positions = torch.randint(0, 300, (num_tokens,), generator=torch.Generator().manual_seed(3)).to(device)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = _randn(num_tokens, q_size + 2 * kv_size, dtype=dtype, device=device)
    want = qkv.clone()

    def views(t):
        return (t[:, :q_size].view(num_tokens, num_heads, head_dim),
                t[:, q_size:q_size + kv_size].view(num_tokens, num_kv_heads, head_dim))

    rope(*views(qkv), positions, cos, sin)
    rope_ref(*views(want), positions, cos, sin)
    torch.testing.assert_close(qkv, want, **TOL[dtype])
    assert torch.equal(qkv[:, q_size + kv_size:], want[:, q_size + kv_size:])  # v untouched


def test_rope_rotates_pairs_by_position_angle():
    # head_dim 2: one pair, one frequency (1.0): a plain 2-D rotation by `position` radians
    cos, sin = rope_cos_sin(rope_inv_freq(2, 10000.0), 10, torch.device("cpu"))
    q = torch.tensor([[[1.0, 0.0]], [[1.0, 0.0]]])
    k = torch.tensor([[[0.0, 1.0]], [[0.0, 1.0]]])
    rope_ref(q, k, torch.tensor([0, 3]), cos, sin)
    torch.testing.assert_close(q[1, 0], torch.tensor([math.cos(3), math.sin(3)]))
    torch.testing.assert_close(k[1, 0], torch.tensor([-math.sin(3), math.cos(3)]))
    torch.testing.assert_close(q[0, 0], torch.tensor([1.0, 0.0]))


def test_llama3_scaling_slows_only_low_frequencies():
    plain, scaled = rope_inv_freq(128, 500000.0), rope_inv_freq(128, 500000.0, {**LLAMA3, "original_max_position_embeddings": 8192})
    assert torch.equal(scaled[:8], plain[:8])  # short wavelengths kept
    torch.testing.assert_close(scaled[-4:], plain[-4:] / 8.0)  # long ones divided by factor
    assert ((scaled <= plain) & (scaled >= plain / 8.0)).all()


def test_rmsnorm_multiplies_an_fp32_weight_in_fp32(device):
    """Gemma's and gpt-oss's norms (weights kept fp32): the product in fp32, then rounded once to
    x's dtype, in the kernel and the reference alike."""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(7, 64, generator=g) * 3).to(device=device, dtype=torch.float16)
    weight = (torch.randn(64, generator=g) * 0.5 + 1).to(device)
    out, _ = rmsnorm(x, None, weight, 1e-6)
    want, _ = rmsnorm_ref(x, None, weight, 1e-6)
    hf = x.float()
    exact = (weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6))).to(torch.float16)
    assert out.dtype == want.dtype == torch.float16 and torch.equal(want, exact)
    torch.testing.assert_close(out, exact, rtol=0, atol=1e-3)  # the kernel's sum order may differ by an ulp
