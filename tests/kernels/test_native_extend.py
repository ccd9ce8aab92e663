"""The native CPU extend kernel (kernels/cpu_extend.c through kernels/native.py): equal to the
reference over the engine's slot layout, taken by extend_attention_torch only where it applies,
and a layout out of range is a ValueError, never a read outside the tensors."""
from __future__ import annotations

import subprocess

import pytest
import torch

from radixflow.kernels import native, torch_attention
from radixflow.kernels.extend_attention import extend_attention_ref
from radixflow.kernels.torch_attention import extend_attention_torch

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=8e-3, atol=8e-3)}

# (prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype): GQA groups 1-64, head
# dims 16-256, no prefix and long ones, extends shorter and longer than one tile (32 tokens at
# small groups) and one key block (32), extend_len 0 rows, a 5,000-token prefix
CASES = [
    ([0], [1], 2, 2, 16, torch.float32),
    ([0], [222], 9, 3, 64, torch.bfloat16),  # SmolLM2's heads, a typical prompt
    ([0, 37, 301, 5], [7, 20, 1, 0], 8, 2, 64, torch.float32),
    ([31, 32, 33], [33, 32, 31], 12, 4, 64, torch.bfloat16),
    ([5000, 0], [16, 65], 9, 3, 64, torch.bfloat16),
    ([17], [100], 32, 8, 128, torch.float32),
    ([3, 0], [40, 5], 64, 1, 16, torch.bfloat16),  # a group of 64: one token a tile
    ([2, 9], [9, 2], 32, 16, 256, torch.float32),
    ([60], [70], 5, 1, 80, torch.float32),
]


def _args(lay, q):
    return (q, lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.prefix_lens, lay.extend_lens,
            lay.extend_starts, q.shape[-1] ** -0.5)


@pytest.fixture
def built(native_built):
    """The native kernels are built (or, without a compiler, the test skipped)."""


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("wide", [False, True], ids=["int32 table", "int64 table"])
@pytest.mark.parametrize("prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype", CASES)
def test_matches_ref(built, kv_layout, on_threads, threads, wide, prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim,
                     dtype):
    lay = kv_layout(prefix_lens, extend_lens, num_kv_heads, head_dim, dtype, False, torch.device("cpu"))
    if wide:
        lay.req_to_token = lay.req_to_token.long()
    q = torch.randn(sum(extend_lens) + 2, num_heads, head_dim, generator=torch.Generator().manual_seed(5)).to(dtype)
    assert native.supports_extend(lay.k_cache, lay.v_cache, num_heads)
    out = on_threads(threads, native.extend_attention_native, *_args(lay, q))
    assert out.dtype == torch.float32 and out.shape == q.shape
    assert out.isfinite().all()  # slot 0 (NaN) and stale table entries past a context are never read
    assert (out[sum(extend_lens):] == 0).all()  # rows no request covers
    ref = extend_attention_ref(*_args(lay, q), lay.k_scale, lay.v_scale).float()
    torch.testing.assert_close(out, ref, **TOL[dtype])


def test_extend_attention_torch_takes_it_where_it_applies(built, kv_layout, monkeypatch):
    calls = []
    kernel = native.extend_attention_native
    monkeypatch.setattr(native, "extend_attention_native", lambda *a: calls.append(a[1].dtype) or kernel(*a))
    for dtype, fp8, head_dim, taken in [(torch.bfloat16, False, 64, True), (torch.float32, False, 128, True),
                                        (torch.float16, False, 64, False), (torch.float32, True, 64, False),
                                        (torch.float32, False, 24, False)]:
        calls.clear()
        lay = kv_layout([5, 0], [9, 4], 2, head_dim, dtype, fp8, torch.device("cpu"))
        q = torch.randn(13, 4, head_dim, generator=torch.Generator().manual_seed(1)).to(dtype)
        args = (*_args(lay, q), lay.k_scale, lay.v_scale)
        out = extend_attention_torch(*args)
        assert bool(calls) == taken, (dtype, fp8, head_dim)
        assert out.dtype == dtype
        tol = TOL.get(dtype, dict(rtol=1e-3, atol=1e-3))
        torch.testing.assert_close(out, extend_attention_ref(*args), **tol)


def test_turned_off_it_is_not_taken(built, kv_layout, monkeypatch):
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    monkeypatch.setattr(native, "extend_attention_native", lambda *a: pytest.fail("the kernel is off"))
    lay = kv_layout([3], [5], 2, 64, torch.float32, False, torch.device("cpu"))
    q = torch.randn(5, 4, 64)
    torch.testing.assert_close(extend_attention_torch(*_args(lay, q)), extend_attention_ref(*_args(lay, q)),
                               **TOL[torch.float32])


@pytest.mark.parametrize("break_it", ["slot past the pool", "negative slot", "row past the table",
                                      "context past the table", "q rows past q"])
def test_a_layout_out_of_range_is_a_value_error(built, kv_layout, break_it):
    lay = kv_layout([4, 2], [3, 5], 1, 16, torch.float32, False, torch.device("cpu"))
    q = torch.randn(8, 2, 16)
    row = int(lay.req_rows[1])
    if break_it == "slot past the pool":
        lay.req_to_token[row, 6] = lay.k_cache.shape[0]
    elif break_it == "negative slot":
        lay.req_to_token[row, 0] = -1
    elif break_it == "row past the table":
        lay.req_rows[1] = lay.req_to_token.shape[0]
    elif break_it == "context past the table":
        lay.prefix_lens[1] = lay.req_to_token.shape[1]
    else:
        lay.extend_starts[1] = 6
    with pytest.raises(ValueError, match="out of range"):
        native.extend_attention_native(*_args(lay, q))


def test_the_torch_path_stays_for_other_caches(kv_layout, monkeypatch):
    """Without the library (no compiler, or turned off) every cache takes the per-request torch path."""
    monkeypatch.setattr(native, "library", lambda: None)
    taken = []
    sdpa = torch_attention._attend_sdpa
    monkeypatch.setattr(torch_attention, "_attend_sdpa", lambda *a: taken.append(1) or sdpa(*a))
    lay = kv_layout([0, 7], [6, 2], 2, 64, torch.bfloat16, False, torch.device("cpu"))
    q = torch.randn(8, 4, 64).to(torch.bfloat16)
    out = extend_attention_torch(*_args(lay, q))
    assert taken == [1, 1]
    torch.testing.assert_close(out, extend_attention_ref(*_args(lay, q)), **TOL[torch.bfloat16])


def test_bf16_caches_take_pair_products_where_the_cpu_has_them(built):
    """A CPU with AVX512-BF16 (this CI's has), and a compiler that knows it, build the bf16
    extend on bf16 pair products."""
    if "avx512_bf16" not in native._cpu_flags().split():
        pytest.skip("this CPU has no AVX512-BF16")
    macros = subprocess.run([native._compiler(), "-march=native", "-dM", "-E", "-"], input="", capture_output=True,
                            text=True, timeout=60).stdout
    if "__AVX512BF16__" not in macros:
        pytest.skip("the C compiler does not target AVX512-BF16 here")
    assert native.extend_bf16_pairs()


@pytest.mark.parametrize("prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim",
                         [([0, 5000], [222, 17], 9, 3, 64), ([31, 2], [33, 1], 4, 2, 16), ([3], [40], 64, 1, 16)])
def test_bf16_without_pair_products_matches_ref(build_without, kv_layout, prefix_lens, extend_lens, num_heads,
                                                num_kv_heads, head_dim):
    """The portable bf16 path (fp32 products of the bf16 entries), as a CPU without AVX512-BF16
    builds it: here the compiler is told to leave the instructions out."""
    build_without("-mno-avx512bf16")
    assert native.library() is not None and not native.extend_bf16_pairs()
    lay = kv_layout(prefix_lens, extend_lens, num_kv_heads, head_dim, torch.bfloat16, False, torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(sum(extend_lens), num_heads, head_dim, generator=gen).to(torch.bfloat16)
    out = native.extend_attention_native(*_args(lay, q))
    torch.testing.assert_close(out, extend_attention_ref(*_args(lay, q)).float(), **TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, prefix_len, num_heads, num_kv_heads, head_dim",
                         [(1, 1, 2, 2, 16), (7, 250, 8, 2, 32), (40, 1500, 9, 3, 64), (3, 33, 64, 1, 16)])
def test_prefix_attention_matches_a_direct_softmax(built, rows, prefix_len, num_heads, num_kv_heads, head_dim,
                                                     dtype):
    """prefix_attention_native: every row over the same slots (more rows than one tile: 40 x 3
    query heads per KV head), out and the natural-log softmax denominator, against fp64 math."""
    gen = torch.Generator().manual_seed(11)
    k = torch.randn(prefix_len + 9, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(prefix_len + 9, num_kv_heads, head_dim, generator=gen).to(dtype)
    slots = torch.randperm(prefix_len + 9, generator=gen)[:prefix_len]
    q = torch.randn(rows, num_heads, head_dim, generator=gen).to(dtype)
    scale = head_dim ** -0.5
    out, lse = native.prefix_attention_native(q, k, v, slots, scale)
    group = num_heads // num_kv_heads
    kk = k[slots].double().repeat_interleave(group, dim=1)  # [prefix_len, num_heads, head_dim]
    vv = v[slots].double().repeat_interleave(group, dim=1)
    scores = torch.einsum("rhd,phd->rhp", q.double(), kk) * scale
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, dim=-1), rtol=1e-5, atol=1e-5)
    ref = torch.einsum("rhp,phd->rhd", torch.softmax(scores, dim=-1), vv)
    torch.testing.assert_close(out.double(), ref, **TOL[torch.float32])


@pytest.mark.parametrize("slots", [torch.tensor([0, 1, 99]), torch.tensor([-1, 2]),
                                   torch.tensor([], dtype=torch.int64)])
def test_prefix_attention_refuses_slots_out_of_range_or_none(built, slots):
    k = torch.randn(10, 1, 16)
    with pytest.raises(ValueError):
        native.prefix_attention_native(torch.randn(2, 2, 16), k, k.clone(), slots, 0.25)


def test_calls_give_back_their_scratch(built, kv_layout, mapped_bytes):
    """Each call allocates its threads' scratch (~400 KB) and frees it: 1,000 calls leave the
    process's memory where it was (1,000 lost scratches would be ~400 MB)."""
    lay = kv_layout([8], [4], 1, 16, torch.float32, False, torch.device("cpu"))
    q = torch.randn(4, 2, 16)
    native.extend_attention_native(*_args(lay, q))
    before = mapped_bytes()
    for _ in range(1000):
        native.extend_attention_native(*_args(lay, q))
    assert mapped_bytes() - before < 64 << 20
