"""Sliding-window attention (Gemma 3's local layers): extend through a `window` on every backend,
decode through `window_context`'s cut table, all against a naive fp64 loop or the reference."""
from __future__ import annotations

import pytest
import torch

from radixflow.kernels import torch_attention
from radixflow.kernels.decode_attention import decode_attention, decode_attention_ref, window_context
from radixflow.kernels.extend_attention import extend_attention, extend_attention_ref
from radixflow.kernels.torch_attention import extend_attention_torch
from radixflow.kernels.torch_decode import decode_attention_torch

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}


def _args(lay, q, sm_scale):
    return (q, lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.prefix_lens, lay.extend_lens,
            lay.extend_starts, sm_scale, lay.k_scale, lay.v_scale)


def _naive_window(q, lay, req, pos, sm_scale, window):
    """One query at `pos` over positions pos - window + 1..pos, in fp64."""
    row = int(lay.req_rows[req])
    first = max(0, pos - window + 1)
    slots = lay.req_to_token[row, first:pos + 1].long()
    k, v = lay.k_cache[slots].double(), lay.v_cache[slots].double()
    if lay.k_cache.dtype == torch.uint8:
        k = lay.k_cache[slots].view(torch.float8_e4m3fn).double() * lay.k_scale
        v = lay.v_cache[slots].view(torch.float8_e4m3fn).double() * lay.v_scale
    group = q.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    probs = torch.softmax((q.double()[None] * k).sum(-1) * sm_scale, dim=0)
    return (probs[..., None] * v).sum(0)


@pytest.mark.parametrize("window", [1, 3, 8, 100])
@pytest.mark.parametrize("fp8", [False, True])
def test_ref_window_matches_naive(kv_layout, window, fp8):
    prefix_lens, extend_lens = [0, 9, 4], [12, 5, 0]
    lay = kv_layout(prefix_lens, extend_lens, 2, 8, torch.float32, fp8, torch.device("cpu"))
    q = torch.randn(17, 4, 8, generator=torch.Generator().manual_seed(2))
    out = extend_attention_ref(*_args(lay, q, 0.4), window=window)
    for req, (prefix_len, extend_len) in enumerate(zip(prefix_lens, extend_lens)):
        start = int(lay.extend_starts[req])
        for j in range(extend_len):
            expected = _naive_window(q[start + j], lay, req, prefix_len + j, 0.4, window)
            torch.testing.assert_close(out[start + j].double(), expected, rtol=1e-5, atol=1e-6)


def test_a_window_wider_than_the_context_is_full_attention(kv_layout):
    lay = kv_layout([5, 0], [3, 9], 2, 16, torch.float32, False, torch.device("cpu"))
    args = _args(lay, torch.randn(12, 4, 16), 0.25)
    torch.testing.assert_close(extend_attention_ref(*args, window=14), extend_attention_ref(*args), rtol=0, atol=0)


# (prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, fp8, num_kv_splits, window): a window
# shorter than the prefix, than a tile, one key, past a 64-key block; split KV; GQA 1/4
TRITON_CASES = [
    ([0, 37, 130], [7, 20, 1], 8, 2, 64, torch.float16, False, 1, 16),
    ([130, 0, 1], [20, 40, 7], 3, 3, 32, torch.float32, True, 3, 70),
    ([90], [70], 4, 1, 16, torch.float32, False, 2, 1),
    ([5, 200], [33, 3], 4, 2, 16, torch.float32, False, 1, 100),
]


@pytest.mark.parametrize("prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, fp8, splits, window",
                         TRITON_CASES)
def test_triton_extend_window_matches_ref(kv_layout, device, prefix_lens, extend_lens, num_heads, num_kv_heads,
                                          head_dim, dtype, fp8, splits, window):
    lay = kv_layout(prefix_lens, extend_lens, num_kv_heads, head_dim, dtype, fp8, device)
    q = torch.randn(sum(extend_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    args = _args(lay, q, head_dim ** -0.5)
    out = extend_attention(*args, max_extend_len=max(extend_lens), num_kv_splits=splits, window=window)
    torch.testing.assert_close(out, extend_attention_ref(*args, window=window), **TOL[dtype])


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("window", [1, 6, 50])
def test_torch_extend_window_matches_ref(kv_layout, monkeypatch, fp8, window):
    monkeypatch.setattr(torch_attention, "WINDOW_QUERY_BLOCK", 7)  # several query blocks per request
    prefix_lens, extend_lens = [0, 37, 3, 60], [30, 20, 0, 2]
    lay = kv_layout(prefix_lens, extend_lens, 2, 16, torch.float32, fp8, torch.device("cpu"))
    args = _args(lay, torch.randn(52, 6, 16), 0.3)
    torch.testing.assert_close(extend_attention_torch(*args, window=window), extend_attention_ref(*args, window=window),
                               **TOL[torch.float32])


@pytest.mark.parametrize("window", [1, 5, 40, 1000])
def test_decode_through_the_window_context_equals_a_one_token_extend(kv_layout, device, window):
    # seq_len 0: a CUDA-graph padding row, which must come out zero
    seq_lens = [38, 0, 131, 5]
    lay = kv_layout([max(n - 1, 0) for n in seq_lens], [1 if n else 0 for n in seq_lens], 2, 16, torch.float32,
                    False, device)
    q_new = torch.randn(3, 8, 16, generator=torch.Generator().manual_seed(3)).to(device)  # the 3 real rows
    table, rows, lens = window_context(lay.req_to_token, lay.req_rows, lay.seq_lens, window)
    assert table.shape == (4, min(window, lay.req_to_token.shape[1])) and table.dtype == lay.req_to_token.dtype
    assert lens.tolist() == [min(n, window) for n in seq_lens]
    expected = extend_attention_ref(q_new, lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows,
                                    lay.seq_lens - lay.extend_lens, lay.extend_lens,
                                    torch.tensor([0, 1, 1, 2], device=device), 0.3, window=window)
    per_row = torch.tensor([0, 0, 1, 2], device=device)  # decode rows: the padding row takes any query
    q, expected = q_new[per_row], expected[per_row]
    expected[1] = 0
    dec = (q, lay.k_cache, lay.v_cache, table, rows, lens, 0.3)
    torch.testing.assert_close(decode_attention_ref(*dec), expected, **TOL[torch.float32])
    torch.testing.assert_close(decode_attention(*dec, num_kv_splits=2), expected, **TOL[torch.float32])
    if device.type == "cpu":
        torch.testing.assert_close(decode_attention_torch(*dec), expected, **TOL[torch.float32])


@pytest.mark.parametrize("option, value", [("window", 0), ("window", -3), ("window", 2.5), ("window", True),
                                           ("softcap", 0), ("softcap", -1.0), ("softcap", float("inf")),
                                           ("softcap", True)])
def test_a_bad_window_or_softcap_is_refused(kv_layout, option, value):
    lay = kv_layout([3], [2], 2, 16, torch.float32, False, torch.device("cpu"))
    args = _args(lay, torch.randn(2, 2, 16), 0.25)
    for op in (extend_attention_ref, extend_attention_torch, extend_attention):
        with pytest.raises(ValueError, match=option):
            op(*args, **{option: value})
    if option == "window":
        with pytest.raises(ValueError, match="window"):
            window_context(lay.req_to_token, lay.req_rows, lay.seq_lens, value)
    else:
        dec = (torch.randn(1, 2, 16), lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.seq_lens, 0.25)
        for op in (decode_attention_ref, decode_attention_torch, decode_attention):
            with pytest.raises(ValueError, match="softcap"):
                op(*dec, softcap=value)


# Gemma 2's attention-logit soft-cap (50 there): small caps here so that it bends the scores
@pytest.mark.parametrize("softcap, window", [(0.7, None), (2.0, 5), (50.0, None)])
@pytest.mark.parametrize("fp8", [False, True])
def test_softcap_matches_naive_and_every_backend(kv_layout, device, softcap, window, fp8):
    prefix_lens, extend_lens = [0, 37, 3, 70], [30, 20, 0, 2]
    lay = kv_layout(prefix_lens, extend_lens, 2, 16, torch.float32, fp8, device)
    q = torch.randn(52, 6, 16, generator=torch.Generator().manual_seed(4)).to(device) * 3
    args = _args(lay, q, 0.3)
    want = extend_attention_ref(*args, window=window, softcap=softcap)
    row = int(lay.req_rows[1])  # one query, naively: softcap * tanh(s / softcap), then softmax
    slots = lay.req_to_token[row, :37 + 5].long()
    k = lay.k_cache[slots].float() if not fp8 else lay.k_cache[slots].view(torch.float8_e4m3fn).float() * lay.k_scale
    v = lay.v_cache[slots].float() if not fp8 else lay.v_cache[slots].view(torch.float8_e4m3fn).float() * lay.v_scale
    first = 0 if window is None else 37 + 4 - window + 1
    s = (q[30 + 4].cpu().view(2, 3, 16)[:, :, None, :] * k.cpu().transpose(0, 1)[:, None, first:, :]).sum(-1) * 0.3
    p = torch.softmax(softcap * torch.tanh(s / softcap), dim=-1)  # [2, 3, keys]
    naive = (p[..., None] * v.cpu().transpose(0, 1)[:, None, first:, :]).sum(-2).reshape(6, 16)
    torch.testing.assert_close(want[30 + 4].cpu(), naive, rtol=1e-5, atol=1e-5)
    assert (want - extend_attention_ref(*args, window=window)).abs().max() > 1e-3 or softcap == 50.0
    got = extend_attention(*args, max_extend_len=30, num_kv_splits=2, window=window, softcap=softcap)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    if device.type == "cpu":
        torch.testing.assert_close(extend_attention_torch(*args, window=window, softcap=softcap), want,
                                   **TOL[torch.float32])
    # decode: the last token of each request with a new query
    table, rows, lens = (lay.req_to_token, lay.req_rows, lay.seq_lens) if window is None else window_context(
        lay.req_to_token, lay.req_rows, lay.seq_lens, window)
    qd = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(5)).to(device) * 3
    dec = (qd, lay.k_cache, lay.v_cache, table, rows, lens, 0.3, lay.k_scale, lay.v_scale)
    want_d = decode_attention_ref(*dec, softcap=softcap)
    torch.testing.assert_close(decode_attention(*dec, num_kv_splits=2, softcap=softcap), want_d, **TOL[torch.float32])
    if device.type == "cpu":
        torch.testing.assert_close(decode_attention_torch(*dec, softcap=softcap), want_d, **TOL[torch.float32])


@pytest.mark.parametrize("native_on", ["0", "1"])
def test_softcap_decode_over_a_shared_prefix_and_a_long_row(kv_layout, monkeypatch, native_on):
    """The gathered decode's other score paths: a prefix three requests share (read once for
    them) and a row longer than LONG_ROW_TOKENS (read by itself in chunks); a soft-cap plans
    without the native kernel whether or not it is on."""
    from radixflow.kernels import torch_decode

    monkeypatch.setenv("RADIXFLOW_NATIVE_KERNELS", native_on)
    monkeypatch.setattr(torch_decode, "LONG_ROW_TOKENS", 100)
    seq_lens = [90, 95, 99, 150]
    lay = kv_layout([n - 1 for n in seq_lens], [1] * 4, 2, 16, torch.float32, False, torch.device("cpu"))
    lay.share_prefixes([([0, 1, 2], 80)])
    q = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(6)) * 3
    dec = (q, lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.seq_lens, 0.3)
    plan = torch_decode.plan_checked_decode(*dec, softcap=1.5)
    assert plan.native is None and plan.shared and plan.long
    torch.testing.assert_close(decode_attention_torch(*dec, softcap=1.5), decode_attention_ref(*dec, softcap=1.5),
                               **TOL[torch.float32])
