"""What dequantizing at load costs: build_model on a random-weight Llama (SmolLM2-135M's shape by
default) stored as bf16 safetensors, as FP8 with 128x128 block scales, and as compressed-tensors
pack-quantized int4 (groups of 64), side by side in one process, rounds interleaved.

    python benchmarks/quantized_load.py --out benchmarks/results/quantized_load_cpu.json
    python benchmarks/quantized_load.py --smoke --out /tmp/ql.json      # tiny shape, one round

The quantized checkpoints are written here (FP8 by a vectorized block quantizer, int4 by the
compressed-tensors library, a test dependency). Reported: each checkpoint's bytes on disk, its load
seconds (median of the rounds) and the ratio to the bf16 checkpoint's; every load ends with the
same float weights in the engine dtype (bf16), so the extra time is the dequantization.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file

from radixflow.runtime.model.model_config import load_model_args
from radixflow.runtime.model.weights import build_model

# (hidden, intermediate, layers, heads, kv heads, vocab)
SHAPES = {"smollm2-135m": (576, 1536, 30, 9, 3, 49152), "tiny": (128, 256, 2, 4, 2, 512)}
GROUP = 128       # FP8 block side (edges padded)
INT4_GROUP = 64   # int4 group: SmolLM2's 576 and 1536 are multiples of 64, not of 128


def _tensors(hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    head_dim = hidden // heads

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)

    out = {"model.embed_tokens.weight": w(vocab, hidden), "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
                    p + "self_attn.k_proj.weight": w(kv * head_dim, hidden),
                    p + "self_attn.v_proj.weight": w(kv * head_dim, hidden),
                    p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
                    p + "mlp.gate_proj.weight": w(inter, hidden), p + "mlp.up_proj.weight": w(inter, hidden),
                    p + "mlp.down_proj.weight": w(hidden, inter),
                    p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                    p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16)})
    return out


def _fp8_block(w: torch.Tensor) -> dict[str, torch.Tensor]:
    n, k = w.shape
    pad = torch.zeros(-(-n // GROUP) * GROUP, -(-k // GROUP) * GROUP)
    pad[:n, :k] = w.float()
    blocks = pad.view(pad.shape[0] // GROUP, GROUP, pad.shape[1] // GROUP, GROUP)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448  # [n / 128, k / 128]
    q = (blocks / scale[:, None, :, None]).view(pad.shape)[:n, :k].to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": scale}


def _writers():
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=INT4_GROUP)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    packer = BaseCompressor.load_from_registry("pack-quantized")

    def int4(w: torch.Tensor) -> dict[str, torch.Tensor]:
        n, k = w.shape
        view = w.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
        scale, zero = calculate_qparams(view.amin(-1), view.amax(-1), args)
        return packer.compress({"weight": w.float(), "weight_scale": scale, "weight_zero_point": zero}, scheme)

    ct_config = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized",
                                   quantization_status="compressed", ignore=["lm_head"]).model_dump(mode="json")
    return {"fp8_block128": (_fp8_block, {"quant_method": "fp8", "activation_scheme": "dynamic",
                                          "weight_block_size": [GROUP, GROUP]}),
            "ct_int4_group64": (int4, ct_config)}


def _write(root: str, name: str, tensors: dict[str, torch.Tensor], config: dict, writer=None) -> str:
    out = os.path.join(root, name)
    os.makedirs(out)
    stored = {}
    for key, t in tensors.items():
        if writer is not None and key.startswith("model.layers.") and key.endswith("_proj.weight"):
            layer = key.removesuffix(".weight")
            stored.update({f"{layer}.{part}": v.contiguous() for part, v in writer(t).items()})
        else:
            stored[key] = t
    save_file(stored, os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="the tiny shape, one round")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    shape = SHAPES["tiny" if a.smoke else a.shape]
    rounds = 1 if a.smoke else a.rounds
    hidden, inter, layers, heads, kv, vocab = shape
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "intermediate_size": inter,
              "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
              "vocab_size": vocab, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
              "torch_dtype": "bfloat16"}
    tensors = _tensors(*shape)
    with tempfile.TemporaryDirectory() as root:
        dirs = {"bf16": _write(root, "bf16", tensors, config)}
        for name, (writer, qc) in _writers().items():
            dirs[name] = _write(root, name, tensors, {**config, "quantization_config": qc}, writer)
        times: dict[str, list[float]] = {name: [] for name in dirs}
        for _ in range(rounds):
            for name, model_dir in dirs.items():
                start = time.perf_counter()
                model = build_model(load_model_args(model_dir), model_dir, torch.bfloat16, torch.device("cpu"), 2048)
                times[name].append(time.perf_counter() - start)
                del model
        sizes = {name: os.path.getsize(os.path.join(d, "model.safetensors")) for name, d in dirs.items()}
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    doc = {"shape": "tiny" if a.smoke else a.shape, "rounds": rounds, "torch_threads": torch.get_num_threads(),
           "checkpoints": {name: {"bytes": sizes[name], "load_s": medians[name], "load_s_rounds": times[name],
                                  "load_ratio_to_bf16": medians[name] / medians["bf16"]} for name in dirs}}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
    for name, row in doc["checkpoints"].items():
        print(f"{name:18s} {row['bytes'] / 2**20:8.1f} MiB  load {row['load_s']:.2f} s  "
              f"x{row['load_ratio_to_bf16']:.2f} of bf16", file=sys.stderr)


if __name__ == "__main__":
    main()
