"""Mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE; GraniteMoE and OLMoE share the code): config
and checkpoint errors, the engine on them, CPU bf16's packed experts, adapters. Parity with
transformers (torch and Triton paths) is in test_model_parity.py, the ops in tests/kernels/test_moe.py."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from conftest import TOKENIZER_FILES
from lora_adapters import ATTN, merge_adapter, write_adapter
from test_model_parity import _copy_checkpoint

from radixflow.runtime import Engine
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.core import model_runner
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.model.model_config import load_model_args, model_args_from_dict
from radixflow.runtime.model.weights import build_model

GREEDY = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
PROMPTS = [[5, 77, 300, 12], [901, 44, 2, 17, 17, 250, 9], [8, 8, 8], list(range(40, 70))]


def _config(**changes) -> dict:
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
           "moe_intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2}
    cfg.update(changes)
    return cfg


def test_config_reads_each_family_and_its_sparse_layers():
    args = model_args_from_dict(_config(decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=True))
    assert (args.num_experts, args.num_experts_per_tok, args.moe_intermediate_size) == (4, 2, 16)
    assert args.moe_layers == (1,) and args.norm_topk_prob and args.qk_norm
    # transformers 5 writes Qwen3-MoE's expert count as num_local_experts
    args = model_args_from_dict({**_config(num_local_experts=8), "num_experts": None})
    assert args.num_experts == 8 and args.moe_layers == (0, 1, 2, 3) and not args.norm_topk_prob
    mixtral = {**_config(architectures=["MixtralForCausalLM"], num_local_experts=8), "num_experts": None}
    args = model_args_from_dict(mixtral)
    assert args.moe_intermediate_size == 64 and args.norm_topk_prob and not args.qk_norm
    qwen2 = model_args_from_dict(_config(architectures=["Qwen2MoeForCausalLM"],
                                         shared_expert_intermediate_size=24))
    assert qwen2.qkv_bias and qwen2.shared_expert_intermediate_size == 24
    dense = model_args_from_dict({**_config(architectures=["Qwen3ForCausalLM"])})
    assert dense.moe_layers == () and dense.num_experts == 0


@pytest.mark.parametrize("changes, match", [
    ({"num_experts_per_tok": 5}, "num_experts_per_tok 5 is more than num_experts 4"),
    ({"num_experts_per_tok": 0}, "num_experts_per_tok must be a positive integer"),
    ({"num_experts": None}, "num_local_experts .or num_experts. is missing"),
    ({"moe_intermediate_size": None}, "moe_intermediate_size is missing"),
    ({"moe_intermediate_size": -3}, "moe_intermediate_size must be a positive integer"),
    ({"mlp_only_layers": "0,1"}, "mlp_only_layers must list layer numbers"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step must be a positive integer"),
    ({"norm_topk_prob": "yes"}, "norm_topk_prob must be true or false"),
    ({"architectures": ["Qwen2MoeForCausalLM"]}, "shared_expert_intermediate_size is missing"),
])
def test_bad_moe_config_is_a_value_error_naming_the_field(tmp_path, changes, match):
    (tmp_path / "config.json").write_text(json.dumps(_config(**changes)))
    with pytest.raises(ValueError, match=match):
        load_model_args(str(tmp_path))


@pytest.mark.parametrize("family, tensor", [
    ("mixtral", "model.layers.1.block_sparse_moe.experts.3.w2.weight"),
    ("qwen3_moe", "model.layers.0.mlp.experts.2.up_proj.weight"),
    ("qwen2_moe", "model.layers.1.mlp.shared_expert_gate.weight"),
])
def test_missing_or_misshaped_expert_tensor_is_named(hf_checkpoint, tmp_path, family, tensor):
    src, _ = hf_checkpoint(family)
    os.makedirs(tmp_path / "missing")
    missing = _copy_checkpoint(src, tmp_path / "missing", drop=tensor)
    with pytest.raises(ValueError, match=tensor.replace(".", r"\.")):
        build_model(load_model_args(missing), missing, torch.float32, torch.device("cpu"), 64)
    os.makedirs(tmp_path / "short")
    short = _copy_checkpoint(src, tmp_path / "short", reshape=tensor)
    with pytest.raises(ValueError, match=tensor.replace(".", r"\.") + ".*do not fit"):
        build_model(load_model_args(short), short, torch.float32, torch.device("cpu"), 64)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_greedy_output_is_the_same_alone_batched_cached_and_chunked(hf_checkpoint, family):
    model_dir, _ = hf_checkpoint(family)
    with Engine(model_dir, kv_cache_tokens=2048, dtype="float32") as engine:
        alone = [engine.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in PROMPTS]
        batched = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
        cached = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
        assert engine.stats().prefix_hit_rate > 0
    with Engine(model_dir, kv_cache_tokens=2048, dtype="float32", chunked_prefill_size=8,
                disable_radix_cache=True) as engine:
        chunked = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
    assert alone == batched == cached == chunked
    assert len({tuple(o) for o in alone}) > 1


def test_bf16_engine_serves_a_moe_model(hf_checkpoint):
    """The CPU's bf16 path (packed projections, layers one by one since the native fused call
    takes no experts) gives the fp32 engine's first greedy token on clear margins."""
    model_dir, _ = hf_checkpoint("qwen3_moe")
    with Engine(model_dir, kv_cache_tokens=2048, dtype="bfloat16") as engine:
        outs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    with Engine(model_dir, kv_cache_tokens=2048, dtype="float32") as engine:
        ref = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    for out, want in zip(outs, ref):
        assert len(out["output_ids"]) == GREEDY["max_new_tokens"]
        assert out["output_ids"][0] == want["output_ids"][0]


def test_random_weights_build_a_moe_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**_config(vocab_size=300), "eos_token_id": 1}))
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(demo_model("tiny"), f), tmp_path)
    with Engine(str(tmp_path), load_format="dummy", kv_cache_tokens=512, dtype="float32") as engine:
        out = engine.generate(input_ids=[5, 6, 7], sampling_params=GREEDY)
    assert len(out["output_ids"]) == GREEDY["max_new_tokens"]


def test_cuda_graphs_are_off_for_a_moe_model(hf_checkpoint, monkeypatch):
    """The experts' grouping reads counts back to the host, which a graph capture forbids."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(model_runner, "resolve_backend", lambda name, device: "triton")
    cfg = EngineConfig(device="cuda", dtype="bfloat16")
    dense = load_model_args(hf_checkpoint("qwen3")[0])
    sparse = load_model_args(hf_checkpoint("qwen3_moe")[0])
    assert model_runner.derive_shape(cfg, dense).cuda_graph_max_bs > 0
    assert model_runner.derive_shape(cfg, sparse).cuda_graph_max_bs == 0


def test_attention_adapters_serve_on_a_moe_model_and_expert_adapters_are_refused(hf_checkpoint, tmp_path):
    model_dir, _ = hf_checkpoint("qwen3_moe")
    adapter = write_adapter(str(tmp_path / "attn"), model_dir, targets=ATTN)
    with Engine(model_dir, dtype="float32", lora_modules=[f"a={adapter}"]) as engine:
        adapted = engine.generate(input_ids=PROMPTS[1], sampling_params=GREEDY, lora="a")["output_ids"]
        base = engine.generate(input_ids=PROMPTS[1], sampling_params=GREEDY)["output_ids"]
    with Engine(merge_adapter(model_dir, adapter, str(tmp_path / "merged")), dtype="float32") as merged:
        assert adapted == merged.generate(input_ids=PROMPTS[1], sampling_params=GREEDY)["output_ids"]
    assert adapted != base
    # layer 0's MLP is experts (layer 1's is dense): an adapter on a dense-model layout's MLP there is refused
    mlp = write_adapter(str(tmp_path / "mlp"), model_dir, targets=("gate_proj",))
    with Engine(model_dir, dtype="float32", enable_lora=True) as engine:
        with pytest.raises(ValueError, match=r"layer 0's MLP, which is a mixture of experts"):
            engine.load_lora_adapter("m", mlp)



@pytest.mark.parametrize("family, config", [("mixtral", {"num_local_experts": 1, "num_experts_per_tok": 1}),
                                            ("qwen3_moe", {"num_local_experts": 1, "num_experts_per_tok": 1})])
def test_a_single_expert_checkpoint_loads_and_matches_transformers(tmp_path, family, config):
    import transformers as tf

    from test_model_parity import _checkpoint_with, _our_logits

    model_dir = _checkpoint_with(tmp_path, family, **config)
    hf = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPTS[1]])).logits[0]
    assert (_our_logits(model_dir, [PROMPTS[1]])[0] - ref).abs().max().item() < 1e-4


def test_zero_experts_is_a_dense_qwen_moe_model():
    args = model_args_from_dict(_config(num_experts=0))
    assert args.moe_layers == () and args.num_experts == 0


def test_join_parts_refuses_parts_that_do_not_fit_instead_of_raising_from_torch():
    from radixflow.runtime.model.weights import join_parts

    e, i, h = 4, 6, 8
    assert join_parts([torch.zeros(e, i, h), torch.zeros(e, i, h)], (e, 2 * i, h)) is not None
    assert join_parts([torch.zeros(e, i + 1, h), torch.zeros(e, i - 1, h)], (e, 2 * i, h)) is None  # gate | up split
    assert join_parts([torch.zeros(e, i, h), torch.zeros(e - 1, i, h)], (e, 2 * i, h)) is None
    assert join_parts([torch.zeros(e, i, h), torch.zeros(e, i, h - 1)], (e, 2 * i, h)) is None
    assert join_parts([torch.zeros(i, h), torch.zeros(i, h - 1)], (2 * i, h)) is None
    assert join_parts([torch.zeros(h, i)], (1, h, i)) is not None  # one expert's down
    assert join_parts([torch.zeros(2 * i, h)], (1, 2 * i, h)) is not None


def test_a_peft_adapter_on_experts_is_refused_as_such(hf_checkpoint, tmp_path):
    """PEFT names expert modules `mlp.experts.N.gate_proj` (Qwen) or `block_sparse_moe.experts.N.w1`
    (Mixtral, target `w1`): the error says adapters on experts are not supported."""
    from safetensors.torch import save_file

    from radixflow.runtime.lora.adapter import load_adapter

    for family, name, target in (("qwen3_moe", "mlp.experts.0.gate_proj", "gate_proj"),
                                 ("mixtral", "block_sparse_moe.experts.0.w1", "w1")):
        model_dir, _ = hf_checkpoint(family)
        path = tmp_path / family
        path.mkdir()
        (path / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "target_modules": [target]}))
        save_file({f"base_model.model.model.layers.0.{name}.lora_A.weight": torch.zeros(4, 64),
                   f"base_model.model.model.layers.0.{name}.lora_B.weight": torch.zeros(48, 4)},
                  str(path / "adapter_model.safetensors"))
        with pytest.raises(ValueError, match="adapters on experts are not supported"):
            load_adapter(str(path), load_model_args(model_dir), 16, frozenset({"gate_proj", "q_proj"}))


@pytest.mark.parametrize("family", ["qwen2_moe", "gpt_oss"])
def test_packed_experts_match_the_plain_weights(hf_checkpoint, family):
    """CPU bf16 packs each expert's weights (packed_linear.prepack_linears; gpt-oss's with their
    biases) and frees the stacked ones: the step's logits stay those of the plain bf16 weights up
    to bf16 rounding."""
    from radixflow.runtime.model.packed_linear import can_prepack, prepack_linears

    if not can_prepack(torch.device("cpu"), torch.bfloat16):
        pytest.skip("no oneDNN bf16 on this CPU")
    model_dir, _ = hf_checkpoint(family)
    args = load_model_args(model_dir)
    model = build_model(args, model_dir, torch.bfloat16, torch.device("cpu"), 64)
    x = torch.randn(5, args.hidden_size, dtype=torch.bfloat16)
    moe = model.layers[0].mlp
    plain = moe(x, None)
    prepack_linears(model)
    assert moe.packed_experts is not None and len(moe.packed_experts) == args.num_experts
    assert moe.experts_gate_up.stride() == (0, 0, 0)  # the stacked copy is gone
    torch.testing.assert_close(moe(x, None).float(), plain.float(), rtol=2e-2, atol=2e-2)
    with Engine(model_dir, kv_cache_tokens=512, dtype="bfloat16") as engine:
        assert engine.runner.model.layers[0].mlp.packed_experts is not None
        outs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert all(len(o["output_ids"]) == GREEDY["max_new_tokens"] for o in outs)


def test_a_bf16_checkpoint_is_not_left_mapped_and_packing_twice_keeps_the_experts(tmp_path, hf_checkpoint):
    """Loaded tensors own their memory: a checkpoint already in the engine dtype is not left mapped
    (packed weights plus the file's pages would count twice in RSS). A second prepack_linears does
    not repack the experts' emptied stacked parameters."""
    import gc

    from safetensors.torch import load_file, save_file

    from radixflow.runtime.model.packed_linear import can_prepack, prepack_linears

    src, _ = hf_checkpoint("qwen3_moe")
    bf16 = tmp_path / "bf16"
    shutil.copytree(src, bf16)
    path = str(bf16 / "model.safetensors")
    save_file({k: v.bfloat16() for k, v in load_file(path).items()}, path)
    model = build_model(load_model_args(str(bf16)), str(bf16), torch.bfloat16, torch.device("cpu"), 64)
    gc.collect()
    with open("/proc/self/maps") as f:
        assert path not in f.read()
    if not can_prepack(torch.device("cpu"), torch.bfloat16):
        return
    x = torch.randn(3, model.args.hidden_size, dtype=torch.bfloat16)
    prepack_linears(model)
    once = model.layers[0].mlp(x, None)
    prepack_linears(model)
    torch.testing.assert_close(model.layers[0].mlp(x, None), once, rtol=0, atol=0)


def _with_tensors(src: str, dst, extra: dict[str, torch.Tensor]) -> dict:
    """A copy of checkpoint `src` at `dst` holding `extra` tensors too; its config.json as a dict."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    save_file({**tensors, **extra}, str(dst / "model.safetensors"))
    return json.loads((dst / "config.json").read_text())


def test_glm4_moe_mtp_layers_are_skipped_and_bad_groups_refused(hf_checkpoint, tmp_path):
    """GLM-4.5's checkpoints store `num_nextn_predict_layers` MTP layers after the decoder's (layer
    num_hidden_layers and on): not run here, so not loaded; the same tensors without that count
    are refused as unused. Groups that cannot hold the choice are a ValueError naming them."""
    src, _ = hf_checkpoint("glm4_moe")
    dst = tmp_path / "mtp"
    cfg = _with_tensors(src, dst, {"model.layers.2.eh_proj.weight": torch.zeros(64, 128),
                                   "model.layers.2.self_attn.q_proj.weight": torch.zeros(128, 64)})
    for count in (1, 0):
        (dst / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": count}))
        if count:
            with Engine(str(dst), kv_cache_tokens=512, dtype="float32") as engine:
                with Engine(src, kv_cache_tokens=512, dtype="float32") as ref:
                    got, want = (e.generate(input_ids=PROMPTS[:2], sampling_params=GREEDY) for e in (engine, ref))
                    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
        else:
            with pytest.raises(ValueError, match="model.layers.2.eh_proj.weight.* are not used by the model"):
                Engine(str(dst), kv_cache_tokens=512, dtype="float32")
    for fields, match in (({"n_group": 3}, "n_group 3 must divide the 8 experts"),
                          ({"topk_group": 5}, "topk_group 5 be at most n_group"),
                          ({"num_experts_per_tok": 5, "topk_group": 2}, "hold the num_experts_per_tok 5"),
                          ({"n_shared_experts": -1}, "n_shared_experts must be an integer >= 0")):
        with pytest.raises(ValueError, match=match):
            model_args_from_dict({**cfg, **fields})


def test_minimax_m2_mtp_modules_are_skipped(hf_checkpoint, tmp_path):
    """MiniMax-M2 stores `num_mtp_modules` MTP layers after the decoder's: not loaded."""
    src, _ = hf_checkpoint("minimax_m2")
    dst = tmp_path / "mtp"
    cfg = _with_tensors(src, dst, {"model.layers.2.self_attn.q_proj.weight": torch.zeros(128, 64)})
    (dst / "config.json").write_text(json.dumps({**cfg, "num_mtp_modules": 1}))
    assert load_model_args(str(dst)).extra_layers == 1
    with Engine(str(dst), kv_cache_tokens=512, dtype="float32") as engine:
        assert len(engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)["output_ids"]) == 12
    (dst / "config.json").write_text(json.dumps({**cfg, "num_mtp_modules": True}))
    with pytest.raises(ValueError, match="num_mtp_modules must be an integer >= 0"):
        load_model_args(str(dst))


def test_ernie_moe_layers_and_refusals():
    """ERNIE 4.5 MoE's experts sit in the layers i with (i + 1) % interval == 0 between the start
    and end indices (-1: the last); use_bias (an LM head bias, not served) is refused."""
    cfg = {"architectures": ["Ernie4_5_MoeForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 8, "num_attention_heads": 4, "moe_intermediate_size": 32, "moe_num_experts": 4,
           "moe_k": 2}
    args = model_args_from_dict({**cfg, "moe_layer_start_index": 2, "moe_layer_interval": 2})
    assert args.moe_layers == (3, 5, 7) and args.router_correction and args.rope_interleaved
    assert model_args_from_dict({**cfg, "moe_layer_end_index": 4}).moe_layers == (1, 2, 3, 4)
    assert model_args_from_dict({**cfg, "num_experts": 6, "num_experts_per_tok": 3, "moe_num_experts": None,
                                 "moe_k": None}).num_experts == 6
    with pytest.raises(ValueError, match="use_bias true is not supported for Ernie4_5_MoeForCausalLM"):
        model_args_from_dict({**cfg, "use_bias": True})
    with pytest.raises(ValueError, match="moe_layer_end_index must be an integer >= -1"):
        model_args_from_dict({**cfg, "moe_layer_end_index": -2})


def test_glm4_moe_without_shared_experts_matches_transformers(tmp_path):
    """n_shared_experts 0: transformers still saves the shared expert's empty tensors ([0, H]),
    which carry nothing and are skipped."""
    import transformers as tf
    from test_model_parity import _checkpoint_with, _our_logits

    src = _checkpoint_with(tmp_path, "glm4_moe", n_shared_experts=0)
    args = load_model_args(src)
    assert args.shared_expert_intermediate_size == 0
    hf = tf.Glm4MoeForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    for prompt, ours in zip(PROMPTS, _our_logits(src, PROMPTS)):
        with torch.no_grad():
            assert (ours - hf(torch.tensor([prompt])).logits[0]).abs().max() < 1e-4


def test_glm4_moe_mtp_layer_default_and_alias(hf_checkpoint, tmp_path):
    """Glm4MoeConfig's num_nextn_predict_layers defaults to 1 (also read as num_mtp_layers): a
    checkpoint with its MTP layer and no such field loads as transformers loads it."""
    src, _ = hf_checkpoint("glm4_moe")
    dst = tmp_path / "mtp"
    cfg = _with_tensors(src, dst, {"model.layers.2.eh_proj.weight": torch.zeros(64, 128)})
    cfg.pop("num_nextn_predict_layers", None)
    for extra in ({}, {"num_mtp_layers": 1}):
        (dst / "config.json").write_text(json.dumps({**cfg, **extra}))
        assert load_model_args(str(dst)).extra_layers == 1
        build_model(load_model_args(str(dst)), str(dst), torch.float32, torch.device("cpu"), 64)


@pytest.mark.parametrize("family", ["glm4_moe", "ernie4_5_moe"])
def test_routers_kept_in_fp32_in_a_bf16_model(hf_checkpoint, family):
    """As transformers keeps them (_keep_in_fp32_modules_strict): GLM-4.5's and ERNIE 4.5 MoE's
    router weights and correction biases stay fp32 in a bf16 model (a bf16 bias near 4 rounds by
    1/64, enough to change which experts are chosen)."""
    src, _ = hf_checkpoint(family)
    model = build_model(load_model_args(src), src, torch.bfloat16, torch.device("cpu"), 64)
    moe = model.layers[1].mlp
    assert moe.gate.weight.dtype == moe.router_correction.dtype == torch.float32
    assert model.layers[1].self_attn.qkv_proj.weight.dtype == torch.bfloat16
