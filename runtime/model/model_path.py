"""What a model path names: a Hugging Face directory, a GGUF file, or a directory holding one GGUF."""
from __future__ import annotations

import glob
import os

from radixflow.runtime.model.default_model import default_model_path


def is_gguf(path: str) -> bool:
    """A regular file that starts with the GGUF magic."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def resolve_model_path(model: str | None) -> str:
    """The path the loaders read: `model` itself, the single .gguf inside a directory without a
    config.json, or (None) the default SmolLM2 GGUF. ValueError when the path cannot be a model."""
    if model is None:
        return default_model_path()
    path = os.fspath(model)
    if os.path.isfile(path):
        if not is_gguf(path):
            raise ValueError(f"{path} is a file but not a GGUF checkpoint; pass a GGUF file or a "
                             "Hugging Face model directory")
        return path
    if not os.path.isdir(path):
        raise ValueError(f"model path {path!r} does not exist")
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    ggufs = sorted(glob.glob(os.path.join(path, "*.gguf")))
    if len(ggufs) == 1:
        return ggufs[0]
    if len(ggufs) > 1:
        names = ", ".join(os.path.basename(g) for g in ggufs)
        raise ValueError(f"{path} holds several GGUF files ({names}); pass the one to load")
    raise ValueError(f"{path} has neither a config.json nor a .gguf file: not a model directory")
