"""A checkpoint that cannot be served fails at load with a ValueError naming the file and the cause,
never a KeyError, ZeroDivisionError, SafetensorError or a torch shape error from deep inside."""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.model.model_config import load_model_args
from radixflow.runtime.model.weights import build_model
from radixflow.runtime.text.tokenizer import Tokenizer


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A fresh copy of the tiny demo model to corrupt."""
    out = tmp_path / "model"
    shutil.copytree(demo_model("tiny"), out)
    return out


def _edit_config(model_dir: Path, edit: Callable[[dict], None]) -> None:
    path = model_dir / "config.json"
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))


def _edit_weights(model_dir: Path, edit: Callable[[dict], None]) -> None:
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def _load(model_dir: Path) -> None:
    args = load_model_args(str(model_dir))
    build_model(args, str(model_dir), torch.float32, torch.device("cpu"), 64)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\udcff"])
def test_config_json_that_is_not_a_json_object_is_named(model_dir: Path, text: str) -> None:
    (model_dir / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ValueError, match=r"config\.json"):
        load_model_args(str(model_dir))


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
                                   "intermediate_size"])
def test_missing_config_field_is_named(model_dir: Path, field: str) -> None:
    _edit_config(model_dir, lambda cfg: cfg.pop(field))
    with pytest.raises(ValueError, match=rf"config\.json.*{field}"):
        load_model_args(str(model_dir))


@pytest.mark.parametrize("field, value", [
    ("num_attention_heads", 0), ("num_attention_heads", -4), ("hidden_size", "64"), ("hidden_size", 64.5),
    ("num_hidden_layers", 0), ("num_hidden_layers", -1), ("vocab_size", 0), ("num_key_value_heads", -2),
    ("head_dim", 0), ("max_position_embeddings", 0), ("num_hidden_layers", True),
])
def test_config_field_of_wrong_type_or_not_positive_is_named(model_dir: Path, field: str, value: object) -> None:
    _edit_config(model_dir, lambda cfg: cfg.update({field: value}))
    with pytest.raises(ValueError, match=rf"config\.json.*{field}"):
        load_model_args(str(model_dir))


def test_heads_without_head_dim_must_divide_hidden_size(model_dir: Path) -> None:
    _edit_config(model_dir, lambda cfg: (cfg.pop("head_dim"), cfg.update(num_attention_heads=0)))
    with pytest.raises(ValueError, match=r"num_attention_heads"):
        load_model_args(str(model_dir))
    _edit_config(model_dir, lambda cfg: cfg.update(num_attention_heads=3, num_key_value_heads=1))
    with pytest.raises(ValueError, match=r"hidden_size 64 .*num_attention_heads 3"):
        load_model_args(str(model_dir))


def test_kv_heads_must_divide_heads(model_dir: Path) -> None:
    _edit_config(model_dir, lambda cfg: cfg.update(num_key_value_heads=3))
    with pytest.raises(ValueError, match=r"num_key_value_heads 3 .*num_attention_heads 4"):
        load_model_args(str(model_dir))


@pytest.mark.parametrize("field, value", [("rope_scaling", "linear"), ("rope_theta", "big"),
                                          ("rms_norm_eps", "x"), ("rms_norm_eps", -1.0)])
def test_malformed_float_or_dict_field_is_named(model_dir: Path, field: str, value: object) -> None:
    _edit_config(model_dir, lambda cfg: cfg.update({field: value}))
    with pytest.raises(ValueError, match=rf"config\.json.*{field}"):
        load_model_args(str(model_dir))


@pytest.mark.parametrize("content", [b"", b"\x10\x00\x00\x00\x00\x00\x00\x00not json garbage!",
                                     (2**62).to_bytes(8, "little") + b"{}"])
def test_unreadable_safetensors_is_named(model_dir: Path, content: bytes) -> None:
    (model_dir / "model.safetensors").write_bytes(content)
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        _load(model_dir)


def test_truncated_safetensors_is_named(model_dir: Path) -> None:
    path = model_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        _load(model_dir)


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.int32])
def test_tensor_that_is_not_floating_point_is_named(model_dir: Path, dtype: torch.dtype) -> None:
    name = "model.layers.0.self_attn.o_proj.weight"
    _edit_weights(model_dir, lambda t: t.update({name: torch.zeros(64, 64, dtype=dtype)}))
    with pytest.raises(ValueError, match=rf"{name}.*{str(dtype).removeprefix('torch.')}"):
        _load(model_dir)


def _shard(model_dir: Path, weight_map: object, raw: str | None = None) -> None:
    (model_dir / "model.safetensors").rename(model_dir / "a.safetensors")
    text = raw if raw is not None else json.dumps({"weight_map": weight_map})
    (model_dir / "model.safetensors.index.json").write_text(text)


@pytest.mark.parametrize("text", ["{broken", "{}", '{"weight_map": [1]}', '{"weight_map": {"x": 3}}'])
def test_malformed_shard_index_is_named(model_dir: Path, text: str) -> None:
    _shard(model_dir, None, raw=text)
    with pytest.raises(ValueError, match=r"model\.safetensors\.index\.json"):
        _load(model_dir)


def test_shard_that_lacks_its_indexed_tensor_is_named(model_dir: Path) -> None:
    names = list(load_file(str(model_dir / "model.safetensors")))
    save_file({"x": torch.zeros(1)}, str(model_dir / "b.safetensors"))
    _shard(model_dir, {n: "b.safetensors" if "layers.1." in n else "a.safetensors" for n in names})
    with pytest.raises(ValueError, match=r"b\.safetensors.*model\.layers\.1\."):
        _load(model_dir)


@pytest.mark.parametrize("text", ["{corrupt", '{"a": 1}', "\udcff"])
def test_corrupt_tokenizer_json_is_named(model_dir: Path, text: str) -> None:
    (model_dir / "tokenizer.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ValueError, match=r"tokenizer\.json"):
        Tokenizer.from_pretrained(str(model_dir))


@pytest.mark.parametrize("name", ["tokenizer_config.json", "generation_config.json"])
def test_tokenizer_side_file_that_is_not_utf8_is_named(model_dir: Path, name: str) -> None:
    (model_dir / name).write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        Tokenizer.from_pretrained(str(model_dir))


def _set_template(model_dir: Path, template: object) -> None:
    path = model_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["chat_template"] = template
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("template", ["{% for m in messages %}{{ m.content }", [{"name": "default", "template": 3}]])
def test_broken_model_chat_template_fails_at_load(model_dir: Path, template: object) -> None:
    _set_template(model_dir, template)
    with pytest.raises(ValueError, match=r"tokenizer_config\.json.*chat template|chat_template"):
        Tokenizer.from_pretrained(str(model_dir))


def test_broken_chat_template_jinja_fails_at_load(model_dir: Path) -> None:
    (model_dir / "chat_template.jinja").write_text("{% if %}")
    with pytest.raises(ValueError, match=r"chat_template\.jinja.*does not compile"):
        Tokenizer.from_pretrained(str(model_dir))


def test_broken_model_template_is_fine_when_overridden(model_dir: Path, tmp_path: Path) -> None:
    _set_template(model_dir, "{% if %}")
    override = tmp_path / "t.jinja"
    override.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    tok = Tokenizer.from_pretrained(str(model_dir), str(override))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi"


@pytest.mark.parametrize("content", [b"{% if %}", b"\xff\xfe"])
def test_broken_chat_template_file_is_named(model_dir: Path, tmp_path: Path, content: bytes) -> None:
    override = tmp_path / "t.jinja"
    override.write_bytes(content)
    with pytest.raises(ValueError, match=r"t\.jinja"):
        Tokenizer.from_pretrained(str(model_dir), str(override))
