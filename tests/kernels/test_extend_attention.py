"""extend_attention (Triton) against extend_attention_ref, and the reference against a naive fp64 loop."""
from __future__ import annotations

import sys

import pytest
import torch

from radixflow.kernels import _triton
from radixflow.kernels.extend_attention import (choose_extend_splits, extend_attention, extend_attention_ref,
                                                stack_heads)

# fp32: online softmax sums in another order than torch.softmax.
# fp16: besides the fp16 output rounding, the kernel rounds P to fp16 for the PV tensor-core dot.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}

# (prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, fp8, num_kv_splits): the odd shapes
# of STYLE.md (batch 1/3/5, prefixes 0/1/130, GQA 1/3/4/8, head dims 64/80/96/128, splits 1 or more),
# spread over few cases because the interpreter is slow
CASES = [
    ([0], [7], 2, 2, 16, torch.float32, False, 1),
    ([0, 37, 130], [7, 20, 1], 8, 2, 64, torch.float16, False, 1),       # GQA 4: 8 tokens per 32-row tile
    ([1, 0, 37, 5, 130], [1, 7, 20, 0, 3], 8, 1, 80, torch.float16, True, 1),  # GQA 8
    ([130, 0, 1], [20, 1, 7], 3, 3, 96, torch.float32, True, 3),         # MHA, split KV
    ([37], [20], 8, 1, 128, torch.float16, False, 4),                    # GQA 8, head dim 128, split KV
    ([5, 37, 0], [33, 1, 7], 6, 2, 32, torch.float32, False, 1),         # GQA 3: 10 tokens in 30 of 32 rows
    ([130, 1, 0], [16, 3, 5], 8, 2, 64, torch.float32, True, 3),         # short extends on a long prefix
    ([130], [2], 16, 2, 80, torch.float16, False, 2),                    # GQA 8, head dim 80, split KV
]


def _args(lay, q, sm_scale):
    return (q, lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.prefix_lens, lay.extend_lens,
            lay.extend_starts, sm_scale, lay.k_scale, lay.v_scale)


@pytest.mark.parametrize("prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, fp8, num_kv_splits",
                         CASES)
def test_op_matches_ref(kv_layout, device, prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, fp8,
                        num_kv_splits):
    lay = kv_layout(prefix_lens, extend_lens, num_kv_heads, head_dim, dtype, fp8, device)
    q = torch.randn(sum(extend_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    args = _args(lay, q, head_dim ** -0.5)
    out = extend_attention(*args, max_extend_len=max(extend_lens), num_kv_splits=num_kv_splits)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out, extend_attention_ref(*args), **TOL[dtype])


def test_group_larger_than_a_tile_is_cut_into_head_blocks(kv_layout, device):
    # 36 query heads on one KV head: the interpreter's 32-row tiles take 18 heads of one token each
    assert stack_heads(36, 32) == (2, 18, 1)
    lay = kv_layout([9, 0], [3, 2], 1, 16, torch.float32, False, device)
    q = torch.randn(5, 36, 16, device=device)
    args = _args(lay, q, 0.25)
    for splits in (1, 2):
        torch.testing.assert_close(extend_attention(*args, num_kv_splits=splits), extend_attention_ref(*args),
                                   **TOL[torch.float32])


def test_stack_heads():
    assert stack_heads(1, 128) == (1, 1, 128)
    assert stack_heads(4, 128) == (1, 4, 32)   # Llama-3-8B: 32 tokens x 4 heads
    assert stack_heads(3, 32) == (1, 3, 10)    # 30 of 32 rows used
    assert stack_heads(8, 32) == (1, 8, 4)
    assert stack_heads(71, 64) == (2, 36, 1)   # Falcon-7B: 71 heads on one KV head
    assert stack_heads(128, 128) == (1, 128, 1)


def test_extend_splits_give_a_short_turn_on_a_long_prefix_enough_programs():
    # Llama-3-8B (8 KV heads, groups of 4: 16 tokens per 64-row tile) on 132 SMs
    turn_tiles = 1 * 8 * 1  # a 16-token turn: one tile per KV head
    assert choose_extend_splits(turn_tiles, 100_016, 132) == 33  # 264 programs, 2 per SM
    assert choose_extend_splits(turn_tiles, 2_000, 132) == 8     # no split under 256 tokens
    assert choose_extend_splits(8 * 256, 4_096, 132) == 1        # a 4K prefill fills the GPU alone
    assert choose_extend_splits(8, 16, 132) == 1


@pytest.mark.parametrize("max_seq_len", [None, 10_000])
def test_splits_default_to_one_off_cuda(kv_layout, device, max_seq_len, monkeypatch):
    # the SM count exists only on CUDA: elsewhere the default is one split, never a device query
    ext = sys.modules[extend_attention.__module__]
    if device.type == "cuda":
        pytest.skip("CPU behaviour")
    monkeypatch.setattr(ext, "_num_sms", lambda dev: pytest.fail("queried the SM count"))
    lay = kv_layout([3], [2], 1, 16, torch.float32, False, device)
    q = torch.randn(2, 2, 16)
    args = _args(lay, q, 0.3)
    torch.testing.assert_close(extend_attention(*args, max_seq_len=max_seq_len), extend_attention_ref(*args),
                               **TOL[torch.float32])


def test_while_loop_path_matches_ref(kv_layout, device, monkeypatch):
    # the loop form the interpreter of triton < 3.9 needs; on triton >= 3.9 the tl.range form runs above
    monkeypatch.setattr(_triton, "use_while_loop", lambda dev: True)
    lay = kv_layout([0, 70], [20, 3], 2, 26, torch.float32, True, device)
    q = torch.randn(23, 4, 26, device=device)
    args = _args(lay, q, 0.3)
    for splits in (1, 2):
        torch.testing.assert_close(extend_attention(*args, num_kv_splits=splits), extend_attention_ref(*args),
                                   **TOL[torch.float32])


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
    with pytest.raises(ValueError, match="max_seq_len"):
        op(*good, max_seq_len=2.5)
    with pytest.raises(ValueError, match="num_kv_splits"):
        op(*good, num_kv_splits=0)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_gpu_bf16_realistic(kv_layout, fp8):
    device = torch.device("cuda")
    prefix_lens, extend_lens = [0, 1000, 3000, 17, 2500], [512, 33, 1096, 1, 0]
    lay = kv_layout(prefix_lens, extend_lens, 8, 128, torch.bfloat16, fp8, device)
    q = torch.randn(sum(extend_lens), 32, 128, device=device, dtype=torch.bfloat16)
    args = _args(lay, q, 128 ** -0.5)
    out = extend_attention(*args, max_extend_len=max(extend_lens))
    split = extend_attention(*args, max_extend_len=max(extend_lens), num_kv_splits=7)
    # bf16 keeps 8 mantissa bits: output rounding plus P rounded to bf16 before the PV dot
    torch.testing.assert_close(out, extend_attention_ref(*args), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(split, extend_attention_ref(*args), rtol=2e-2, atol=2e-2)
