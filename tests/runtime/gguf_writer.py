"""Test helper: write a Hugging Face demo-model directory as a GGUF file, the way llama.cpp's
converter lays it out (names, Q/K row permutation for llama, tokenizer metadata, norms in F32;
Gemma's norms with the 1 its RMSNorm adds, its window and soft-cap keys)."""
from __future__ import annotations

import json
import os

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

from radixflow.runtime.text.tokenizer import Tokenizer

QTYPES = {"F32": gguf.GGMLQuantizationType.F32, "F16": gguf.GGMLQuantizationType.F16,
          "Q8_0": gguf.GGMLQuantizationType.Q8_0, "Q4_1": gguf.GGMLQuantizationType.Q4_1,
          "Q4_0": gguf.GGMLQuantizationType.Q4_0, "Q4_K": gguf.GGMLQuantizationType.Q4_K}


def permute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter permutation: rotate-half rows → interleaved pairs within each head."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """A simple Q4_K encoder: per 32-weight sub-block a 6-bit scale and min, 4-bit weights; each
    256-weight block stores d, dmin (f16), 12 packed scale bytes and 128 nibble bytes."""
    blocks = w.astype(np.float32).reshape(-1, 8, 32)
    lo, hi = np.minimum(blocks.min(-1), 0.0), blocks.max(-1)
    scale = np.maximum(hi - lo, 1e-8) / 15.0                        # [n, 8]
    d = np.maximum(scale.max(-1), 1e-8) / 63.0                      # [n]
    dmin = np.maximum((-lo).max(-1), 1e-8) / 63.0
    d16, dmin16 = d.astype(np.float16), dmin.astype(np.float16)
    sc = np.clip(np.round(scale / d16.astype(np.float32)[:, None]), 1, 63).astype(np.uint8)
    mn = np.clip(np.round(-lo / dmin16.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    step = (d16.astype(np.float32)[:, None] * sc)[..., None]
    offset = (dmin16.astype(np.float32)[:, None] * mn)[..., None]
    q = np.clip(np.round((blocks + offset) / step), 0, 15).astype(np.uint8)  # [n, 8, 32]
    packed = np.zeros((blocks.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)
    out = np.concatenate([d16.view(np.uint8).reshape(-1, 2), dmin16.view(np.uint8).reshape(-1, 2), packed, qs], -1)
    return out.reshape(*w.shape[:-1], w.shape[-1] // 256 * 144)


def _encode(w: np.ndarray, qtype: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    if w.ndim == 1 or qtype == "F32":
        return w.astype(np.float32), QTYPES["F32"]
    block_size, _ = gguf.GGML_QUANT_SIZES[QTYPES[qtype]]
    if w.shape[-1] % block_size:  # as llama.cpp's converter: rows that do not fit the blocks stay F16
        return w.astype(np.float16), QTYPES["F16"]
    if qtype == "Q4_K":
        return quantize_q4_k(w), QTYPES["Q4_K"]
    return gguf.quants.quantize(w.astype(np.float32), QTYPES[qtype]), QTYPES[qtype]


def _gguf_tensors(cfg: dict, weights: dict[str, torch.Tensor], permute: bool,
                  gemma: bool = False) -> dict[str, np.ndarray]:
    if gemma:  # llama.cpp's converter stores Gemma's norms as the weights its RMSNorm multiplies by: 1 + w
        weights = {k: v + 1 if k.endswith("norm.weight") else v for k, v in weights.items()}
    out = {"token_embd.weight": weights["model.embed_tokens.weight"], "output_norm.weight": weights["model.norm.weight"]}
    if "lm_head.weight" in weights:
        out["output.weight"] = weights["lm_head.weight"]
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}  # Phi-3's fused ones, stored fused
    if gemma:  # norms after attention and MLP too; the one before the MLP is ffn_norm
        names.update({"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                      "post_feedforward_layernorm": "post_ffw_norm"})
    for i in range(cfg["num_hidden_layers"]):
        for hf, ours in names.items():
            for kind in ("weight", "bias"):
                key = f"model.layers.{i}.{hf}.{kind}"
                if key in weights:
                    out[f"blk.{i}.{ours}.{kind}"] = weights[key]
        out.update(_expert_tensors(cfg, weights, i))
    arrays = {k: v.float().numpy() for k, v in out.items()}
    if permute:  # as llama.cpp's converter: the rows of Q and K, weights and biases
        for i in range(cfg["num_hidden_layers"]):
            for kind in ("weight", "bias"):
                q, k = f"blk.{i}.attn_q.{kind}", f"blk.{i}.attn_k.{kind}"
                if q in arrays:
                    arrays[q] = permute_rope_rows(arrays[q], cfg["num_attention_heads"])
                    arrays[k] = permute_rope_rows(arrays[k], cfg["num_key_value_heads"])
    return arrays


def _expert_tensors(cfg: dict, weights: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    """Layer i's experts as llama.cpp stacks them (ffn_*_exps [E, rows, cols]), its router, and a
    Qwen2-MoE shared expert (its gate a vector [H]); nothing for a dense layer."""
    for block, (gate, up, down) in (("block_sparse_moe", ("w1", "w3", "w2")),
                                    ("mlp", ("gate_proj", "up_proj", "down_proj"))):
        p = f"model.layers.{i}.{block}."
        if p + "gate.weight" in weights:
            break
    else:
        return {}
    count = cfg.get("num_local_experts") or cfg["num_experts"]
    out = {f"blk.{i}.ffn_gate_inp.weight": weights[p + "gate.weight"]}
    for ours, hf in (("gate", gate), ("up", up), ("down", down)):
        out[f"blk.{i}.ffn_{ours}_exps.weight"] = torch.stack(
            [weights[f"{p}experts.{e}.{hf}.weight"] for e in range(count)])
    shared = f"model.layers.{i}.mlp.shared_expert."
    if shared + "gate_proj.weight" in weights:
        for ours in ("gate", "up", "down"):
            out[f"blk.{i}.ffn_{ours}_shexp.weight"] = weights[f"{shared}{ours}_proj.weight"]
        out[f"blk.{i}.ffn_gate_inp_shexp.weight"] = weights[f"model.layers.{i}.mlp.shared_expert_gate.weight"][0]
    return out


def _add_tokenizer(writer: gguf.GGUFWriter, model_dir: str, pre: str) -> None:
    tok = Tokenizer.from_dir(model_dir)
    data = json.loads(tok.backend.to_str())
    vocab = sorted(tok.backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    special = tok.special_token_ids
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list([t for t, _ in vocab])
    writer.add_token_types([3 if i in special else 1 for _, i in vocab])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tok.bos_token_id)
    writer.add_eos_token_id(tok.eos_token_ids[0])
    writer.add_add_bos_token(False)
    writer.add_chat_template(tok.chat_templates["default"])


def write_gguf(model_dir: str, out_path: str, qtype: str, arch: str = "llama", pre: str = "default") -> str:
    """Write `model_dir` (a demo model) as a GGUF of `arch`, 2-D weights in `qtype`, its tokenizer
    tagged with the pre-tokenizer type `pre` (tokenizer.ggml.pre)."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    writer = gguf.GGUFWriter(out_path, arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    rope = cfg.get("rope_parameters") or {}
    local = rope.get("sliding_attention", {}).get("rope_theta")  # Gemma 3's window layers (nested, transformers 5)
    rope = rope.get("full_attention", rope)
    writer.add_rope_freq_base(cfg.get("rope_theta") or rope.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    if arch != "phi3":  # its own below
        writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(cfg["vocab_size"])
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        if "moe_intermediate_size" in cfg:
            writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if "shared_expert_intermediate_size" in cfg:
            writer.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    gemma = arch in ("gemma2", "gemma3")
    if arch == "phi3":  # partial rotary, LongRoPE's factors and contexts, the window
        rotary = int(head_dim * cfg.get("partial_rotary_factor", 1.0))
        writer.add_rope_dimension_count(rotary)
        scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        if scaling.get("rope_type", scaling.get("type")) == "longrope":
            original = cfg.get("original_max_position_embeddings") or scaling["original_max_position_embeddings"]
            writer.add_rope_scaling_orig_ctx_len(original)
            scale = cfg["max_position_embeddings"] / original
            writer.add_rope_scaling_attn_factors(1.0 if scale <= 1 else (1 + np.log(scale) / np.log(original)) ** 0.5)
            for kind in ("long", "short"):
                writer.add_tensor(f"rope_factors_{kind}.weight", np.array(scaling[f"{kind}_factor"], dtype=np.float32))
        if cfg.get("sliding_window"):
            writer.add_sliding_window(cfg["sliding_window"])
    if gemma:
        writer.add_sliding_window(cfg["sliding_window"])
        for name in ("attn_logit_softcapping", "final_logit_softcapping"):
            if (arch == "gemma2" or name.startswith("final")) and cfg.get(name) is not None:
                writer.add_float32(f"{arch}.{name}", cfg[name])
        scaling = cfg.get("rope_scaling") or rope
        if scaling.get("rope_type") == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(scaling["factor"])
        if local is not None and local != 10000.0:  # llama.cpp's own value when the key is absent
            writer.add_float32(f"{arch}.rope.freq_base_swa", local)
    _add_tokenizer(writer, model_dir, pre)
    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    for name, array in _gguf_tensors(cfg, weights, permute=arch == "llama", gemma=gemma).items():
        data, raw_type = _encode(array, qtype)
        writer.add_tensor(name, data, raw_dtype=raw_type)  # quantized: data's shape is the byte shape
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def write_sentencepiece_gguf(out_path: str, corpus: str, vocab_size: int = 700) -> str:
    """A tokenizer-only llama GGUF in SentencePiece style: <unk> <s> </s>, 256 byte tokens
    <0xNN>, then BPE pieces with "▁" for spaces scored by rank; no merges (readers derive them)."""
    import tokenizers

    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>", byte_fallback=True))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                             show_progress=False)
    bpe.train_from_iterator([corpus], trainer)
    pieces = [t for t, _ in sorted(bpe.get_vocab().items(), key=lambda kv: kv[1]) if t not in ("<unk>", "<s>", "</s>")]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    writer = gguf.GGUFWriter(out_path, "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
