"""Random PEFT adapters for a model directory: for tests, benchmarks and smoke runs."""
from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

from radixflow.runtime.lora.adapter import module_dims
from radixflow.runtime.model.model_config import load_model_args

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL = ATTN + ("gate_proj", "up_proj", "down_proj")


def write_random_adapter(path: str, model_dir: str, rank: int = 8, targets: tuple[str, ...] = ATTN,
                         seed: int = 0, alpha: float | None = None, b_std: float | None = None,
                         dtype: torch.dtype = torch.float32, **extra_config) -> str:
    """A PEFT adapter directory at `path` with random lora_A (std 1/sqrt(d_in)) and lora_B (std
    `b_std`, default 1/sqrt(rank): strong enough to change greedy tokens). `extra_config` goes
    into adapter_config.json as is. Returns `path`."""
    args = load_model_args(model_dir)
    gen = torch.Generator().manual_seed(seed)
    b_std = rank ** -0.5 if b_std is None else b_std
    tensors = {}
    for layer in range(args.num_layers):
        for module in targets:
            d_in, d_out = module_dims(args, module)
            part = "mlp" if module in ("gate_proj", "up_proj", "down_proj", "gate_up_proj") else "self_attn"
            name = f"base_model.model.model.layers.{layer}.{part}.{module}"
            tensors[f"{name}.lora_A.weight"] = (torch.randn(rank, d_in, generator=gen) / d_in ** 0.5).to(dtype)
            tensors[f"{name}.lora_B.weight"] = (torch.randn(d_out, rank, generator=gen) * b_std).to(dtype)
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha if alpha is not None else 2 * rank,
              "target_modules": list(targets), "bias": "none", **extra_config}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return path
