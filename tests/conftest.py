"""Shared pytest setup: the repository root off sys.path, torch threads per xdist worker, Triton
interpreter on CPU, skip `gpu` tests without CUDA."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# `python -m pytest` puts the working directory, the repository root, first on sys.path. There
# the project's folders (kernels/, runtime/, radix/, ...) would shadow installed packages with
# the same top-level name: transformers 5.25 imports Hugging Face's `kernels` package and got
# this project's. The project is imported as the installed `radixflow`, never by folder name.
_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != _ROOT]

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # pytest-xdist's workers share the cores: each takes its share of torch (and native kernel)
    # threads. A test that needs more asks for them (on_threads below).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

if not torch.cuda.is_available():
    # Must be set before anything imports triton: the interpreter swaps triton.language at import.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def on_threads():
    """on_threads(n, fn, *args): fn(*args) with n torch (and native kernel) threads."""
    def run(threads: int, fn, *args):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return fn(*args)
        finally:
            torch.set_num_threads(before)
    return run
