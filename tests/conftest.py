"""Shared pytest setup: Triton interpreter on CPU, skip `gpu` tests without CUDA."""
from __future__ import annotations

import os

import pytest
import torch

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
