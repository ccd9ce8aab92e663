"""GGUF checkpoints: our reader vs the gguf package, and logits / greedy output vs transformers
loading the same file (`from_pretrained(dir, gguf_file=...)`), for llama, qwen2 and qwen3 files
written from small demo models in F32, F16, Q8_0, Q4_1 and Q4_K."""
from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package is a radixflow dependency")

from gguf_writer import write_gguf  # noqa: E402  (tests/runtime is on sys.path via conftest)

from radixflow.runtime.model.demo import DemoSpec, demo_model, write_demo_model  # noqa: E402
from radixflow.runtime.model.gguf_file import GGUFFile  # noqa: E402
from radixflow.runtime.model.gguf_loader import gguf_sources  # noqa: E402
from radixflow.runtime.model.model_config import load_model_args  # noqa: E402
from radixflow.runtime.model.model_path import resolve_model_path  # noqa: E402
from radixflow.runtime.model.weights import build_model  # noqa: E402
from test_model_parity import _hf_greedy, _our_logits  # noqa: E402

# hidden 256 / intermediate 512: every row length is a multiple of Q4_K's 256-weight blocks
WIDE = DemoSpec(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, max_position_embeddings=512, tie_word_embeddings=True,
                embed_std=0.05, lm_head_std=0.05, o_proj_gain=0.3, final_norm_mean=3.0, seed=99)


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """factory(qtype, source="tiny" | "wide" | family-dir) -> (dir, file name): one GGUF per folder."""
    made: dict[tuple[str, str], tuple[str, str]] = {}
    wide = write_demo_model("tiny", tmp_path_factory.mktemp("wide-hf"), spec=WIDE)

    def make(qtype: str, source: str = "tiny", arch: str = "llama") -> tuple[str, str]:
        key = (qtype, source)
        if key not in made:
            src = {"tiny": demo_model("tiny"), "wide": wide}.get(source, source)
            out = tmp_path_factory.mktemp(f"gguf-{qtype}")
            name = f"model-{qtype}.gguf"
            write_gguf(src, str(out / name), qtype, arch=arch)
            made[key] = (str(out), name)
        return made[key]

    return make


def _hf_from_gguf(folder: str, name: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


PROMPTS = [[5, 77, 300, 12], [901, 44, 2, 17, 17, 250, 9, 1000, 3, 64, 88]]


@pytest.mark.parametrize("qtype,source", [("F32", "tiny"), ("F16", "tiny"), ("Q8_0", "tiny"),
                                          ("Q4_1", "tiny"), ("Q4_K", "wide")])
def test_logits_match_transformers(gguf_files, qtype, source):
    folder, name = gguf_files(qtype, source)
    hf = _hf_from_gguf(folder, name)
    ours = _our_logits(os.path.join(folder, name), PROMPTS)
    for prompt, mine in zip(PROMPTS, ours):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0].float()
        # identical dequantized fp32 weights on both sides
        assert (mine - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("qtype,source", [("F32", "tiny"), ("F16", "tiny"), ("Q8_0", "tiny"), ("Q4_1", "tiny"),
                                          ("Q4_K", "wide")])
def test_greedy_32_tokens_match_transformers(gguf_files, qtype, source):
    from radixflow.runtime import Engine

    folder, name = gguf_files(qtype, source)
    hf = _hf_from_gguf(folder, name)
    # fp32 pinned: auto is bf16 on CPUs with native bf16, and transformers runs fp32
    with Engine(os.path.join(folder, name), kv_cache_tokens=2048, dtype="float32") as engine:
        outs = engine.generate(input_ids=PROMPTS,
                               sampling_params={"max_new_tokens": 32, "temperature": 0, "ignore_eos": True})
    for prompt, out in zip(PROMPTS, outs):
        assert out["output_ids"] == _hf_greedy(hf, prompt, 32)


def test_qwen2_matches_transformers(hf_checkpoint, gguf_files):
    src, _ = hf_checkpoint("qwen2", heads=4)
    folder, name = gguf_files("F32", src, arch="qwen2")
    args = load_model_args(os.path.join(folder, name))
    assert args.architecture == "Qwen2ForCausalLM" and args.qkv_bias and args.tie_word_embeddings
    hf = _hf_from_gguf(folder, name)
    ours = _our_logits(os.path.join(folder, name), PROMPTS)
    for prompt, mine in zip(PROMPTS, ours):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0].float()
        assert (mine - ref).abs().max().item() < 1e-4


def test_qwen3_gguf_equals_its_safetensors_source(hf_checkpoint, gguf_files):
    """qwen3 (q/k norms, head_dim from attention.key_length). NOTE: transformers' GGUF reader ignores
    key_length for qwen3, so the reference is our safetensors load, itself checked against
    transformers in test_model_parity."""
    src, _ = hf_checkpoint("qwen3")
    folder, name = gguf_files("F32", src, arch="qwen3")
    args = load_model_args(os.path.join(folder, name))
    assert args.qk_norm and args.head_dim == 16 and args.num_heads == 8
    for a, b in zip(_our_logits(os.path.join(folder, name), PROMPTS), _our_logits(src, PROMPTS)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_llama_gguf_equals_its_safetensors_source(gguf_files):
    """F32 GGUF (Q/K permuted by the writer) loads to the same model as the demo's safetensors."""
    folder, name = gguf_files("F32")
    ours = _our_logits(os.path.join(folder, name), PROMPTS)
    ref = _our_logits(demo_model("tiny"), PROMPTS)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_reader_matches_gguf_package(gguf_files):
    folder, name = gguf_files("Q4_K", "wide")
    path = os.path.join(folder, name)
    ours, ref = GGUFFile(path), gguf.GGUFReader(path)
    assert set(ours.tensors) == {t.name for t in ref.tensors}
    for t in ref.tensors:
        expected = gguf.quants.dequantize(t.data, t.tensor_type)
        got = ours.dequantize(t.name)
        assert got.dtype == torch.float32 and got.is_contiguous()
        np.testing.assert_array_equal(got.numpy().reshape(-1), np.asarray(expected).reshape(-1))
    tokens = ref.fields["tokenizer.ggml.tokens"]
    assert ours.metadata["tokenizer.ggml.tokens"] == [bytes(tokens.parts[i]).decode() for i in tokens.data]
    assert ours.metadata["llama.block_count"] == WIDE.num_hidden_layers
    assert ours.metadata["llama.rope.freq_base"] == pytest.approx(10000.0)


def test_directory_holding_one_gguf(gguf_files, tmp_path):
    folder, name = gguf_files("Q8_0")
    assert resolve_model_path(folder) == os.path.join(folder, name)
    shutil.copy(os.path.join(folder, name), tmp_path / "a.gguf")
    shutil.copy(os.path.join(folder, name), tmp_path / "b.gguf")
    with pytest.raises(ValueError, match="several GGUF files"):
        resolve_model_path(str(tmp_path))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="not a GGUF"):
        resolve_model_path(str(tmp_path / "notes.txt"))


def _rewrite(src: str, dst: str, *, arch: str | None = None, retype: str | None = None) -> str:
    """Copy a GGUF, changing general.architecture or the type of token_embd.weight's data."""
    reader = gguf.GGUFReader(src)
    new_arch = arch or reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, new_arch)
    old_arch = reader.fields["general.architecture"].contents()
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value, vtype = field.contents(), field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key.replace(old_arch + ".", new_arch + ".", 1), value, vtype, sub_type=sub)
    for t in reader.tensors:
        qtype = t.tensor_type
        if retype and t.name == "token_embd.weight":
            qtype = gguf.GGMLQuantizationType[retype]
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_unsupported_architecture_is_named(gguf_files, tmp_path):
    folder, name = gguf_files("F32")
    bad = _rewrite(os.path.join(folder, name), str(tmp_path / "bad.gguf"), arch="falcon")
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'falcon'"):
        load_model_args(bad)


def test_undequantizable_tensor_type_is_named(gguf_files, tmp_path):
    folder, name = gguf_files("Q8_0")
    bad = _rewrite(os.path.join(folder, name), str(tmp_path / "bad.gguf"), retype="I8")
    args = load_model_args(bad)
    with pytest.raises(ValueError, match=r"token_embd\.weight.*I8"):
        build_model(args, bad, torch.float32, torch.device("cpu"), 64)


EVERY_LISTED_TYPE = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
SCALE_BYTES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # byte offsets of each block's fp16 scales


def _raw_tensor(rows: np.ndarray, qtype: str, rng: np.random.Generator) -> np.ndarray:
    """`rows` [n, 256] fp32 encoded as `qtype` bytes; the K-quants (no numpy quantizer in `gguf`) as
    random blocks whose fp16 scales are set to sane values, so every weight is finite."""
    kind = gguf.GGMLQuantizationType[qtype]
    if qtype in ("F32", "F16"):
        return rows.astype(np.float32 if qtype == "F32" else np.float16)
    if qtype not in SCALE_BYTES:
        return gguf.quants.quantize(rows, kind)
    block, nbytes = gguf.GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, size=(rows.shape[0], rows.shape[1] // block, nbytes), dtype=np.uint8)
    for offset in SCALE_BYTES[qtype]:
        raw[..., offset:offset + 2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    return raw.reshape(rows.shape[0], -1)


def test_every_listed_tensor_type_reads_like_the_gguf_package(tmp_path):
    """Our reader finds each type's bytes (block and type sizes) and dequantizes them as `gguf` does;
    where `gguf` can quantize, the round trip is close to the source."""
    rng = np.random.default_rng(0)
    path = str(tmp_path / "types.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    source = {q: rng.standard_normal((3, 256)).astype(np.float32) for q in EVERY_LISTED_TYPE}
    for qtype, rows in source.items():
        data = _raw_tensor(rows, qtype, rng)
        kind = gguf.GGMLQuantizationType[qtype]
        writer.add_tensor(f"t.{qtype}", data, raw_dtype=kind if data.dtype == np.uint8 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours, ref = GGUFFile(path), gguf.GGUFReader(path)
    for t in ref.tensors:
        qtype = t.name.split(".", 1)[1]
        assert t.tensor_type == gguf.GGMLQuantizationType[qtype]
        got = ours.dequantize(t.name)
        assert got.shape == (3, 256) and bool(torch.isfinite(got).all()), qtype
        want = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(3, 256)
        np.testing.assert_array_equal(got.numpy(), want, err_msg=qtype)
        if qtype not in SCALE_BYTES:
            err = np.abs(got.numpy() - source[qtype]).max()
            assert err < (0.5 if qtype.startswith("Q4") else 0.25), (qtype, err)


def test_load_logs_time_and_pool_size_and_shows_a_progress_bar(gguf_files, caplog, monkeypatch):
    """Start-up says what it did: the GGUF load time and the KV pool size in the log, and a
    progress bar (tqdm; drawn only on a terminal) over every tensor while dequantizing."""
    import logging

    import tqdm.auto

    from radixflow.runtime import Engine

    bars = []
    real_tqdm = tqdm.auto.tqdm

    def recording_tqdm(iterable, **kwargs):
        bars.append((kwargs.get("desc"), len(iterable)))
        return real_tqdm(iterable, **kwargs)

    monkeypatch.setattr(tqdm.auto, "tqdm", recording_tqdm)
    folder, name = gguf_files("Q8_0")
    with caplog.at_level(logging.INFO, logger="radixflow"):
        with Engine(os.path.join(folder, name), cpu_kv_cache_bytes=1 << 20, dtype="float32"):
            pass
    args = load_model_args(os.path.join(folder, name))
    assert bars == [("dequantizing GGUF", len(gguf_sources(args, permuted=True)))]  # one step per parameter
    assert re.search(r"loaded \d+ GGUF tensors \(.*Q8_0.*\) from .* in \d+\.\d\d s", caplog.text), caplog.text
    per_token = 2 * args.num_layers * args.num_kv_heads * args.head_dim * 4
    assert f"KV pool: {(1 << 20) // per_token} tokens" in caplog.text, caplog.text


@pytest.mark.parametrize("family, arch", [("mixtral", "llama"), ("qwen3_moe", "qwen3moe"), ("qwen2_moe", "qwen2moe")])
def test_moe_gguf_equals_its_safetensors_source(hf_checkpoint, gguf_files, family, arch):
    """Experts stacked as llama.cpp writes them (ffn_*_exps), the router, Qwen2-MoE's shared expert
    and its vector gate; a `llama` file with experts is Mixtral. Q8_0 quantizes the experts too."""
    src, _ = hf_checkpoint(family)
    folder, name = gguf_files("F32", src, arch=arch)
    args, ref_args = load_model_args(os.path.join(folder, name)), load_model_args(src)
    for field in ("architecture", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                  "moe_layers", "shared_expert_intermediate_size", "intermediate_size", "qkv_bias", "qk_norm"):
        assert getattr(args, field) == getattr(ref_args, field), field
    ref = _our_logits(src, PROMPTS)
    for a, b in zip(_our_logits(os.path.join(folder, name), PROMPTS), ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    folder, name = gguf_files("Q8_0", src, arch=arch)
    for a, b in zip(_our_logits(os.path.join(folder, name), PROMPTS), ref):
        assert (a - b).abs().max().item() < 0.1


def test_projection_biases_load_from_gguf_and_an_unused_tensor_is_refused(gguf_files, tmp_path):
    """o_proj's and the MLP's biases (attn_output.bias, ffn_*.bias) are read; a tensor the model
    does not use (here layer 1's o_proj bias with none on layer 0) is a ValueError naming it."""
    import transformers as tf
    from safetensors.torch import load_file, save_file
    from test_model_parity import _checkpoint_with

    src = _checkpoint_with(tmp_path / "hf", "llama3", attention_bias=True, mlp_bias=True,  # no llama3 RoPE in GGUF
                               rope_scaling=None, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    hf = tf.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    hf.save_pretrained(src)
    folder, name = gguf_files("F32", src)
    args = load_model_args(os.path.join(folder, name))
    assert args.qkv_bias and args.o_bias and args.mlp_bias
    for a, b in zip(_our_logits(os.path.join(folder, name), PROMPTS), _our_logits(src, PROMPTS)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    weights = load_file(os.path.join(src, "model.safetensors"))
    del weights["model.layers.0.self_attn.o_proj.bias"]
    save_file(weights, os.path.join(src, "model.safetensors"))
    bad = write_gguf(src, str(tmp_path / "bad.gguf"), "F32")
    with pytest.raises(ValueError, match=r"'blk\.1\.attn_output\.bias' are not used by the model"):
        _our_logits(bad, PROMPTS)


def test_moe_gguf_metadata_errors_name_the_key(hf_checkpoint, tmp_path):
    """A `llama` file with a router but no expert_count, and a qwen2moe file with dense layers but
    no feed_forward_length, are ValueErrors naming the key (not a missing dense tensor or a shape)."""
    import gguf

    def rewrite(src: str, out: str, drop: str) -> str:
        reader = gguf.GGUFReader(src)
        writer = gguf.GGUFWriter(out, reader.fields["general.architecture"].contents())
        for field in reader.fields.values():
            if field.name in (drop, "general.architecture") or field.name.startswith("GGUF."):
                continue
            writer.add_key_value(field.name, field.contents(), field.types[0],
                                 field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
        for t in reader.tensors:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return out

    src, _ = hf_checkpoint("mixtral")
    path = write_gguf(src, str(tmp_path / "mixtral.gguf"), "F32")
    with pytest.raises(ValueError, match="llama.expert_count"):
        load_model_args(rewrite(path, str(tmp_path / "no-count.gguf"), "llama.expert_count"))
    from test_model_parity import _checkpoint_with

    src = _checkpoint_with(tmp_path / "q2", "qwen2_moe", mlp_only_layers=[1])
    path = write_gguf(src, str(tmp_path / "qwen2moe.gguf"), "F32", arch="qwen2moe")
    assert load_model_args(path).moe_layers == (0,)
    with pytest.raises(ValueError, match="lacks qwen2moe.feed_forward_length"):
        load_model_args(rewrite(path, str(tmp_path / "no-ffn.gguf"), "qwen2moe.feed_forward_length"))


def _gemma_source(tmp_path, family: str, **config) -> str:
    """A tiny Gemma checkpoint as llama.cpp can describe it (attention scale 1 / sqrt(head_dim), the
    default window patterns), its norms perturbed so that the stored 1 + w matters."""
    from safetensors.torch import load_file, save_file
    from test_model_parity import _checkpoint_with

    src = _checkpoint_with(tmp_path, family, query_pre_attn_scalar=16, **config)
    path = os.path.join(src, "model.safetensors")
    weights = load_file(path)
    g = torch.Generator().manual_seed(5)
    for name, t in weights.items():
        if t.dim() >= 2:
            weights[name] = torch.randn(t.shape, generator=g) * 0.08
        elif name.endswith("norm.weight"):
            weights[name] = torch.randn(t.shape, generator=g) * 0.3
    save_file(weights, path)
    return src


@pytest.mark.parametrize("family, config", [
    # every other layer from the first through the window; scores and logits soft-capped
    ("gemma2", dict(num_hidden_layers=3, sliding_window=4)),
    # all but every 6th layer through the window on their own RoPE base (10,000 as llama.cpp's, and
    # another one written as rope.freq_base_swa); linear RoPE scaling in the global layer
    ("gemma3", dict(num_hidden_layers=6, sliding_window=4, rope_local_base_freq=10000.0, sliding_window_pattern=6)),
    ("gemma3", dict(num_hidden_layers=6, sliding_window=4, rope_local_base_freq=500.0, sliding_window_pattern=6)),
])
def test_gemma_gguf_equals_its_safetensors_source(tmp_path, family, config):
    """gemma2 / gemma3 files as llama.cpp's converter writes them (norms stored as 1 + w, norms after
    attention and MLP) load to the model of their safetensors source, itself checked against
    transformers in test_model_parity; Q8_0 too, within its rounding."""
    src = _gemma_source(tmp_path / "src", family, **config)
    ref_args = load_model_args(src)
    out = tmp_path / "gguf"
    out.mkdir()
    for qtype in ("F32", "Q8_0"):
        path = write_gguf(src, str(out / f"{qtype}.gguf"), qtype, arch=family)
        args = load_model_args(path)
        for field in ("architecture", "window_layers", "sliding_window", "attention_multiplier", "local_rope_theta",
                      "rope_theta", "attn_logit_softcapping", "final_logit_softcapping", "qk_norm", "post_norms",
                      "hidden_act", "embedding_multiplier", "tie_word_embeddings"):
            assert getattr(args, field) == getattr(ref_args, field), field
        scaling = [{k: (a or {}).get(k) for k in ("rope_type", "factor")} for a in (args.rope_scaling,
                                                                                    ref_args.rope_scaling)]
        assert scaling[0] == scaling[1]
        assert args.window_layers and len(args.window_layers) < args.num_layers  # both kinds of layer
        ref = _our_logits(src, PROMPTS)
        for a, b in zip(_our_logits(path, PROMPTS), ref):
            if qtype == "F32":
                torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
            else:
                assert (a - b).abs().max().item() < 0.1


def test_gemma_gguf_metadata_errors_name_the_key(tmp_path):
    src = _gemma_source(tmp_path / "src", "gemma2", num_hidden_layers=2, sliding_window=4)
    path = write_gguf(src, str(tmp_path / "g.gguf"), "F32", arch="gemma2")
    f = GGUFFile(path)
    f.metadata["gemma2.attention.sliding_window"] = 0
    from radixflow.runtime.model.gguf_loader import model_args_from_gguf

    with pytest.raises(ValueError, match="gemma2.attention.sliding_window must be a positive integer"):
        model_args_from_gguf(f)
    f.metadata["gemma2.attention.sliding_window"] = 4
    f.metadata["gemma2.attention.sliding_window_pattern"] = [True]
    with pytest.raises(ValueError, match="sliding_window_pattern must hold a flag per layer"):
        model_args_from_gguf(f)
    f.metadata["gemma2.attention.sliding_window_pattern"] = [False, True]
    assert model_args_from_gguf(f).window_layers == (1,)


@pytest.mark.parametrize("family", ["phi3", "phi3_partial", "phi3_longrope", "phi3_window"])
def test_phi3_gguf_equals_its_safetensors_source(hf_checkpoint, tmp_path, family):
    """phi3 files: q | k | v and gate | up stored fused (attn_qkv, ffn_up), Phi-4-mini's partial
    rotary (rope.dimension_count, its heads reordered at load as the safetensors' are), Phi-3.5's
    LongRoPE (rope_factors_long / _short, the original context and attention factor) across its
    switch, and Phi-3-mini's window on every layer; Q8_0 too, within its rounding."""
    if family == "phi3_longrope":
        from test_longrope import SWITCH, _factors, save_tiny_phi3

        src = str(tmp_path / "src")
        save_tiny_phi3(src, seed=7, rope_scaling={"type": "longrope", "short_factor": _factors(1, 1.0, 3.0),
                                                  "long_factor": _factors(2, 4.0, 40.0)})
        prompts = [[5, 77, 300, 12], list(range(3, 3 + SWITCH + 9))]  # one short, one past the switch
    elif family == "phi3_window":
        from test_model_parity import _checkpoint_with

        src, prompts = _checkpoint_with(tmp_path, "phi3", sliding_window=4), PROMPTS
    else:
        src, _ = hf_checkpoint(family)
        prompts = PROMPTS
    ref_args = load_model_args(src)
    ref = _our_logits(src, prompts)
    for qtype in ("F32", "Q8_0"):
        path = write_gguf(src, str(tmp_path / f"{qtype}.gguf"), qtype, arch="phi3")
        args = load_model_args(path)
        for field in ("rope_dim", "long_rope_len", "window_layers", "sliding_window", "tie_word_embeddings",
                      "fused_qkv", "fused_gate_up"):
            assert getattr(args, field) == getattr(ref_args, field), field
        for a, b in zip(_our_logits(path, prompts), ref):
            if qtype == "F32":
                torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
            else:
                assert (a - b).abs().max().item() < 0.1


def _gemma_file(tmp_path, family: str = "gemma3", **config) -> str:
    src = _gemma_source(tmp_path / "src", family, num_hidden_layers=6, sliding_window=4, sliding_window_pattern=6,
                        **config)
    return write_gguf(src, str(tmp_path / "g.gguf"), "F32", arch=family), src


def test_gemma3_gguf_final_softcap_and_no_window(tmp_path):
    """A gemma3 file's final_logit_softcapping is applied (llama.cpp's converter writes it where the
    config sets it), and one without attention.sliding_window (a config whose pattern is 1) runs
    every layer with full attention."""
    from radixflow.runtime.model.gguf_loader import model_args_from_gguf

    path, src = _gemma_file(tmp_path, final_logit_softcapping=3.0)
    f = GGUFFile(path)
    f.metadata["gemma3.final_logit_softcapping"] = 3.0
    assert model_args_from_gguf(f).final_logit_softcapping == 3.0 == load_model_args(src).final_logit_softcapping
    del f.metadata["gemma3.attention.sliding_window"]
    args = model_args_from_gguf(f)
    assert args.sliding_window is None and args.window_layers == ()


@pytest.mark.parametrize("key, value, match", [
    ("gemma3.attention.scale", 0.0, "gemma3.attention.scale must be a positive number"),
    ("gemma3.rope.freq_base_swa", -1.0, "gemma3.rope.freq_base_swa must be a positive number"),
    ("gemma3.rope.scaling.factor", -2.0, "gemma3.rope.scaling.factor must be a positive number"),
    ("gemma3.rope.dimension_count", 7, "gemma3.rope.dimension_count 7"),
])
def test_bad_gguf_rope_and_scale_keys_are_named(tmp_path, key, value, match):
    from radixflow.runtime.model.gguf_loader import model_args_from_gguf

    path, _ = _gemma_file(tmp_path)
    f = GGUFFile(path)
    f.metadata[key] = value
    if key.endswith("scaling.factor"):
        f.metadata["gemma3.rope.scaling.type"] = "linear"
    with pytest.raises(ValueError, match=match):
        model_args_from_gguf(f)


def test_a_zero_linear_factor_is_no_scaling_as_llama_cpp_reads_it(tmp_path):
    from radixflow.runtime.model.gguf_loader import model_args_from_gguf

    path, _ = _gemma_file(tmp_path)
    f = GGUFFile(path)
    f.metadata["gemma3.rope.scaling.type"], f.metadata["gemma3.rope.scaling.factor"] = "linear", 0.0
    assert model_args_from_gguf(f).rope_scaling is None


def test_a_phi3_attention_factor_must_be_positive(tmp_path):
    from radixflow.runtime.model.gguf_loader import model_args_from_gguf
    from test_longrope import _factors, save_tiny_phi3

    src = str(tmp_path / "src")
    save_tiny_phi3(src, seed=7, rope_scaling={"type": "longrope", "short_factor": _factors(1, 1.0, 3.0),
                                              "long_factor": _factors(2, 4.0, 40.0)})
    f = GGUFFile(write_gguf(src, str(tmp_path / "p.gguf"), "F32", arch="phi3"))
    for bad in (0.0, -1.0):
        f.metadata["phi3.rope.scaling.attn_factor"] = bad
        with pytest.raises(ValueError, match="phi3.rope.scaling.attn_factor must be a positive number"):
            model_args_from_gguf(f)
