"""The native CPU decode kernel (kernels/cpu_decode.c through kernels/native.py): equal to the
reference over the engine's slot layout, taken only where it applies, and a missing or failing
compiler falls back to the torch path (for the extend kernel built beside it too)."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from radixflow.kernels import native, torch_decode
from radixflow.kernels.decode_attention import decode_attention_ref
from radixflow.kernels.torch_decode import decode_attention_torch

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=8e-3, atol=8e-3)}

# (seq_lens (0 = padding row), num_heads, num_kv_heads, head_dim, dtype): GQA groups 1-32, up to
# 64 heads, head dims 16-256, contexts shorter and longer than one block of 32 tokens (and than
# the prefetch distance), a 5,000-token row
CASES = [
    ([1], 2, 2, 16, torch.float32),
    ([33, 0, 131, 32], 9, 3, 64, torch.bfloat16),
    ([5000, 7], 9, 3, 64, torch.bfloat16),
    ([64, 65, 1], 32, 8, 128, torch.float32),
    ([300, 31], 16, 1, 256, torch.bfloat16),
    ([0, 0], 4, 1, 64, torch.float32),
    ([3, 40], 64, 2, 64, torch.bfloat16),
    ([2, 9], 32, 16, 256, torch.float32),
]


def _layout(kv_layout, seq_lens, num_kv_heads, head_dim, dtype):
    prefix_lens = [max(s - 1, 0) for s in seq_lens]
    return kv_layout(prefix_lens, [min(s, 1) for s in seq_lens], num_kv_heads, head_dim, dtype, False,
                     torch.device("cpu"))


def _args(lay, q):
    return (q, lay.k_cache, lay.v_cache, lay.req_to_token, lay.req_rows, lay.seq_lens, q.shape[-1] ** -0.5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seq_lens, num_heads, num_kv_heads, head_dim, dtype", CASES)
def test_matches_ref(kv_layout, attention_path, on_threads, threads, seq_lens, num_heads, num_kv_heads, head_dim, dtype):
    lay = _layout(kv_layout, seq_lens, num_kv_heads, head_dim, dtype)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=torch.Generator().manual_seed(3)).to(dtype)
    plan = torch_decode.plan_checked_decode(*_args(lay, q))
    assert (plan.native is not None) == (attention_path == "native")
    out = on_threads(threads, decode_attention_torch, *_args(lay, q))
    assert out.dtype == dtype and out.isfinite().all()
    torch.testing.assert_close(out, decode_attention_ref(*_args(lay, q)), **TOL[dtype])
    padding = lay.seq_lens == 0
    assert torch.equal(out[padding], torch.zeros_like(out[padding]))


# (seq_lens, shared prefix groups): one request, one long and one empty row, a long row in a
# shared-prefix group, more requests than threads (no split)
SPLIT_CASES = [([300], []), ([0, 200], []), ([260, 250, 9], [([0, 1], 100)]), ([90, 80, 70, 60, 50], [])]


@pytest.mark.parametrize("seq_lens, groups", SPLIT_CASES)
def test_long_rows_split_over_idle_threads_match_ref(kv_layout, attention_path, on_threads, monkeypatch, seq_lens,
                                                    groups):
    """With fewer requests than threads, a long context is cut into pieces (SPLIT_PIECE_TOKENS
    lowered here) that the threads read at once, then merged."""
    monkeypatch.setattr(torch_decode, "SPLIT_PIECE_TOKENS", 16)
    lay = _layout(kv_layout, seq_lens, 2, 32, torch.float32)
    lay.share_prefixes(groups)
    q = torch.randn(len(seq_lens), 6, 32, generator=torch.Generator().manual_seed(4))
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        plan = torch_decode.plan_checked_decode(*_args(lay, q))
    finally:
        torch.set_num_threads(before)
    out = on_threads(4, decode_attention_torch, *_args(lay, q))
    if attention_path == "native":
        split = plan.native.rows is not None
        assert split == (len(seq_lens) <= 2), plan.native  # 4 threads: pieces for up to 2 requests
        if split:
            assert plan.native.rows.numel() > len(seq_lens)
    torch.testing.assert_close(out, decode_attention_ref(*_args(lay, q)), **TOL[torch.float32])
    padding = lay.seq_lens == 0
    assert torch.equal(out[padding], torch.zeros_like(out[padding]))


@pytest.mark.parametrize("members, threads, head_dim", [(7, 1, 32), (7, 4, 32), (8, 1, 32), (20, 1, 32), (20, 2, 32),
                                                    (20, 1, 40)])
def test_a_shared_prefix_is_read_once_by_a_kernel(kv_layout, attention_path, on_threads, monkeypatch, members,
                                                  threads, head_dim):
    """A prefix shared by 7 requests x 8 query heads (56 <= 64) is read once by the decode kernel
    (with 4 threads, in pieces); by 8 requests (64 heads) too; by 20 (160 heads) the extend kernel
    (not causal) reads it once for all of them; a head_dim it does not take (40: not a multiple of
    16) goes to the gathered matmuls."""
    monkeypatch.setattr(torch_decode, "SPLIT_PIECE_TOKENS", 32)
    monkeypatch.setattr(torch_decode, "NATIVE_SHARED_MIN_READS", 0)  # split whatever the group saves
    calls, prefix_calls = [], []
    real, real_prefix = native.decode_attention_native, native.prefix_attention_native
    monkeypatch.setattr(native, "decode_attention_native", lambda *a: calls.append(tuple(a[0].shape)) or real(*a))
    monkeypatch.setattr(native, "prefix_attention_native",
                        lambda *a: prefix_calls.append((tuple(a[0].shape), a[3].numel())) or real_prefix(*a))
    lay = _layout(kv_layout, [300 + i for i in range(members)], 2, head_dim, torch.float32)
    lay.share_prefixes([(list(range(members)), 250)])
    q = torch.randn(members, 8, head_dim, generator=torch.Generator().manual_seed(6))
    out = on_threads(threads, decode_attention_torch, *_args(lay, q))
    torch.testing.assert_close(out, decode_attention_ref(*_args(lay, q)), **TOL[torch.float32])
    if attention_path == "native":
        own = (members, 8, head_dim)  # the requests' own suffixes
        if members * 8 <= native.MAX_HEADS:
            pieces = 1 if threads == 1 else 4
            assert calls == [own, (pieces, members * 8, head_dim)] and prefix_calls == []
        else:
            assert calls == [own]
            assert prefix_calls == ([] if head_dim % native.EXTEND_VEC else [(own, 250)])


@pytest.mark.parametrize("members, prefix_len, split", [(3, 500, False), (4, 1500, False), (9, 2100, True),
                                                      (20, 900, True)])
def test_the_native_path_splits_a_shared_prefix_only_where_that_saves_enough(kv_layout, attention_path, members,
                                                                            prefix_len, split):
    """On the native kernels, reading a shared prefix once and merging its part back costs more
    than each member reading it again when the group is small: the prefix is split off only where
    the other members' reads of it come to NATIVE_SHARED_MIN_READS tokens. The torch path, whose
    gathered matmuls pay per token read, always splits."""
    lay = _layout(kv_layout, [prefix_len + 5 + i for i in range(members)], 1, 16, torch.float32)
    lay.share_prefixes([(list(range(members)), prefix_len)])
    q = torch.randn(members, 2, 16, generator=torch.Generator().manual_seed(2))
    plan = torch_decode.plan_checked_decode(*_args(lay, q))
    assert len(plan.shared) == (1 if split or attention_path != "native" else 0)
    torch.testing.assert_close(decode_attention_torch(*_args(lay, q)), decode_attention_ref(*_args(lay, q)),
                               **TOL[torch.float32])


def test_lse_is_the_log_of_the_softmax_denominator(monkeypatch):
    """The second output is what merging with another part of the context needs."""
    monkeypatch.setenv(native.ENV_SWITCH, "1")
    if native.library() is None:
        assert native._compiler() is None, "a C compiler is on PATH: the native kernel must build"
        pytest.skip("no C compiler")
    k = torch.randn(40, 1, 16)
    v = torch.randn(40, 1, 16)
    q = torch.randn(2, 2, 16)
    slots = torch.tensor([3, 9, 4] + list(range(10, 30)), dtype=torch.int64)
    offsets = torch.tensor([0, 3, 23], dtype=torch.int64)
    out, lse = native.decode_attention_native(q, k, v, slots, offsets, 0.5)
    for b, (a, e) in enumerate([(0, 3), (3, 23)]):
        scores = 0.5 * q[b] @ k[slots[a:e], 0].T  # [heads, n]
        torch.testing.assert_close(lse[b], scores.logsumexp(-1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out[b], scores.softmax(-1) @ v[slots[a:e], 0], rtol=1e-5, atol=1e-5)
    empty, lse0 = native.decode_attention_native(q[:1], k, v, slots[:0], torch.zeros(2, dtype=torch.int64), 0.5)
    assert torch.equal(empty, torch.zeros_like(empty)) and lse0.isneginf().all()


@pytest.mark.parametrize("case", ["fp16", "fp8", "128 heads", "strided cache"])
def test_what_the_kernel_does_not_take_goes_the_torch_way(kv_layout, attention_path, case):
    dtype, fp8, heads, kv_heads, dim = torch.float32, False, 4, 2, 16
    if case == "fp16":
        dtype = torch.float16
    elif case == "fp8":
        fp8 = True
    elif case == "128 heads":
        heads, kv_heads = 128, 2
    lay = kv_layout([9, 20], [1, 1], kv_heads, dim, dtype, fp8, torch.device("cpu"))
    if case == "strided cache":  # the same values, every other row of a wider buffer: the kernel reads rows densely
        lay.k_cache, lay.v_cache = (torch.stack([c, c], dim=1).flatten(0, 1)[::2] for c in (lay.k_cache, lay.v_cache))
        assert not lay.k_cache.is_contiguous()
    q = torch.randn(2, heads, dim).to(dtype)
    assert torch_decode.plan_checked_decode(*_args(lay, q)).native is None
    tol = dict(rtol=1e-3, atol=1e-3) if dtype == torch.float16 else TOL[torch.float32]
    torch.testing.assert_close(decode_attention_torch(*_args(lay, q)), decode_attention_ref(*_args(lay, q)), **tol)


def test_off_by_the_environment(kv_layout, monkeypatch):
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    assert native.library() is None
    lay = _layout(kv_layout, [12, 5], 1, 16, torch.float32)
    assert torch_decode.plan_checked_decode(*_args(lay, torch.randn(2, 2, 16))).native is None


def test_a_failing_compiler_falls_back_to_torch(kv_layout, fresh_build, monkeypatch, caplog):
    monkeypatch.setenv("CC", "false")  # exits 1 for --version and for the build
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.library() is None
    assert "torch path" in caplog.text
    lay = _layout(kv_layout, [40, 3], 2, 32, torch.float32)
    q = torch.randn(2, 4, 32)
    assert torch_decode.plan_checked_decode(*_args(lay, q)).native is None
    torch.testing.assert_close(decode_attention_torch(*_args(lay, q)), decode_attention_ref(*_args(lay, q)),
                               **TOL[torch.float32])
    assert not fresh_build.exists() or [p for p in fresh_build.iterdir() if p.suffix != ".lock"] == []  # no half-written library left behind


@pytest.fixture
def session_library(native_built) -> Path:
    """The session's own build of the kernels (asked for before fresh_build resets the loader)."""
    return Path(native.library()._name)


def test_the_build_is_cached_per_source_and_machine(session_library, fresh_build, monkeypatch):
    """Each build is a copy of the session's (the real compile runs once a session, in the
    fixtures; ~30 s on two cores), so this checks the cache keys alone."""
    compiled = []

    def compile_as_copy(cc, target):
        compiled.append(target)
        shutil.copyfile(session_library, target)
        return True
    monkeypatch.setattr(native, "_compile", compile_as_copy)
    assert native.library() is not None and len(compiled) == 1
    (built,) = fresh_build.glob("cpu_kernels-*.so")
    stamp = built.stat().st_mtime_ns
    monkeypatch.setattr(native, "_loaded", {})
    assert native.library() is not None  # a second process (here: a reset) loads it, no rebuild
    assert len(compiled) == 1
    assert sorted(p.name for p in fresh_build.iterdir()) == [built.name, built.name + ".lock"]  # no temporary left
    assert built.stat().st_mtime_ns == stamp
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(native, "_cpu_flags", lambda: "flags : another machine")
    assert native.library() is not None  # another machine's build is its own file: asked for, and loaded
    assert len(list(fresh_build.glob("cpu_kernels-*.so"))) == 2 and len(compiled) == 2 and compiled[1] != built


def test_builders_starting_together_compile_once(session_library, fresh_build, monkeypatch):
    """Two builders at once (API servers, test workers starting together): one compiles, the
    other waits on the build's lock file and loads what it made."""
    compiled = []

    def slow_compile(cc, target):
        compiled.append(target)
        time.sleep(0.5)
        shutil.copyfile(session_library, target)
        return True
    monkeypatch.setattr(native, "_compile", slow_compile)
    with ThreadPoolExecutor(2) as pool:  # _build itself: library() would serialize them in-process
        libs = list(pool.map(lambda _: native._build(), range(2)))
    assert all(lib is not None for lib in libs) and len(compiled) == 1


def test_loading_the_kernel_keeps_the_process_float_modes(tmp_path):
    """Linked with -ffast-math, a shared library sets flush-to-zero / denormals-are-zero for the
    whole process when it loads; the kernel is linked without it (a fresh process, loading the
    library from the session's build cache: its key holds the link flags, so a change to them
    builds anew)."""
    if native._compiler() is None:
        pytest.skip("no C compiler")
    script = ("import torch; from radixflow.kernels import native; assert native.library() is not None; "
              "x = torch.tensor([1e-40]); print(float((x * 0.5)[0]), 1e-310 / 2)")
    env = {**os.environ, native.ENV_SWITCH: "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, check=True).stdout.split()
    assert float(out[0]) > 0 and float(out[1]) > 0  # denormals survive


@pytest.fixture
def built(native_built):
    """The native kernels are built (or, without a compiler, the test skipped)."""


def _direct(q, k, v, slots, offsets, scale):
    """fp64 (out, lse) of each request over its slots, the natural-log softmax denominator."""
    group = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for b in range(q.shape[0]):
        idx = slots[offsets[b]:offsets[b + 1]]
        kk = k[idx].double().repeat_interleave(group, dim=1)  # [n, heads, head_dim]
        vv = v[idx].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].double(), kk) * scale
        outs.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), vv))
        lses.append(scores.logsumexp(-1))
    return torch.stack(outs), torch.stack(lses)


# (context lengths, heads, KV heads, head_dim, cache dtype): every build's cases. head_dim 16
# and 128 (fp32), 64 and 256 (bf16: pair products), 48 (bf16, a multiple of 16 but not of 32:
# fp32 products of the converted entries), 40 (not a multiple of 16: the portable loop on any
# build); blocks of 32 keys full, cut in either half, and a 16-token one
DIRECT_CASES = [
    ([1, 16, 33], 4, 2, 16, torch.float32),
    ([31, 17, 700], 9, 3, 64, torch.bfloat16),
    ([64, 5], 32, 8, 128, torch.float32),
    ([100], 16, 1, 256, torch.bfloat16),
    ([47, 32], 6, 2, 48, torch.bfloat16),
    ([20, 70], 4, 1, 40, torch.float32),
    ([3, 90], 64, 2, 64, torch.bfloat16),
]


def _check_direct(lengths, num_heads, num_kv_heads, head_dim, dtype, threads):
    gen = torch.Generator().manual_seed(5)
    total = sum(lengths)
    k = torch.randn(total + 20, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(total + 20, num_kv_heads, head_dim, generator=gen).to(dtype)
    slots = torch.randperm(total + 20, generator=gen)[:total]
    offsets = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
    q = torch.randn(len(lengths), num_heads, head_dim, generator=gen).to(dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, lse = native.decode_attention_native(q, k, v, slots, offsets, head_dim ** -0.5)
    finally:
        torch.set_num_threads(before)
    ref_out, ref_lse = _direct(q, k, v, slots, offsets, head_dim ** -0.5)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("lengths, num_heads, num_kv_heads, head_dim, dtype", DIRECT_CASES)
def test_matches_a_direct_softmax(built, lengths, num_heads, num_kv_heads, head_dim, dtype, threads):
    """out and lse against fp64 math on the build this machine makes (keys in the vector lanes
    where the CPU has AVX-512)."""
    _check_direct(lengths, num_heads, num_kv_heads, head_dim, dtype, threads)


def test_the_portable_build_matches_a_direct_softmax(build_without):
    """The loop a CPU without AVX-512 builds (here the compiler is told to leave AVX-512 out),
    every case on one build."""
    build_without("-mno-avx512f")
    assert native.library() is not None and native.decode_lanes() == 0
    for case in DIRECT_CASES:
        _check_direct(*case, threads=1)


def test_the_lanes_build_where_the_compiler_targets_avx512(built):
    macros = subprocess.run([native._compiler(), "-march=native", "-dM", "-E", "-"], input="", capture_output=True,
                            text=True, timeout=60).stdout
    if "__AVX512F__" not in macros or "__AVX512BW__" not in macros:
        pytest.skip("the C compiler does not target AVX-512 here")
    assert native.decode_lanes() == (2 if "__AVX512BF16__" in macros else 1)


def test_fp32_queries_over_a_bf16_cache_are_not_rounded(built):
    """Pair products need bf16 queries: an fp32 model's queries over a bf16 cache take fp32
    products (rounded to bf16 they would be off by ~1e-3)."""
    gen = torch.Generator().manual_seed(8)
    k = torch.randn(300, 2, 64, generator=gen).to(torch.bfloat16)
    v = torch.randn(300, 2, 64, generator=gen).to(torch.bfloat16)
    slots = torch.randperm(300, generator=gen)[:250]
    offsets = torch.tensor([0, 250])
    q = torch.randn(1, 8, 64, generator=gen) * 3
    out, lse = native.decode_attention_native(q, k, v, slots, offsets, 0.125)
    ref_out, ref_lse = _direct(q, k, v, slots, offsets, 0.125)
    rounded_out, _ = _direct(q.to(torch.bfloat16).float(), k, v, slots, offsets, 0.125)
    assert (rounded_out - ref_out).abs().max() > 1e-3  # what rounding the queries would cost
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)


def test_calls_give_back_their_scratch(built, mapped_bytes):
    """The keys-in-lanes build allocates each thread's scratch (~200 KB) per call and frees it:
    1,000 calls leave the process's memory where it was (lost, they would be ~200 MB)."""
    k = torch.randn(64, 2, 16)
    v = torch.randn(64, 2, 16)
    slots, offsets = torch.arange(40), torch.tensor([0, 40])
    q = torch.randn(1, 4, 16)
    native.decode_attention_native(q, k, v, slots, offsets, 0.25)
    before = mapped_bytes()
    for _ in range(1000):
        native.decode_attention_native(q, k, v, slots, offsets, 0.25)
    assert mapped_bytes() - before < 64 << 20


def test_a_failing_source_fails_the_build_cleanly(fresh_build, monkeypatch, tmp_path, caplog):
    """The sources compile side by side: one that fails makes library() None (the torch path),
    says which step failed, and leaves no object or partial library in the cache."""
    wrapper = tmp_path / "cc-failing"  # fails cpu_silu.c; writes an empty object for the others (no real compile)
    wrapper.write_text(f"#!{sys.executable}\n"
                       "import sys\n"
                       "args = sys.argv[1:]\n"
                       "if any(a.endswith('cpu_silu.c') for a in args):\n"
                       "    sys.exit('no silu today')\n"
                       "if '-o' in args:\n"
                       "    open(args[args.index('-o') + 1], 'wb').close()\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.library() is None
    assert "cpu_silu.c" in caplog.text and "no silu today" in caplog.text
    assert [p for p in fresh_build.iterdir() if p.suffix != ".lock"] == []  # the lock file stays


@pytest.mark.parametrize("flags, extend_o2", [("flags : fpu sse avx2 fma", True), ("flags : avx2 avx512f avx512bw", False)])
def test_the_extend_source_builds_at_o2_without_avx512(monkeypatch, flags, extend_o2):
    """Its emulated 16-float vectors take ~3.5x longer to compile at -O3 and run no faster."""
    monkeypatch.setattr(native, "_cpu_flags", lambda: flags)
    got = {src.name: extra for src, extra in native._sources()}
    assert ("-O2" in got["cpu_extend.c"]) == extend_o2
    assert all("-O2" not in extra for name, extra in got.items() if name != "cpu_extend.c")
