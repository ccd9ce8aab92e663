"""What the host CPU computes natively: decides the default dtype on CPU."""
from __future__ import annotations

import functools

CPUINFO = "/proc/cpuinfo"
# Either makes bf16 matmuls native (oneDNN uses them): AVX512-BF16 dot products, AMX tiles.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo_text: str) -> frozenset[str]:
    """The feature flags of the first processor listed in /proc/cpuinfo text."""
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@functools.cache
def has_native_bf16(cpuinfo_path: str = CPUINFO) -> bool:
    """Whether this CPU has native bf16 arithmetic (False where /proc/cpuinfo cannot be read:
    then bf16 would be emulated, at about half the speed of fp32)."""
    try:
        with open(cpuinfo_path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return False
    return bool(cpu_flags(text) & NATIVE_BF16_FLAGS)
