"""decode_attention_torch / extend_attention_torch (the CPU-fast twins) against the references."""
from __future__ import annotations

import pytest
import torch

from radixflow.kernels import torch_attention, torch_decode
from radixflow.kernels.decode_attention import decode_attention_ref
from radixflow.kernels.extend_attention import extend_attention_ref
from radixflow.kernels.torch_attention import extend_attention_torch
from radixflow.kernels.torch_decode import decode_attention_torch


@pytest.fixture(autouse=True)
def _torch_path_by_default(monkeypatch):
    """These tests are of the torch twins: the native kernels are off unless a test takes the
    `attention_path` fixture (both paths)."""
    monkeypatch.setenv("RADIXFLOW_NATIVE_KERNELS", "0")

# Both sides do fp32 math, summing in another order (chunked, scales folded); fp16 outputs
# can then round one fp16 ulp apart (~1e-3 near 1).
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=1e-3, atol=1e-3),
       torch.bfloat16: dict(rtol=8e-3, atol=8e-3)}

# (prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, fp8): GQA 1/4/8, head dims
# 64/80/128 and odd ones, empty and long prefixes, extend_len 0 rows, extends past one query chunk
EXTEND_CASES = [
    ([0], [7], 2, 2, 16, torch.float32, False),
    ([0, 37, 301], [7, 20, 1], 8, 2, 64, torch.float16, False),
    ([1, 0, 37, 5, 301], [1, 7, 20, 0, 3], 8, 1, 80, torch.float16, True),
    ([301, 0, 1], [20, 1, 131], 3, 3, 96, torch.float32, True),
    ([37], [263], 8, 2, 128, torch.float32, False),
    ([5, 37, 0], [33, 1, 7], 6, 2, 32, torch.bfloat16, False),
    ([0, 600], [257, 2], 12, 4, 64, torch.float32, True),  # the small model's head shapes
]

# (seq_lens (0 = CUDA-graph padding row), num_heads, num_kv_heads, head_dim, dtype, fp8)
DECODE_CASES = [
    ([1], 2, 2, 16, torch.float32, False),
    ([38, 0, 131], 8, 2, 64, torch.float16, False),
    ([2, 131, 21, 0, 8], 8, 1, 80, torch.float16, True),
    ([131, 1, 8], 3, 3, 96, torch.float32, True),
    ([57, 700], 16, 2, 128, torch.float32, False),
    ([0, 45, 7], 6, 2, 32, torch.bfloat16, False),
    ([0, 0], 4, 1, 64, torch.float32, False),  # padding only
    ([1050, 3, 0, 997], 12, 4, 64, torch.float32, True),
]


def _extend_args(lay, q, sm_scale):
    return (q, lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.prefix_lens, lay.extend_lens,
            lay.extend_starts, sm_scale, lay.k_scale, lay.v_scale)


def _decode_args(lay, q, sm_scale):
    return (q, lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.seq_lens, sm_scale,
            lay.k_scale, lay.v_scale, 8)


def _decode_layout(kv_layout, seq_lens, num_kv_heads, head_dim, dtype, fp8, device):
    # decode: the new token is the context's last one, already stored
    prefix_lens = [max(s - 1, 0) for s in seq_lens]
    return kv_layout(prefix_lens, [min(s, 1) for s in seq_lens], num_kv_heads, head_dim, dtype, fp8, device)


@pytest.mark.parametrize("prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, fp8", EXTEND_CASES)
def test_extend_matches_ref(kv_layout, device, attention_path, prefix_lens, extend_lens, num_heads, num_kv_heads,
                            head_dim, dtype, fp8):
    lay = kv_layout(prefix_lens, extend_lens, num_kv_heads, head_dim, dtype, fp8, device)
    q = torch.randn(sum(extend_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    args = _extend_args(lay, q, head_dim ** -0.5)
    out = extend_attention_torch(*args)
    assert out.shape == q.shape and out.dtype == dtype
    assert out.isfinite().all()  # slot 0 (NaN) and stale table entries are never read
    torch.testing.assert_close(out, extend_attention_ref(*args), **TOL[dtype])


@pytest.mark.parametrize("seq_lens, num_heads, num_kv_heads, head_dim, dtype, fp8", DECODE_CASES)
def test_decode_matches_ref(kv_layout, device, attention_path, seq_lens, num_heads, num_kv_heads, head_dim, dtype, fp8):
    lay = _decode_layout(kv_layout, seq_lens, num_kv_heads, head_dim, dtype, fp8, device)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    args = _decode_args(lay, q, head_dim ** -0.5)
    out = decode_attention_torch(*args)
    assert out.shape == q.shape and out.dtype == dtype
    assert out.isfinite().all()
    torch.testing.assert_close(out, decode_attention_ref(*args), **TOL[dtype])
    padding = lay.seq_lens == 0
    assert torch.equal(out[padding], torch.zeros_like(out[padding]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_strided_q_and_padding_rows(kv_layout, device, attention_path, dtype):
    lay = kv_layout([3, 40], [5, 9], 2, 16, dtype, False, device)
    qkv = torch.randn(14 + 2, 3 * 4 * 16, device=device, dtype=dtype)
    q = qkv[:, : 4 * 16].view(16, 4, 16)  # a view into a fused qkv projection, 2 padding rows at the end
    assert not q.is_contiguous()
    args = _extend_args(lay, q, 0.25)
    out = extend_attention_torch(*args)
    torch.testing.assert_close(out, extend_attention_ref(*args), **TOL[dtype])
    assert torch.equal(out[14:], torch.zeros_like(out[14:]))  # rows no request covers

    lay = _decode_layout(kv_layout, [30, 9], 2, 16, dtype, False, device)
    q = qkv[:2, : 4 * 16].view(2, 4, 16)
    args = _decode_args(lay, q, 0.25)
    torch.testing.assert_close(decode_attention_torch(*args), decode_attention_ref(*args), **TOL[dtype])


def test_decode_equals_extend_with_one_new_token(kv_layout, attention_path):
    lay = _decode_layout(kv_layout, [12, 1, 40, 0], 2, 16, torch.float32, True, torch.device("cpu"))
    q = torch.randn(4, 4, 16)
    decode = decode_attention_torch(*_decode_args(lay, q, 0.25))
    extend = extend_attention_torch(*_extend_args(lay, q, 0.25))
    torch.testing.assert_close(decode, extend, rtol=1e-6, atol=1e-6)


def test_empty_batch(kv_layout, device, attention_path):
    lay = kv_layout([], [], 2, 16, torch.float32, False, device)
    q = torch.zeros(0, 2, 16, device=device)
    assert decode_attention_torch(*_decode_args(lay, q, 1.0)).shape == (0, 2, 16)
    assert extend_attention_torch(*_extend_args(lay, q, 1.0)).shape == (0, 2, 16)


def test_validation_errors(kv_layout):
    lay = kv_layout([2], [3], 2, 16, torch.float32, False, torch.device("cpu"))
    q = torch.randn(3, 4, 16)
    with pytest.raises(ValueError, match="head_dim"):
        extend_attention_torch(*_extend_args(lay, torch.randn(3, 4, 32), 0.25))
    with pytest.raises(ValueError, match="k_scale"):
        extend_attention_torch(*_extend_args(lay, q, 0.25)[:9], 0.0)
    with pytest.raises(ValueError, match="num_kv_splits"):
        decode_attention_torch(*_decode_args(lay, q[:1], 0.25)[:9], 0)
    with pytest.raises(ValueError, match="seq_lens must have 1 entries"):
        decode_attention_torch(*_decode_args(lay, q[:1], 0.25)[:5], lay.seq_lens[:0], 0.25)


@pytest.mark.parametrize("seq_lens, num_heads, num_kv_heads, head_dim, dtype, fp8", DECODE_CASES[1:4] + DECODE_CASES[7:])
def test_decode_in_request_chunks_matches_ref(kv_layout, device, monkeypatch, seq_lens, num_heads, num_kv_heads,
                                             head_dim, dtype, fp8):
    monkeypatch.setattr(torch_decode, "GATHER_CHUNK_TOKENS", 300)  # 1-2 requests per gather
    lay = _decode_layout(kv_layout, seq_lens, num_kv_heads, head_dim, dtype, fp8, device)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    args = _decode_args(lay, q, head_dim ** -0.5)
    torch.testing.assert_close(decode_attention_torch(*args), decode_attention_ref(*args), **TOL[dtype])


def _as_runs(lay, broken_at: int | None = None):
    """Give each request of `lay` one ascending run of slots, back to back from slot 1, as a fresh
    pool hands out a long prefill. `broken_at`: position of the first request's run that takes the
    pool's last slot instead (no run uses it), so the run is out of place there but keeps its ends."""
    base = 1
    for row, seq_len in zip(lay.req_rows.tolist(), lay.seq_lens.tolist()):
        if seq_len:
            lay.req_to_token[row, :seq_len] = torch.arange(base, base + seq_len, dtype=torch.int32)
            base += seq_len
    if broken_at is not None:
        lay.req_to_token[int(lay.req_rows[0]), broken_at] = lay.k_cache.shape[0] - 1
    return lay


@pytest.fixture
def force_path(monkeypatch):
    """force_path("chunked" | "sdpa"): every request takes that path (small chunks, so a
    5,000-token context spans several); returns the list of paths taken, one per request."""
    def force(path: str) -> list[str]:
        taken = []
        chunked, sdpa = torch_attention._attend_chunked, torch_attention._attend_sdpa
        monkeypatch.setattr(torch_attention, "MIN_CHUNKED_CONTEXT_FLOATS", 0 if path == "chunked" else 1 << 62)
        monkeypatch.setattr(torch_attention, "MIN_CHUNK_TOKENS", 700)
        monkeypatch.setattr(torch_attention, "_attend_chunked", lambda *a: taken.append("chunked") or chunked(*a))
        monkeypatch.setattr(torch_attention, "_attend_sdpa", lambda *a: taken.append("sdpa") or sdpa(*a))
        return taken
    return force


# (prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, fp8): a long prefix, none,
# one new token and several, GQA 1/2/4, a request past MAX_CHUNKED_EXTEND (SDPA either way)
CHUNKED_CASES = [
    ([5000], [1], 4, 2, 16, torch.float32, False),
    ([5000, 0, 37], [16, 9, 1], 4, 1, 16, torch.float32, False),
    ([4999, 1], [64, 1], 8, 2, 64, torch.float32, True),
    ([2100, 0], [5, 3], 3, 3, 32, torch.float16, False),
    ([0, 700], [1, 200], 4, 2, 16, torch.float32, False),
]


@pytest.mark.parametrize("path", ["chunked", "sdpa"])
@pytest.mark.parametrize("slots", ["shuffled", "runs", "run with one slot out of place"])
@pytest.mark.parametrize("prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, fp8", CHUNKED_CASES)
def test_extend_paths_match_ref(kv_layout, force_path, path, slots, prefix_lens, extend_lens, num_heads,
                                num_kv_heads, head_dim, dtype, fp8):
    lay = kv_layout(prefix_lens, extend_lens, num_kv_heads, head_dim, dtype, fp8, torch.device("cpu"))
    if slots != "shuffled":
        _as_runs(lay, broken_at=prefix_lens[0] // 2 if slots != "runs" else None)
    q = torch.randn(sum(extend_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(1)).to(dtype)
    args = _extend_args(lay, q, head_dim ** -0.5)
    taken = force_path(path)
    out = extend_attention_torch(*args)
    expected = [path if e <= torch_attention.MAX_CHUNKED_EXTEND else "sdpa" for e in extend_lens if e]
    assert taken == expected
    assert out.isfinite().all()
    torch.testing.assert_close(out, extend_attention_ref(*args), **TOL[dtype])


def test_run_start():
    run = torch.arange(7, 7 + 300, dtype=torch.int32)
    assert torch_attention._run_start(run) == 7
    assert torch_attention._run_start(run[:1]) == 7
    assert torch_attention._run_start(run.long()) == 7
    moved = run.clone()
    moved[150] = 1000  # one slot out of place: first, last and length still match a run
    assert torch_attention._run_start(moved) is None
    assert torch_attention._run_start(run.flip(0)) is None
    assert torch_attention._run_start(run[::2].contiguous()) is None


@pytest.mark.parametrize("extend_len, num_kv_heads, head_dim, context_len, path", [
    (16, 2, 16, 100_016, "chunked"),  # a short turn after a long prefix
    (16, 2, 16, 20_016, "sdpa"),  # below MIN_CHUNKED_CONTEXT_FLOATS
    (1, 4, 64, 4_097, "chunked"),
    (129, 4, 64, 30_000, "sdpa"),  # past MAX_CHUNKED_EXTEND
])
def test_path_rule(monkeypatch, extend_len, num_kv_heads, head_dim, context_len, path):
    taken = []
    monkeypatch.setattr(torch_attention, "_attend_chunked", lambda *a: taken.append("chunked"))
    monkeypatch.setattr(torch_attention, "_attend_sdpa", lambda *a: taken.append("sdpa") or a[0])
    cache = torch.zeros(context_len, num_kv_heads, head_dim)
    q = torch.zeros(extend_len, 2 * num_kv_heads, head_dim)
    torch_attention._attend_request(q, cache, cache, torch.arange(context_len), context_len - extend_len,
                                    1.0, 1.0, 1.0)
    assert taken == [path]


# (seq_lens, groups of (batch indices, shared prefix length), num_heads, num_kv_heads, head_dim, dtype, fp8)
SHARED_CASES = [
    ([300, 300, 300], [([0, 1, 2], 200)], 4, 2, 16, torch.float32, False),
    ([300, 0, 90, 301, 250], [([0, 3, 4], 249)], 8, 2, 64, torch.float16, False),  # one member's last-but-one token
    ([100, 140, 0, 170, 200, 65], [([0, 1], 99), ([3, 4], 120)], 6, 2, 32, torch.float32, True),  # two groups, fp8
    ([9000, 8800], [([0, 1], 8700)], 4, 1, 16, torch.float32, False),  # prefix over several shared chunks
    ([500, 400, 300], [([0, 1, 2], 70)], 12, 4, 64, torch.bfloat16, False),
]


def _check_decode_matches_ref(lay, num_heads: int, head_dim: int, dtype: torch.dtype, device) -> None:
    """decode_attention_torch over `lay` equals the reference; padding rows (seq_len 0) are zero."""
    q = torch.randn(len(lay.seq_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    args = _decode_args(lay, q, head_dim ** -0.5)
    out = decode_attention_torch(*args)
    assert out.isfinite().all()
    torch.testing.assert_close(out, decode_attention_ref(*args), **TOL[dtype])
    padding = lay.seq_lens == 0
    assert torch.equal(out[padding], torch.zeros_like(out[padding]))


@pytest.mark.parametrize("seq_lens, groups, num_heads, num_kv_heads, head_dim, dtype, fp8", SHARED_CASES)
def test_decode_over_shared_prefixes_matches_ref(kv_layout, device, attention_path, seq_lens, groups, num_heads,
                                                 num_kv_heads, head_dim, dtype, fp8):
    lay = _decode_layout(kv_layout, seq_lens, num_kv_heads, head_dim, dtype, fp8, device)
    lay.share_prefixes(groups)
    plan = torch_decode.plan_decode(lay.req_to_token, lay.req_rows, lay.seq_lens)
    assert sorted((p.rows.tolist(), p.slots.shape[0]) for p in plan.shared) == sorted(groups)  # found, exactly
    _check_decode_matches_ref(lay, num_heads, head_dim, dtype, device)


def test_short_or_unshared_prefixes_take_the_plain_gather(kv_layout):
    lay = _decode_layout(kv_layout, [300, 300, 40, 40, 200], 2, 16, torch.float32, False, torch.device("cpu"))
    lay.share_prefixes([([0, 1], torch_decode.MIN_SHARED_PREFIX_TOKENS - 1), ([2, 3], 39)])
    assert torch_decode.plan_decode(lay.req_to_token, lay.req_rows, lay.seq_lens).shared == []


def test_shared_prefix_plan_reads_only_each_rows_own_slots(kv_layout):
    """After a shared prefix, a row's gathered slots are its own context past the prefix."""
    lay = _decode_layout(kv_layout, [150, 120], 2, 16, torch.float32, False, torch.device("cpu"))
    lay.share_prefixes([([0, 1], 100)])
    plan = torch_decode.plan_decode(lay.req_to_token, lay.req_rows, lay.seq_lens)
    (chunk,) = plan.chunks
    assert chunk.length == 50 and chunk.rows.tolist() == [0, 1]
    rows = chunk.slots.view(2, 50)
    table = lay.req_to_token[lay.req_rows]
    assert torch.equal(rows[0], table[0, 100:150].long())
    assert torch.equal(rows[1, :20], table[1, 100:120].long())
    assert torch.equal(rows[1, 20:], table[1, 100].long().expand(30))  # padding: its first own slot, hidden
    assert chunk.visible.view(2, 50).sum(dim=1).tolist() == [50, 20]


# (seq_lens, shared-prefix groups, rows read alone, num_heads, num_kv_heads, head_dim, dtype, fp8),
# with LONG_ROW_TOKENS at 256: one long row among short ones, two long rows and a padding row, long
# own parts after a shared prefix, two long rows side by side, a long row beside a padding row
LONG_CASES = [
    ([2000, 40, 7], [], [0], 4, 2, 16, torch.float32, False),
    ([900, 30, 1300, 0], [], [0, 2], 8, 2, 64, torch.float16, False),
    ([1500, 1400, 60], [([0, 1], 300)], [0, 1], 6, 2, 32, torch.float32, True),
    ([700, 800, 256], [], [0, 1], 12, 4, 64, torch.bfloat16, False),
    ([0, 5000], [], [1], 4, 1, 16, torch.float32, False),
]


@pytest.mark.parametrize("seq_lens, groups, alone, num_heads, num_kv_heads, head_dim, dtype, fp8", LONG_CASES)
def test_a_long_context_is_read_alone_not_gathered_whole(kv_layout, device, monkeypatch, seq_lens, groups,
                                                        alone, num_heads, num_kv_heads, head_dim, dtype, fp8):
    """Rows whose own context passes LONG_ROW_TOKENS are read by themselves in chunks of
    SHARED_CHUNK_TOKENS (a 100K-token row gathered whole to fp32 would be ~77 MB a layer); each
    keeps one placeholder column in the gathered layout."""
    monkeypatch.setattr(torch_decode, "LONG_ROW_TOKENS", 256)
    monkeypatch.setattr(torch_decode, "SHARED_CHUNK_TOKENS", 256)  # a long row spans several chunks
    lay = _decode_layout(kv_layout, seq_lens, num_kv_heads, head_dim, dtype, fp8, device)
    lay.share_prefixes(groups)
    plan = torch_decode.plan_decode(lay.req_to_token, lay.req_rows, lay.seq_lens)
    starts = {row: length for rows, length in groups for row in rows}
    own = [s - starts.get(i, 0) for i, s in enumerate(seq_lens)]
    assert [row for row, _ in plan.long] == alone
    table = lay.req_to_token[lay.req_rows].long()
    for row, slots in plan.long:
        assert torch.equal(slots, table[row, starts.get(row, 0): seq_lens[row]])
    lengths = {r: c.visible[i].sum().item() for c in plan.chunks for i, r in enumerate(c.rows.tolist())}
    assert lengths == {i: 1 if i in alone else max(n, 1) for i, n in enumerate(own)}
    _check_decode_matches_ref(lay, num_heads, head_dim, dtype, device)


def test_rows_are_gathered_in_chunks_of_like_lengths():
    """Rows are sorted by their own length and each chunk is padded to its longest row, not the
    batch's: a batch of lengths spread over 100..2000 gathers close to its sum of lengths (padding
    every row to the longest made the decode step's attention 1.6-1.75x slower, measured)."""
    import random

    rng = random.Random(0)
    lengths = [rng.randrange(100, 2000) for _ in range(64)]
    table = torch.arange(1, 64 * 2001 + 1, dtype=torch.int32).view(64, 2001)
    plan = torch_decode.plan_decode(table, torch.arange(64), torch.tensor(lengths))
    gathered = sum(c.rows.numel() * c.length for c in plan.chunks)
    assert gathered <= 1.05 * sum(lengths)  # every row padded to the longest: 1.69x the sum here
    assert sorted(r for c in plan.chunks for r in c.rows.tolist()) == list(range(64))
    for c in plan.chunks:
        own = [lengths[r] for r in c.rows.tolist()]
        assert c.length == max(own) and c.rows.numel() * c.length <= max(torch_decode.GATHER_CHUNK_TOKENS, c.length)
        assert c.visible.view(len(own), c.length).sum(dim=1).tolist() == own
    assert plan.order is not None and plan.order.tolist() == [r for c in plan.chunks for r in c.rows.tolist()]
    # rows already longest first (equal ones, say): the batch's own order, nothing permuted
    plan = torch_decode.plan_decode(table, torch.arange(8), torch.full((8,), 100))
    assert plan.order is None and [c.rows.tolist() for c in plan.chunks] == [list(range(8))]


@pytest.mark.parametrize("seq_lens, dtype, fp8", [
    ([5, 300, 0, 17, 290, 1, 64, 150, 0, 299, 33], torch.float32, False),
    ([120, 7, 260, 260, 3, 0, 90], torch.bfloat16, False),
    ([40, 600, 41, 2, 599, 300], torch.float16, True),
])
def test_decode_over_chunks_of_like_lengths_matches_ref(kv_layout, device, monkeypatch, seq_lens, dtype, fp8):
    """Rows of many lengths in several chunks (GATHER_CHUNK_TOKENS lowered), with a shared
    prefix group and padding rows: outputs land in their own rows and equal the reference."""
    monkeypatch.setattr(torch_decode, "GATHER_CHUNK_TOKENS", 300)
    lay = _decode_layout(kv_layout, seq_lens, 2, 32, dtype, fp8, device)
    if dtype == torch.float32:
        lay.share_prefixes([([1, 4], 200)])
    plan = torch_decode.plan_decode(lay.req_to_token, lay.req_rows, lay.seq_lens)
    assert len(plan.chunks) >= 3
    _check_decode_matches_ref(lay, 8, 32, dtype, device)
