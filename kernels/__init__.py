"""radixflow.kernels: Triton kernels (CUDA, or the interpreter) beside same-signature torch references.

kernels/torch_attention.py and torch_decode.py add CPU-fast torch twins of the attention ops (the engine's
CPU path).
"""
from __future__ import annotations

from .activation import gelu_tanh_and_mul, gelu_tanh_and_mul_ref, silu_and_mul, silu_and_mul_ref
from .decode_attention import chunk_context, choose_kv_splits, decode_attention, decode_attention_ref, window_context
from .extend_attention import choose_extend_splits, extend_attention, extend_attention_ref
from .fp8 import FP8_E4M3_MAX, dequantize_fp8, quantize_fp8
from .lora import lora_expand, lora_expand_ref, lora_shrink, lora_shrink_ref
from .logits_mask import apply_token_bitmask, apply_token_bitmask_ref
from .moe import fused_moe, fused_moe_ref, moe_route, moe_route_grouped
from .rmsnorm import rmsnorm, rmsnorm_ref
from .rope import rope, rope_attention_factor, rope_cos_sin, rope_inv_freq, rope_ref
from .store_kv import store_kv, store_kv_ref
from .torch_attention import extend_attention_torch
from .torch_decode import (DecodeGather, decode_attention_gathered, decode_attention_torch, plan_checked_decode,
                           plan_decode)

__all__ = [
    "FP8_E4M3_MAX",
    "DecodeGather",
    "apply_token_bitmask",
    "apply_token_bitmask_ref",
    "choose_extend_splits",
    "choose_kv_splits",
    "decode_attention",
    "decode_attention_gathered",
    "decode_attention_ref",
    "decode_attention_torch",
    "dequantize_fp8",
    "extend_attention",
    "extend_attention_ref",
    "extend_attention_torch",
    "fused_moe",
    "gelu_tanh_and_mul",
    "gelu_tanh_and_mul_ref",
    "fused_moe_ref",
    "lora_expand",
    "lora_expand_ref",
    "lora_shrink",
    "lora_shrink_ref",
    "moe_route",
    "moe_route_grouped",
    "plan_checked_decode",
    "plan_decode",
    "quantize_fp8",
    "rmsnorm",
    "rmsnorm_ref",
    "rope",
    "rope_attention_factor",
    "rope_cos_sin",
    "rope_inv_freq",
    "rope_ref",
    "silu_and_mul",
    "silu_and_mul_ref",
    "store_kv",
    "store_kv_ref",
    "window_context",
    "chunk_context",
]
