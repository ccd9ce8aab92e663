"""GGUF tensor data to fp32 torch tensors: float types by a dtype view, block-quantized types
(Q4_0 … Q8_0, the K-quants, IQ*) by the `gguf` package's numpy dequantizers."""
from __future__ import annotations

import numpy as np
import torch

F32, F16, BF16 = 0, 1, 30
_FLOAT_VIEWS = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Stored bytes `raw` (uint8 view of the file) of one tensor → a fresh fp32 tensor of `shape`.

    NotImplementedError when the `gguf` package cannot dequantize `ggml_type`.
    """
    if ggml_type in _FLOAT_VIEWS:
        data = torch.from_numpy(np.array(raw, dtype=np.uint8).reshape(-1))  # a private, writable copy
        return data.view(_FLOAT_VIEWS[ggml_type]).float().reshape(shape)
    import gguf

    out = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(ggml_type))
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(shape)
