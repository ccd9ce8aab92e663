"""Every adapter that cannot be served is rejected with a ValueError naming the cause."""
from __future__ import annotations

import json
import os

import pytest
from safetensors.torch import load_file, save_file

from lora_adapters import ALL, write_adapter
from radixflow.runtime import Engine, EngineConfig
from radixflow.runtime.config import LORA_TARGET_MODULES
from radixflow.runtime.lora.adapter import TARGETS, load_adapter
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.model.model_config import load_model_args


@pytest.fixture(scope="module")
def model():
    return demo_model("tiny")


def _load(path, model, max_rank=16, lora_dir=None):
    return load_adapter(path, load_model_args(model), max_rank, frozenset(ALL), lora_dir)


def test_target_names_are_declared_once():
    assert set(TARGETS) == set(LORA_TARGET_MODULES)


@pytest.mark.parametrize("extra,match", [
    ({"use_dora": True}, "DoRA"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"rank_pattern": {"q_proj": 4}}, "rank_pattern"),
    ({"bias": "all"}, "bias"),
])
def test_unsupported_config_is_rejected(model, tmp_path, extra, match):
    path = write_adapter(str(tmp_path / "a"), model, rank=4, **extra)
    with pytest.raises(ValueError, match=match):
        _load(path, model)


def test_rank_above_max_is_rejected(model, tmp_path):
    path = write_adapter(str(tmp_path / "a"), model, rank=32)
    with pytest.raises(ValueError, match="rank 32 is above max_lora_rank=16"):
        _load(path, model)


def test_unknown_target_module_is_rejected(model, tmp_path):
    path = write_adapter(str(tmp_path / "a"), model, rank=4)
    cfg_path = os.path.join(path, "adapter_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["target_modules"] = ["q_proj", "embed_tokens"]
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match=r"unknown target modules \['embed_tokens'\]"):
        _load(path, model)


def test_target_outside_the_engine_slots_is_rejected(model, tmp_path):
    path = write_adapter(str(tmp_path / "a"), model, rank=4, targets=("down_proj",))
    with pytest.raises(ValueError, match="not in the engine's lora_target_modules"):
        Engine(model, lora_modules=[f"a={path}"], lora_target_modules="q_proj,v_proj")


def test_shape_mismatch_with_the_base_is_rejected(model, tmp_path):
    path = write_adapter(str(tmp_path / "a"), model, rank=4)
    weights_path = os.path.join(path, "adapter_model.safetensors")
    tensors = load_file(weights_path)
    name = "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"
    tensors[name] = tensors[name][:-1].contiguous()
    save_file(tensors, weights_path)
    with pytest.raises(ValueError, match="layer 0 k_proj has lora_A"):
        _load(path, model)


def test_tensor_for_a_missing_layer_is_rejected(model, tmp_path):
    path = write_adapter(str(tmp_path / "a"), model, rank=4)
    weights_path = os.path.join(path, "adapter_model.safetensors")
    tensors = load_file(weights_path)
    tensors["base_model.model.model.layers.99.self_attn.q_proj.lora_A.weight"] = tensors[
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].clone()
    save_file(tensors, weights_path)
    with pytest.raises(ValueError, match="layer 99"):
        _load(path, model)


def test_path_outside_lora_dir_is_rejected(model, tmp_path):
    inside = tmp_path / "adapters"
    path = write_adapter(str(tmp_path / "elsewhere"), model, rank=4)
    os.symlink(path, inside.mkdir() or inside / "link")  # a link out of the directory is outside too
    for p in (path, str(inside / "link"), str(inside / ".." / "elsewhere")):
        with pytest.raises(ValueError, match="outside --lora-dir"):
            _load(p, model, lora_dir=str(inside))
    with pytest.raises(ValueError, match="outside --lora-dir"):
        Engine(model, lora_dir=str(inside), lora_modules=[f"a={path}"])


def test_missing_files_are_rejected(model, tmp_path):
    with pytest.raises(ValueError, match="adapter_config.json"):
        _load(str(tmp_path), model)
    path = write_adapter(str(tmp_path / "a"), model, rank=4)
    os.remove(os.path.join(path, "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="only safetensors"):
        _load(path, model)


@pytest.mark.parametrize("kwargs,match", [
    ({"max_loras": 0}, "max_loras"),
    ({"max_loras": 2, "max_loras_per_batch": 3}, "max_loras_per_batch"),
    ({"lora_target_modules": "q_proj,lm_head"}, "lm_head"),
    ({"lora_modules": ["no-equals-sign"]}, "NAME=PATH"),
    ({"max_cpu_loras": 0}, "max_cpu_loras"),
])
def test_bad_lora_config_is_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_unknown_adapter_and_bad_names_are_rejected(model, tmp_path):
    path = write_adapter(str(tmp_path / "a"), model, rank=4)
    with Engine(model, lora_modules=[f"a={path}"]) as eng:
        with pytest.raises(ValueError, match="unknown LoRA adapter 'b'"):
            eng.generate("hi", {"max_new_tokens": 1}, lora="b")
        with pytest.raises(ValueError, match="adapter name"):
            eng.load_lora_adapter("", path)
        with pytest.raises(ValueError, match="unknown LoRA adapter"):  # a path, but no lora_dir
            eng.generate("hi", {"max_new_tokens": 1}, lora_path=path)


def _rewrite_config(path, **changes):
    cfg_path = os.path.join(path, "adapter_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)  # NaN and Infinity as Python's json writes (and reads) them


@pytest.mark.parametrize("content", [b"", b"\x00" * 7, b"not a safetensors file at all", "truncated"])
def test_corrupt_weights_file_is_rejected_naming_it(model, tmp_path, content):
    path = write_adapter(str(tmp_path / "a"), model, rank=4)
    weights_path = os.path.join(path, "adapter_model.safetensors")
    if content == "truncated":
        with open(weights_path, "rb") as f:
            content = f.read()[:-100]
    with open(weights_path, "wb") as f:
        f.write(content)
    with pytest.raises(ValueError, match="adapter_model.safetensors"):
        _load(path, model)


@pytest.mark.parametrize("changes,match", [
    ({"lora_alpha": float("nan")}, "lora_alpha"),
    ({"lora_alpha": float("inf")}, "lora_alpha"),
    ({"lora_alpha": -float("inf")}, "lora_alpha"),
    ({"lora_alpha": 1e38}, "scale"),
    ({"lora_alpha": 1e300, "use_rslora": True}, "scale"),
    ({"lora_alpha": True}, "lora_alpha"),
    ({"r": True}, "r must be a positive integer"),
    ({"r": 4.0}, "r must be a positive integer"),
])
def test_non_finite_or_mistyped_config_is_rejected(model, tmp_path, changes, match):
    path = write_adapter(str(tmp_path / "a"), model, rank=4)
    _rewrite_config(path, **changes)
    with pytest.raises(ValueError, match=match):
        _load(path, model)


def test_a_usual_alpha_loads(model, tmp_path):
    path = write_adapter(str(tmp_path / "a"), model, rank=4, alpha=64, use_rslora=True)
    assert _load(path, model).scale == 32.0


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_tensor_values_are_rejected(model, tmp_path, value):
    path = write_adapter(str(tmp_path / "a"), model, rank=4)
    weights_path = os.path.join(path, "adapter_model.safetensors")
    tensors = load_file(weights_path)
    name = "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"
    tensors[name][3, 1] = value
    save_file(tensors, weights_path)
    with pytest.raises(ValueError, match="layer 0 v_proj.*not finite"):
        _load(path, model)
