"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL checkpoints served as their language models (text only): the
text config read from `text_config` or the released flat form, the vision tower's tensors skipped,
the multimodal RoPE read as plain RoPE (a text-only prompt's three positions are one); logits and
greedy tokens as transformers' multimodal model gives them for text."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from radixflow.runtime import Engine
from radixflow.runtime.model.model_config import load_model_args
from test_model_parity import _hf_greedy, _our_logits  # noqa: E402  (tests/runtime is on sys.path via conftest)

PROMPTS = [[5, 77, 300, 12], [901, 44, 2, 17, 17, 250, 9, 1000, 3, 64, 88]]


def _vl_checkpoint(tmp_path, kind: str):
    """A tiny random VL model of `kind` saved with the demo tokenizer; (dir, transformers model)."""
    import transformers as tf

    from conftest import TOKENIZER_FILES
    from radixflow.runtime.model.demo import demo_model
    from radixflow.runtime.text.tokenizer import Tokenizer

    demo = demo_model("tiny")
    text = dict(vocab_size=Tokenizer.from_dir(demo).vocab_size, hidden_size=64, intermediate_size=112,
                num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64)
    # the multimodal RoPE's sections, one per position axis, summing to the head's rotated pairs
    if kind == "qwen3_vl_moe":  # experts in layer 1 (layer 0 dense), one gate | up and one down tensor each
        text.update(head_dim=16, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0])
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 500_000.0, "mrope_section": [2, 3, 3],
                                   "mrope_interleaved": True}
        vision["deepstack_visual_indexes"] = [0]
        cfg = tf.Qwen3VLMoeConfig(text_config=text, vision_config=vision)
        cls = tf.Qwen3VLMoeForConditionalGeneration
    elif kind == "qwen3_vl":
        text["head_dim"] = 16
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 500_000.0, "mrope_section": [2, 3, 3],
                                   "mrope_interleaved": True}
        vision["deepstack_visual_indexes"] = [0]
        cfg = tf.Qwen3VLConfig(text_config=text, vision_config=vision)
        cls = tf.Qwen3VLForConditionalGeneration
    elif kind == "qwen2_vl":
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [1, 1, 2]}
        cfg = tf.Qwen2VLConfig(text_config=text, vision_config=dict(depth=1, embed_dim=32, num_heads=2,
                                                                     hidden_size=64, mlp_ratio=1))
        cls = tf.Qwen2VLForConditionalGeneration
    elif kind == "glm4v":  # GLM-4.1V: GLM-4's layer, half of each head (hidden / heads = 8) rotated in interleaved pairs
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10_000.0, "mrope_section": [0, 1, 1],
                                   "partial_rotary_factor": 0.5}
        cfg = tf.Glm4vConfig(text_config=text, vision_config=dict(depth=1, hidden_size=32, num_heads=2,
                                                                  intermediate_size=32, out_hidden_size=64))
        cls = tf.Glm4vForConditionalGeneration
    elif kind == "glm4v_moe":  # GLM-4.5V: GLM-4.5's experts (layer 0 dense), half of each head rotated
        text.update(moe_intermediate_size=24, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                    first_k_dense_replace=1, routed_scaling_factor=2.0)  # head_dim: hidden / heads = 8
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10_000.0, "mrope_section": [0, 1, 1],
                                   "partial_rotary_factor": 0.5}
        cfg = tf.Glm4vMoeConfig(text_config=text, vision_config=dict(depth=1, hidden_size=32, num_heads=2,
                                                                     intermediate_size=32, out_hidden_size=64))
        cls = tf.Glm4vMoeForConditionalGeneration
    else:
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [1, 1, 2]}
        cfg = tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision)
        cls = tf.Qwen2_5_VLForConditionalGeneration
    torch.manual_seed(3)
    hf = cls(cfg).float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
            elif "norm" in name:
                p.normal_(1.0, 0.3)
            elif "bias" in name:
                p.normal_(0.0, 0.05)
    out = tmp_path / kind
    hf.save_pretrained(str(out))
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(demo, f), out)
    return str(out), hf


def _hf_logits(hf, prompt):
    with torch.no_grad():
        return hf(input_ids=torch.tensor([prompt])).logits[0].float()


@pytest.mark.parametrize("kind, arch", [("qwen2_vl", "Qwen2ForCausalLM"), ("qwen2_5_vl", "Qwen2ForCausalLM"),
                                        ("qwen3_vl", "Qwen3ForCausalLM"), ("qwen3_vl_moe", "Qwen3MoeForCausalLM"),
                                        ("glm4v", "Glm4ForCausalLM"), ("glm4v_moe", "Glm4MoeForCausalLM")])
def test_a_vl_checkpoint_serves_its_language_model(tmp_path, kind, arch):
    model_dir, hf = _vl_checkpoint(tmp_path, kind)
    args = load_model_args(model_dir)
    assert args.architecture == arch and args.rope_scaling is None
    for prompt, ours in zip(PROMPTS, _our_logits(model_dir, PROMPTS)):
        assert (ours - _hf_logits(hf, prompt)).abs().max() < 1e-4
    with Engine(model_dir, kv_cache_tokens=1024, dtype="float32") as engine:
        outs = engine.generate(input_ids=PROMPTS, sampling_params={"max_new_tokens": 16, "temperature": 0,
                                                                   "ignore_eos": True})
    for prompt, out in zip(PROMPTS, outs):
        assert out["output_ids"] == _hf_greedy(hf, prompt, 16)


@pytest.mark.parametrize("text_class", ["Qwen2VLTextConfig", "Qwen2_5_VLTextConfig", "Qwen3VLTextConfig",
                                        "Glm4vTextConfig", "Glm4vMoeTextConfig"])
def test_absent_text_fields_take_the_vl_text_config_class_defaults(tmp_path, text_class):
    """What a VL config leaves out is its text config class's (Qwen2-VL's rms_norm_eps 1e-5 and 8
    KV heads, not Qwen2's), in the text_config and the flat form alike."""
    import transformers as tf

    arch = {"Qwen2VLTextConfig": "Qwen2VLForConditionalGeneration",
            "Qwen2_5_VLTextConfig": "Qwen2_5_VLForConditionalGeneration",
            "Qwen3VLTextConfig": "Qwen3VLForConditionalGeneration", "Glm4vTextConfig": "Glm4vForConditionalGeneration",
            "Glm4vMoeTextConfig": "Glm4vMoeForConditionalGeneration"}[text_class]
    shape = dict(vocab_size=96, hidden_size=256, intermediate_size=96, num_hidden_layers=2, num_attention_heads=32)
    ref = getattr(tf, text_class)(**shape)
    for form in ({"text_config": shape}, shape):
        (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch], **form}))
        args = load_model_args(str(tmp_path))
        assert (args.num_kv_heads, args.rms_norm_eps, args.max_position_embeddings, args.rope_theta) == (
            ref.num_key_value_heads, ref.rms_norm_eps, ref.max_position_embeddings, ref.rope_parameters["rope_theta"])
        assert args.head_dim == (getattr(ref, "head_dim", None) or 256 // 32)
        if text_class.startswith("Glm4v"):  # the rotated part: rope_parameters' factor, else the class's default
            factor = ref.rope_parameters.get("partial_rotary_factor", 1.0)
            assert args.rope_dim == int(args.head_dim * factor) and args.qkv_bias and not args.o_bias


@pytest.mark.parametrize("arch, tied", [("Qwen2_5_VLForConditionalGeneration", True),
                                        ("Qwen3VLForConditionalGeneration", False)])
def test_the_head_ties_as_transformers_ties_it(tmp_path, arch, tied):
    """With no top-level tie_word_embeddings, Qwen2(.5)-VL take the text config's, Qwen3-VL its own
    default (false), as transformers' VL config classes read them."""
    text = dict(vocab_size=96, hidden_size=256, intermediate_size=96, num_hidden_layers=2, num_attention_heads=32,
                tie_word_embeddings=True)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch], "text_config": text}))
    assert load_model_args(str(tmp_path)).tie_word_embeddings is tied
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch], "text_config": text,
                                                      "tie_word_embeddings": not tied}))
    assert load_model_args(str(tmp_path)).tie_word_embeddings is (not tied)


def test_qwen3_vl_moe_experts_in_the_released_layout(tmp_path):
    """Qwen3-VL-MoE's released files store each layer's experts as x @ W (gate_up [E, H, 2I], down
    [E, I, H]); transformers saves them as it holds them ([E, 2I, H], [E, H, I]): both load alike."""
    from safetensors.torch import load_file, save_file

    model_dir, hf = _vl_checkpoint(tmp_path, "qwen3_vl_moe")
    assert load_model_args(model_dir).stacked_experts and load_model_args(model_dir).moe_layers == (1,)
    path = os.path.join(model_dir, "model.safetensors")
    tensors = load_file(path)
    for name in [n for n in tensors if ".mlp.experts." in n]:
        tensors[name] = tensors[name].transpose(1, 2).contiguous()
    save_file(tensors, path)
    for prompt, ours in zip(PROMPTS, _our_logits(model_dir, PROMPTS)):
        assert (ours - _hf_logits(hf, prompt)).abs().max() < 1e-4


def test_the_released_flat_qwen2_5_vl_config_reads_alike(tmp_path):
    """Qwen2.5-VL's released config.json: the text fields at the top level beside vision_config,
    rope_scaling {"type": "mrope", "mrope_section": [...]}."""
    model_dir, _ = _vl_checkpoint(tmp_path, "qwen2_5_vl")
    path = os.path.join(model_dir, "config.json")
    cfg = json.load(open(path))
    text = cfg.pop("text_config")
    flat = {**cfg, **{k: v for k, v in text.items() if k not in ("rope_parameters", "model_type")},
            "rope_theta": text["rope_parameters"]["rope_theta"],
            "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]}}
    before = load_model_args(model_dir)
    json.dump(flat, open(path, "w"))
    after = load_model_args(model_dir)
    assert after == before


def _mistral3(tmp_path):
    import transformers as tf

    from conftest import TOKENIZER_FILES
    from radixflow.runtime.model.demo import demo_model
    from radixflow.runtime.text.tokenizer import Tokenizer

    demo = demo_model("tiny")
    text = dict(vocab_size=Tokenizer.from_dir(demo).vocab_size, hidden_size=64, intermediate_size=112,
                num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                max_position_embeddings=512, sliding_window=None, bos_token_id=None, eos_token_id=None,
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000_000.0})
    vision = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=16)
    torch.manual_seed(5)
    hf = tf.Mistral3ForConditionalGeneration(tf.Mistral3Config(text_config=text, vision_config=vision)).float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    out = tmp_path / "mistral3"
    hf.save_pretrained(str(out))
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(demo, f), out)
    return str(out), hf


def test_mistral3_serves_its_language_model(tmp_path):
    """Mistral-Small-3.x (Mistral3ForConditionalGeneration) as its Mistral text model; its tie as
    the top-level flag says (transformers writes true), else as its text config says (the released
    configs have no top-level flag, and store the head: untied, the head used)."""
    from safetensors.torch import load_file, save_file

    model_dir, hf = _mistral3(tmp_path)
    args = load_model_args(model_dir)
    assert args.architecture == "MistralForCausalLM" and args.tie_word_embeddings and args.sliding_window is None
    for prompt, ours in zip(PROMPTS, _our_logits(model_dir, PROMPTS)):
        assert (ours - _hf_logits(hf, prompt)).abs().max() < 1e-4
    # the released form: no top-level tie, a head of its own stored beside the embeddings
    path = os.path.join(model_dir, "config.json")
    cfg = json.load(open(path))
    del cfg["tie_word_embeddings"]
    json.dump(cfg, open(path, "w"))
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    head = torch.randn(tensors["language_model.model.embed_tokens.weight"].shape, generator=torch.Generator().manual_seed(2))
    save_file({**tensors, "language_model.lm_head.weight": head * 0.08}, os.path.join(model_dir, "model.safetensors"))
    assert not load_model_args(model_dir).tie_word_embeddings
    with torch.no_grad():
        hf.lm_head.weight = torch.nn.Parameter(head * 0.08)  # the text model with its own head
    for prompt, ours in zip(PROMPTS, _our_logits(model_dir, PROMPTS)):
        assert (ours - _hf_logits(hf, prompt)).abs().max() < 1e-4
