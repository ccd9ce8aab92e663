"""Native CPU kernels: C sources in this folder, compiled once per machine with the system C
compiler and called through ctypes (no torch headers, no build step at install time).

    cpu_decode.c   decode attention reading the KV cache in place (see decode_attention_native)
    cpu_extend.c   causal extend (prefill) attention, the same way (see extend_attention_native)
    cpu_common.h   what both share

Both compile into one shared library. It lands in `<cache_root()>/kernels` (else, not writable,
a temporary folder) under a name that hashes the sources, the compiler command, its version and this CPU's flags, so
a changed source or another machine compiles anew. Where there is no compiler, or it fails,
`library()` returns None once and logs why; the callers fall back to their torch twins.
RADIXFLOW_NATIVE_KERNELS=0 turns the native kernels off. The engine builds the library when its
CPU attention is set up (runtime/model/attention.py), not on the first decode step.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

ENV_SWITCH = "RADIXFLOW_NATIVE_KERNELS"
HERE = Path(__file__).parent
SOURCES = (HERE / "cpu_decode.c", HERE / "cpu_extend.c")
HEADERS = (HERE / "cpu_common.h",)
COMPILE_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=gnu11")
# Linked apart, without -ffast-math: linked with it, the library gets a constructor that sets the
# CPU's flush-to-zero / denormals-are-zero modes for the whole process when it loads.
LINK_FLAGS = ("-shared", "-fopenmp")
MAX_HEADS, MAX_HEAD_DIM, MAX_KV_ROW = 64, 256, 4096  # as in cpu_decode.c
EXTEND_VEC, EXTEND_MAX_GROUP = 16, 64  # cpu_extend.c: head_dim a multiple of VEC, G <= MAX_GROUP
ENTRY_POINTS = {torch.float32: "decode_f32", torch.bfloat16: "decode_bf16"}
EXTEND_ENTRY_POINTS = {torch.float32: "extend_f32", torch.bfloat16: "extend_bf16"}

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") not in ("0", "false", "no", "off")


def library() -> ctypes.CDLL | None:
    """The compiled kernels (built on first use), or None where they cannot be built or are off."""
    if not enabled():
        return None
    with _lock:
        if "lib" not in _loaded:
            _loaded["lib"] = _build()
        return _loaded["lib"]


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
    write their own file first). False (and a log line saying why) when a step fails."""
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    objs = [f"{tmp[:-3]}-{i}.o" for i in range(len(SOURCES))]
    steps = [[cc, *COMPILE_FLAGS, "-c", "-o", obj, str(src)] for obj, src in zip(objs, SOURCES)]
    steps.append([cc, *LINK_FLAGS, "-o", tmp, *objs, "-lm"])
    try:
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                log.warning("building the native CPU kernels failed (CPU attention runs on its torch path): %s\n%s",
                            " ".join(step), done.stderr[-2000:])
                return False
        os.replace(tmp, target)
        return True
    finally:
        for leftover in (tmp, *objs):
            if os.path.exists(leftover):
                os.unlink(leftover)


def _build() -> ctypes.CDLL | None:
    cc = _compiler()
    if cc is None:
        log.info("no C compiler found: CPU attention runs on its torch path")
        return None
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
        sources = [path.read_bytes() for path in (*SOURCES, *HEADERS)]
        command = " ".join((cc, *COMPILE_FLAGS, "|", *LINK_FLAGS))
        key = hashlib.sha256(b"\0".join([*sources, command.encode(), version.encode(),
                                          _cpu_flags().encode()])).hexdigest()[:16]
        target = _cache_dir() / f"cpu_kernels-{key}.so"
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
                       p]
        fn.restype = ctypes.c_int
    return lib


def supports(k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int) -> bool:
    """Whether decode_attention_native takes these caches (dense rows) and head count (else: the
    torch path)."""
    num_kv_heads, head_dim = k_cache.shape[1:]
    return (k_cache.device.type == "cpu" and k_cache.dtype in ENTRY_POINTS and num_heads % num_kv_heads == 0
            and num_heads <= MAX_HEADS and head_dim <= MAX_HEAD_DIM and num_kv_heads * head_dim <= MAX_KV_ROW
            and k_cache.is_contiguous() and v_cache.is_contiguous() and library() is not None)


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
    return (k_cache.device.type == "cpu" and k_cache.dtype in EXTEND_ENTRY_POINTS and num_heads % num_kv_heads == 0
            and num_heads // num_kv_heads <= EXTEND_MAX_GROUP and head_dim % EXTEND_VEC == 0
            and head_dim <= MAX_HEAD_DIM and k_cache.is_contiguous() and v_cache.is_contiguous()
            and library() is not None)


def extend_attention_native(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            req_to_token: torch.Tensor, req_rows: torch.Tensor, prefix_lens: torch.Tensor,
                            extend_lens: torch.Tensor, extend_starts: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """fp32 [num_tokens, num_heads, head_dim]: for each request, causal attention of its new
    tokens (q rows extend_starts[i] ..) over its context, slots req_to_token[req_rows[i],
    :prefix_lens[i] + extend_lens[i]] read in place from the caches (the new tokens' K / V
    stored already). Rows no request covers are zero. Only where `supports_extend(k_cache,
    v_cache, num_heads)`, with index tensors of the checked shapes (kernels/extend_attention.py);
    a row, length or slot id out of range is a ValueError."""
    lib = library()
    assert lib is not None
    num_tokens, num_heads, head_dim = q.shape
    qf = q.to(torch.float32).contiguous()
    out = torch.zeros(num_tokens, num_heads, head_dim, dtype=torch.float32)
    table = req_to_token if req_to_token.stride(1) == 1 else req_to_token.contiguous()
    index = [t.to(torch.int64).contiguous() for t in (req_rows, prefix_lens, extend_lens, extend_starts)]
    bounds = torch.tensor([*table.shape, num_tokens, k_cache.shape[0]], dtype=torch.int64)
    fn = getattr(lib, EXTEND_ENTRY_POINTS[k_cache.dtype])
    status = fn(qf.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), table.data_ptr(), table.stride(0),
                int(table.dtype == torch.int64), *(t.data_ptr() for t in index), index[0].shape[0], num_heads,
                k_cache.shape[1], head_dim, sm_scale, out.data_ptr(), torch.get_num_threads(), bounds.data_ptr())
    if status == -2:
        raise ValueError("extend attention: a request's row, lengths, q rows or slot ids are out of range")
    if status != 0:
        raise MemoryError("the native extend attention kernel could not allocate its scratch memory")
    return out
