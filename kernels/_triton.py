"""Optional Triton import: the references must keep working where Triton is not installed."""
from __future__ import annotations

from typing import Any, Callable

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
    TRITON_VERSION = tuple(int(p) for p in triton.__version__.split(".")[:2])
except ImportError:  # e.g. macOS wheels: only the *_ref ops are usable there
    HAS_TRITON = False
    TRITON_VERSION = (0, 0)

    class _NoTriton:
        """Stands in for the `triton` module so kernel definitions still import."""

        @staticmethod
        def jit(fn: Callable[..., Any] | None = None, **_: Any) -> Any:
            return fn if fn is not None else (lambda f: f)

    triton = _NoTriton()  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]


def require_triton(op_name: str) -> None:
    """Raise a clear error before touching any Triton API when Triton is missing."""
    if not HAS_TRITON:
        raise RuntimeError(f"{op_name} needs Triton, which is not installed; call {op_name}_ref instead")


def use_while_loop(device: torch.device) -> bool:
    """Whether the KV loops must be `while` loops instead of `tl.range` for loops.

    NOTE: the interpreter of triton < 3.9 turns a loaded scalar into a 1-element
    array that NumPy 2 refuses to `int()`, so `range(0, loaded_len, BLOCK)` fails
    there. Compiled kernels (CUDA tensors) always take the `tl.range` loop, which
    the software pipeliner (num_stages) understands; `while` loops it does not.
    """
    return device.type != "cuda" and TRITON_VERSION < (3, 9)
