"""The CPU default dtype: bf16 only where the CPU has native bf16; float32 stays a flag."""
from __future__ import annotations

import torch

from radixflow.runtime.core import model_runner
from radixflow.runtime.model import cpu_features
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.model.model_config import load_model_args

SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ZEN3 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx2 fma\n"


def test_native_bf16_detected_from_cpuinfo_flags(tmp_path):
    for text, want in ((SAPPHIRE_RAPIDS, True), (ZEN3, False)):
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        cpu_features.has_native_bf16.cache_clear()
        assert cpu_features.has_native_bf16(str(path)) is want
    cpu_features.has_native_bf16.cache_clear()
    assert cpu_features.has_native_bf16(str(tmp_path / "missing")) is False
    cpu_features.has_native_bf16.cache_clear()


def test_auto_dtype_on_cpu_follows_native_bf16(monkeypatch):
    args = load_model_args(demo_model("tiny"))
    for native, want in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(model_runner, "has_native_bf16", lambda native=native: native)
        assert model_runner.derive_shape(EngineConfig(device="cpu"), args).dtype == want
        pinned = model_runner.derive_shape(EngineConfig(device="cpu", dtype="float32"), args)
        assert pinned.dtype == torch.float32
