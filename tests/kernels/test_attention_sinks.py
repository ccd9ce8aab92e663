"""Attention sinks (gpt-oss): each query head's learned logit joins its softmax's denominator as a
key without a value. Every backend (the references, Triton under the interpreter, the CPU torch
paths with and without the native kernels) against a naive fp64 softmax over scores + [sink]."""
from __future__ import annotations

import pytest
import torch

from radixflow.kernels import torch_decode
from radixflow.kernels.decode_attention import decode_attention, decode_attention_ref, window_context
from radixflow.kernels.extend_attention import extend_attention, extend_attention_ref
from radixflow.kernels.torch_attention import extend_attention_torch
from radixflow.kernels.torch_decode import decode_attention_torch

TOL = dict(rtol=1e-5, atol=1e-5)
HEADS, KV_HEADS, DIM = 6, 2, 16


def _args(lay, q, sm_scale):
    return (q, lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.prefix_lens, lay.extend_lens,
            lay.extend_starts, sm_scale, lay.k_scale, lay.v_scale)


def _kv(lay, slots):
    k, v = lay.k_cache[slots], lay.v_cache[slots]
    if lay.k_cache.dtype == torch.uint8:
        return (k.view(torch.float8_e4m3fn).double() * lay.k_scale, v.view(torch.float8_e4m3fn).double() * lay.v_scale)
    return k.double(), v.double()


def _naive(q, lay, row, first, last, sm_scale, sinks):
    """One query [heads, dim] over the keys at positions [first, last) of slot-table row `row`:
    softmax over its scores and its head's sink, the sink's weight dropped; fp64."""
    k, v = _kv(lay, lay.req_to_token[row, first:last].long().cpu())
    group = HEADS // KV_HEADS
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [keys, heads, dim]
    scores = (q.double().cpu()[None] * k).sum(-1).T * sm_scale  # [heads, keys]
    probs = torch.softmax(torch.cat([scores, sinks.double().cpu()[:, None]], dim=1), dim=1)[:, :-1]
    return (probs[..., None] * v.transpose(0, 1)).sum(1)


def _sinks(device, scale=2.0):
    # spread wide: a sink far above the scores takes most of the weight, one far below almost none
    return (torch.randn(HEADS, generator=torch.Generator().manual_seed(9)) * scale + 1.0).to(device)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("fp8", [False, True])
def test_sinks_match_naive_on_every_backend(kv_layout, device, window, fp8):
    prefix_lens, extend_lens = [0, 37, 3, 70], [30, 20, 0, 2]
    lay = kv_layout(prefix_lens, extend_lens, KV_HEADS, DIM, torch.float32, fp8, device)
    q = torch.randn(52, HEADS, DIM, generator=torch.Generator().manual_seed(4)).to(device) * 2
    sinks = _sinks(device)
    args = _args(lay, q, 0.3)
    want = extend_attention_ref(*args, window=window, sinks=sinks)
    for req, (prefix_len, extend_len) in enumerate(zip(prefix_lens, extend_lens)):
        start, row = int(lay.extend_starts[req]), int(lay.req_rows[req])
        for j in (0, extend_len - 1) if extend_len else ():
            pos = prefix_len + j
            first = 0 if window is None else max(0, pos - window + 1)
            naive = _naive(q[start + j], lay, row, first, pos + 1, 0.3, sinks)
            torch.testing.assert_close(want[start + j].double().cpu(), naive, **TOL)
    assert (want - extend_attention_ref(*args, window=window)).abs().max() > 1e-2  # the sinks changed it
    for splits in (1, 3):
        got = extend_attention(*args, max_extend_len=30, num_kv_splits=splits, window=window, sinks=sinks)
        torch.testing.assert_close(got, want, **TOL)
    if device.type == "cpu":
        torch.testing.assert_close(extend_attention_torch(*args, window=window, sinks=sinks), want, **TOL)
    table, rows, lens = (lay.req_to_token, lay.req_rows, lay.seq_lens) if window is None else window_context(
        lay.req_to_token, lay.req_rows, lay.seq_lens, window)
    qd = torch.randn(4, HEADS, DIM, generator=torch.Generator().manual_seed(5)).to(device) * 2
    dec = (qd, lay.k_cache, lay.v_cache, table, rows, lens, 0.3, lay.k_scale, lay.v_scale)
    want_d = decode_attention_ref(*dec, sinks=sinks)
    for i in range(4):
        n = int(lens[i])
        torch.testing.assert_close(want_d[i].double().cpu(), _naive(qd[i], lay if window is None else _Table(lay, table),
                                                                    int(rows[i]), 0, n, 0.3, sinks), **TOL)
    for splits in (1, 4):
        torch.testing.assert_close(decode_attention(*dec, num_kv_splits=splits, sinks=sinks), want_d, **TOL)
    if device.type == "cpu":
        torch.testing.assert_close(decode_attention_torch(*dec, sinks=sinks), want_d, **TOL)


class _Table:
    """A layout seen through another slot table (window_context's cut one)."""

    def __init__(self, lay, table):
        self.k_cache, self.v_cache, self.k_scale, self.v_scale, self.req_to_token = (
            lay.k_cache, lay.v_cache, lay.k_scale, lay.v_scale, table)


@pytest.mark.parametrize("native_on", ["0", "1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sinks_decode_over_shared_prefixes_long_rows_and_padding(kv_layout, monkeypatch, native_on, dtype):
    """The CPU decode's other paths: a prefix three requests share (read once for them), a row
    longer than LONG_ROW_TOKENS, the native kernel's outputs rescaled by their log-sum-exp, and a
    padding row (seq_len 0: zeros, as without sinks)."""
    monkeypatch.setenv("RADIXFLOW_NATIVE_KERNELS", native_on)
    monkeypatch.setattr(torch_decode, "LONG_ROW_TOKENS", 100)
    monkeypatch.setattr(torch_decode, "NATIVE_SHARED_MIN_READS", 1)  # the native kernels read the prefix once too
    seq_lens = [90, 95, 99, 150, 1]
    lay = kv_layout([n - 1 for n in seq_lens], [1] * 5, KV_HEADS, DIM, dtype, False, torch.device("cpu"))
    lay.share_prefixes([([0, 1, 2], 80)])
    lens = lay.seq_lens.clone()
    lens[4] = 0
    q = (torch.randn(5, HEADS, DIM, generator=torch.Generator().manual_seed(6)) * 2).to(dtype)
    sinks = _sinks(torch.device("cpu")).to(dtype)
    dec = (q, lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lens, 0.3)
    want = decode_attention_ref(*dec, sinks=sinks)
    assert torch.equal(want[4], torch.zeros_like(want[4]))
    for shared in (True, False):
        if not shared:  # the plain gathered path: no shared prefix
            dec = (q[3:], lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows[3:], lens[3:], 0.3)
            want = decode_attention_ref(*dec, sinks=sinks)
        plan = torch_decode.plan_checked_decode(*dec, sinks=sinks)
        assert bool(plan.shared) == shared and (plan.native is not None) == (native_on == "1")
        tol = TOL if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(decode_attention_torch(*dec, sinks=sinks), want, **tol)


@pytest.mark.parametrize("sinks", [torch.zeros(5), torch.zeros(6, 1), torch.zeros(6, dtype=torch.int64), [0.0] * 6])
def test_bad_sinks_are_refused(kv_layout, sinks):
    lay = kv_layout([3], [2], KV_HEADS, DIM, torch.float32, False, torch.device("cpu"))
    args = _args(lay, torch.randn(2, HEADS, DIM), 0.25)
    for op in (extend_attention_ref, extend_attention_torch, extend_attention):
        with pytest.raises(ValueError, match="sinks"):
            op(*args, sinks=sinks)
    dec = (torch.randn(1, HEADS, DIM), lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.seq_lens, 0.25)
    for op in (decode_attention_ref, decode_attention_torch, decode_attention):
        with pytest.raises(ValueError, match="sinks"):
            op(*dec, sinks=sinks)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_bf16_sinks_at_gpt_oss_heads(kv_layout):
    """Compiled kernels, bf16, gpt-oss's head shape (64 query heads of 64 dims over 8 KV heads),
    split and unsplit, against the fp32 reference."""
    cuda = torch.device("cuda")
    lay = kv_layout([0, 300, 5], [200, 16, 1], 8, 64, torch.bfloat16, False, cuda)
    q = torch.randn(217, 64, 64, device=cuda, dtype=torch.bfloat16)
    sinks = torch.randn(64, device=cuda, dtype=torch.bfloat16) * 2
    args = _args(lay, q, 0.125)
    want = extend_attention_ref(*args, window=128, sinks=sinks).float()
    for splits in (None, 4):
        got = extend_attention(*args, max_extend_len=200, max_seq_len=316, num_kv_splits=splits, window=128,
                               sinks=sinks)
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    dec = (q[:3].contiguous(), lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.seq_lens, 0.125)
    torch.testing.assert_close(decode_attention(*dec, num_kv_splits=8, sinks=sinks).float(),
                               decode_attention_ref(*dec, sinks=sinks).float(), rtol=2e-2, atol=2e-2)
