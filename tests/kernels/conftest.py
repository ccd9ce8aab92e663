"""Kernel tests: run the Triton kernels in the interpreter when there is no GPU, plus a KV layout builder."""
from __future__ import annotations

import os
import platform
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

if not torch.cuda.is_available():
    # NOTE: triton reads TRITON_INTERPRET when `@triton.jit` decorates a function, and its
    # own tl.zeros / tl.max / ... are decorated when triton.language is first imported, so
    # the variable must be set before the process first imports triton, kernels or runtime.
    if "triton" in sys.modules and type(sys.modules["triton"].language.standard.zeros).__name__ == "JITFunction":
        raise RuntimeError("triton was imported before tests/kernels/conftest.py could set TRITON_INTERPRET=1; "
                           "set it in tests/conftest.py (or the environment) when CUDA is unavailable")
    os.environ["TRITON_INTERPRET"] = "1"

from radixflow.kernels.fp8 import quantize_fp8  # noqa: E402


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class KVLayout:
    """Requests' contexts scattered over a token-granular KV pool, as the engine lays them out."""

    k_cache: torch.Tensor  # [num_slots, num_kv_heads, head_dim], model dtype or uint8 (fp8 bits)
    v_cache: torch.Tensor
    req_to_token: torch.Tensor  # [max_running, max_context_len] int32
    req_rows: torch.Tensor  # [batch] int64
    prefix_lens: torch.Tensor  # [batch] int64
    extend_lens: torch.Tensor  # [batch] int64
    extend_starts: torch.Tensor  # [batch] int64
    seq_lens: torch.Tensor  # [batch] int64
    k_scale: float
    v_scale: float

    def share_prefixes(self, groups: list[tuple[list[int], int]]) -> None:
        """Make the requests at batch indices `members` begin with the first `prefix_len` slots of
        the first member (as the radix cache hands requests the KV of a prefix they share)."""
        for members, prefix_len in groups:
            lead = self.req_to_token[int(self.req_rows[members[0]]), :prefix_len]
            for i in members[1:]:
                self.req_to_token[int(self.req_rows[i]), :prefix_len] = lead


def make_layout(prefix_lens: list[int], extend_lens: list[int], num_kv_heads: int, head_dim: int,
                dtype: torch.dtype, fp8: bool, device: torch.device, seed: int = 0) -> KVLayout:
    """Build a pool where each request's slots are shuffled over the pool.

    Requests with seq_len 0 are padding: slot-table row 0, as in CUDA graphs.
    Slot 0 (the padding dummy) holds NaN and the table past each seq_len holds
    stale slot ids, so a kernel that reads beyond a context shows it.
    """
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    num_slots = sum(seq_lens) + 9
    max_context_len = max(seq_lens, default=0) + 5
    batch = len(seq_lens)
    slot_ids = (torch.randperm(num_slots - 1, generator=gen) + 1).tolist()  # all but slot 0
    req_to_token = torch.randint(0, num_slots, (batch + 3, max_context_len), generator=gen, dtype=torch.int32)
    req_to_token[0] = 0
    free_rows = (torch.randperm(batch + 2, generator=gen) + 1).tolist()  # rows 1.., shuffled
    req_rows = []
    for seq_len in seq_lens:
        row = free_rows.pop() if seq_len > 0 else 0
        req_rows.append(row)
        req_to_token[row, :seq_len] = torch.tensor([slot_ids.pop() for _ in range(seq_len)], dtype=torch.int32)
    k = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen)
    k_scale, v_scale = (0.5, 0.25) if fp8 else (1.0, 1.0)
    if fp8:
        k_cache, v_cache = quantize_fp8(k, k_scale), quantize_fp8(v, v_scale)
        k_cache[0] = v_cache[0] = 0x7F  # e4m3fn NaN
    else:
        k_cache, v_cache = k.to(dtype), v.to(dtype)
        k_cache[0] = v_cache[0] = float("nan")
    extend_starts = torch.tensor([0] + extend_lens[:-1]).cumsum(0) if batch else torch.zeros(0, dtype=torch.int64)

    def as_long(xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.int64, device=device)

    return KVLayout(
        k_cache=k_cache.to(device), v_cache=v_cache.to(device), req_to_token=req_to_token.to(device),
        req_rows=as_long(req_rows), prefix_lens=as_long(prefix_lens), extend_lens=as_long(extend_lens),
        extend_starts=extend_starts.to(device), seq_lens=as_long(seq_lens), k_scale=k_scale, v_scale=v_scale,
    )


@pytest.fixture
def kv_layout() -> Callable[..., KVLayout]:
    return make_layout


def naive_attention(q: torch.Tensor, layout: KVLayout, req: int, pos: int, sm_scale: float) -> torch.Tensor:
    """One query [num_heads, head_dim] of request `req` at context position `pos`, token by token in fp64."""
    row = int(layout.req_rows[req])
    keys, values = [], []
    for p in range(pos + 1):  # causal: positions 0..pos
        slot = int(layout.req_to_token[row, p])
        k, v = layout.k_cache[slot].cpu(), layout.v_cache[slot].cpu()
        if layout.k_cache.dtype == torch.uint8:
            k = k.view(torch.float8_e4m3fn).double() * layout.k_scale
            v = v.view(torch.float8_e4m3fn).double() * layout.v_scale
        keys.append(k.double())
        values.append(v.double())
    group = q.shape[0] // layout.k_cache.shape[1]
    k = torch.stack(keys).repeat_interleave(group, dim=1)  # [pos + 1, num_heads, head_dim]
    v = torch.stack(values).repeat_interleave(group, dim=1)
    scores = (q.cpu().double()[None] * k).sum(-1) * sm_scale  # [pos + 1, num_heads]
    probs = torch.softmax(scores, dim=0)
    return (probs[..., None] * v).sum(0)  # [num_heads, head_dim]


@pytest.fixture
def naive() -> Callable[..., torch.Tensor]:
    return naive_attention


@pytest.fixture(params=["torch", "native"])
def attention_path(request, monkeypatch) -> str:
    """CPU attention (decode and extend) through the torch path or the native kernels
    (kernels/native.py; RADIXFLOW_NATIVE_KERNELS). Where a C compiler is on PATH the native
    kernels must build; without one their cases skip."""
    from radixflow.kernels import native

    monkeypatch.setenv(native.ENV_SWITCH, "1" if request.param == "native" else "0")
    if request.param == "native" and native.library() is None:
        assert native._compiler() is None, "a C compiler is on PATH: the native kernel must build"
        pytest.skip("no C compiler: the native kernel cannot build")
    return request.param


@pytest.fixture
def native_built() -> None:
    """For tests of the native kernels themselves: where a C compiler is on PATH they must
    build; without one the test skips."""
    from radixflow.kernels import native

    if native.library() is None:
        assert native._compiler() is None, "a C compiler is on PATH: the native kernels must build"
        pytest.skip("no C compiler: the native kernels cannot build")


@pytest.fixture
def fresh_build(monkeypatch, tmp_path) -> Path:
    """library() builds anew into tmp_path (the process's loaded library is put back after)."""
    from radixflow.kernels import native

    monkeypatch.setenv(native.ENV_SWITCH, "1")
    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_loaded", {})
    return tmp_path / "kernels"


@pytest.fixture(scope="session")
def builds_without_dir(tmp_path_factory) -> Path:
    """Where build_without's libraries and compiler wrappers live for the whole session: each
    flag's library is compiled once (the build cache keys on the compiler command, so the
    wrapper's path stays the same) and loaded by every test that asks for it."""
    return tmp_path_factory.mktemp("builds_without")


# the macro a -mno-... flag takes away: where -march=native does not define it either, the build
# this machine makes anyway is the one the flag asks for
_FLAG_MACROS = {"-mno-avx512f": "__AVX512F__", "-mno-avx512bf16": "__AVX512BF16__"}


@pytest.fixture
def build_without(builds_without_dir, monkeypatch) -> Callable[[str], None]:
    """build_without("-mno-avx512bf16"): library() loads a build made with the C compiler told
    to leave an instruction set out, as a CPU without it builds (x86 only, else the test skipped).
    On a CPU without it, that is the build this machine makes: the session's is used (no compile)."""
    from radixflow.kernels import native

    def use(flag: str) -> None:
        cc = native._compiler()
        if cc is None or platform.machine() not in ("x86_64", "AMD64"):
            pytest.skip("needs an x86 C compiler")
        monkeypatch.setenv(native.ENV_SWITCH, "1")
        macros = subprocess.run([cc, "-march=native", "-dM", "-E", "-"], input="", capture_output=True,
                                text=True, timeout=60).stdout
        if _FLAG_MACROS[flag] not in macros:
            return
        wrapper = builds_without_dir / f"cc{flag}"
        if not wrapper.exists():
            wrapper.write_text(f'#!/bin/sh\nexec {cc} "$@" {flag}\n')
            wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setattr(native, "_loaded", {})  # put back after the test
        monkeypatch.setenv("CC", str(wrapper))
        monkeypatch.setenv("RADIXFLOW_CACHE", str(builds_without_dir))
    return use


@pytest.fixture
def mapped_bytes() -> Callable[[], int]:
    """mapped_bytes(): the process's virtual memory size (what it has allocated, touched or not);
    the test skipped without /proc."""
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("needs /proc")

    def size() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    return size
