"""One decoder for the Llama family (Llama 2/3/3.1, Mistral, Qwen2, Qwen3), driven by ModelArgs.

Projections are fused at load time (q|k|v into `qkv_proj`, gate|up into `gate_up_proj`) so each
layer runs two matmuls fewer. Attention goes through an `AttentionFn` that receives the step's
ForwardBatch, so where K/V live (the engine's slot pool) is the backend's business.
"""
from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from radixflow.runtime.forward_batch import ForwardBatch
from radixflow.runtime.model_config import ModelArgs


class AttentionFn(Protocol):
    def __call__(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 fb: ForwardBatch) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] of the new tokens → attention output [T, H, D]."""
        ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], with llama3 or linear scaling applied."""
    d = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaling = args.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind != "llama3":
        return inv_freq
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling.get("original_max_position_embeddings", 8192)
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(args: ModelArgs, max_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [max_len, head_dim] in fp32 (halves repeated, rotate-half layout)."""
    inv_freq = rope_inv_freq(args).to(device)
    freqs = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    out = x.float() * cos[:, None, :] + rotated.float() * sin[:, None, :]
    return out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.args, self.layer_id = args, layer_id
        self.qkv_proj = nn.Linear(args.hidden_size, args.q_size + 2 * args.kv_size, bias=args.qkv_bias)
        self.o_proj = nn.Linear(args.q_size, args.hidden_size, bias=False)
        if args.qk_norm:
            self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps)
            self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                fb: ForwardBatch, attn: AttentionFn) -> torch.Tensor:
        a = self.args
        q, k, v = self.qkv_proj(x).split([a.q_size, a.kv_size, a.kv_size], dim=-1)
        q = q.view(-1, a.num_heads, a.head_dim)     # [T, H, D]
        k = k.view(-1, a.num_kv_heads, a.head_dim)  # [T, Hkv, D]
        v = v.view(-1, a.num_kv_heads, a.head_dim)  # [T, Hkv, D]
        if a.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = attn(self.layer_id, q, k, v, fb)        # [T, H, D]
        return self.o_proj(o.reshape(-1, a.q_size))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.intermediate_size = args.intermediate_size
        self.gate_up_proj = nn.Linear(args.hidden_size, 2 * args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args, layer_id)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                fb: ForwardBatch, attn: AttentionFn) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, fb, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class CausalLM(nn.Module):
    """Decoder-only LM. Build on the meta device, then `load_weights` assigns real tensors."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.rope_cos: torch.Tensor | None = None
        self.rope_sin: torch.Tensor | None = None

    def init_rope(self, max_len: int, device: torch.device) -> None:
        """Tables for positions [0, max_len); call once the weights are on `device`."""
        self.rope_cos, self.rope_sin = rope_cos_sin(self.args, max_len, device)

    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.args.tie_word_embeddings else self.lm_head.weight

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch, attn: AttentionFn) -> torch.Tensor:
        """Logits [len(fb.logit_rows), vocab] in fp32 for the requested token rows."""
        assert self.rope_cos is not None, "init_rope() must run before forward()"
        cos = self.rope_cos.index_select(0, fb.positions)
        sin = self.rope_sin.index_select(0, fb.positions)
        x = self.embed_tokens(fb.input_ids)  # [T, hidden]
        for layer in self.layers:
            x = layer(x, cos, sin, fb, attn)
        x = self.norm(x.index_select(0, fb.logit_rows))
        return F.linear(x, self.lm_head_weight()).float()
