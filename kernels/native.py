"""Native CPU kernels: C sources in this folder, compiled once per machine with the system C
compiler and called through ctypes (no torch headers, no build step at install time).

    cpu_decode.c   decode attention reading the KV cache in place (see decode_attention_native;
                   keys in the vector lanes where the CPU has AVX-512: decode_lanes)
    cpu_extend.c   causal extend (prefill) attention, the same way (see extend_attention_native),
                   and many rows over one shared prefix (prefix_attention_native)
    cpu_elementwise.c   RMSNorm and RoPE with torch's rounding, one pass each
    cpu_silu.c     SiLU-and-mul in one pass
    cpu_linear.c   bf16 linear layers on a packed weight layout with AVX512-BF16
    cpu_layers.c   a bf16 forward step through every decoder layer, calling the others
                   (runtime/model/fused_layers.py)
    cpu_common.h, cpu_bf16.h   what they share

This module builds and loads the library and wraps the attention kernels; native_layers.py
wraps the others.

They compile into one shared library. It lands in `<cache_root()>/kernels` (else, not writable,
a temporary folder) under a name that hashes the sources, the compiler command, its version and this CPU's flags, so
a changed source or another machine compiles anew. Where there is no compiler, or it fails,
`library()` returns None once and logs why; the callers fall back to their torch twins.
RADIXFLOW_NATIVE_KERNELS=0 turns the native kernels off. The engine builds the library when its
CPU attention is set up (runtime/model/attention.py), not on the first decode step.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

ENV_SWITCH = "RADIXFLOW_NATIVE_KERNELS"
HERE = Path(__file__).parent
# each source with its own flags after COMPILE_FLAGS: the elementwise passes round every
# operation as torch does (no fast-math, no fused multiply-add but the one written)
SOURCES = ((HERE / "cpu_decode.c", ()), (HERE / "cpu_extend.c", ()), (HERE / "cpu_silu.c", ()),
           (HERE / "cpu_linear.c", ()), (HERE / "cpu_elementwise.c", ("-fno-fast-math", "-ffp-contract=off")),
           (HERE / "cpu_layers.c", ("-fno-fast-math", "-ffp-contract=off")))
HEADERS = (HERE / "cpu_common.h", HERE / "cpu_bf16.h")
COMPILE_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=gnu11")
# Linked apart, without -ffast-math: linked with it, the library gets a constructor that sets the
# CPU's flush-to-zero / denormals-are-zero modes for the whole process when it loads.
LINK_FLAGS = ("-shared", "-fopenmp")
MAX_HEADS, MAX_HEAD_DIM, MAX_KV_ROW = 64, 256, 4096  # as in cpu_decode.c
EXTEND_VEC, EXTEND_MAX_GROUP = 16, 64  # cpu_extend.c: head_dim a multiple of VEC, G <= MAX_GROUP
ENTRY_POINTS = {torch.float32: "decode_f32", torch.bfloat16: "decode_bf16"}
EXTEND_ENTRY_POINTS = {torch.float32: "extend_f32", torch.bfloat16: "extend_bf16"}
ELEMENTWISE_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}  # native_layers.py's passes

_lock = threading.Lock()
_loaded: dict[str, Any] = {}  # "lib": the library (or None); "lanes": sum_lanes()


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") not in ("0", "false", "no", "off")


def library() -> ctypes.CDLL | None:
    """The compiled kernels (built on first use), or None where they cannot be built or are off."""
    if not enabled():
        return None
    lib = _loaded.get("lib", _loaded)  # built already: no lock (a decode step asks ~10 times a layer)
    if lib is not _loaded:
        return lib
    with _lock:
        if "lib" not in _loaded:
            _loaded["lib"] = _build()
        return _loaded["lib"]


def _sources() -> tuple[tuple[Path, tuple[str, ...]], ...]:
    """SOURCES with this machine's flags. Without AVX-512, cpu_extend.c's 16-float vectors are
    emulated, and at -O3 it takes ~35 s to compile on two cores against ~10 s at -O2, which runs
    it as fast there (measured on an AVX2 EPYC: -O2 0.7-1.1x the time of -O3 on prefill shapes)."""
    if "avx512f" in _cpu_flags().split():
        return SOURCES
    return tuple((src, (*flags, "-O2") if src.name == "cpu_extend.c" else flags) for src, flags in SOURCES)


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cache_root() -> Path:
    """radixflow's cache folder (built kernels here, demo models in runtime/model/demo.py):
    $RADIXFLOW_CACHE, else $XDG_CACHE_HOME/radixflow, else ~/.cache/radixflow."""
    if os.environ.get("RADIXFLOW_CACHE"):
        return Path(os.environ["RADIXFLOW_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "radixflow"


def _cache_dir() -> Path:
    folder = cache_root() / "kernels"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="radixflow-kernels-"))


def _compile(cc: str, target: Path) -> bool:
    """Compile each source, then link them, into `target` (atomically: concurrent builders each
    write their own file first). The sources compile side by side, one process each (the build
    takes the longest source's time where cores allow). False (and a log line saying why) when a
    step fails."""
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    sources = _sources()
    objs = [f"{tmp[:-3]}-{i}.o" for i in range(len(sources))]
    compiles = [[cc, *COMPILE_FLAGS, *flags, "-c", "-o", obj, str(src)] for obj, (src, flags) in zip(objs, sources)]
    link = [cc, *LINK_FLAGS, "-o", tmp, *objs, "-lm"]
    try:
        with ThreadPoolExecutor(max_workers=min(len(compiles), os.cpu_count() or 1)) as pool:
            failed = [(step, done) for step, done in zip(compiles, pool.map(_run_step, compiles)) if done.returncode]
        if not failed:
            done = _run_step(link)
            failed = [(link, done)] if done.returncode else []
        if failed:
            step, done = failed[0]
            log.warning("building the native CPU kernels failed (CPU attention runs on its torch path): %s\n%s",
                        " ".join(step), done.stderr[-2000:])
            return False
        os.replace(tmp, target)
        return True
    finally:
        for leftover in (tmp, *objs):
            if os.path.exists(leftover):
                os.unlink(leftover)


@contextlib.contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    """Held while `target` is built: processes starting together (API servers, test workers)
    compile it once, the others wait and load it. Without fcntl (not POSIX), no lock: each
    builds its own copy, as atomically as before."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(target.with_name(target.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run_step(step: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(step, capture_output=True, text=True, timeout=300)


def _build() -> ctypes.CDLL | None:
    cc = _compiler()
    if cc is None:
        log.info("no C compiler found: CPU attention runs on its torch path")
        return None
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
        sources = [path.read_bytes() for path in (*(src for src, _ in SOURCES), *HEADERS)]
        command = " ".join((cc, *COMPILE_FLAGS, *(f for _, flags in _sources() for f in flags), "|", *LINK_FLAGS))
        key = hashlib.sha256(b"\0".join([*sources, command.encode(), version.encode(),
                                          _cpu_flags().encode()])).hexdigest()[:16]
        target = _cache_dir() / f"cpu_kernels-{key}.so"
        if not target.exists():
            with _build_lock(target):  # another process building it: wait for its file
                if not target.exists() and not _compile(cc, target):
                    return None
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("native CPU kernels unavailable (%s): CPU attention runs on its torch path", exc)
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for name in ENTRY_POINTS.values():
        fn = getattr(lib, name)
        fn.argtypes = [p, p, p, p, p, i64, i64, i64, i64, ctypes.c_float, p, p, ctypes.c_int]
        fn.restype = None
    for name in EXTEND_ENTRY_POINTS.values():
        fn = getattr(lib, name)
        fn.argtypes = [p, p, p, p, i64, ctypes.c_int, p, p, p, p, i64, i64, i64, i64, ctypes.c_float, p, ctypes.c_int,
                       p, ctypes.c_int, p]
        fn.restype = ctypes.c_int
    lib.extend_bf16_pairs.argtypes, lib.extend_bf16_pairs.restype = [], ctypes.c_int
    lib.decode_lanes.argtypes, lib.decode_lanes.restype = [], ctypes.c_int
    lib.linear_lanes.argtypes, lib.linear_lanes.restype = [], ctypes.c_int
    lib.linear_bf16.argtypes, lib.linear_bf16.restype = [p, p, i64, i64, i64, p, p, ctypes.c_int], None
    f32, i32 = ctypes.c_float, ctypes.c_int
    for suffix in ELEMENTWISE_SUFFIX.values():
        for name, argtypes in (("rmsnorm_scale", [p, i64, p, p, f32, i64, i64, p, i32]),
                               ("rmsnorm", [p, i64, p, p, f32, i64, i64, i32, p, p, i32]),
                               ("rope", [p, i64, p, p, i64, i64, i64, p, i32]), ("silu_mul", [p, i64, i64, p, i32])):
            fn = getattr(lib, f"{name}_{suffix}")
            fn.argtypes, fn.restype = argtypes, None
    lib.mean_squares.argtypes, lib.mean_squares.restype = [p, i64, i64, i32, p], None
    lib.forward_layers_bf16.argtypes = [i64, p, p, i64, f32, f32, i32, p, p, p, p, p, p, i32]
    lib.forward_layers_bf16.restype = ctypes.c_int
    return lib


def _dense_caches(k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int) -> bool:
    """What both attention kernels need: dense fp32 / bf16 CPU caches, whole query groups per KV
    head, head_dim at most MAX_HEAD_DIM, and the library built."""
    num_kv_heads, head_dim = k_cache.shape[1:]
    return (k_cache.device.type == "cpu" and k_cache.dtype in ENTRY_POINTS and num_heads % num_kv_heads == 0
            and head_dim <= MAX_HEAD_DIM and k_cache.is_contiguous() and v_cache.is_contiguous()
            and library() is not None)


def supports(k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int) -> bool:
    """Whether decode_attention_native takes these caches (dense rows) and head count (else: the
    torch path)."""
    num_kv_heads, head_dim = k_cache.shape[1:]
    return (num_heads <= MAX_HEADS and num_kv_heads * head_dim <= MAX_KV_ROW
            and _dense_caches(k_cache, v_cache, num_heads))


def decode_lanes() -> int:
    """Which build of the decode kernel runs (cpu_decode.c): 0 the portable loop, 1 keys in the
    vector lanes (AVX-512), 2 the same with bf16 pair products for bf16 queries over bf16 caches."""
    lib = library()
    return 0 if lib is None else int(lib.decode_lanes())


def decode_attention_native(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                            offsets: torch.Tensor, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out fp32 [batch, num_heads, head_dim], lse fp32 [batch, num_heads]): attention of q [batch,
    num_heads, head_dim] over request b's KV at slots[offsets[b]:offsets[b + 1]] (int64), read
    in place from the [slots, num_kv_heads, head_dim] caches. A request with no slots gets zeros
    and lse -inf. Only where `supports(k_cache, v_cache, num_heads)`; the caller guarantees slots in range."""
    lib = library()
    assert lib is not None
    batch, num_heads, head_dim = q.shape
    qf = q.to(torch.float32).contiguous()
    out = torch.empty(batch, num_heads, head_dim, dtype=torch.float32)
    lse = torch.empty(batch, num_heads, dtype=torch.float32)
    fn = getattr(lib, ENTRY_POINTS[k_cache.dtype])
    fn(qf.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(), offsets.data_ptr(), batch, num_heads,
       k_cache.shape[1], head_dim, sm_scale, out.data_ptr(), lse.data_ptr(), torch.get_num_threads())
    return out, lse


def supports_extend(k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int) -> bool:
    """Whether extend_attention_native takes these caches (dense fp32 / bf16 rows) and heads."""
    num_kv_heads, head_dim = k_cache.shape[1:]
    return (num_heads // num_kv_heads <= EXTEND_MAX_GROUP and head_dim % EXTEND_VEC == 0
            and _dense_caches(k_cache, v_cache, num_heads))


def extend_bf16_pairs() -> bool:
    """Whether extend_attention_native computes a bf16 cache's scores with AVX512-BF16 pair
    products (the library built for a CPU that has them): exact products of bf16 queries and
    keys, fp32 sums; else fp32 products. False without the library."""
    lib = library()
    return lib is not None and bool(lib.extend_bf16_pairs())


def extend_attention_native(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            req_to_token: torch.Tensor, req_rows: torch.Tensor, prefix_lens: torch.Tensor,
                            extend_lens: torch.Tensor, extend_starts: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """fp32 [num_tokens, num_heads, head_dim]: for each request, causal attention of its new
    tokens (q rows extend_starts[i] ..) over its context, slots req_to_token[req_rows[i],
    :prefix_lens[i] + extend_lens[i]] read in place from the caches (the new tokens' K / V
    stored already). Rows no request covers are zero. Only where `supports_extend(k_cache,
    v_cache, num_heads)`, with index tensors of the checked shapes (kernels/extend_attention.py);
    a row, length or slot id out of range is a ValueError. For bf16 caches see extend_bf16_pairs:
    q must then hold bf16 values (a bf16 model's queries do)."""
    out, _ = _extend_call(q, k_cache, v_cache, req_to_token, (req_rows, prefix_lens, extend_lens, extend_starts),
                          sm_scale, causal=True)
    return out


def prefix_attention_native(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                            sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out fp32 [n, num_heads, head_dim], lse fp32 [n, num_heads]): attention of every row of q
    [n, num_heads, head_dim] over the same keys, the cache slots `slots` (1-D int32 / int64, not
    empty), read in place once for all rows per KV head (a shared prefix's part of a decode step;
    lse is the natural log of each row's softmax denominator). Only where `supports_extend`; a
    slot id out of range is a ValueError."""
    n = q.shape[0]
    if slots.dim() != 1 or slots.numel() == 0:
        raise ValueError("prefix attention needs a non-empty 1-D tensor of slots")
    index = (torch.zeros(1, dtype=torch.int64), torch.tensor([slots.shape[0]]), torch.tensor([n]),
             torch.zeros(1, dtype=torch.int64))
    return _extend_call(q, k_cache, v_cache, slots.view(1, -1), index, sm_scale, causal=False)


def _extend_call(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                 index: tuple[torch.Tensor, ...], sm_scale: float,
                 causal: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One call of the extend kernel (kernels/cpu_extend.c); index = (rows, prefix_lens,
    extend_lens, q starts). (out, lse), lse only when not causal."""
    lib = library()
    assert lib is not None
    num_tokens, num_heads, head_dim = q.shape
    qf = q.to(torch.float32).contiguous()
    out = torch.zeros(num_tokens, num_heads, head_dim, dtype=torch.float32)
    lse = None if causal else torch.empty(num_tokens, num_heads, dtype=torch.float32)
    table, index, bounds = _extend_layout(req_to_token, index, num_tokens, k_cache.shape[0])
    fn = getattr(lib, EXTEND_ENTRY_POINTS[k_cache.dtype])
    status = fn(qf.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), table.data_ptr(), table.stride(0),
                int(table.dtype == torch.int64), *(t.data_ptr() for t in index), index[0].shape[0], num_heads,
                k_cache.shape[1], head_dim, sm_scale, out.data_ptr(), torch.get_num_threads(), bounds.data_ptr(),
                int(causal), None if lse is None else lse.data_ptr())
    if status == -2:
        raise ValueError("extend attention: a request's row, lengths, q rows or slot ids are out of range")
    if status != 0:
        raise MemoryError("the native extend attention kernel could not allocate its scratch memory")
    return out, lse


def _extend_layout(req_to_token: torch.Tensor, index: tuple[torch.Tensor, ...], num_tokens: int,
                   num_slots: int) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """The extend kernel's view of a step: the slot table with unit column stride, the index
    tensors as contiguous int64, and the bounds its layout check reads (table rows, columns, q
    rows, cache slots)."""
    table = req_to_token if req_to_token.stride(1) == 1 else req_to_token.contiguous()
    bounds = torch.tensor([*table.shape, num_tokens, num_slots], dtype=torch.int64)
    return table, [t.to(torch.int64).contiguous() for t in index], bounds
