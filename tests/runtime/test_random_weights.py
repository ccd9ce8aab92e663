"""load_format="dummy": a model from config.json alone, with random weights (speed benchmarks)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.model.model_config import load_model_args
from radixflow.runtime.model.random_weights import INIT_STD, build_random_model


@pytest.fixture(scope="module")
def config_only_dir(tmp_path_factory) -> Path:
    """The demo model's directory without its safetensors."""
    out = tmp_path_factory.mktemp("config-only")
    for f in Path(demo_model("tiny")).iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, out / f.name)
    return out


def test_random_model_shapes_and_init(config_only_dir):
    args = load_model_args(str(config_only_dir))
    model = build_random_model(args, torch.float32, torch.device("cpu"), max_len=64, seed=3)
    params = dict(model.named_parameters())
    assert not any(p.is_meta for p in params.values())
    assert params["layers.0.self_attn.qkv_proj.weight"].shape == (args.q_size + 2 * args.kv_size, args.hidden_size)
    assert torch.equal(params["norm.weight"], torch.ones(args.hidden_size))
    std = params["layers.1.mlp.gate_up_proj.weight"].std().item()
    assert abs(std - INIT_STD) < 0.1 * INIT_STD
    again = build_random_model(args, torch.float32, torch.device("cpu"), max_len=64, seed=3)
    assert torch.equal(again.embed_tokens.weight, model.embed_tokens.weight)  # seeded


def test_engine_serves_dummy_weights_without_checkpoint(config_only_dir):
    with pytest.raises(ValueError, match="safetensors"):
        Engine(str(config_only_dir), kv_cache_tokens=256)
    with Engine(str(config_only_dir), load_format="dummy", kv_cache_tokens=256) as engine:
        out = engine.generate(input_ids=[1, 2, 3], sampling_params={"temperature": 0, "max_new_tokens": 4,
                                                                    "ignore_eos": True})
    assert len(out["output_ids"]) == 4
