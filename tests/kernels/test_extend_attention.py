"""extend_attention (Triton) against extend_attention_ref, and the reference against a naive fp64 loop."""
from __future__ import annotations

import pytest
import torch

from radixflow.kernels import _triton
from radixflow.kernels.extend_attention import extend_attention, extend_attention_ref

# fp32: online softmax sums in another order than torch.softmax.
# fp16: besides the fp16 output rounding, the kernel rounds P to fp16 for the PV tensor-core dot.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}

# (prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, fp8): the odd shapes of STYLE.md,
# spread over few cases because the interpreter is slow
CASES = [
    ([0], [7], 2, 2, 16, torch.float32, False),
    ([0, 37, 130], [7, 20, 1], 8, 2, 64, torch.float16, False),
    ([1, 0, 37, 5, 130], [1, 7, 20, 0, 3], 8, 1, 80, torch.float16, True),
    ([130, 0, 1], [20, 1, 7], 3, 3, 96, torch.float32, True),
    ([37], [20], 8, 2, 128, torch.float16, False),
    ([5, 37, 0], [33, 1, 7], 6, 2, 32, torch.float32, False),
]


def _args(lay, q, sm_scale):
    return (q, lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.prefix_lens, lay.extend_lens,
            lay.extend_starts, sm_scale, lay.k_scale, lay.v_scale)


@pytest.mark.parametrize("prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, fp8", CASES)
def test_op_matches_ref(kv_layout, device, prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, fp8):
    lay = kv_layout(prefix_lens, extend_lens, num_kv_heads, head_dim, dtype, fp8, device)
    q = torch.randn(sum(extend_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    args = _args(lay, q, head_dim ** -0.5)
    out = extend_attention(*args, max_extend_len=max(extend_lens))
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out, extend_attention_ref(*args), **TOL[dtype])


def test_while_loop_path_matches_ref(kv_layout, device, monkeypatch):
    # the loop form the interpreter of triton < 3.9 needs; on triton >= 3.9 the tl.range form runs above
    monkeypatch.setattr(_triton, "use_while_loop", lambda dev: True)
    lay = kv_layout([0, 70], [20, 3], 2, 26, torch.float32, True, device)
    q = torch.randn(23, 4, 26, device=device)
    args = _args(lay, q, 0.3)
    torch.testing.assert_close(extend_attention(*args), extend_attention_ref(*args), **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_strided_q_padding_rows_and_default_max_extend_len(kv_layout, device, dtype):
    lay = kv_layout([3, 40], [5, 9], 2, 16, dtype, False, device)
    qkv = torch.randn(14 + 2, 3 * 4 * 16, device=device, dtype=dtype)
    q = qkv[:, : 4 * 16].view(16, 4, 16)  # a view into a fused qkv projection, 2 padding rows at the end
    assert not q.is_contiguous()
    args = _args(lay, q, 0.25)
    out = extend_attention(*args)
    torch.testing.assert_close(out, extend_attention_ref(*args), **TOL[dtype])
    assert torch.equal(out[14:], torch.zeros_like(out[14:]))  # rows no request covers


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, 2), (8, 2), (8, 1)])
def test_ref_matches_naive_fp64(kv_layout, naive, num_heads, num_kv_heads, fp8):
    prefix_lens, extend_lens = [0, 6, 3], [4, 3, 0]
    lay = kv_layout(prefix_lens, extend_lens, num_kv_heads, 8, torch.float32, fp8, torch.device("cpu"))
    q = torch.randn(7, num_heads, 8)
    out = extend_attention_ref(*_args(lay, q, 0.4))
    for req, (prefix_len, extend_len) in enumerate(zip(prefix_lens, extend_lens)):
        start = int(lay.extend_starts[req])
        for j in range(extend_len):
            expected = naive(q[start + j], lay, req, prefix_len + j, 0.4)
            torch.testing.assert_close(out[start + j].double(), expected, rtol=1e-5, atol=1e-6)


def test_empty_batch_and_zero_tokens(kv_layout, device):
    lay = kv_layout([], [], 2, 16, torch.float32, False, device)
    q = torch.zeros(0, 2, 16, device=device)
    for op in (extend_attention, extend_attention_ref):
        assert op(*_args(lay, q, 1.0)).shape == (0, 2, 16)


@pytest.mark.parametrize("op", [extend_attention, extend_attention_ref])
def test_validation_errors(kv_layout, op):
    lay = kv_layout([2], [3], 2, 16, torch.float32, False, torch.device("cpu"))
    q = torch.randn(3, 4, 16)
    good = list(_args(lay, q, 0.25))

    def bad(index, value, match):
        args = list(good)
        args[index] = value
        with pytest.raises(ValueError, match=match):
            op(*args)

    bad(0, q[..., 0], "q must have 3 dims")
    bad(0, q.to(torch.int32), "q must have dtype")
    bad(0, torch.randn(3, 16, 4).transpose(1, 2), "q must be contiguous in its last dim")
    bad(0, torch.randn(3, 3, 16), "multiple of the caches' num_kv_heads")
    bad(0, torch.randn(3, 4, 32), "head_dim")
    bad(1, lay.k_cache.half(), "k_cache must have dtype")
    bad(2, lay.v_cache[:5], "must have one shape")
    bad(3, lay.req_to_token.float(), "req_to_token must have dtype")
    bad(5, lay.prefix_lens[:0], "prefix_lens must have 1 entries")
    bad(6, lay.extend_lens.float(), "extend_lens must have dtype")
    bad(8, -1.0, "sm_scale")
    bad(9, 0.0, "k_scale")
    with pytest.raises(ValueError, match="max_extend_len"):
        op(*good, max_extend_len=-1)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_gpu_bf16_realistic(kv_layout, fp8):
    device = torch.device("cuda")
    prefix_lens, extend_lens = [0, 1000, 3000, 17, 2500], [512, 33, 1096, 1, 0]
    lay = kv_layout(prefix_lens, extend_lens, 8, 128, torch.bfloat16, fp8, device)
    q = torch.randn(sum(extend_lens), 32, 128, device=device, dtype=torch.bfloat16)
    args = _args(lay, q, 128 ** -0.5)
    out = extend_attention(*args, max_extend_len=max(extend_lens))
    # bf16 keeps 8 mantissa bits: output rounding plus P rounded to bf16 before the PV dot
    torch.testing.assert_close(out, extend_attention_ref(*args), rtol=2e-2, atol=2e-2)
