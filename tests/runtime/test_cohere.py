"""Command R / R+ (CohereForCausalLM) and Command R7B / A (Cohere2ForCausalLM) beyond
test_model_parity's prefill and greedy checks: the released configs, Cohere2's layer types
without a window, and its windows and layers without RoPE through the engine's other attention
paths."""
from __future__ import annotations

import json

import pytest

from radixflow.runtime.model.model_config import load_model_args
from engine_runs import assert_greedy_as_transformers  # noqa: E402  (tests/runtime is on sys.path via conftest)

GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
COMMAND_R = {"architectures": ["CohereForCausalLM"], "hidden_size": 8192, "intermediate_size": 22528,
             "layer_norm_eps": 1e-05, "logit_scale": 0.0625, "max_position_embeddings": 8192,
             "num_attention_heads": 64, "num_hidden_layers": 40, "num_key_value_heads": 64, "rope_theta": 8000000.0,
             "use_qk_norm": False, "vocab_size": 256000}
COMMAND_R7B = {"architectures": ["Cohere2ForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
               "layer_norm_eps": 1e-05, "logit_scale": 0.25, "max_position_embeddings": 132096,
               "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rope_theta": 50000.0,
               "sliding_window": 4096, "sliding_window_pattern": 4, "vocab_size": 256000}


def _args(tmp_path, cfg: dict):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return load_model_args(str(tmp_path))


def test_the_released_configs_read_as_their_shapes(tmp_path):
    r = _args(tmp_path, COMMAND_R)
    assert r.parallel_block and r.layer_norm and not r.norm_bias and r.tie_word_embeddings and r.rope_interleaved
    assert (r.head_dim, r.logits_scaling, r.rope_theta, r.qk_layer_norm) == (128, 16.0, 8000000.0, False)
    assert _args(tmp_path, {**COMMAND_R, "use_qk_norm": True}).qk_layer_norm  # Command R+
    r7b = _args(tmp_path, COMMAND_R7B)
    assert r7b.nope_layers == tuple(range(3, 32, 4)) and r7b.sliding_window == 4096
    assert r7b.window_layers == tuple(i for i in range(32) if (i + 1) % 4) and r7b.logits_scaling == 4.0
    with pytest.raises(ValueError, match="logit_scale must be a positive number"):
        _args(tmp_path, {**COMMAND_R, "logit_scale": 0})


def test_cohere2_layers_without_a_window(tmp_path):
    """A null sliding_window where layers slide is refused (transformers refuses it too); with every
    layer full, none slides and none rotates."""
    with pytest.raises(ValueError, match="sliding_window null is not supported where layers slide"):
        _args(tmp_path, {**COMMAND_R7B, "sliding_window": None})
    args = _args(tmp_path, {**COMMAND_R7B, "sliding_window": None, "layer_types": ["full_attention"] * 32})
    assert args.window_layers == () and args.nope_layers == tuple(range(32))


@pytest.mark.parametrize("family", ["cohere", "cohere2"])
def test_engine_paths_give_transformers_greedy_tokens(hf_checkpoint, family):
    """The parallel layer, windows and layers without RoPE through prefill chunks, a cached prefix
    past the window and mixed steps: each request's greedy tokens equal transformers'."""
    assert_greedy_as_transformers(*hf_checkpoint(family), GREEDY, chunked_prefill_size=6)
