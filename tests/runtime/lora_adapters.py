"""Test helpers: random PEFT adapters for a model directory, and that model with an adapter merged in."""
from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from radixflow.runtime.lora.adapter import module_dims
from radixflow.runtime.model.model_config import load_model_args

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL = ATTN + ("gate_proj", "up_proj", "down_proj")


def _prefix(module: str) -> str:
    return "self_attn" if module in ATTN else "mlp"


def write_adapter(path: str, model_dir: str, rank: int = 8, targets: tuple[str, ...] = ATTN, seed: int = 0,
                  alpha: float | None = None, **extra_config) -> str:
    """A PEFT adapter directory at `path` with random lora_A / lora_B (strong enough to change
    greedy tokens of the tiny model). `extra_config` goes into adapter_config.json as is."""
    args = load_model_args(model_dir)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(args.num_layers):
        for module in targets:
            d_in, d_out = module_dims(args, module)
            name = f"base_model.model.model.layers.{layer}.{_prefix(module)}.{module}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(rank, d_in, generator=gen) / d_in ** 0.5
            tensors[f"{name}.lora_B.weight"] = torch.randn(d_out, rank, generator=gen) / rank ** 0.5
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha if alpha is not None else 2 * rank,
              "target_modules": list(targets), "bias": "none", **extra_config}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return path


def merge_adapter(model_dir: str, adapter_dir: str, out_dir: str) -> str:
    """A copy of `model_dir` whose weights are W + scale * B @ A for every adapter tensor pair."""
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        cfg = json.load(f)
    r = cfg["r"]
    scale = cfg["lora_alpha"] / (r ** 0.5 if cfg.get("use_rslora") else r)
    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    lora = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    for name, a in lora.items():
        if ".lora_A." not in name:
            continue
        b = lora[name.replace(".lora_A.", ".lora_B.")]
        base = name.replace("base_model.model.", "").replace(".lora_A.weight", ".weight")
        weights[base] = (weights[base].double() + scale * (b.double() @ a.double())).to(weights[base].dtype)
    shutil.copytree(model_dir, out_dir)
    save_file(weights, os.path.join(out_dir, "model.safetensors"))
    return out_dir
