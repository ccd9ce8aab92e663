"""Demo model: deterministic bytes, the cache location, atomic builds, a random model that is not degenerate."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from radixflow.kernels import native
from radixflow.runtime.model import demo as dm
from radixflow.runtime.model.demo import demo_model, write_demo_model
from radixflow.runtime.text.tokenizer import Tokenizer

FILES = {
    "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
}
PROMPTS = [
    "Hello, world!",
    "The weather today is",
    "def parse_file(path):",
    '{"name": "Bob",',
    "café 日本 🙂",
    "1, 2, 3, 4,",
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_demo_model("tiny", str(tmp_path_factory.mktemp("tiny"))))


def _contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_unknown_size_lists_the_sizes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'huge'.*tiny, small"):
        demo_model("huge")
    with pytest.raises(ValueError, match="tiny, small"):
        write_demo_model("huge", str(tmp_path))
    assert not any(tmp_path.iterdir())


def test_cache_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path / "rf"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert dm.cache_dir() == native.cache_root() == tmp_path / "rf"
    monkeypatch.delenv("RADIXFLOW_CACHE")
    assert dm.cache_dir() == native.cache_root() == tmp_path / "xdg" / "radixflow"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert dm.cache_dir() == native.cache_root() == tmp_path / "home" / ".cache" / "radixflow"


def test_demo_model_is_built_once_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path))
    first = demo_model()
    built = _contents(Path(first))
    assert first == str(tmp_path / f"demo-tiny-v{dm.DEMO_VERSION}")
    monkeypatch.setattr(dm, "write_demo_model", _fail)  # a cached model is never rebuilt
    assert demo_model("tiny") == first
    assert _contents(Path(first)) == built == _contents(tiny_dir)
    assert [p.name for p in tmp_path.iterdir()] == [Path(first).name]  # no staging left behind


def _fail(*args: object) -> str:
    raise AssertionError("the cached demo model was rebuilt")


def test_losing_a_build_race_keeps_the_winner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path))
    target = tmp_path / f"demo-tiny-v{dm.DEMO_VERSION}"
    real_write = dm.write_demo_model

    def write_while_another_process_wins(size: str, out_dir: str) -> str:
        real_write(size, str(target))  # the other process renames its copy into place first
        (target / "winner").write_text("1")
        return real_write(size, out_dir)

    monkeypatch.setattr(dm, "write_demo_model", write_while_another_process_wins)
    assert demo_model("tiny") == str(target)
    assert (target / "winner").exists()
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_write_is_byte_identical(tmp_path: Path, tiny_dir: Path) -> None:
    again = Path(write_demo_model("tiny", str(tmp_path / "again")))
    assert set(_contents(again)) == FILES
    assert _contents(again) == _contents(tiny_dir)


def test_tiny_config(tiny_dir: Path) -> None:
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    expected = {
        "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 3072, "max_position_embeddings": 2048,
        "tie_word_embeddings": False, "torch_dtype": "float32", "hidden_act": "silu", "bos_token_id": 3067,
        "eos_token_id": 3068,
    }
    assert {k: config[k] for k in expected} == expected
    generation = json.loads((tiny_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [3068, 3070]
    tok = Tokenizer.from_dir(str(tiny_dir))
    assert tok.vocab_size == config["vocab_size"]
    assert tok.decode(tok.eos_token_ids, skip_special_tokens=False) == "<|end_of_text|><|im_end|>"


def test_tiny_weights(tiny_dir: Path) -> None:
    weights = load_file(str(tiny_dir / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in weights.values())
    assert weights["model.embed_tokens.weight"].shape == weights["lm_head.weight"].shape == (3072, 64)
    assert weights["model.layers.3.self_attn.q_proj.weight"].shape == (64, 64)
    assert weights["model.layers.3.self_attn.k_proj.weight"].shape == (32, 64)
    assert weights["model.layers.0.mlp.down_proj.weight"].shape == (64, 176)
    assert len(weights) == 2 + 1 + 4 * 9
    # norm weights are not all ones, so a loader that drops them is caught by output comparisons
    assert not torch.equal(weights["model.norm.weight"], torch.ones(64))


def test_shipped_tokenizer_is_the_trained_one() -> None:
    trained = dm.train_demo_tokenizer().to_str(pretty=True) + "\n"
    assert trained == dm.TOKENIZER_PATH.read_text(encoding="utf-8"), (
        "data/demo_tokenizer.json differs from training on data/corpus.txt: run "
        "`python -m radixflow.runtime.model.demo` and bump DEMO_VERSION (or the trainer changed)"
    )


def test_tokens_span_several_characters(tiny_dir: Path) -> None:
    tok = Tokenizer.from_dir(str(tiny_dir))
    text = dm.CORPUS_PATH.read_text(encoding="utf-8")
    assert len(text) / len(tok.encode(text, add_special_tokens=False)) > 3.5
    assert len(tok.encode(" 日本", add_special_tokens=False)) == 1


def _greedy(model: torch.nn.Module, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy continuation of `ids` plus the top-1 minus top-2 logit gap at every step."""
    tokens, margins = list(ids), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([tokens])).logits[0, -1]
            top = logits.topk(2).values
            margins.append(float(top[0] - top[1]))
            tokens.append(int(logits.argmax()))
    return tokens[len(ids):], margins


def _check_not_degenerate(model_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model, info = transformers.LlamaForCausalLM.from_pretrained(str(model_dir), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tok = Tokenizer.from_dir(str(model_dir))
    outputs, margins = [], []
    for prompt in PROMPTS:
        tokens, gaps = _greedy(model.eval(), tok.encode(prompt), 20)
        outputs.append(tokens)
        margins += gaps
        assert len(set(tokens)) >= 10, (prompt, tok.decode(tokens))
    assert len({tuple(t) for t in outputs}) == len(PROMPTS)
    assert statistics.median(margins) > 0.1
    # the same last token in different contexts continues differently: attention matters
    same_end = [_greedy(model, tok.encode(p), 5)[0] for p in ("I walked to the", "It was cold in the")]
    assert same_end[0] != same_end[1]


def test_tiny_random_model_is_not_degenerate(tiny_dir: Path) -> None:
    _check_not_degenerate(tiny_dir)


@pytest.mark.slow
def test_small_model(tmp_path: Path) -> None:
    small = Path(write_demo_model("small", str(tmp_path / "small")))
    config = json.loads((small / "config.json").read_text())
    assert config["tie_word_embeddings"] and config["max_position_embeddings"] == 4096
    weights = load_file(str(small / "model.safetensors"))
    assert "lm_head.weight" not in weights
    assert 95e6 < sum(t.numel() for t in weights.values()) < 105e6
    _check_not_degenerate(small)
