"""Test helpers: random PEFT adapters for a model directory, and that model with an adapter merged in."""
from __future__ import annotations

import json
import os
import shutil

from safetensors.torch import load_file, save_file

from radixflow.runtime.lora.random_adapter import ALL, ATTN, write_random_adapter  # noqa: F401 (ALL, ATTN: for the tests)


def write_adapter(path: str, model_dir: str, rank: int = 8, targets: tuple[str, ...] = ATTN, seed: int = 0,
                  alpha: float | None = None, **extra_config) -> str:
    """A random fp32 PEFT adapter (strong enough to change greedy tokens of the tiny model)."""
    return write_random_adapter(path, model_dir, rank, targets, seed, alpha, **extra_config)


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


def assert_adapter_equals_merged(model_dir: str, adapter: str, prompts: list[list[int]], out_dir: str,
                                 params: dict) -> None:
    """Greedy output with `adapter` equals the output of its weights merged into the base, and differs
    from the base's own (so the adapter reached the tokens)."""
    from radixflow.runtime import Engine

    with Engine(model_dir, dtype="float32", kv_cache_tokens=512, lora_modules=[f"a={adapter}"]) as engine:
        adapted = [engine.generate(input_ids=p, sampling_params=params, lora="a")["output_ids"] for p in prompts]
        base = [engine.generate(input_ids=p, sampling_params=params)["output_ids"] for p in prompts]
    with Engine(merge_adapter(model_dir, adapter, out_dir), dtype="float32", kv_cache_tokens=512) as merged:
        assert adapted == [merged.generate(input_ids=p, sampling_params=params)["output_ids"] for p in prompts]
    assert adapted != base
