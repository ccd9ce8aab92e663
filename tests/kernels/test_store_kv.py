"""store_kv (Triton) against store_kv_ref, bit for bit, and the fp8 e4m3 encoding against torch's."""
from __future__ import annotations

import pytest
import torch

from radixflow.kernels.fp8 import FP8_E4M3_MAX, dequantize_fp8, quantize_fp8
from radixflow.kernels.store_kv import store_kv, store_kv_ref


def _caches(num_slots, num_kv_heads, head_dim, dtype, device):
    k_cache = torch.full((num_slots, num_kv_heads, head_dim), 7, dtype=dtype, device=device)
    return k_cache, k_cache.clone()


@pytest.mark.parametrize("cache_dtype, kv_dtype, slot_dtype, scales", [
    (torch.float16, torch.float16, torch.int64, (1.0, 1.0)),
    (torch.float32, torch.float32, torch.int32, (1.0, 1.0)),
    (torch.float16, torch.float32, torch.int32, (3.0, 3.0)),  # plain cast: scales unused
    (torch.uint8, torch.float16, torch.int64, (0.5, 0.125)),
    (torch.uint8, torch.float32, torch.int32, (1.0, 2.0)),
])
@pytest.mark.parametrize("num_kv_heads, head_dim", [(1, 16), (3, 80), (8, 128)])
def test_op_matches_ref_bitwise(device, cache_dtype, kv_dtype, slot_dtype, scales, num_kv_heads, head_dim):
    gen = torch.Generator().manual_seed(0)
    num_tokens = 7
    slots = (torch.randperm(40, generator=gen)[:num_tokens] + 1).to(device, slot_dtype)
    # magnitudes from 1e-4 to 1e3: subnormal, normal and saturating fp8 values
    magnitudes = 10.0 ** torch.randint(-4, 4, (num_tokens, 1, 1), generator=gen)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen) * magnitudes
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen) * 100
    k, v = k.to(device, kv_dtype), v.to(device, kv_dtype)
    got = _caches(41, num_kv_heads, head_dim, cache_dtype, device)
    want = _caches(41, num_kv_heads, head_dim, cache_dtype, device)
    store_kv(*got, slots, k, v, *scales)
    store_kv_ref(*want, slots, k, v, *scales)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    untouched = torch.ones(41, dtype=torch.bool, device=device)
    untouched[slots.long()] = False
    assert (got[0][untouched] == 7).all()


def test_fp8_encoding_is_bit_exact_on_every_code_and_tie(device):
    # every finite e4m3 value, every midpoint between neighbours (ties round to even), saturation and signed zero
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    values = values[~values.isnan()].unique()
    mids = (values[1:] + values[:-1]) / 2
    extra = torch.tensor([0.0, -0.0, 448.0, 449.0, 464.0, 1e9, -1e9, 1e-30, 3e-3, -31.4, 124.2])
    x = torch.cat([values, mids, extra])
    k = x.view(-1, 1, 1).expand(-1, 1, 16).contiguous().to(device)
    got = _caches(x.numel() + 1, 1, 16, torch.uint8, device)
    slots = torch.arange(1, x.numel() + 1, device=device)
    store_kv(*got, slots, k, k, 1.0, 1.0)
    expected = x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)  # torch rounds to nearest even
    assert torch.equal(got[0][1:, 0, 0].cpu(), expected)


def test_fp8_helpers_round_trip_and_saturate():
    x = torch.tensor([0.0, 1.0, -2.5, 0.001, 1000.0, -1000.0])
    u8 = quantize_fp8(x, 0.5)
    assert u8.dtype == torch.uint8
    back = dequantize_fp8(u8, 0.5, torch.float16)
    assert back.dtype == torch.float16
    torch.testing.assert_close(back[:3].float(), x[:3])  # exactly representable
    assert back[4].item() == FP8_E4M3_MAX * 0.5 and back[5].item() == -FP8_E4M3_MAX * 0.5  # saturated, not NaN
    assert abs(back[3].item() - 0.001) < 0.5 * 2.0 ** -9 * 0.5  # subnormal: within half a step


def test_strided_kv_views(device):
    # k and v as views into a fused qkv projection: token stride != num_kv_heads * head_dim
    qkv = torch.randn(5, 4 * 16 + 2 * 2 * 16, device=device)
    k = qkv[:, 64:96].view(5, 2, 16)
    v = qkv[:, 96:].view(5, 2, 16)
    got, want = _caches(9, 2, 16, torch.float32, device), _caches(9, 2, 16, torch.float32, device)
    slots = torch.tensor([8, 1, 5, 3, 2], device=device)
    store_kv(*got, slots, k, v)
    store_kv_ref(*want, slots, k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(got[0][8], k[0])


def test_no_tokens_is_a_no_op(device):
    caches = _caches(4, 2, 16, torch.float16, device)
    empty = torch.zeros(0, 2, 16, device=device, dtype=torch.float16)
    for op in (store_kv, store_kv_ref):
        op(*caches, torch.zeros(0, dtype=torch.int64, device=device), empty, empty)
    assert (caches[0] == 7).all()


@pytest.mark.parametrize("op", [store_kv, store_kv_ref])
def test_validation_errors(op):
    k_cache, v_cache = _caches(9, 2, 16, torch.float16, "cpu")
    k = torch.randn(3, 2, 16)
    slots = torch.tensor([1, 2, 3])
    cases = [
        ((k_cache, v_cache, slots, k[:, :1], k), "must have one shape"),
        ((k_cache, v_cache, slots, k[:, :1], k[:, :1]), "does not match k_cache"),
        ((k_cache, v_cache[:, :, :8], slots, k, k), "must have one shape"),
        ((k_cache, v_cache.float(), slots, k, k), "must have one dtype"),
        ((k_cache.to(torch.int8), v_cache.to(torch.int8), slots, k, k), "k_cache must have dtype"),
        ((k_cache, v_cache, slots[:2], k, k), "slots must have 3 entries"),
        ((k_cache, v_cache, slots.float(), k, k), "slots must have dtype"),
        ((k_cache, v_cache, slots, k.transpose(1, 2).contiguous().transpose(1, 2), k), "k must be contiguous"),
        ((k_cache.to(torch.uint8), v_cache.to(torch.uint8), slots, k, k, 0.0), "k_scale"),
    ]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            op(*args)


@pytest.mark.gpu
def test_gpu_bf16_and_fp8(device):
    for cache_dtype in (torch.bfloat16, torch.uint8):
        slots = torch.randperm(5000, device="cuda")[:4096] + 1
        k = torch.randn(4096, 8, 128, device="cuda", dtype=torch.bfloat16)
        got, want = _caches(5001, 8, 128, cache_dtype, "cuda"), _caches(5001, 8, 128, cache_dtype, "cuda")
        store_kv(*got, slots, k, k * 3, 0.7, 0.3)
        store_kv_ref(*want, slots, k, k * 3, 0.7, 0.3)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
