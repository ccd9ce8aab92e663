"""Attention kernels at Llama-3-8B head shapes: ours (Triton) vs the torch reference vs SDPA, against HBM bandwidth.

    python benchmarks/attention_kernels.py --out benchmarks/out/kernels        # a CUDA machine, a few minutes
    python benchmarks/attention_kernels.py --smoke --out /tmp/kernels          # CPU (Triton interpreter), seconds

Decode attention reads every context token's K and V once, so its floor is
`kv_bytes / HBM bandwidth`; the figure of merit is achieved bandwidth (K/V bytes read / time)
as a share of the bandwidth a large device-to-device copy reaches on the same card (measured
here, bytes read + written) and of the datasheet figure. Contexts sit at scattered slot ids, as
the radix cache hands them out. Compared:

    ours          radixflow.kernels.decode_attention / extend_attention (split-KV, slot table)
    ours_fp8      the same over an fp8 e4m3 cache (half the bytes)
    torch_ref     the *_ref twins (fp32 math over gathered KV); skipped past REF_MAX_TOKENS
    sdpa          torch SDPA over K/V already gathered contiguous (no slot table: a lower bound
                  for a non-paged engine)
    gather_sdpa   gathering the slots and then SDPA (what a naive paged engine would do)

Times: CUDA events around each call, median of TIMED_RUNS after warm-up, L2 flushed before each
call (a fixed count, not triton's do_bench, whose count grows as the kernel shrinks and whose
flushes then dominate the wall time). Results go to OUT/kernels.json (rewritten after every
case, so a timeout keeps what finished).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

NOMINAL_PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0}  # vendor datasheets (HBM3e / HBM3 SXM)
KEY_DECODE = (64, 4096)  # the issue's acceptance shape (>= 70% of measured bandwidth): measured first
REF_MAX_TOKENS = 1 << 18  # torch_ref materializes fp32 K/V copies: skip it past this many context tokens
WARMUP_RUNS, TIMED_RUNS = 3, 30
L2_FLUSH_BYTES = 256 << 20  # > the H200's 60 MB L2 (and the 50 MB of an H100)


@dataclass(frozen=True)
class Grid:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    decode: tuple[tuple[int, int], ...]       # (batch, context_len)
    extend: tuple[tuple[int, int, int], ...]  # (batch, prefix_len, extend_len)
    split_sweep: tuple[tuple[int, int], ...]  # (batch, context_len) timed at every split count
    splits: tuple[int, ...]
    default_splits: int
    copy_bytes: int


FULL = Grid(32, 8, 128, torch.bfloat16,
            decode=tuple((b, c) for b in (1, 16, 64, 256) for c in (512, 1024, 4096, 8192)),
            # the last two: short turns on long prefixes, where the extend kernel splits the KV
            extend=((1, 0, 2048), (4, 1024, 512), (16, 2048, 128), (1, 8192, 1024), (1, 100_000, 16), (4, 32768, 64)),
            split_sweep=((1, 8192), (64, 4096)), splits=(1, 2, 4, 8, 16, 32),
            default_splits=8,  # fixed here; the engine picks per batch (kernels.choose_kv_splits)
            copy_bytes=2 << 30)
# fp32: the interpreter's bf16 tl.dot is wrong (DEVELOPERS.md); tiny shapes keep it to seconds
SMOKE = Grid(4, 2, 16, torch.float32, decode=((1, 9), (3, 24)), extend=((2, 7, 5), (1, 70, 3)),
             split_sweep=((3, 24),), splits=(1, 2), default_splits=2, copy_bytes=4 << 20)


# -- timing and environment ---------------------------------------------------------------------

_flush_buffer: torch.Tensor | None = None


def cuda_time_ms(fn: Callable[[], object]) -> float:
    """Median of TIMED_RUNS calls, each timed by CUDA events after an L2 flush."""
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    for _ in range(WARMUP_RUNS):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(TIMED_RUNS)]
    for start, end in events:
        _flush_buffer.zero_()  # the GPU runs this while Python launches fn, hiding launch overhead
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def time_ms(fn: Callable[[], object], device: torch.device, cpu_runs: int = 1) -> float:
    """Median milliseconds of `fn` on a GPU; on CPU wall clock after one warm-up call, where the
    figures only show that the code runs."""
    if device.type == "cuda":
        return cuda_time_ms(fn)
    fn()
    runs = []
    for _ in range(cpu_runs):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return statistics.median(runs)


def measure_copy_gbps(device: torch.device, num_bytes: int) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written."""
    src = torch.randn(num_bytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device)
    return 2 * num_bytes / (ms * 1e-3) / 1e9


def environment(device: torch.device) -> dict[str, object]:
    info: dict[str, object] = {"torch": torch.__version__, "python": platform.python_version(),
                               "device": str(device)}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, sm_count=props.multi_processor_count, memory_gib=props.total_memory / 2**30)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=Path(__file__).resolve().parent)
        # RADIXFLOW_COMMIT (gpu_check.sh) first: a copied tree can carry an older .git than its files
        info["commit"] = os.environ.get("RADIXFLOW_COMMIT") or commit.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
    return info


def nominal_peak_gbps(gpu_name: str | None) -> float | None:
    return next((v for k, v in NOMINAL_PEAK_GBPS.items() if gpu_name and k in gpu_name), None)


# -- inputs ----------------------------------------------------------------------------------------

@dataclass
class Pool:
    """Requests' contexts at scattered slots of a KV pool, plus the same K/V gathered for SDPA."""

    k_cache: torch.Tensor       # [num_slots, num_kv_heads, head_dim], dtype or uint8 (fp8 bits)
    v_cache: torch.Tensor
    req_to_token: torch.Tensor  # [batch, max_context_len] int32
    req_rows: torch.Tensor      # [batch] int64
    seq_lens: torch.Tensor      # [batch] int64
    k_scale: float
    v_scale: float


def quantize_chunked(x: torch.Tensor, scale: float) -> torch.Tensor:
    """fp8 e4m3 bits of x / scale, a slice at a time (the fp32 temporaries of a whole 8 GB pool add up)."""
    from radixflow.kernels import quantize_fp8

    out = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    step = 1 << 16
    for i in range(0, x.shape[0], step):
        out[i:i + step] = quantize_fp8(x[i:i + step], scale)
    return out


def make_pool(grid: Grid, seq_lens: list[int], device: torch.device, fp8: bool, seed: int) -> Pool:
    gen = torch.Generator(device).manual_seed(seed)
    num_slots = sum(seq_lens) + 1  # slot 0: the padding dummy
    shape = (num_slots, grid.num_kv_heads, grid.head_dim)
    k = torch.randn(shape, dtype=grid.dtype, device=device, generator=gen)
    v = torch.randn(shape, dtype=grid.dtype, device=device, generator=gen)
    scale = 0.5 if fp8 else 1.0
    if fp8:
        k, v = quantize_chunked(k, scale), quantize_chunked(v, scale)
    slots = torch.randperm(num_slots - 1, device=device, generator=gen).to(torch.int32) + 1
    table = torch.zeros((len(seq_lens), max(seq_lens)), dtype=torch.int32, device=device)
    start = 0
    for i, n in enumerate(seq_lens):
        table[i, :n] = slots[start:start + n]
        start += n
    as_long = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
    return Pool(k, v, table, as_long(list(range(len(seq_lens)))), as_long(seq_lens), scale, scale)


def gathered(pool: Pool, which: str, dtype: torch.dtype) -> torch.Tensor:
    """[batch, num_kv_heads, context_len, head_dim] contiguous copy of K or V (equal lengths only)."""
    from radixflow.kernels import dequantize_fp8

    cache = pool.k_cache if which == "k" else pool.v_cache
    scale = pool.k_scale if which == "k" else pool.v_scale
    rows = cache[pool.req_to_token.long()]  # [batch, context_len, num_kv_heads, head_dim]
    if rows.dtype == torch.uint8:
        rows = dequantize_fp8(rows, scale, dtype)
    return rows.transpose(1, 2).contiguous()


def sdpa_variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 sm_scale: float) -> tuple[str, Callable[..., torch.Tensor]]:
    """SDPA of q [batch, num_heads, q_len, head_dim], causal bottom-right, over k/v [batch,
    num_kv_heads, kv_len, head_dim]: ("gqa", f) when SDPA takes the KV heads as they are, else
    ("expanded_kv", f) repeating them per query head. Tried once here, so timing never pays for
    a failed attempt. `f(q, k, v)` returns [batch, num_heads, q_len, head_dim]."""
    from torch.nn.attention.bias import causal_lower_right

    q_len, kv_len = q.shape[2], k.shape[2]
    mask = None if q_len == 1 else causal_lower_right(q_len, kv_len)
    group = q.shape[1] // k.shape[1]

    def gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sm_scale, enable_gqa=True)

    def expanded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sm_scale)

    try:
        gqa(q, k, v)
        return "gqa", gqa
    except (RuntimeError, TypeError, NotImplementedError):  # no SDPA backend takes GQA with this mask
        return "expanded_kv", expanded


# -- cases -----------------------------------------------------------------------------------------

class Runner:
    """Times cases, appends a row per measurement, rewrites OUT/kernels.json after each case."""

    def __init__(self, grid: Grid, device: torch.device, out_dir: Path, budget_s: float) -> None:
        self.grid, self.device, self.out_dir = grid, device, out_dir
        self.deadline = time.monotonic() + budget_s
        self.rows: list[dict[str, object]] = []
        self.meta: dict[str, object] = {}
        self.peak_gbps = float("nan")

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def measure(self, row: dict[str, object], fn: Callable[[], torch.Tensor], kv_bytes: int, flops: float,
                want: torch.Tensor | None) -> torch.Tensor | None:
        """Time `fn`, check it against `want`; a failure is recorded in the row, not raised."""
        if self.out_of_time():
            self.rows.append({**row, "skipped": "time budget"})
            return None
        try:
            out = fn()  # compiles; and the result to check
            ms = time_ms(fn, self.device)
        except (RuntimeError, ValueError) as exc:  # torch.cuda.OutOfMemoryError is a RuntimeError
            self.rows.append({**row, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return None
        gbps = kv_bytes / (ms * 1e-3) / 1e9
        result = {**row, "ms": ms, "kv_bytes": kv_bytes, "kv_gbps": gbps,
                  "frac_of_copy_peak": gbps / self.peak_gbps, "tflops": flops / (ms * 1e-3) / 1e12}
        if want is not None:
            result["max_abs_err"] = float((out.float() - want.float()).abs().max())
        self.rows.append(result)
        return out

    def save(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        doc = {"meta": self.meta, "rows": self.rows}
        tmp = self.out_dir / "kernels.json.tmp"
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.out_dir / "kernels.json")

    def free(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def run_case(self, case: Callable[..., None], *args: object) -> None:
        """`case(self, *args)`, unless out of time; an error building its inputs is recorded, not raised."""
        label = {"kind": case.__name__, "args": list(args)}
        if self.out_of_time():
            self.rows.append({**label, "skipped": "time budget"})
            return
        try:
            case(self, *args)
        except RuntimeError as exc:
            self.rows.append({**label, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            self.free()
        self.save()


def kv_bytes_of(grid: Grid, num_tokens: int, fp8: bool) -> int:
    elem = 1 if fp8 else torch.empty((), dtype=grid.dtype).element_size()
    return 2 * num_tokens * grid.num_kv_heads * grid.head_dim * elem


def decode_case(r: Runner, batch: int, context_len: int, splits: tuple[int, ...], kind: str) -> None:
    from radixflow.kernels import decode_attention, decode_attention_ref

    g, dev = r.grid, r.device
    sm_scale = 1.0 / math.sqrt(g.head_dim)
    q = torch.randn(batch, g.num_heads, g.head_dim, dtype=g.dtype, device=dev)
    base = dict(kind=kind, batch=batch, context_len=context_len, num_heads=g.num_heads,
                num_kv_heads=g.num_kv_heads, head_dim=g.head_dim, dtype=str(g.dtype).removeprefix("torch."))
    flops = 4.0 * batch * g.num_heads * g.head_dim * context_len
    for fp8 in (False, True):
        if kind == "decode_splits" and fp8:
            continue
        pool = make_pool(g, [context_len] * batch, dev, fp8, seed=batch * 7919 + context_len)
        k, v = gathered(pool, "k", g.dtype), gathered(pool, "v", g.dtype)
        qs = q[:, :, None]  # [batch, num_heads, 1, head_dim]
        variant, sdpa = sdpa_variant(qs, k, v, sm_scale)
        want = sdpa(qs, k, v)[:, :, 0]
        nbytes = kv_bytes_of(g, batch * context_len, fp8)
        kv = "fp8_e4m3" if fp8 else base["dtype"]
        args = (q, pool.k_cache, pool.v_cache, pool.req_to_token, pool.req_rows, pool.seq_lens, sm_scale,
                pool.k_scale, pool.v_scale)
        for s in splits:
            r.measure({**base, "impl": "ours_fp8" if fp8 else "ours", "kv_dtype": kv, "num_kv_splits": s},
                      lambda s=s: decode_attention(*args, num_kv_splits=s), nbytes, flops, want)
        if kind == "decode":
            if batch * context_len <= REF_MAX_TOKENS:
                r.measure({**base, "impl": "torch_ref", "kv_dtype": kv},
                          lambda: decode_attention_ref(*args), nbytes, flops, want)
            else:
                r.rows.append({**base, "impl": "torch_ref", "kv_dtype": kv, "skipped": "memory (fp32 copies)"})
            if not fp8:
                r.measure({**base, "impl": "sdpa", "kv_dtype": kv, "sdpa_variant": variant}, lambda: sdpa(qs, k, v),
                          nbytes, flops, None)
                r.measure({**base, "impl": "gather_sdpa", "kv_dtype": kv, "sdpa_variant": variant},
                          lambda: sdpa(qs, gathered(pool, "k", g.dtype), gathered(pool, "v", g.dtype)),
                          nbytes, flops, None)
        del pool, k, v, want
        r.free()


def extend_inputs(r: Runner, batch: int, prefix_len: int, extend_len: int) -> tuple:
    """(q, prefix_lens, extend_lens, extend_starts, FLOPs) of `batch` equal requests: `extend_len`
    new tokens each after `prefix_len` cached ones."""
    g, dev = r.grid, r.device
    q = torch.randn(batch * extend_len, g.num_heads, g.head_dim, dtype=g.dtype, device=dev)
    as_long = lambda xs: torch.tensor(xs, dtype=torch.int64, device=dev)  # noqa: E731
    prefix_lens, extend_lens = as_long([prefix_len] * batch), as_long([extend_len] * batch)
    starts = as_long([i * extend_len for i in range(batch)])
    # causal: query j of a request sees prefix_len + j + 1 keys; 2 FLOPs per MAC, QK and PV
    visible = batch * (extend_len * prefix_len + extend_len * (extend_len + 1) // 2)
    return q, prefix_lens, extend_lens, starts, 4.0 * g.num_heads * g.head_dim * visible


def extend_case(r: Runner, batch: int, prefix_len: int, extend_len: int) -> None:
    from radixflow.kernels import extend_attention, extend_attention_ref

    g, dev = r.grid, r.device
    sm_scale = 1.0 / math.sqrt(g.head_dim)
    seq_len = prefix_len + extend_len
    q, prefix_lens, extend_lens, starts, flops = extend_inputs(r, batch, prefix_len, extend_len)
    base = dict(kind="extend", batch=batch, prefix_len=prefix_len, extend_len=extend_len, num_heads=g.num_heads,
                num_kv_heads=g.num_kv_heads, head_dim=g.head_dim, dtype=str(g.dtype).removeprefix("torch."))
    qb = q.view(batch, extend_len, g.num_heads, g.head_dim).transpose(1, 2)  # [batch, heads, extend_len, dim]
    for fp8 in (False, True):
        pool = make_pool(g, [seq_len] * batch, dev, fp8, seed=batch * 131 + seq_len)
        k, v = gathered(pool, "k", g.dtype), gathered(pool, "v", g.dtype)
        variant, sdpa = sdpa_variant(qb, k, v, sm_scale)
        want = sdpa(qb, k, v).transpose(1, 2).reshape_as(q)
        nbytes = kv_bytes_of(g, batch * seq_len, fp8)
        kv = "fp8_e4m3" if fp8 else base["dtype"]
        args = (q, pool.k_cache, pool.v_cache, pool.req_to_token, pool.req_rows, prefix_lens, extend_lens, starts,
                sm_scale, pool.k_scale, pool.v_scale)
        # KV splits as the engine picks them (from the longest context); on CPU a forced 2 runs the merge
        splits = None if dev.type == "cuda" else 2
        r.measure({**base, "impl": "ours_fp8" if fp8 else "ours", "kv_dtype": kv},
                  lambda: extend_attention(*args, max_extend_len=extend_len, max_seq_len=seq_len,
                                           num_kv_splits=splits), nbytes, flops, want)
        if batch * seq_len <= REF_MAX_TOKENS:
            r.measure({**base, "impl": "torch_ref", "kv_dtype": kv}, lambda: extend_attention_ref(*args), nbytes,
                      flops, want)
        if not fp8:
            r.measure({**base, "impl": "sdpa", "kv_dtype": kv, "sdpa_variant": variant}, lambda: sdpa(qb, k, v),
                      nbytes, flops, None)
        del pool, k, v, want
        r.free()


# Extend launch configurations timed by --extend-sweep (the engine's is the first): tile rows and
# KV block, warps, pipeline stages, and the KV-split count as a multiple of the engine's choice.
EXTEND_SWEEP = (
    dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2, split_mult=1),
    dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=3, split_mult=1),
    dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2, split_mult=1),
    dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2, split_mult=1),
    dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, split_mult=1),
    dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2, split_mult=1),
    dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2, split_mult=2),
    dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=3, split_mult=2),
)


def extend_sweep_case(r: Runner, batch: int, prefix_len: int, extend_len: int) -> None:
    """Our bf16 extend kernel at one shape under each EXTEND_SWEEP configuration (patched in)."""
    from radixflow.kernels import extend_attention

    mod = sys.modules["radixflow.kernels.extend_attention"]
    g, dev = r.grid, r.device
    sm_scale = 1.0 / math.sqrt(g.head_dim)
    seq_len = prefix_len + extend_len
    q, prefix_lens, extend_lens, starts, flops = extend_inputs(r, batch, prefix_len, extend_len)
    pool = make_pool(g, [seq_len] * batch, dev, False, seed=batch * 131 + seq_len)
    args = (q, pool.k_cache, pool.v_cache, pool.req_to_token, pool.req_rows, prefix_lens, extend_lens, starts,
            sm_scale, pool.k_scale, pool.v_scale)
    base = dict(kind="extend_sweep", batch=batch, prefix_len=prefix_len, extend_len=extend_len)
    orig_cfg, orig_splits = mod._launch_config, mod.choose_extend_splits
    want = None
    try:
        for cfg in EXTEND_SWEEP if dev.type == "cuda" else EXTEND_SWEEP[:1]:
            launch = {k: v for k, v in cfg.items() if k != "split_mult"}
            mult = cfg["split_mult"]
            mod._launch_config = lambda *a, launch=launch: dict(launch) if dev.type == "cuda" else orig_cfg(*a)
            mod.choose_extend_splits = lambda *a, mult=mult: min(256, mult * orig_splits(*a))
            out = r.measure({**base, "config": cfg}, lambda: extend_attention(
                *args, max_extend_len=extend_len, max_seq_len=seq_len), kv_bytes_of(g, batch * seq_len, False),
                flops, want)
            if want is None:
                want = out  # the engine's configuration: the others are checked against it
    finally:
        mod._launch_config, mod.choose_extend_splits = orig_cfg, orig_splits
    del pool
    r.free()


# -- report ----------------------------------------------------------------------------------------

def _find(rows: list[dict], **match: object) -> dict | None:
    return next((x for x in rows if all(x.get(k) == v for k, v in match.items()) and "ms" in x), None)


def summary(r: Runner) -> str:
    g = r.grid
    dt = str(g.dtype).removeprefix("torch.")
    lines = [f"measured copy peak {r.peak_gbps:.0f} GB/s; nominal {r.meta.get('nominal_peak_gbps')} GB/s",
             f"decode ({g.num_heads}q/{g.num_kv_heads}kv heads, dim {g.head_dim}, {g.default_splits} splits): "
             "ms and K/V GB/s (% of copy peak)",
             f"{'batch':>5} {'ctx':>6} | {'ours':>22} | {'ours fp8':>22} | {'torch_ref':>9} | {'sdpa':>8} | "
             f"{'gather+sdpa':>11}"]

    def cell(row: dict | None, full: bool) -> str:
        if row is None:
            return "-"
        if not full:
            return f"{row['ms']:.3f}"
        return f"{row['ms']:.3f} {row['kv_gbps']:5.0f} ({100 * row['frac_of_copy_peak']:3.0f}%)"

    for b, c in g.decode:
        m = dict(kind="decode", batch=b, context_len=c)
        lines.append(
            f"{b:>5} {c:>6} | {cell(_find(r.rows, impl='ours', num_kv_splits=g.default_splits, **m), True):>22} | "
            f"{cell(_find(r.rows, impl='ours_fp8', num_kv_splits=g.default_splits, **m), True):>22} | "
            f"{cell(_find(r.rows, impl='torch_ref', kv_dtype=dt, **m), False):>9} | "
            f"{cell(_find(r.rows, impl='sdpa', **m), False):>8} | "
            f"{cell(_find(r.rows, impl='gather_sdpa', **m), False):>11}")
    lines.append("extend: ms, TFLOP/s")
    for b, p, e in g.extend:
        m = dict(kind="extend", batch=b, prefix_len=p, extend_len=e)
        parts = []
        for impl in ("ours", "ours_fp8", "torch_ref", "sdpa"):
            row = _find(r.rows, impl=impl, **m) if impl != "torch_ref" else _find(r.rows, impl=impl, kv_dtype=dt, **m)
            parts.append(f"{impl} " + ("-" if row is None else f"{row['ms']:.3f} ({row['tflops']:.0f})"))
        lines.append(f"  batch {b} prefix {p} extend {e}: " + "; ".join(parts))
    for b, c in g.split_sweep:
        rows = [x for x in r.rows if x.get("kind") == "decode_splits" and x.get("batch") == b
                and x.get("context_len") == c and "ms" in x]
        lines.append(f"splits at batch {b} x {c}: " + ", ".join(
            f"{x['num_kv_splits']}: {x['kv_gbps']:.0f} GB/s" for x in rows))
    b, c = KEY_DECODE
    key = _find(r.rows, kind="decode", impl="ours", batch=b, context_len=c, num_kv_splits=g.default_splits)
    if key is not None:
        lines.append(f"KEY: decode batch {b} x {c} {dt}: {key['kv_gbps']:.0f} GB/s = "
                     f"{100 * key['frac_of_copy_peak']:.0f}% of the measured copy peak (target >= 70%)")
    errors = [x for x in r.rows if "error" in x]
    if errors:
        lines.append(f"{len(errors)} measurement(s) failed, first: {errors[0]}")
    sweep = [row for row in r.rows if row.get("kind") == "extend_sweep"]
    if sweep:
        lines.append("extend configurations (BLOCK_M/BLOCK_N/warps/stages/split x): ms per shape (batch/prefix/extend)")
        shapes = list(dict.fromkeys((row["batch"], row["prefix_len"], row["extend_len"]) for row in sweep))
        lines.append("  " + " ".join(f"{b}/{p}/{e}".rjust(14) for b, p, e in shapes) + "  config")
        for cfg in EXTEND_SWEEP:
            cells = []
            for b, p, e in shapes:
                row = next((x for x in sweep if x.get("config") == cfg and (x["batch"], x["prefix_len"],
                            x["extend_len"]) == (b, p, e)), None)
                cells.append(f"{row['ms']:.3f}".rjust(14) if row and "ms" in row else "-".rjust(14))
            label = "/".join(str(cfg[k]) for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "split_mult"))
            lines.append("  " + " ".join(cells) + "  " + label)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for kernels.json")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; runs on CPU through the Triton interpreter")
    ap.add_argument("--time-budget-s", type=float, default=240.0, help="start no measurement after this long")
    ap.add_argument("--extend-sweep", action="store_true",
                    help="then time the extend kernel at every EXTEND_SWEEP launch configuration")
    args = ap.parse_args(argv)
    if args.smoke and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before radixflow.kernels imports triton
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        print("no CUDA device: run with --smoke for the CPU check", file=sys.stderr)
        return 2
    grid = SMOKE if args.smoke else FULL
    torch.manual_seed(0)
    r = Runner(grid, device, args.out, args.time_budget_s)
    r.meta = {**environment(device), "smoke": args.smoke, "grid": repr(grid)}
    r.peak_gbps = measure_copy_gbps(device, grid.copy_bytes)
    r.meta.update(copy_peak_gbps=r.peak_gbps, nominal_peak_gbps=nominal_peak_gbps(r.meta.get("gpu")))
    r.save()
    with torch.inference_mode():
        for b, c in sorted(grid.decode, key=lambda bc: bc != KEY_DECODE):
            r.run_case(decode_case, b, c, (grid.default_splits,), "decode")
        for b, p, e in grid.extend:
            r.run_case(extend_case, b, p, e)
        for b, c in grid.split_sweep:
            r.run_case(decode_case, b, c, tuple(s for s in grid.splits if s != grid.default_splits), "decode_splits")
        if args.extend_sweep:
            for b, p, e in grid.extend:
                r.run_case(extend_sweep_case, b, p, e)
    # the sweep skips the default count: copy those rows in so each sweep reads complete
    for b, c in grid.split_sweep:
        row = _find(r.rows, kind="decode", impl="ours", batch=b, context_len=c, num_kv_splits=grid.default_splits)
        if row is not None:
            r.rows.append({**row, "kind": "decode_splits"})
    r.save()
    text = summary(r)
    (args.out / "kernels_summary.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
