"""gpt-oss (GptOssForCausalLM) beyond test_model_parity's prefill and greedy checks: the engine's
other attention paths (a cached prefix, chunked prefill, mixed steps, n-gram drafts, overlap)
against transformers' greedy tokens, and the MXFP4 experts of the released checkpoints
dequantized at load as transformers dequantizes them."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixflow.runtime import Engine
from radixflow.runtime.model.dequantize import dequantize_mxfp4
from radixflow.runtime.model.model_config import load_model_args
from engine_runs import assert_greedy_as_transformers  # noqa: E402  (tests/runtime is on sys.path via conftest)
from test_model_parity import _hf_greedy  # noqa: E402

GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


def test_config_reads_gpt_oss_as_transformers_does(hf_checkpoint):
    model_dir, hf = hf_checkpoint("gpt_oss")
    args = load_model_args(model_dir)
    assert args.attention_sinks and args.router_bias and args.expert_bias and args.expert_act == "swiglu_clamped"
    assert args.swiglu_limit == hf.config.swiglu_limit and args.swiglu_alpha == hf.config.swiglu_alpha
    assert args.window_layers == tuple(i for i, t in enumerate(hf.config.layer_types) if t == "sliding_attention")
    assert args.sliding_window == hf.config.sliding_window and args.moe_layers == (0, 1)
    assert args.qkv_bias and args.o_bias and args.norm_topk_prob
    assert args.rope_scaling["rope_type"] == "yarn" and args.rope_theta == 150_000.0


@pytest.mark.parametrize("options", [
    dict(chunked_prefill_size=8),                      # prompts in chunks: extends over a cached prefix
    dict(enable_overlap=True),
    dict(speculative_algorithm="ngram", speculative_ngram_min=1, speculative_ngram_max=2),
])
def test_engine_paths_give_transformers_greedy_tokens(hf_checkpoint, options):
    """Sinks in every attention path the engine takes: prefill chunks and a second request on a
    cached prefix (extend with a prefix, past the 8-token window), batched decode, mixed steps,
    verify rows of drafts; each request's greedy tokens equal transformers'."""
    assert_greedy_as_transformers(*hf_checkpoint("gpt_oss"), GREEDY, **options)


def _mxfp4(shape: tuple[int, ...], g: torch.Generator, low: int = 118, high: int = 123) -> tuple[torch.Tensor, ...]:
    """Random MXFP4 (blocks, scales) of a float [..., out, in] tensor: every code, scales 2^(low-127)
    to 2^(high-128) (values up to 6 times that)."""
    *lead, out, cols = shape
    blocks = torch.randint(0, 256, (*lead, out, cols // 32, 16), generator=g, dtype=torch.int64).to(torch.uint8)
    scales = torch.randint(low, high, (*lead, out, cols // 32), generator=g, dtype=torch.int64).to(torch.uint8)
    return blocks, scales


def test_mxfp4_codes_dequantize_as_transformers_dequantizes_them():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(3)
    blocks, scales = _mxfp4((3, 8, 64), g, 120, 135)
    blocks[0, 0, 0] = torch.arange(16, dtype=torch.uint8) * 17  # both nibbles of every code
    ours = dequantize_mxfp4(blocks, scales, "t")
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert ours.shape == want.shape == (3, 64, 8)
    assert torch.equal(ours, want)
    assert set(ours[0, :32, 0].abs().tolist()) >= {0.0, 6.0 * 2.0 ** (int(scales[0, 0, 0]) - 127)}


def _mxfp4_checkpoints(tmp_path, hf_dir: str) -> tuple[str, str]:
    """(MXFP4 checkpoint, float checkpoint) of one gpt-oss model: its experts stored as MXFP4 codes
    in one (as the released checkpoints store them), as transformers' dequantization of those codes
    in the other."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(11)
    tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
    quantized, floats = dict(tensors), dict(tensors)
    for name, t in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = _mxfp4(tuple(t.transpose(1, 2).shape), g)  # the codes of [E, out, in]
            del quantized[name]
            quantized[name + "_blocks"], quantized[name + "_scales"] = blocks, scales
            floats[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).contiguous()  # [E, in, out]
    dirs = []
    for kind, state in (("mxfp4", quantized), ("float", floats)):
        out = tmp_path / kind
        shutil.copytree(hf_dir, out)
        cfg = json.loads((out / "config.json").read_text())
        if kind == "mxfp4":
            cfg["quantization_config"] = {"quant_method": "mxfp4",
                                          "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                     "model.embed_tokens", "lm_head"]}
        (out / "config.json").write_text(json.dumps(cfg))
        save_file(state, str(out / "model.safetensors"))
        dirs.append(str(out))
    return dirs[0], dirs[1]


def test_an_mxfp4_checkpoint_serves_the_floats_its_codes_mean(hf_checkpoint, tmp_path):
    """The released checkpoints' form: each layer's experts as `_blocks` / `_scales`. Served, it
    gives the greedy tokens and logprobs (bit for bit) of the float checkpoint holding transformers'
    dequantization of the same codes, and that one gives transformers' own greedy tokens."""
    import transformers as tf

    hf_dir, _ = hf_checkpoint("gpt_oss")
    quantized, floats = _mxfp4_checkpoints(tmp_path, hf_dir)
    prompts = [[5, 77, 300, 12], [901, 44, 2, 17, 17, 250, 9]]
    runs = []
    for model_dir in (quantized, floats):
        with Engine(model_dir, kv_cache_tokens=1024, dtype="float32") as engine:
            outs = engine.generate(input_ids=prompts, return_logprob=True, sampling_params=GREEDY)
        runs.append([(o["output_ids"], o["meta_info"]["output_token_logprobs"]) for o in outs])
    assert runs[0] == runs[1]
    hf = tf.GptOssForCausalLM.from_pretrained(floats, dtype=torch.float32, attn_implementation="eager").eval()
    for p, (ids, _) in zip(prompts, runs[1]):
        assert ids == _hf_greedy(hf, p, GREEDY["max_new_tokens"])


@pytest.mark.parametrize("change, match", [
    (lambda t, n: t.pop(n + "_scales"), "has blocks but no"),
    (lambda t, n: t.update({n + "_blocks": t[n + "_blocks"].to(torch.int16)}), "must be stored as uint8"),
    (lambda t, n: t.update({n + "_scales": t[n + "_scales"][..., :1].contiguous()}), "must be scales' shape"),
])
def test_malformed_mxfp4_tensors_are_refused_naming_them(hf_checkpoint, tmp_path, change, match):
    hf_dir, _ = hf_checkpoint("gpt_oss")
    quantized, _ = _mxfp4_checkpoints(tmp_path, hf_dir)
    path = os.path.join(quantized, "model.safetensors")
    tensors = load_file(path)
    change(tensors, "model.layers.1.mlp.experts.down_proj")
    save_file(tensors, path)
    with pytest.raises(ValueError, match=f"model.layers.1.mlp.experts.down_proj.*{match}|{match}.*down_proj"):
        Engine(quantized, kv_cache_tokens=512, dtype="float32")


def test_mxfp4_outside_the_experts_is_refused(hf_checkpoint, tmp_path):
    """MXFP4 is read where gpt-oss stores it, its experts (in x @ W order); a `_blocks` tensor
    anywhere else would load transposed, so it is refused naming the tensor."""
    hf_dir, _ = hf_checkpoint("gpt_oss")
    quantized, _ = _mxfp4_checkpoints(tmp_path, hf_dir)
    path = os.path.join(quantized, "model.safetensors")
    tensors = load_file(path)
    name = "model.layers.0.self_attn.o_proj.weight"
    blocks, scales = _mxfp4(tuple(tensors.pop(name).shape), torch.Generator().manual_seed(1))
    tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    save_file(tensors, path)
    with pytest.raises(ValueError, match="o_proj.weight.*MXFP4 is read for gpt-oss's experts only"):
        Engine(quantized, kv_cache_tokens=512, dtype="float32")


def test_mxfp4_scales_at_the_top_of_the_range_dequantize_as_transformers_does():
    """Scale byte 255 (the MX spec's NaN; transformers reads it as 2^128): a zero code stays 0."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks = (torch.arange(16, dtype=torch.uint8) * 17).reshape(1, 1, 1, 16)  # every code, both nibbles
    for scale in (0, 1, 254, 255):
        scales = torch.full((1, 1, 1), scale, dtype=torch.uint8)
        ours, want = dequantize_mxfp4(blocks, scales, "t"), convert_moe_packed_tensors(blocks, scales,
                                                                                       dtype=torch.float32)
        assert torch.equal(ours.nan_to_num(), want.nan_to_num()) and ours.isnan().sum() == want.isnan().sum()


def test_config_fields_read_as_transformers_reads_gpt_oss():
    """`num_experts` is GptOssConfig's alias of num_local_experts; hidden_act is ignored (the
    experts always take the clamped SwiGLU), as transformers ignores it."""
    import transformers as tf

    from radixflow.runtime.model.model_config import model_args_from_dict

    cfg = {"architectures": ["GptOssForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 8, "num_experts": 8, "hidden_act": "gelu"}
    ref = tf.GptOssConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
    args = model_args_from_dict(cfg)
    assert args.num_experts == ref.num_local_experts == 8 and args.expert_act == "swiglu_clamped"
    assert args.num_experts_per_tok == ref.num_experts_per_tok
