"""Test helper: the installed SmolLM2 GGUF (skip with the install command when absent) and
transformers' own load of it, shared across test modules (each load takes seconds)."""
from __future__ import annotations

import os
from functools import lru_cache
from unittest import mock

import pytest

from radixflow.runtime.model.default_model import INSTALL_COMMAND, default_model_path, is_default_model_installed


def smollm2_path() -> str:
    if not is_default_model_installed():
        pytest.skip(f"SmolLM2 is not installed ({INSTALL_COMMAND}; CI installs it)")
    return default_model_path()


@lru_cache(maxsize=1)
def hf_tokenizer():
    from transformers import AutoTokenizer

    path = smollm2_path()
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


@lru_cache(maxsize=2)
def hf_model(dtype_name: str = "float32"):
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    path = smollm2_path()
    # NOTE: transformers rebuilds gguf's tensor-name map once per tensor (~20 s here); the map is a
    # pure function of (arch, layers), so a cached one loads the same model in a fraction of it
    cached = lru_cache(maxsize=None)(gguf.get_tensor_name_map)
    with mock.patch.object(gguf, "get_tensor_name_map", cached):
        return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                    dtype=getattr(torch, dtype_name)).eval()
