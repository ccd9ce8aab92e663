"""The decoder's shape, read from a Hugging Face `config.json` (or GGUF metadata) for the supported architectures."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@dataclass(frozen=True)
class ModelArgs:
    """Everything the decoder needs to be built; differences between families are flags here."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool          # Qwen2: q/k/v projections carry a bias
    qk_norm: bool           # Qwen3: RMSNorm over head_dim on q and k before RoPE
    torch_dtype: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def load_model_args(model_dir: str) -> ModelArgs:
    """Parse `model_dir/config.json` (or a GGUF file's metadata); ValueError for a missing file or
    an unsupported architecture."""
    if os.path.isfile(model_dir):
        from radixflow.runtime.model.gguf_file import read_gguf
        from radixflow.runtime.model.gguf_loader import model_args_from_gguf

        return model_args_from_gguf(read_gguf(model_dir))
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"no config.json in {model_dir!r}: not a Hugging Face model directory")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    return model_args_from_dict(cfg)


def model_args_from_dict(cfg: dict[str, Any]) -> ModelArgs:
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ValueError(f"unsupported architecture {archs or cfg.get('model_type')!r}; "
                         f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    num_heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
    rope = cfg.get("rope_parameters") or {}  # newer transformers keep theta and scaling here
    rope_scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    if rope_scaling is not None:
        kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
        if kind not in ("default", "llama3", "linear"):
            raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: llama3, linear")
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    is_qwen2 = arch == "Qwen2ForCausalLM"
    return ModelArgs(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=cfg.get("rope_theta") or rope.get("rope_theta", 10000.0),
        rope_scaling=rope_scaling,
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        qkv_bias=cfg.get("attention_bias", is_qwen2) or is_qwen2,
        qk_norm=arch == "Qwen3ForCausalLM",
        torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype") or "float32",
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )
