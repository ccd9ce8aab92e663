"""The decoder matches transformers on the same weights: prefill logits and greedy output."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixflow.runtime.model.attention import AttentionOps, PoolAttention
from radixflow.runtime.core.forward_batch import ForwardBatch
from radixflow.runtime.core.kv_pool import KVPool, ReqToTokenPool
from radixflow.runtime.model.model_config import load_model_args
from radixflow.runtime.model.weights import build_model

FAMILIES = ["llama3", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "smollm3", "granite",
            "granitemoe", "phi3", "phi3_partial", "olmo2", "olmo3", "olmoe", "gemma", "gemma2", "gemma3", "seed_oss", "internlm3", "ernie4_5", "glm", "glm4", "exaone4", "hunyuan", "arcee", "apertus", "starcoder2",
            "gpt_oss", "glm4_moe", "minimax_m2", "ernie4_5_moe", "deepseek_v2", "deepseek_v3", "llama4",
            "cohere", "cohere2", "hunyuan_moe", "dots1", "ministral", "ministral3"]


def _our_logits(model_dir: str, prompts: list[list[int]], windows: dict[int, int] | None = None) -> list[torch.Tensor]:
    """All-position logits of each prompt, computed as one batched extend step (`windows`: the
    layers' sliding windows, else the model's)."""
    args = load_model_args(model_dir)
    model = build_model(args, model_dir, torch.float32, torch.device("cpu"), 512)
    pool = KVPool(1024, args.num_layers, args.num_kv_heads, args.head_dim, torch.float32, torch.device("cpu"))
    table = ReqToTokenPool(8, 512, torch.device("cpu"))
    lens = [len(p) for p in prompts]
    slots = [pool.alloc(n) for n in lens]
    rows = list(range(len(prompts)))
    table.write(rows, [0] * len(rows), slots)
    starts = [sum(lens[:i]) for i in range(len(lens))]
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    fb = ForwardBatch(
        is_decode=False, input_ids=t([x for p in prompts for x in p]),
        positions=t([i for n in lens for i in range(n)]), out_slots=t([s for ss in slots for s in ss]),
        req_to_token=table.table, req_rows=t(rows), prefix_lens=t([0] * len(lens)), extend_lens=t(lens),
        seq_lens=t(lens), extend_starts=t(starts), logit_rows=t(list(range(sum(lens)))),
        prefix_lens_cpu=[0] * len(lens), extend_lens_cpu=lens)
    attn = PoolAttention(pool, AttentionOps.for_backend("torch"), args.sm_scale,
                         windows=args.layer_windows if windows is None else windows,
                         softcap=args.attn_logit_softcapping, chunks=args.layer_chunks)
    logits = model(fb, attn)
    return list(logits.split(lens))


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_match_transformers(hf_checkpoint, family):
    model_dir, hf = hf_checkpoint(family)
    g = torch.Generator().manual_seed(0)
    vocab = hf.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (1, 5, 17, 40)]
    ours = _our_logits(model_dir, prompts)
    for p, mine in zip(prompts, ours):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0].float()
        assert (mine - ref).abs().max().item() < 1e-4


def test_sharded_checkpoint_loads_identically(hf_checkpoint):
    sharded_dir, _ = hf_checkpoint("llama3", shard=True)
    single_dir, _ = hf_checkpoint("llama3")
    assert os.path.isfile(os.path.join(sharded_dir, "model.safetensors.index.json"))
    prompt = [[3, 14, 15, 92, 65, 35]]
    torch.testing.assert_close(_our_logits(sharded_dir, prompt)[0], _our_logits(single_dir, prompt)[0],
                               rtol=0, atol=0)


def _hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_continuation_matches_transformers(hf_checkpoint, family):
    from radixflow.runtime import Engine

    model_dir, hf = hf_checkpoint(family)
    prompts = [[5, 77, 300, 12], [901, 44, 2, 17, 17, 250, 9]]
    with Engine(model_dir, kv_cache_tokens=2048, dtype="float32") as engine:  # exact vs the fp32 reference
        outs = engine.generate(input_ids=prompts,
                               sampling_params={"max_new_tokens": 32, "temperature": 0, "ignore_eos": True})
    for p, out in zip(prompts, outs):
        assert out["output_ids"] == _hf_greedy(hf, p, 32)


def _copy_checkpoint(src: str, dst, drop: str | None = None, reshape: str | None = None) -> str:
    for f in os.listdir(src):
        if f != "model.safetensors":
            with open(os.path.join(src, f), "rb") as a, open(dst / f, "wb") as b:
                b.write(a.read())
    tensors = load_file(os.path.join(src, "model.safetensors"))
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = tensors[reshape][:-1].contiguous()
    save_file(tensors, str(dst / "model.safetensors"))
    return str(dst)


def test_missing_tensor_is_named(hf_checkpoint, tmp_path):
    src, _ = hf_checkpoint("qwen2")
    bad = _copy_checkpoint(src, tmp_path, drop="model.layers.1.self_attn.k_proj.bias")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias"):
        build_model(load_model_args(bad), bad, torch.float32, torch.device("cpu"), 64)


def test_misshaped_tensor_is_named(hf_checkpoint, tmp_path):
    src, _ = hf_checkpoint("llama3")
    bad = _copy_checkpoint(src, tmp_path, reshape="model.layers.0.mlp.down_proj.weight")
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.down_proj\.weight"):
        build_model(load_model_args(bad), bad, torch.float32, torch.device("cpu"), 64)


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="unsupported architecture.*GPT2LMHeadModel"):
        load_model_args(str(tmp_path))


def test_demo_tiny_model_matches_transformers():
    """The built-in demo model itself: prefill logits and 32 greedy tokens."""
    from transformers import LlamaForCausalLM

    from radixflow.runtime import Engine, demo_model

    model_dir = demo_model("tiny")
    hf = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    prompts = [[3067, 100, 200, 300], [3067] + list(range(400, 433))]
    for p, mine in zip(prompts, _our_logits(model_dir, prompts)):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0].float()
        assert (mine - ref).abs().max().item() < 1e-4
    with Engine(model_dir, kv_cache_tokens=2048, dtype="float32") as engine:  # exact vs the fp32 reference
        outs = engine.generate(input_ids=prompts,
                               sampling_params={"max_new_tokens": 32, "temperature": 0, "ignore_eos": True})
    for p, out in zip(prompts, outs):
        assert out["output_ids"] == _hf_greedy(hf, p, 32)


def _checkpoint_with(tmp_path, family: str, **config) -> str:
    """A tiny checkpoint of `family` with `config` over the fixture's settings, random weights."""
    import transformers as tf

    from conftest import SAVED_ARCHITECTURES, TOKENIZER_FILES, _CLASSES, _hf_config
    from radixflow.runtime.model.demo import demo_model

    from radixflow.runtime.text.tokenizer import Tokenizer

    base = _hf_config(family, Tokenizer.from_dir(demo_model("tiny")).vocab_size)
    fields = {k: v for k, v in base.to_dict().items() if k != "layer_types"}  # derived from the window fields
    cfg = type(base)(**{**fields, **config})
    torch.manual_seed(0)
    hf = getattr(tf, _CLASSES[family])(cfg).float().eval()
    hf.save_pretrained(str(tmp_path))
    if family in SAVED_ARCHITECTURES:  # transformers runs it on another family's class
        saved = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**saved, "architectures": [SAVED_ARCHITECTURES[family]]}))
    for f in TOKENIZER_FILES:
        with open(os.path.join(demo_model("tiny"), f), "rb") as a, open(tmp_path / f, "wb") as b:
            b.write(a.read())
    return str(tmp_path)


@pytest.mark.parametrize("family, config, layers", [
    ("mistral", {"sliding_window": 6}, [0, 1]),                  # Mistral-7B-v0.1's sliding_window 4096
    ("phi3", {"sliding_window": 6}, [0, 1]),                     # Phi-3-mini-4k's 2047
    ("mixtral", {"sliding_window": 6}, [0, 1]),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1}, [1]),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 0}, [0, 1]),
    ("qwen2_moe", {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 2}, [0]),
    ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 6}, [0, 1]),
    ("smollm3", {"use_sliding_window": True, "sliding_window": 6}, [1]),  # its layers without RoPE
    ("qwen2", {"use_sliding_window": False, "sliding_window": 6}, []),    # Qwen2's default: off
    ("olmo3", {"sliding_window": 6}, [0, 1]),
    ("starcoder2", {"sliding_window": 6}, [0, 1]),  # every layer, as Mistral's
    ("exaone4", {"sliding_window": 6, "sliding_window_pattern": 2}, [0]),  # layer 1 global, without RoPE  # all but every fourth layer; the window layers' own RoPE base
])
def test_a_sliding_window_matches_transformers_past_it(tmp_path, family, config, layers):
    """Each family's window is attended in the layers transformers gives it, past the window too:
    prefill logits, and greedy decoding through the engine (the cap on the context it replaces
    gave up everything past the window)."""
    import transformers as tf

    from radixflow.runtime import Engine

    model_dir = _checkpoint_with(tmp_path, family, **config)
    hf = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # wide weights, so that what a window hides moves the logits
        for p in hf.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    hf.save_pretrained(model_dir)
    args = load_model_args(model_dir)
    assert list(args.window_layers) == layers and args.sliding_window == (6 if layers else None)
    prompt = torch.randint(0, hf.config.vocab_size, (30,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float()
    mine = _our_logits(model_dir, [prompt])[0]
    assert (mine - ref).abs().max().item() < 1e-4
    if layers:  # the window matters at these sizes: full attention would be far off
        assert (_our_logits(model_dir, [prompt], windows={})[0] - ref).abs().max().item() > 1e-2
    with Engine(model_dir, kv_cache_tokens=512, dtype="float32", chunked_prefill_size=8) as engine:
        assert engine.runner.shape.max_context_len == 512  # not capped at the window
        out = engine.generate(input_ids=prompt[:9], sampling_params={"max_new_tokens": 12, "temperature": 0.0,
                                                                     "ignore_eos": True})
    assert out["output_ids"] == _hf_greedy(hf, prompt[:9], 12)


@pytest.mark.parametrize("family, scaling", [
    ("qwen2", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),  # Qwen2.5 / Qwen3's long context
    ("qwen3", {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "beta_fast": 16,
               "beta_slow": 2, "truncate": False}),
    ("llama3", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 0.8,
                "mscale_all_dim": 0.5}),
    ("mistral", {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16, "attention_factor": 1.3}),
])
def test_yarn_rope_scaling_matches_transformers(tmp_path, family, scaling):
    """YaRN (refused before): per-dimension interpolation and the cos/sin attention factor."""
    import transformers as tf

    model_dir = _checkpoint_with(tmp_path, family, rope_scaling=scaling)
    hf = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    hf.save_pretrained(model_dir)
    assert load_model_args(model_dir).rope_scaling["rope_type"] == "yarn"
    prompt = torch.randint(0, hf.config.vocab_size, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float()
    assert (_our_logits(model_dir, [prompt])[0] - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("scaling, match", [
    ({"rope_type": "su", "factor": 2.0}, "unsupported rope_scaling type 'su'"),  # Phi-3's name only
    ({"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}, "longrope is supported for Phi3ForCausalLM"),
    ({"rope_type": "yarn", "factor": 0, "original_max_position_embeddings": 16},
     "rope_scaling factor must be a positive number"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": "4k"}, "original_max_position_embeddings"),
])
def test_rope_scalings_not_computed_are_refused(tmp_path, scaling, match):
    with pytest.raises(ValueError, match=match):
        _args_of(tmp_path, "Qwen2ForCausalLM", rope_scaling=scaling)


@pytest.mark.parametrize("family", ["internlm3", "hunyuan"])
def test_dynamic_scaling_is_plain_rope_within_max_position_embeddings(tmp_path, family):
    """transformers' dynamic NTK scaling (internlm3-8b-instruct's config) stretches the base only
    for sequences past max_position_embeddings: within it the logits are plain RoPE's; a context
    past it is refused. HunYuan's `dynamic` with an alpha is its fixed stretch (FAMILIES' hunyuan)."""
    import transformers as tf

    from radixflow.runtime import Engine

    model_dir = _checkpoint_with(tmp_path, family, rope_scaling={"rope_type": "dynamic", "factor": 6.0},
                                 max_position_embeddings=64)
    hf = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert load_model_args(model_dir).rope_scaling["rope_type"] == "dynamic"
    prompt = torch.randint(0, hf.config.vocab_size, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float()
    assert (_our_logits(model_dir, [prompt])[0] - ref).abs().max().item() < 1e-4
    with pytest.raises(ValueError, match="max_model_len 128 is past the model's max_position_embeddings 64"):
        Engine(model_dir, max_model_len=128, kv_cache_tokens=256)


@pytest.mark.parametrize("kind", ["yarn", "su"])
def test_phi3s_old_names_for_longrope_are_longrope(tmp_path, kind):
    """Phi-3 configs once named longrope `su` or `yarn` (with short and long factors): transformers
    reads both as longrope (tests/runtime/test_longrope.py), not as YaRN."""
    args = _args_of(tmp_path, "Phi3ForCausalLM", rope_scaling={"type": kind, "short_factor": [1.0] * 4,
                                                                "long_factor": [2.0] * 4})
    assert args.rope_scaling["rope_type"] == "longrope" and args.long_rope_len == 4096


def test_llama3_scaling_without_its_original_context_takes_max_position_embeddings(tmp_path):
    """As transformers fills it in (Apertus' and Arcee's older configs leave it out)."""
    import transformers as tf

    model_dir = _checkpoint_with(tmp_path, "llama3", max_position_embeddings=64, rope_scaling={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0})
    saved = json.loads((tmp_path / "config.json").read_text())  # transformers writes it: take it out again
    saved["rope_parameters"].pop("original_max_position_embeddings")
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert load_model_args(model_dir).rope_scaling["original_max_position_embeddings"] == 64
    hf = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert hf.config.rope_parameters.get("original_max_position_embeddings", 64) == 64
    prompt = torch.randint(0, hf.config.vocab_size, (40,), generator=torch.Generator().manual_seed(6)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float()
    assert (_our_logits(model_dir, [prompt])[0] - ref).abs().max().item() < 1e-4


def test_yarn_scales_from_the_familys_context_when_the_config_names_none(tmp_path):
    """Neither original_max_position_embeddings nor max_position_embeddings: YaRN scales from the
    family's default context (Qwen2Config's 32768), as transformers does."""
    import transformers as tf

    fields = {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], **fields}))
    scaling = load_model_args(str(tmp_path)).rope_scaling
    want = tf.Qwen2Config(**fields)
    assert scaling["original_max_position_embeddings"] == want.max_position_embeddings == 32768


@pytest.mark.parametrize("family, config", [
    ("llama3", {"attention_bias": True}),   # q, k, v and o_proj biases
    ("llama3", {"mlp_bias": True}),         # gate, up and down biases
    ("qwen3", {"attention_bias": True}),
])
def test_projection_biases_match_transformers(tmp_path, family, config):
    """Biases a config turns on are loaded and added, not dropped (o_proj's and the MLP's were)."""
    import transformers as tf

    model_dir = _checkpoint_with(tmp_path, family, **config)
    hf = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # the saved biases are zeros by default: make them matter
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    hf.save_pretrained(model_dir)
    prompt = [3, 14, 15, 92, 65, 35]
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float()
    assert (_our_logits(model_dir, [prompt])[0] - ref).abs().max().item() < 1e-4


def test_a_checkpoint_tensor_the_model_does_not_use_is_refused(hf_checkpoint, tmp_path):
    """An unused tensor is a feature not served (a quantized checkpoint's weight scales, a bias the
    config does not declare): loading without it would give wrong outputs silently."""
    src, _ = hf_checkpoint("llama3")
    bad = _copy_checkpoint(src, tmp_path)
    tensors = load_file(os.path.join(bad, "model.safetensors"))
    tensors["model.layers.1.mlp.down_proj.weight_scale"] = torch.ones(1)
    save_file(tensors, os.path.join(bad, "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.down_proj\.weight_scale.*not used"):
        build_model(load_model_args(bad), bad, torch.float32, torch.device("cpu"), 64)


@pytest.mark.parametrize("act", ["gelu", "relu", 3])
def test_an_mlp_activation_other_than_silu_is_refused(tmp_path, act):
    """The MLPs compute SiLU-and-mul: another hidden_act would give wrong outputs silently."""
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_act": act}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="hidden_act .* is not supported for LlamaForCausalLM; supported: silu"):
        load_model_args(str(tmp_path))
    cfg["hidden_act"] = "silu"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_model_args(str(tmp_path)).hidden_size == 32


@pytest.mark.parametrize("arch, config, match", [
    ("LlamaForCausalLM", {"partial_rotary_factor": 0.75}, "partial_rotary_factor 0.75 is supported for Phi3ForCausalLM and GLM only"),
    ("Qwen2ForCausalLM", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
     "partial_rotary_factor 0.5 is supported for Phi3ForCausalLM and GLM only"),
    ("Phi3ForCausalLM", {"partial_rotary_factor": 0.01}, "rotates 0 of 8 head dims"),
    ("Phi3ForCausalLM", {"partial_rotary_factor": "half"}, "partial_rotary_factor must be a positive number"),
])
def test_a_partial_rotary_embedding_outside_phi3_or_odd_is_refused(tmp_path, arch, config, match):
    """transformers' Phi-3 rotates part of each head (Phi-4-mini: 3/4; tests: FAMILIES' phi3_partial);
    other families' transformers code rotates whole heads."""
    cfg = {"architectures": [arch], "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, **config}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match):
        load_model_args(str(tmp_path))


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "smollm3", "granite", "phi3", "phi3_partial", "olmo2",
                                    "olmoe", "glm4", "ernie4_5", "hunyuan", "apertus", "starcoder2", "gpt_oss",
                                    "glm4_moe", "minimax_m2", "ernie4_5_moe", "deepseek_v2", "deepseek_v3", "llama4",
            "cohere", "cohere2", "hunyuan_moe", "dots1", "ministral", "ministral3"])
def test_triton_ops_path_equals_the_torch_path(hf_checkpoint, monkeypatch, family):
    """The model as CUDA runs it (fused norms, RoPE and SiLU-and-mul, the grouped Triton experts),
    here in the Triton interpreter, gives the CPU path's greedy tokens and logprobs: the families
    whose layers differ (experts, layers without RoPE, multipliers, fused checkpoints, norms after)."""
    from radixflow.runtime import Engine
    from radixflow.runtime.model import model

    model_dir, _ = hf_checkpoint(family)
    prompts = [[5, 77, 300, 12], [901, 44, 2, 17, 17, 250, 9]]
    runs = []
    for triton_ops in (False, True):
        monkeypatch.setattr(model, "FORCE_TRITON_OPS", triton_ops)
        with Engine(model_dir, device="cpu", dtype="float32", kv_cache_tokens=512, attention_backend="torch") as engine:
            outs = engine.generate(input_ids=prompts, return_logprob=True,
                                   sampling_params={"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True})
        runs.append(([o["output_ids"] for o in outs],
                     [[lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]] for o in outs]))
    assert runs[1][0] == runs[0][0]
    torch.testing.assert_close(torch.tensor(runs[1][1]), torch.tensor(runs[0][1]), rtol=1e-4, atol=1e-4)


def _args_of(tmp_path, arch: str, **fields):
    cfg = {"architectures": [arch], "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, **fields}
    if "Moe" in arch:
        cfg.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=8)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return load_model_args(str(tmp_path))


@pytest.mark.parametrize("arch, fields, window, layers", [
    ("LlamaForCausalLM", {"sliding_window": 64}, None, ()),          # Llama's attention never slides
    ("GraniteForCausalLM", {"sliding_window": 64}, None, ()),
    ("SmolLM3ForCausalLM", {"sliding_window": 64}, None, ()),        # only under use_sliding_window
    ("SmolLM3ForCausalLM", {"sliding_window": 64, "use_sliding_window": True}, 64, (3,)),  # no RoPE in layer 3
    ("MistralForCausalLM", {}, 4096, (0, 1, 2, 3)),                  # transformers' default when the key is absent
    ("MistralForCausalLM", {"sliding_window": None}, None, ()),
    ("Qwen3MoeForCausalLM", {"sliding_window": 64, "use_sliding_window": True, "max_window_layers": 2}, 64,
     (0, 1, 2, 3)),
    ("Qwen2MoeForCausalLM", {"sliding_window": 64, "use_sliding_window": True, "max_window_layers": 8}, 64, (0, 2)),
    ("Qwen2ForCausalLM", {"sliding_window": 64, "use_sliding_window": True, "max_window_layers": 8}, None, ()),
    ("Qwen2ForCausalLM", {"sliding_window": 64, "use_sliding_window": True}, None, ()),  # max_window_layers 28
    ("Qwen2ForCausalLM", {"sliding_window": 64, "use_sliding_window": True, "max_window_layers": 2}, 64, (2, 3)),
    ("Qwen3ForCausalLM", {"use_sliding_window": True, "max_window_layers": 0}, 4096, (0, 1, 2, 3)),  # its default
    ("Qwen3ForCausalLM", {"sliding_window": 64, "use_sliding_window": True,
                          "layer_types": ["full_attention", "sliding_attention"] * 2}, 64, (1, 3)),
])
def test_the_window_follows_each_familys_rules(tmp_path, arch, fields, window, layers):
    args = _args_of(tmp_path, arch, **fields)
    assert (args.sliding_window, args.window_layers) == (window, layers)


def test_olmo3_hub_config_reads_as_transformers_reads_it(tmp_path):
    """OLMo-3's config.json: rope_theta and rope_scaling at the top go to the full layers only; the
    window layers (three of four, absent layer_types) take 500,000 unscaled; the window 4096."""
    args = _args_of(tmp_path, "Olmo3ForCausalLM", rope_theta=10000.0, max_position_embeddings=65536,
                    rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192})
    assert args.window_layers == (0, 1, 2) and args.sliding_window == 4096
    assert (args.rope_theta, args.local_rope_theta, args.rope_scaling["rope_type"]) == (10000.0, 500000.0, "yarn")
    assert args.post_norms and not args.pre_norms and args.qk_norm_whole


def test_minimax_m2s_explicit_partial_rotary_factor_wins_over_rotary_dim(tmp_path):
    """As transformers reads MiniMax-M2: `rotary_dim` stands for partial_rotary_factor only where the
    config gives no factor."""
    args = _args_of(tmp_path, "MiniMaxM2ForCausalLM", head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                    rotary_dim=16, partial_rotary_factor=0.5)
    assert args.rope_dim == 8
    assert _args_of(tmp_path, "MiniMaxM2ForCausalLM", head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                    rotary_dim=12).rope_dim == 12


@pytest.mark.parametrize("arch, fields, want", [
    # what each transformers config class defaults to where config.json is silent
    ("SeedOssForCausalLM", {}, dict(head_dim=128, qkv_bias=True, o_bias=False, mlp_bias=False)),
    ("SeedOssForCausalLM", {"attention_out_bias": True, "mlp_bias": True}, dict(o_bias=True, mlp_bias=True)),
    ("InternLM3ForCausalLM", {"qkv_bias": True, "bias": True},  # its config's old names
     dict(head_dim=128, qkv_bias=True, o_bias=True, mlp_bias=True)),
    ("Ernie4_5ForCausalLM", {}, dict(head_dim=128, rope_theta=500000.0, tie_word_embeddings=True,
                                     rope_interleaved=True, qkv_bias=False)),
    ("Ernie4_5ForCausalLM", {"use_bias": True}, dict(qkv_bias=True, o_bias=True, mlp_bias=True)),
    ("GlmForCausalLM", {}, dict(head_dim=128, rotary_dim=64, rope_interleaved=True, qkv_bias=True, o_bias=False,
                                fused_gate_up=True, fused_qkv=False, post_norms=False)),
    ("Glm4ForCausalLM", {"head_dim": 8, "partial_rotary_factor": 1.0}, dict(rotary_dim=8, post_norms=True,
                                                                           pre_norms=True)),
    ("LlamaForCausalLM", {"attention_bias": True, "mlp_bias": True}, dict(qkv_bias=True, o_bias=True, mlp_bias=True)),
    ("MistralForCausalLM", {"attention_bias": True}, dict(qkv_bias=False, o_bias=False)),
    ("Qwen2ForCausalLM", {}, dict(qkv_bias=True, o_bias=False, rope_theta=10000.0)),
    # EXAONE-4.0-32B's form: a window in three of four layers, the fourth global without RoPE
    ("Exaone4ForCausalLM", {"sliding_window_pattern": "LLLG"},
     dict(sliding_window=4096, window_layers=(0, 1, 2), nope_layers=(3,), qk_norm=True, post_norms=True,
          pre_norms=False)),
    ("Exaone4ForCausalLM", {"sliding_window": None}, dict(sliding_window=None, window_layers=(), nope_layers=())),
    # a window but no layer sliding: every layer global, without RoPE (as transformers computes it)
    ("Exaone4ForCausalLM", {"sliding_window_pattern": 1}, dict(sliding_window=None, window_layers=(),
                                                                nope_layers=(0, 1, 2, 3))),
    # transformers 5 reads RoPE's fields from rope_parameters (or a legacy rope_scaling, which replaces
    # it) before the top-level ones
    ("SeedOssForCausalLM", {"rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 50.0}},
     dict(rope_theta=50.0)),
    ("GlmForCausalLM", {"head_dim": 16, "partial_rotary_factor": 0.5,
                        "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.75}}, dict(rotary_dim=12)),
    ("Ernie4_5ForCausalLM", {"rope_scaling": {"rope_type": "default", "rope_theta": 50.0}}, dict(rope_theta=50.0)),
    # ApertusConfig's llama3 RoPE when the config names none; an empty rope_parameters stays plain RoPE
    ("ApertusForCausalLM", {"max_position_embeddings": 65536}, dict(rope_theta=12_000_000.0, long_rope_len=None)),
    ("ApertusForCausalLM", {"rope_parameters": {}}, dict(rope_theta=10000.0, rope_scaling=None)),
])
def test_each_familys_config_defaults_and_biases(tmp_path, arch, fields, want):
    args = _args_of(tmp_path, arch, **fields)
    assert {k: getattr(args, k) for k in want} == want


# each architecture's transformers config class (InternLM3 runs on Llama's model class)
_CONFIG_CLASSES = {"LlamaForCausalLM": "LlamaConfig", "MistralForCausalLM": "MistralConfig",
                   "Qwen2ForCausalLM": "Qwen2Config", "Qwen3ForCausalLM": "Qwen3Config",
                   "MixtralForCausalLM": "MixtralConfig", "Qwen2MoeForCausalLM": "Qwen2MoeConfig",
                   "Qwen3MoeForCausalLM": "Qwen3MoeConfig", "SmolLM3ForCausalLM": "SmolLM3Config",
                   "GraniteForCausalLM": "GraniteConfig", "GraniteMoeForCausalLM": "GraniteMoeConfig",
                   "Phi3ForCausalLM": "Phi3Config", "Olmo2ForCausalLM": "Olmo2Config", "Olmo3ForCausalLM": "Olmo3Config",
                   "OlmoeForCausalLM": "OlmoeConfig", "GemmaForCausalLM": "GemmaConfig",
                   "Gemma2ForCausalLM": "Gemma2Config", "Gemma3ForCausalLM": "Gemma3TextConfig",
                   "SeedOssForCausalLM": "SeedOssConfig", "InternLM3ForCausalLM": "InternLM3Config",
                   "Ernie4_5ForCausalLM": "Ernie4_5Config", "GlmForCausalLM": "GlmConfig", "Glm4ForCausalLM": "Glm4Config",
                   "Exaone4ForCausalLM": "Exaone4Config", "HunYuanDenseV1ForCausalLM": "HunYuanDenseV1Config",
                   "ArceeForCausalLM": "ArceeConfig", "ApertusForCausalLM": "ApertusConfig",
                   "Starcoder2ForCausalLM": "Starcoder2Config", "GptOssForCausalLM": "GptOssConfig",
                   "Glm4MoeForCausalLM": "Glm4MoeConfig", "MiniMaxM2ForCausalLM": "MiniMaxM2Config",
                   "Ernie4_5_MoeForCausalLM": "Ernie4_5_MoeConfig", "DeepseekV2ForCausalLM": "DeepseekV2Config",
                   "DeepseekV3ForCausalLM": "DeepseekV3Config", "Llama4ForCausalLM": "Llama4TextConfig",
                   "CohereForCausalLM": "CohereConfig", "Cohere2ForCausalLM": "Cohere2Config",
                   "HunYuanMoEV1ForCausalLM": "HunYuanMoEV1Config", "Dots1ForCausalLM": "Dots1Config",
                   "MinistralForCausalLM": "MinistralConfig", "Ministral3ForCausalLM": "Ministral3Config"}


def test_every_architecture_has_its_transformers_config_class():
    from radixflow.runtime.model.model_config import SUPPORTED_ARCHITECTURES

    assert set(_CONFIG_CLASSES) == set(SUPPORTED_ARCHITECTURES)


@pytest.mark.parametrize("arch", sorted(_CONFIG_CLASSES))
def test_absent_fields_take_the_transformers_config_class_defaults(tmp_path, arch):
    """A config.json naming only the shape: each field radixflow reads as transformers' config class
    of the family fills it in (KV heads, norm epsilon, context length, RoPE base, head size, tie)."""
    import transformers as tf

    # 32 query heads: some classes default to 16 or 32 KV heads, which must divide them
    shape = dict(vocab_size=96, hidden_size=256, intermediate_size=96, num_hidden_layers=4, num_attention_heads=32)
    if arch in ("MixtralForCausalLM", "GraniteMoeForCausalLM"):  # the experts' fields stay required
        shape.update(num_local_experts=4, num_experts_per_tok=2)
    elif arch == "DeepseekV2ForCausalLM":  # V3's class has a top-k, V2's none
        shape.update(num_experts_per_tok=4)
    elif arch == "Dots1ForCausalLM":  # its class names no experts
        shape.update(n_routed_experts=4, num_experts_per_tok=2)
    elif "Moe" in arch or arch == "OlmoeForCausalLM":
        shape.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                     **({"shared_expert_intermediate_size": 32} if arch == "Qwen2MoeForCausalLM" else {}))
    ref = getattr(tf, _CONFIG_CLASSES[arch])(**shape)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch], **shape}))
    args = load_model_args(str(tmp_path))
    rope = ref.rope_parameters.get("full_attention", ref.rope_parameters)
    eps = ref.norm_epsilon if arch == "Starcoder2ForCausalLM" else ref.layer_norm_eps if arch.startswith("Cohere") else \
        ref.rms_norm_eps
    want = dict(num_kv_heads=ref.num_key_value_heads or ref.num_attention_heads, rms_norm_eps=eps,
                max_position_embeddings=ref.max_position_embeddings, rope_theta=rope["rope_theta"],
                head_dim=getattr(ref, "head_dim", None) or 256 // 32, tie_word_embeddings=ref.tie_word_embeddings)
    if arch.startswith("Deepseek"):  # latent attention: the pool's one head holds the latent and the rotated key
        want.update(num_kv_heads=1, head_dim=ref.kv_lora_rank + ref.qk_rope_head_dim, q_lora_rank=ref.q_lora_rank,
                    qk_nope_head_dim=ref.qk_nope_head_dim, v_head_dim=ref.v_head_dim, rope_interleaved=True,
                    num_experts=ref.n_routed_experts, n_group=ref.n_group or 1, topk_group=ref.topk_group or 1,
                    routed_scaling_factor=ref.routed_scaling_factor, norm_topk_prob=ref.norm_topk_prob,
                    moe_layers=tuple(range(ref.first_k_dense_replace, 4)),
                    shared_expert_intermediate_size=ref.moe_intermediate_size * ref.n_shared_experts)
    assert {k: getattr(args, k) for k in want} == want


@pytest.mark.parametrize("arch, fields, match", [
    ("Phi3ForCausalLM", {"partial_rotary_factor": True}, "partial_rotary_factor must be a positive number"),
    ("Ernie4_5ForCausalLM", {"use_bias": "yes"}, "use_bias must be true or false"),
    ("SeedOssForCausalLM", {"attention_out_bias": 1}, "attention_out_bias must be true or false"),
    ("InternLM3ForCausalLM", {"qkv_bias": True, "bias": False}, "InternLM3 with attention_bias .* must be equal"),
    ("LlamaForCausalLM", {"rope_theta": 0}, "rope_theta must be a positive number"),
    ("Exaone4ForCausalLM", {"sliding_window_pattern": "LXG"}, "sliding_window_pattern 'LXG' must be a positive "
                                                               "integer or a string of L"),
    ("LlamaForCausalLM", {"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ("LlamaForCausalLM", {"hidden_act": ["silu"]}, r"hidden_act \['silu'\] is not supported"),
    ("LlamaForCausalLM", {"rope_scaling": {"rope_type": "linear", "factor": "2"}},
     "rope_scaling factor must be a positive number"),
    ("LlamaForCausalLM", {"rope_scaling": {"rope_type": "linear"}}, "rope_scaling factor must be a positive number"),
    ("LlamaForCausalLM", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 5.0,
                                           "high_freq_factor": 4.0}}, "low_freq_factor 5.0 must not be above"),
])
def test_malformed_family_fields_are_refused_naming_them(tmp_path, arch, fields, match):
    with pytest.raises(ValueError, match=match):
        _args_of(tmp_path, arch, **fields)


def test_family_defaults_of_absent_fields(tmp_path):
    """An absent tie_word_embeddings is the family's transformers default (SmolLM3: tied); a Mistral
    or Phi-3 config's attention_bias means nothing there (their projections have no bias)."""
    assert _args_of(tmp_path, "SmolLM3ForCausalLM").tie_word_embeddings
    assert not _args_of(tmp_path, "LlamaForCausalLM").tie_word_embeddings
    for arch in ("MistralForCausalLM", "Phi3ForCausalLM"):
        args = _args_of(tmp_path, arch, attention_bias=True, sliding_window=None)
        assert not args.qkv_bias and not args.o_bias


def test_tensors_outside_the_model_are_skipped_not_refused(hf_checkpoint, tmp_path):
    """A PPO value head or Medusa heads saved beside the LM are not the LM's: transformers loads the
    LM and so does radixflow; an unused tensor under model. or lm_head. is still refused."""
    src, _ = hf_checkpoint("llama3")
    extra = _copy_checkpoint(src, tmp_path)
    tensors = load_file(os.path.join(extra, "model.safetensors"))
    tensors["v_head.summary.weight"] = torch.ones(1, 64)
    tensors["medusa_head.0.0.linear.weight"] = torch.ones(4, 4)
    save_file(tensors, os.path.join(extra, "model.safetensors"))
    prompt = [[3, 14, 15, 92]]
    torch.testing.assert_close(_our_logits(extra, prompt)[0], _our_logits(src, prompt)[0], rtol=0, atol=0)


def test_clipped_qkv_is_refused(tmp_path):
    """OLMoE's clip_qkv clamps q, k and v, which this decoder does not do: refused, not ignored."""
    with pytest.raises(ValueError, match="clip_qkv 8.0 is not supported"):
        _args_of(tmp_path, "OlmoeForCausalLM", num_experts=4, num_experts_per_tok=2, clip_qkv=8.0)
    assert _args_of(tmp_path, "OlmoeForCausalLM", num_experts=4, num_experts_per_tok=2, clip_qkv=None).qk_norm_whole


def test_hunyuan_moe_per_layer_fields(tmp_path):
    """Hunyuan MoE's released configs list num_experts / moe_topk per layer: one value for all is read,
    layers that differ are refused."""
    base = dict(num_hidden_layers=2, intermediate_size=64, rope_scaling={"type": "dynamic", "alpha": 1000.0})
    args = _args_of(tmp_path, "HunYuanMoEV1ForCausalLM", **base, num_experts=[8, 8], moe_topk=[2, 2])
    assert (args.num_experts, args.num_experts_per_tok, args.moe_layers) == (8, 2, (0, 1))
    assert args.shared_expert_intermediate_size == args.moe_intermediate_size == 64 and args.qk_norm_after_rope
    with pytest.raises(ValueError, match=r"moe_topk differing between layers \(\[2, 4\]\) is not supported"):
        _args_of(tmp_path, "HunYuanMoEV1ForCausalLM", **base, num_experts=8, moe_topk=[2, 4])
    with pytest.raises(ValueError, match="num_experts must be one integer or one per each of the 2 layers"):
        _args_of(tmp_path, "HunYuanMoEV1ForCausalLM", **base, num_experts=[8], moe_topk=2)


@pytest.mark.parametrize("archs", [5, {"a": 1}, [5], [None]])
def test_malformed_architectures_are_refused(tmp_path, archs):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": archs, "vocab_size": 100, "hidden_size": 32}))
    with pytest.raises(ValueError, match="architectures must be a list of class names"):
        load_model_args(str(tmp_path))


def test_ministral3_reads_its_temperature_alone_or_in_mistral3(tmp_path):
    """Ministral 3's text config (alone, or as a Mistral3ForConditionalGeneration's text_config of model_type
    ministral3): its rope_parameters' llama_4_scaling_beta scales every layer's queries; a plain Mistral
    text config under Mistral 3 stays Mistral."""
    text = {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
    alone = _args_of(tmp_path, "Ministral3ForCausalLM")  # its class's default RoPE: YaRN 16 over 16,384, beta 0.1
    assert alone.attn_temperature == (16384.0, 0.1, 0.0) and alone.temperature_all_layers
    for model_type, arch in (("ministral3", "Ministral3ForCausalLM"), ("mistral", "MistralForCausalLM")):
        (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Mistral3ForConditionalGeneration"],
                                                          "text_config": {**text, "model_type": model_type}}))
        args = load_model_args(str(tmp_path))
        assert args.architecture == arch and (args.attn_temperature is not None) is (model_type == "ministral3")
