"""radixflow.runtime: the engine. Public surface: Engine, EngineClient (the core in its own
process), EngineConfig, SamplingParams, demo_model.

Names resolve lazily so that importing a light submodule (sampling parameters, say) does not
pull in torch and the whole engine.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Engine": "radixflow.runtime.engine",
    "EngineClient": "radixflow.runtime.core_client",
    "EngineConfig": "radixflow.runtime.config",
    "SamplingParams": "radixflow.runtime.sampling_params",
    "demo_model": "radixflow.runtime.model.demo",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'radixflow.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
