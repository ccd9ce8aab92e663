"""decode_attention (Triton, split-KV) against decode_attention_ref, and the reference against naive fp64."""
from __future__ import annotations

import pytest
import torch

from radixflow.kernels import _triton
from radixflow.kernels.decode_attention import decode_attention, decode_attention_ref
from radixflow.kernels.extend_attention import extend_attention_ref

# fp32: the split merge and online softmax sum in another order than torch.softmax.
# fp16: besides the fp16 output rounding, the kernel rounds P to fp16 for the PV tensor-core dot.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}

# (seq_lens (0 = CUDA-graph padding row), num_heads, num_kv_heads, head_dim, dtype, fp8, num_kv_splits)
CASES = [
    ([1], 2, 2, 16, torch.float32, False, 8),
    ([38, 0, 131], 8, 2, 64, torch.float16, False, 8),
    ([2, 131, 21, 0, 8], 8, 1, 80, torch.float16, True, 3),
    ([131, 1, 8], 3, 3, 96, torch.float32, True, 1),
    ([57, 200], 16, 2, 128, torch.float16, False, 16),
    ([0, 45, 7], 6, 2, 32, torch.float32, False, 5),
    ([40, 3], 80, 1, 16, torch.float32, False, 2),  # group 80 > 64 heads per program: 2 head blocks
]


def _args(lay, q, sm_scale, num_kv_splits):
    return (q, lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.seq_lens, sm_scale,
            lay.k_scale, lay.v_scale, num_kv_splits)


def _layout(kv_layout, seq_lens, num_kv_heads, head_dim, dtype, fp8, device):
    # decode: the new token is the context's last one, already stored
    prefix_lens = [max(s - 1, 0) for s in seq_lens]
    return kv_layout(prefix_lens, [min(s, 1) for s in seq_lens], num_kv_heads, head_dim, dtype, fp8, device)


@pytest.mark.parametrize("seq_lens, num_heads, num_kv_heads, head_dim, dtype, fp8, num_kv_splits", CASES)
def test_op_matches_ref(kv_layout, device, seq_lens, num_heads, num_kv_heads, head_dim, dtype, fp8, num_kv_splits):
    lay = _layout(kv_layout, seq_lens, num_kv_heads, head_dim, dtype, fp8, device)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    args = _args(lay, q, head_dim ** -0.5, num_kv_splits)
    out = decode_attention(*args)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out, decode_attention_ref(*args), **TOL[dtype])
    padding = lay.seq_lens == 0
    assert torch.equal(out[padding], torch.zeros_like(out[padding]))  # no NaN from empty contexts


def test_while_loop_path_matches_ref(kv_layout, device, monkeypatch):
    # the loop form the interpreter of triton < 3.9 needs; on triton >= 3.9 the tl.range form runs above
    monkeypatch.setattr(_triton, "use_while_loop", lambda dev: True)
    lay = _layout(kv_layout, [90, 0, 5], 2, 26, torch.float32, True, device)
    q = torch.randn(3, 8, 26, device=device)
    args = _args(lay, q, 0.3, 4)
    torch.testing.assert_close(decode_attention(*args), decode_attention_ref(*args), **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_strided_q(kv_layout, device, dtype):
    lay = _layout(kv_layout, [30, 9], 2, 16, dtype, False, device)
    q = torch.randn(2, 3 * 4 * 16, device=device, dtype=dtype)[:, : 4 * 16].view(2, 4, 16)  # a view into fused qkv
    assert not q.is_contiguous()
    args = _args(lay, q, 0.25, 2)
    torch.testing.assert_close(decode_attention(*args), decode_attention_ref(*args), **TOL[dtype])


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, 2), (8, 2), (8, 1)])
def test_ref_matches_naive_fp64(kv_layout, naive, num_heads, num_kv_heads, fp8):
    seq_lens = [5, 0, 1, 9]
    lay = _layout(kv_layout, seq_lens, num_kv_heads, 8, torch.float32, fp8, torch.device("cpu"))
    q = torch.randn(4, num_heads, 8)
    out = decode_attention_ref(*_args(lay, q, 0.4, 8))
    for req, seq_len in enumerate(seq_lens):
        expected = naive(q[req], lay, req, seq_len - 1, 0.4) if seq_len else torch.zeros(num_heads, 8).double()
        torch.testing.assert_close(out[req].double(), expected, rtol=1e-5, atol=1e-6)


def test_ref_equals_extend_ref_with_one_new_token(kv_layout):
    lay = _layout(kv_layout, [12, 1, 40], 2, 16, torch.float32, True, torch.device("cpu"))
    q = torch.randn(3, 4, 16)
    decode = decode_attention_ref(*_args(lay, q, 0.25, 8))
    extend = extend_attention_ref(q, lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.prefix_lens,
                                  lay.extend_lens, lay.extend_starts, 0.25, lay.k_scale, lay.v_scale)
    torch.testing.assert_close(decode, extend, rtol=1e-6, atol=1e-6)


def test_empty_batch(kv_layout, device):
    lay = kv_layout([], [], 2, 16, torch.float32, False, device)
    q = torch.zeros(0, 2, 16, device=device)
    for op in (decode_attention, decode_attention_ref):
        assert op(*_args(lay, q, 1.0, 8)).shape == (0, 2, 16)


@pytest.mark.parametrize("op", [decode_attention, decode_attention_ref])
def test_validation_errors(kv_layout, op):
    lay = _layout(kv_layout, [3, 5], 2, 16, torch.float32, True, torch.device("cpu"))
    q = torch.randn(2, 4, 16)
    good = list(_args(lay, q, 0.25, 8))

    def bad(index, value, match):
        args = list(good)
        args[index] = value
        with pytest.raises(ValueError, match=match):
            op(*args)

    bad(0, torch.randn(2, 4, 16, dtype=torch.float64), "q must have dtype")
    bad(0, torch.randn(2, 4, 8), "head_dim")
    bad(1, lay.k_cache.double(), "k_cache must have dtype")
    bad(2, lay.v_cache.view(torch.int8), "v_cache must have dtype")
    bad(3, lay.req_to_token[0], "req_to_token must have 2 dims")
    bad(4, lay.req_rows[:1], "req_rows must have 2 entries")
    bad(5, lay.seq_lens[:, None], "seq_lens must have 1 dims")
    bad(8, float("inf"), "v_scale")
    bad(9, 0, "num_kv_splits")


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_gpu_bf16_realistic(kv_layout, fp8):
    device = torch.device("cuda")
    seq_lens = [4096, 1, 0, 777, 2048, 3001, 64]
    lay = _layout(kv_layout, seq_lens, 8, 128, torch.bfloat16, fp8, device)
    q = torch.randn(len(seq_lens), 32, 128, device=device, dtype=torch.bfloat16)
    args = _args(lay, q, 128 ** -0.5, 8)
    # bf16 keeps 8 mantissa bits: output rounding plus P rounded to bf16 before the PV dot
    torch.testing.assert_close(decode_attention(*args), decode_attention_ref(*args), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay(kv_layout):
    device = torch.device("cuda")
    lay = _layout(kv_layout, [1000, 20, 0, 300], 8, 128, torch.bfloat16, False, device)
    q = torch.randn(4, 32, 128, device=device, dtype=torch.bfloat16)
    args = _args(lay, q, 128 ** -0.5, 8)
    decode_attention(*args)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(*args)
    lay.seq_lens.copy_(torch.tensor([999, 21, 0, 1], device=device))  # same buffers, new lengths
    q.normal_()
    graph.replay()
    torch.testing.assert_close(out, decode_attention_ref(*args), rtol=2e-2, atol=2e-2)  # bf16, as above


def test_kv_splits_fill_the_gpu_without_short_splits():
    from radixflow.kernels.decode_attention import MAX_KV_SPLITS, choose_kv_splits
    # Llama-3-8B shapes (8 KV heads) on 132 SMs
    assert choose_kv_splits(1, 8, 4096, 132) == 16          # 256-token splits: 128 programs
    assert choose_kv_splits(1, 8, 100_000, 132) == 33       # 2 programs per SM
    assert choose_kv_splits(64, 8, 4096, 132) == 1          # the batch alone fills the GPU
    assert choose_kv_splits(8, 8, 4096, 132) == 5
    assert choose_kv_splits(1, 1, 10**7, 10_000) == MAX_KV_SPLITS
    assert choose_kv_splits(4, 8, 100, 132) == 1            # one short context: one split
    assert choose_kv_splits(0, 8, 0, 132) == 1
    for batch in (1, 3, 16, 256):
        for ctx in (1, 255, 257, 8192):
            s = choose_kv_splits(batch, 8, ctx, 132)
            assert 1 <= s <= MAX_KV_SPLITS and (s == 1 or -(-ctx // s) >= 128)
