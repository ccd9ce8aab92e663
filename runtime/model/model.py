"""One decoder for the Llama family (Llama 2/3/3.1, Mistral, Qwen2, Qwen3, Phi-3, SmolLM3, Granite,
OLMo 2, Gemma 1, 2 and 3) and its mixture-of-experts kin (Mixtral, Qwen2-MoE, Qwen3-MoE, GraniteMoE, OLMoE:
kernels/moe.py), DeepSeek-V2 / V3's latent attention (LatentAttention) and Llama 4 among them, driven by
ModelArgs.

Projections are fused at load time (q|k|v into `qkv_proj`, gate|up into `gate_up_proj`) so each
layer runs two matmuls fewer. Attention goes through an `AttentionFn` that receives the step's
ForwardBatch, so where K/V live (the engine's slot pool) is the backend's business. On CUDA the
norms (with the residual add), RoPE and SiLU-and-mul run as fused Triton kernels (kernels/);
on CPU as a few torch ops each.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from radixflow import kernels
from radixflow.kernels import native_layers
from radixflow.kernels.moe import grouped_experts
from radixflow.runtime.core.forward_batch import ForwardBatch
from radixflow.runtime.model.rope_layout import pass_through_columns
from radixflow.runtime.model import fused_layers
from radixflow.runtime.model.model_config import ModelArgs

# Vocabulary rows per logits matmul on CPU (see project_logits).
LOGITS_CHUNK = 512
# Run the fused Triton ops on CPU tensors too (tests, under TRITON_INTERPRET=1); else CUDA only.
FORCE_TRITON_OPS = False


def use_triton_ops(x: torch.Tensor) -> bool:
    return x.is_cuda or FORCE_TRITON_OPS


def add_lora(fb: ForwardBatch, layer_id: int, proj: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y (the base projection of x) plus each row's adapter delta, in place (runtime/lora/batch.py)."""
    if fb.lora is not None:
        fb.lora.apply(layer_id, proj, x, y)
    return y


class AttentionFn(Protocol):
    def __call__(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 fb: ForwardBatch, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] of the new tokens → attention output [T, H, D]; `sinks` [H]
        (passed only by a model that has them): each head's logit joins its softmax's denominator."""
        ...


class RMSNorm(nn.Module):
    """RMSNorm over the last dim, optionally fused with the residual add that precedes it."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x, residual [T, dim] → (norm(h), h) with h = x + residual (x when residual is None)."""
        if use_triton_ops(x):
            return kernels.rmsnorm(x, residual, self.weight, self.eps)
        normed = native_layers.rmsnorm(x, residual, self.weight, self.eps)
        return rmsnorm_cpu(x, residual, self.weight, self.eps) if normed is None else normed

    def norm_heads(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, heads, dim] → norm of every head vector, same shape (Qwen3's q/k norm)."""
        return self(x.reshape(-1, x.shape[-1]))[0].view(x.shape)


class LayerNorm(RMSNorm):
    """LayerNorm with a bias (StarCoder2) or without (Cohere), same contract as RMSNorm: x, residual
    [T, dim] → (norm(h), h), h = x + residual; the sum in fp32 on CPU, as rmsnorm_cpu keeps it. Torch
    ops on every device (no fused kernel)."""

    def __init__(self, dim: int, eps: float, bias: bool = True) -> None:
        super().__init__(dim, eps)
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        h = x.float() if residual is None else x.float() + residual
        bias = None if self.bias is None else self.bias.float()
        normed = F.layer_norm(h, (h.shape[-1],), self.weight.float(), bias, self.eps)
        return normed.to(x.dtype), (h if x.device.type == "cpu" else h.to(x.dtype))


class HeadLayerNorm(nn.Module):
    """Command R+'s q / k norm: each head's vector LayerNormed (no bias) with that head's own
    weights [heads, head_dim], in fp32, back in the input's dtype."""

    def __init__(self, heads: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, heads, head_dim] → the same shape."""
        normed = F.layer_norm(x.float(), (x.shape[-1],), None, None, self.eps)
        return (normed * self.weight.float()).to(x.dtype)


def make_norm(args: ModelArgs) -> RMSNorm:
    """A hidden-size norm of the model's kind: RMSNorm, or StarCoder2's and Cohere's LayerNorm."""
    if args.layer_norm:
        return LayerNorm(args.hidden_size, args.rms_norm_eps, args.norm_bias)
    return RMSNorm(args.hidden_size, args.rms_norm_eps)


def rmsnorm_cpu(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm on CPU in torch ops (kernels/native_layers.py `rmsnorm`: the same bits in fewer passes): x
    [T, dim], residual fp32 or None → (norm(h), h), h = x + residual in fp32.

    NOTE: on CPU the residual stream stays fp32 whatever the weights' dtype: a bf16 stream
    rounds every layer's sum, enough to flip SmolLM2's greedy answers (a tie at the first token
    of "What is the capital of France?"); the cost is one elementwise add per norm.
    """
    h = x.float() if residual is None else x.float() + residual
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight.dtype == torch.float32 and x.dtype != torch.float32:  # Gemma, gpt-oss: the product in fp32
        return (weight * normed).to(x.dtype), h
    return weight * normed.to(x.dtype), h


def silu_mul_cpu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [T, 2 * inter] = | gate | up | in torch ops (kernels/native_layers.py
    `silu_mul` in one pass)."""
    gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
    return F.silu(gate).mul_(up)  # [T, intermediate]


def rope_tables(args: ModelArgs, max_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_len, rope_table_dim] fp32 for the model's RoPE (llama3 / linear / yarn scaling
    applied). LongRoPE: [2 * max_len, head_dim], the short factors' rows then the long ones'
    (a long sequence's tokens read row position + max_len: ForwardBatch.rope_positions)."""
    factor = kernels.rope_attention_factor(args.rope_scaling)
    tables = []
    for long in (False, True) if args.long_rope_len is not None else (False,):
        inv_freq = kernels.rope_inv_freq(args.rope_dim, args.rope_theta, args.rope_scaling, long)
        inv_freq = torch.cat([inv_freq, inv_freq.new_zeros((args.rope_table_dim - args.rope_dim) // 2)])
        cos, sin = kernels.rope_cos_sin(inv_freq, max_len, device, factor)
        if args.rope_dim < args.rope_table_dim:  # the dims partial RoPE passes through: cos 1, sin 0 (unscaled)
            passed = pass_through_columns(args.rope_table_dim, args.rope_dim).to(device)
            cos[:, passed], sin[:, passed] = 1.0, 0.0
        tables.append((cos, sin))
    return torch.cat([cos for cos, _ in tables]), torch.cat([sin for _, sin in tables])


def rotate_cpu(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """RoPE on CPU: x [T, heads, D]; cos [T, 1, D]; sin_signed [T, 1, D] = sin with its first half
    negated, so that | x1 | x2 | → x * cos + | x2 | x1 | * sin_signed. New tensor of x's dtype:
    the native pass where it applies (kernels/native_layers.py `rope`, the same bits), else torch ops.

    NOTE: each half adds its product in place instead of building the swapped | x2 | x1 | copy
    (a cat, two conversions and one broadcast addcmul): the same sums bit for bit, ~6x less time
    at prefill sizes (4,096 tokens x 12 heads x 64, one core).
    """
    rotated = native_layers.rope(x, cos, sin_signed)
    if rotated is not None:
        return rotated
    half = x.shape[-1] // 2
    xf = x.float()
    out = xf * cos
    out[..., :half].addcmul_(xf[..., half:], sin_signed[..., :half])
    out[..., half:].addcmul_(xf[..., :half], sin_signed[..., half:])
    return out.to(x.dtype)


@dataclass
class RopeStep:
    """One step's RoPE inputs: the tables and positions (CUDA kernel), or gathered rows (CPU)."""

    positions: torch.Tensor  # [T] int64
    cos: torch.Tensor        # CUDA: [max_len, D] table; CPU: [T, 1, D] rows
    sin: torch.Tensor        # CUDA: [max_len, D] table; CPU: [T, 1, D] rows, first half negated
    temperature: torch.Tensor | None = None  # [T, 1, 1]: the step's query scales (ModelArgs.attn_temperature)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.args, self.layer_id = args, layer_id
        self.qkv_proj = nn.Linear(args.hidden_size, args.q_size + 2 * args.kv_size, bias=args.qkv_bias)
        self.o_proj = nn.Linear(args.q_size, args.hidden_size, bias=args.o_bias)
        if args.qk_norm:
            self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps)
            self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps)
        elif args.qk_norm_whole:  # OLMo 2, OLMoE: over the whole projection
            self.q_norm = RMSNorm(args.q_size, args.rms_norm_eps)
            self.k_norm = RMSNorm(args.kv_size, args.rms_norm_eps)
        elif args.qk_layer_norm:  # Command R+
            self.q_norm = HeadLayerNorm(args.num_heads, args.head_dim, args.rms_norm_eps)
            self.k_norm = HeadLayerNorm(args.num_kv_heads, args.head_dim, args.rms_norm_eps)
        # gpt-oss: one learned logit per query head in its softmax's denominator (AttentionFn `sinks`)
        self.sinks = nn.Parameter(torch.empty(args.num_heads)) if args.attention_sinks else None

    def forward(self, x: torch.Tensor, rope: RopeStep, fb: ForwardBatch, attn: AttentionFn) -> torch.Tensor:
        a = self.args
        qkv = add_lora(fb, self.layer_id, "qkv", x, self.qkv_proj(x))  # [T, q_size + 2 * kv_size]
        num_tokens, qk_size = qkv.shape[0], a.q_size + a.kv_size
        q = qkv[:, :a.q_size].view(num_tokens, a.num_heads, a.head_dim)
        k = qkv[:, a.q_size:qk_size].view(num_tokens, a.num_kv_heads, a.head_dim)
        v = qkv[:, qk_size:].view(num_tokens, a.num_kv_heads, a.head_dim)
        if a.qk_norm and not a.qk_norm_after_rope:
            q, k = self.q_norm.norm_heads(q), self.k_norm.norm_heads(k)
        elif a.qk_norm_whole:
            q = self.q_norm(qkv[:, :a.q_size].contiguous())[0].view(num_tokens, a.num_heads, a.head_dim)
            k = self.k_norm(qkv[:, a.q_size:qk_size].contiguous())[0].view(num_tokens, a.num_kv_heads, a.head_dim)
        elif a.qk_layer_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.layer_id in a.nope_layers:  # SmolLM3: no position encoding in this layer
            pass
        elif use_triton_ops(x):
            kernels.rope(q, k, rope.positions, rope.cos, rope.sin)  # in place
        elif a.qk_norm or a.qk_norm_whole or a.qk_layer_norm:
            q, k = rotate_cpu(q, rope.cos, rope.sin), rotate_cpu(k, rope.cos, rope.sin)
        else:  # q and k side by side in qkv: one rotation over [T, num_heads + num_kv_heads, D]
            qk = rotate_cpu(qkv[:, :qk_size].view(num_tokens, -1, a.head_dim), rope.cos, rope.sin)
            q, k = qk[:, :a.num_heads], qk[:, a.num_heads:]
        if a.qk_norm_after_rope:  # HunYuan: the rotated q and k normed per head
            q, k = self.q_norm.norm_heads(q), self.k_norm.norm_heads(k)
        if a.qk_norm_weightless and self.layer_id not in a.nope_layers:  # Llama 4: rotated q, k normed unweighted
            q, k = rms_unweighted(q, a.rms_norm_eps), rms_unweighted(k, a.rms_norm_eps)
        if rope.temperature is not None and (a.temperature_all_layers or self.layer_id in a.nope_layers):
            q = q * rope.temperature  # by position: Llama 4's layers without RoPE, Ministral 3's every layer
        if self.sinks is None:
            o = attn(self.layer_id, q, k, v, fb)
        else:
            o = attn(self.layer_id, q, k, v, fb, sinks=self.sinks)
        o = o.reshape(-1, a.q_size)  # [T, q_size]
        return add_lora(fb, self.layer_id, "o", o, self.o_proj(o))


# the latent norms' epsilon, whatever rms_norm_eps says: transformers' and DeepSeek's own code build them so
LATENT_NORM_EPS = 1e-6


class LatentAttention(nn.Module):
    """DeepSeek-V2 / V3's multi-head latent attention (MLA), with the up-projections absorbed.

    Per token: a latent c = norm(x W_dkv) of kv_lora_rank dims and one key of qk_rope_head_dim
    dims shared by every head, rotated (k_pe). Each head h's query is | q_nope | q_pe |
    (from x, or through a q_lora_rank bottleneck). kv_b_proj holds each head's W_uk [nope, latent]
    and W_uv [v, latent], so q_nope . (W_uk c) = (W_uk^T q_nope) . c: every head attends over the
    one KV head | c | k_pe | with the query | W_uk^T q_nope | q_pe |, and its output's latent part
    times W_uv^T is the head's value sum. The KV pool keeps | c | k_pe | per token (keys and values
    alike: KVPool shared_kv), kv_lora_rank + qk_rope_head_dim numbers instead of
    2 * heads * head dims. The rotated dims' rows are de-interleaved at load (rope_layout.py) and
    turned by rotate-half tables of qk_rope_head_dim columns."""

    def __init__(self, args: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.args, self.layer_id = args, layer_id
        heads, qk_dim = args.num_heads, args.qk_nope_head_dim + args.qk_rope_head_dim
        if args.q_lora_rank:
            self.q_a_proj = nn.Linear(args.hidden_size, args.q_lora_rank, bias=args.qkv_bias)
            self.q_a_layernorm = RMSNorm(args.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(args.q_lora_rank, heads * qk_dim, bias=False)
        else:
            self.q_proj = nn.Linear(args.hidden_size, heads * qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(args.hidden_size, args.kv_lora_rank + args.qk_rope_head_dim,
                                            bias=args.qkv_bias)
        self.kv_a_layernorm = RMSNorm(args.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(args.kv_lora_rank, heads * (args.qk_nope_head_dim + args.v_head_dim), bias=False)
        self.o_proj = nn.Linear(heads * args.v_head_dim, args.hidden_size, bias=args.o_bias)

    def forward(self, x: torch.Tensor, rope: RopeStep, fb: ForwardBatch, attn: AttentionFn) -> torch.Tensor:
        a = self.args
        tokens, heads, nope, rot, latent = x.shape[0], a.num_heads, a.qk_nope_head_dim, a.qk_rope_head_dim, a.kv_lora_rank
        if a.q_lora_rank:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))[0])
        else:
            q = self.q_proj(x)
        q = q.view(tokens, heads, nope + rot)
        kv = self.kv_a_proj_with_mqa(x)  # [T, latent + rot]
        c = self.kv_a_layernorm(kv[:, :latent].contiguous())[0]  # [T, latent]
        q_pe, k_pe = q[..., nope:].contiguous(), kv[:, None, latent:].contiguous()  # [T, H, rot], [T, 1, rot]
        if use_triton_ops(x):
            kernels.rope(q_pe, k_pe, rope.positions, rope.cos, rope.sin)  # in place
        else:
            q_pe, k_pe = rotate_cpu(q_pe, rope.cos, rope.sin), rotate_cpu(k_pe, rope.cos, rope.sin)
        w = self.kv_b_proj.weight.view(heads, nope + a.v_head_dim, latent)
        q_latent = torch.bmm(q[..., :nope].transpose(0, 1), w[:, :nope])  # [H, T, latent]
        query = torch.cat([q_latent.transpose(0, 1), q_pe], dim=-1)  # [T, H, latent + rot]
        key = torch.cat([c, k_pe[:, 0]], dim=-1)[:, None]  # [T, 1, latent + rot]: the values' latent too
        o = attn(self.layer_id, query, key, key, fb)  # [T, H, latent + rot]
        o = torch.bmm(o[..., :latent].transpose(0, 1), w[:, nope:].transpose(1, 2))  # [H, T, v]
        return self.o_proj(o.transpose(0, 1).reshape(tokens, heads * a.v_head_dim))


def rms_unweighted(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] over its last dim's root mean square, in fp32, back in x's dtype (Llama 4's q / k norm)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def attention_temperature(positions: torch.Tensor, floor_scale: float, scale: float, offset: float) -> torch.Tensor:
    """The query scale at each position [T] (fp32): log1p(floor((pos + offset) / floor_scale)) * scale + 1
    (Llama 4: offset 1; Ministral 3: offset 0)."""
    return torch.log1p(torch.floor((positions.float() + offset) / floor_scale)) * scale + 1.0


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [T, 2 * inter] = | gate | up | → [T, inter]: the Triton kernel on
    CUDA, else the native pass, else torch ops."""
    if use_triton_ops(gate_up):
        return kernels.silu_and_mul(gate_up)
    act = native_layers.silu_mul(gate_up)
    return silu_mul_cpu(gate_up) if act is None else act


def act_and_mul(gate_up: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up for ModelArgs.hidden_act: silu_and_mul, or GELU's tanh form (Gemma 2 and 3: the
    Triton kernel on CUDA, torch ops on CPU)."""
    if act == "silu":
        return silu_and_mul(gate_up)
    if use_triton_ops(gate_up):
        return kernels.gelu_tanh_and_mul(gate_up)
    return kernels.gelu_tanh_and_mul_ref(gate_up)


def swiglu_clamped(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's experts' activation of gate_up [n, 2I] = | gate | up |: (up + 1) * g * sigmoid(alpha * g)
    with g = min(gate, limit) and up clamped to [-limit, limit], in gate_up's dtype → [n, I]."""
    gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
    gate = gate.clamp(max=limit)
    return (up.clamp(-limit, limit) + 1) * (gate * torch.sigmoid(gate * alpha))


def ungated_act(up: torch.Tensor, act: str, xielu: tuple[torch.Tensor, ...] | None) -> torch.Tensor:
    """act(up) of an MLP without a gate: Arcee's squared ReLU, StarCoder2's GELU (tanh form), or Apertus' xIELU with its learned
    (alpha_p, alpha_n, beta, eps): x > 0: softplus(alpha_p) x^2 + beta x, else
    (beta + softplus(alpha_n)) (expm1(min(x, eps)) - x) + beta x."""
    if act == "relu2":
        return torch.relu(up).square()
    if act == "gelu_tanh":  # StarCoder2
        return F.gelu(up, approximate="tanh")
    assert xielu is not None
    alpha_p, alpha_n, beta, eps = (t.to(up.dtype) for t in xielu)
    alpha_p, alpha_n = F.softplus(alpha_p), beta + F.softplus(alpha_n)
    return torch.where(up > 0, alpha_p * up * up + beta * up,
                       (torch.expm1(torch.minimum(up, eps)) - up) * alpha_n + beta * up)


class MLP(nn.Module):
    """The dense SwiGLU MLP (gate_up_proj: | gate | up |), or without a gate (ModelArgs.gated_mlp false:
    gate_up_proj holds up alone); `lora` False for one that adapters do not reach (a shared
    expert), `bias` its biases (default: ModelArgs.mlp_bias)."""

    def __init__(self, args: ModelArgs, layer_id: int, intermediate_size: int | None = None,
                 lora: bool = True, bias: bool | None = None) -> None:
        super().__init__()
        self.layer_id, self.lora, self.act, self.gated = layer_id, lora, args.hidden_act, args.gated_mlp
        self.intermediate_size = args.intermediate_size if intermediate_size is None else intermediate_size
        bias = args.mlp_bias if bias is None else bias  # a shared expert: none
        width = 2 * self.intermediate_size if self.gated else self.intermediate_size
        self.gate_up_proj = nn.Linear(args.hidden_size, width, bias=bias)
        self.down_proj = nn.Linear(self.intermediate_size, args.hidden_size, bias=bias)
        if args.hidden_act == "xielu":  # its learned scalars, as the checkpoint stores them
            self.act_alpha_p, self.act_alpha_n = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
            self.act_beta, self.act_eps = nn.Parameter(torch.zeros(())), nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [T, 2 * intermediate], or [T, intermediate] without a gate
        if self.lora and self.gated:
            gate_up = add_lora(fb, self.layer_id, "gate_up", x, gate_up)
        if self.gated:
            act = act_and_mul(gate_up, self.act)  # [T, intermediate]
        else:
            act = ungated_act(gate_up, self.act, (self.act_alpha_p, self.act_alpha_n, self.act_beta, self.act_eps)
                              if self.act == "xielu" else None)
        down = self.down_proj(act)
        return add_lora(fb, self.layer_id, "down", act, down) if self.lora else down


class SparseMoE(nn.Module):
    """A mixture-of-experts MLP: `gate` routes each token to its top-k of the experts' SwiGLU MLPs,
    stored stacked (kernels/moe.py: the grouped Triton kernel on CUDA, the torch grouping on CPU);
    Qwen2-MoE adds a shared expert scaled by sigmoid(shared_expert_gate(x)), GLM-4.5 one without a
    gate and its grouped sigmoid routing (router_correction), Llama 4 one without a gate beside one
    expert per token whose input its router weight scales (expert_input_scaled); gpt-oss's router and
    experts carry biases and its experts take the clamped SwiGLU (swiglu_clamped). LoRA adapters
    do not reach it (runtime/lora/adapter.py refuses them)."""

    def __init__(self, args: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.top_k, self.renormalize = args.num_experts_per_tok, args.norm_topk_prob
        experts, inter = args.num_experts, args.moe_intermediate_size
        self.gate = nn.Linear(args.hidden_size, experts, bias=args.router_bias)
        self.experts_gate_up = nn.Parameter(torch.empty(experts, 2 * inter, args.hidden_size))
        self.experts_down = nn.Parameter(torch.empty(experts, args.hidden_size, inter))
        self.experts_gate_up_bias = nn.Parameter(torch.empty(experts, 2 * inter)) if args.expert_bias else None
        self.experts_down_bias = nn.Parameter(torch.empty(experts, args.hidden_size)) if args.expert_bias else None
        self.swiglu = (args.swiglu_alpha, args.swiglu_limit) if args.expert_act == "swiglu_clamped" else None
        # GLM-4.5: sigmoid scores, grouped, with the router's correction bias (kernels.moe_route_grouped)
        self.grouping = (args.n_group, args.topk_group, args.routed_scaling_factor, args.router_scoring)
        self.router_correction = nn.Parameter(torch.empty(experts)) if args.router_correction else None
        # routed by moe_route_grouped from fp32 logits: GLM-4.5, MiniMax-M2, ERNIE 4.5 MoE, DeepSeek-V2 / V3,
        # Hunyuan MoE (its softmax top-k, one group, no correction)
        self.grouped = args.router_correction or ".mlp.gate.weight" in args.fp32_parameters
        self.input_scaled = args.expert_input_scaled  # Llama 4
        self.group_score = args.group_score
        # CPU bf16: each expert's (gate | up, down) on the packed layout (packed_linear.prepack_linears)
        self.packed_experts: list[tuple[nn.Module, nn.Module]] | None = None
        self.shared_expert: MLP | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if args.shared_expert_intermediate_size:
            self.shared_expert = MLP(args, layer_id, args.shared_expert_intermediate_size, lora=False, bias=False)
            if args.shared_expert_gate:
                self.shared_expert_gate = nn.Linear(args.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        routed = x  # the experts' input
        if self.input_scaled:  # the one expert of the top logit, its input scaled by the logit's sigmoid
            top = self.gate(x).topk(1, dim=-1)
            routed = x * torch.sigmoid(top.values.float()).to(x.dtype)
            weights, ids = torch.ones(top.values.shape, dtype=torch.float32, device=x.device), top.indices
        elif not self.grouped:
            weights, ids = kernels.moe_route(self.gate(x), self.top_k, self.renormalize)
        else:  # in fp32, as the checkpoint's router is kept
            logits = F.linear(x.float(), self.gate.weight.float())
            weights, ids = kernels.moe_route_grouped(logits, self.top_k, self.renormalize, self.router_correction,
                                                     *self.grouping, group_score=self.group_score)
        biases = (self.experts_gate_up_bias, self.experts_down_bias)
        if self.packed_experts is not None:  # CPU bf16 (the stacked parameters are emptied)
            out = grouped_experts(routed, weights, ids, len(self.packed_experts), self._packed_expert)
        elif use_triton_ops(x):
            out = kernels.fused_moe(routed, weights, ids, self.experts_gate_up, self.experts_down,
                                    None if self.swiglu is None else self._act, *biases)
        else:
            out = kernels.fused_moe_ref(routed, weights, ids, self.experts_gate_up, self.experts_down, self._act,
                                        *biases)
        if self.shared_expert is not None:
            shared = self.shared_expert(x, fb)
            out = out + (shared if self.shared_expert_gate is None else torch.sigmoid(self.shared_expert_gate(x)) * shared)
        return out

    def _act(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The experts' activation: SiLU-and-mul, or gpt-oss's clamped SwiGLU."""
        return silu_and_mul(gate_up) if self.swiglu is None else swiglu_clamped(gate_up, *self.swiglu)

    def _packed_expert(self, expert: int, rows: torch.Tensor) -> torch.Tensor:
        assert self.packed_experts is not None
        gate_up, down = self.packed_experts[expert]
        return down(self._act(gate_up(rows)))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.residual_multiplier = args.residual_multiplier  # Granite: each branch scaled before its add
        self.post_norms, self.pre_norms = args.post_norms, args.pre_norms
        self.local_rope = layer_id in args.window_layers and args.local_rope_theta is not None  # Gemma 3
        if args.pre_norms:
            self.input_layernorm = make_norm(args)
        if args.post_norms:  # OLMo 2, Gemma 2 and 3 (which norm before the MLP too)
            self.post_feedforward_layernorm = make_norm(args)
            if args.pre_norms:
                self.pre_feedforward_layernorm = make_norm(args)
        self.self_attn = LatentAttention(args, layer_id) if args.mla else Attention(args, layer_id)
        self.parallel = args.parallel_block  # Cohere: attention and the MLP read the one norm's output
        if not self.parallel:
            self.post_attention_layernorm = make_norm(args)
        self.mlp = SparseMoE(args, layer_id) if layer_id in args.moe_layers else MLP(args, layer_id)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: RopeStep,
                fb: ForwardBatch, attn: AttentionFn) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) → (this layer's MLP output, the residual stream before it): the residual
        add runs fused into the next norm (residual None at the first layer: x is the stream)."""
        if self.post_norms:
            return self._post_norms(x, residual, rope, fb, attn)
        h, residual = self.input_layernorm(x, residual)
        if self.parallel:  # stream + attn(norm(stream)) + mlp(norm(stream))
            return self.self_attn(h, rope, fb, attn) + self.mlp(h, fb), residual
        h = self.self_attn(h, rope, fb, attn)
        if self.residual_multiplier != 1.0:
            h = h * self.residual_multiplier
        h, residual = self.post_attention_layernorm(h, residual)
        h = self.mlp(h, fb)
        return (h if self.residual_multiplier == 1.0 else h * self.residual_multiplier), residual

    def _post_norms(self, x: torch.Tensor, residual: torch.Tensor | None, rope: RopeStep, fb: ForwardBatch,
                    attn: AttentionFn) -> tuple[torch.Tensor, torch.Tensor]:
        """OLMo 2's layer, same contract: stream = x + residual; stream += norm(attn(stream));
        returns (norm(mlp(stream)), stream); Gemma's norms the branches' inputs too
        (attn(norm(stream)), mlp(norm(stream))). The stream is fp32 on CPU, as the fused norms keep it."""
        if residual is None:
            stream = x if use_triton_ops(x) else x.float()
        else:
            stream = x.to(residual.dtype) + residual
        h = stream.to(x.dtype)
        h = self.self_attn(self.input_layernorm(h)[0] if self.pre_norms else h, rope, fb, attn)
        stream = stream + self.post_attention_layernorm(h)[0].to(stream.dtype)
        h = stream.to(x.dtype)
        h = self.mlp(self.pre_feedforward_layernorm(h)[0] if self.pre_norms else h, fb)
        return self.post_feedforward_layernorm(h)[0], stream


class CausalLM(nn.Module):
    """Decoder-only LM. Build on the meta device, then `load_weights` assigns real tensors."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args, i) for i in range(args.num_layers))
        self.norm = make_norm(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        # CPU bf16: the LM head on oneDNN's prepacked layout (packed_linear.prepack_linears)
        self.packed_lm_head: nn.Module | None = None
        self.rope_cos: torch.Tensor | None = None
        self.rope_sin: torch.Tensor | None = None
        self.rope_sin_signed: torch.Tensor | None = None
        # Gemma 3's window layers: (cos, sin, sin_signed) of their own RoPE base
        self.local_rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.fused_layers: tuple | None = None  # runtime/model/fused_layers.py's, decided on first use
        self.last_hidden: torch.Tensor | None = None  # the latest forward's, [logit rows, hidden]
        self.kept_hidden: torch.Tensor | None = None  # the latest forward's, [fb.hidden_rows, hidden]

    def init_rope(self, max_len: int, device: torch.device) -> None:
        """Tables for positions [0, max_len); call once the weights are on `device`."""
        self.rope_cos, self.rope_sin = rope_tables(self.args, max_len, device)
        self.rope_sin_signed = _sin_signed(self.rope_sin)
        if self.args.local_rope_theta is not None:
            inv_freq = kernels.rope_inv_freq(self.args.head_dim, self.args.local_rope_theta, None)
            cos, sin = kernels.rope_cos_sin(inv_freq, max_len, device)
            self.local_rope = (cos, sin, _sin_signed(sin))

    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.args.tie_word_embeddings else self.lm_head.weight

    def _rope_step(self, positions: torch.Tensor, local: bool = False) -> RopeStep:
        assert self.rope_cos is not None and self.rope_sin is not None and self.rope_sin_signed is not None, \
            "init_rope() must run before forward()"
        tables = (self.rope_cos, self.rope_sin, self.rope_sin_signed)
        if local:
            assert self.local_rope is not None
            tables = self.local_rope
        if use_triton_ops(positions):
            return RopeStep(positions, tables[0], tables[1])
        cos = tables[0].index_select(0, positions)[:, None, :]  # [T, 1, D]
        return RopeStep(positions, cos, tables[2].index_select(0, positions)[:, None, :])

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch, attn: AttentionFn) -> torch.Tensor:
        """Logits [len(fb.logit_rows), vocab] in fp32 for the requested token rows."""
        positions = fb.positions if fb.rope_positions is None else fb.rope_positions
        rope = self._rope_step(positions)
        local_rope = self._rope_step(positions, local=True) if self.local_rope is not None else rope
        x, residual = self.embed_tokens(fb.input_ids), None  # [T, hidden]
        if self.args.attn_temperature is not None:  # once a step, for the layers that scale their queries
            scales = attention_temperature(fb.positions, *self.args.attn_temperature).to(x.dtype)[:, None, None]
            rope = RopeStep(rope.positions, rope.cos, rope.sin, scales)
        if self.args.embedding_multiplier_in_dtype:  # Gemma: its scale rounded to the weights' dtype first
            x = x * torch.tensor(self.args.embedding_multiplier, dtype=x.dtype)
        elif self.args.embedding_multiplier != 1.0:  # Granite
            x = x * self.args.embedding_multiplier
        fused = None if use_triton_ops(x) else fused_layers.run_layers(self, fb, attn, x, rope.cos, rope.sin)
        if fused is not None:  # CPU bf16: every layer in one native call
            x, residual = fused
        else:
            for layer in self.layers:
                x, residual = layer(x, residual, local_rope if layer.local_rope else rope, fb, attn)
        self.kept_hidden = None if fb.hidden_rows is None else self._final_norm(x, residual, fb.hidden_rows)
        x = self._final_norm(x, residual, fb.logit_rows)
        self.last_hidden = x  # the logit rows' final hidden states (embedding requests read them)
        if self.packed_lm_head is not None:
            logits = self.packed_lm_head(x).float()
        else:
            logits = project_logits(x, self.lm_head_weight())
        if self.args.logits_scaling != 1.0:  # Granite
            logits = logits.div_(self.args.logits_scaling)
        cap = self.args.final_logit_softcapping
        return logits if cap is None else logits.div_(cap).tanh_().mul_(cap)  # Gemma 2, Gemma 3 where asked

    def _final_norm(self, x: torch.Tensor, residual: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The final hidden states [len(rows), hidden] of flat token `rows`: the last norm applied
        to their residual stream."""
        return self.norm(x.index_select(0, rows), residual.index_select(0, rows))[0]


def _sin_signed(sin: torch.Tensor) -> torch.Tensor:
    """The CPU rotation's sin table: its first half negated (see rotate_cpu)."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)


def project_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [rows, hidden] @ weight [vocab, hidden]^T → fp32 [rows, vocab].

    NOTE: on CPU the vocabulary goes in chunks of LOGITS_CHUNK rows of `weight`: one big matmul
    at a few rows runs far below the matmul peak on one core, chunks that stay in cache do not
    (benchmarks/cpu_decode.py measures the step). In bf16 the chunks stay bf16 (converting the
    weights per step costs ~4.6x the matmul); the residual stream before the final norm is fp32.
    CPU bf16 with oneDNN takes CausalLM.packed_lm_head instead (the same products, ~2.4x faster).
    """
    if x.is_cuda or x.shape[0] == 0:
        return F.linear(x, weight).float()
    vocab = weight.shape[0]
    out = torch.empty((x.shape[0], vocab), dtype=torch.float32)
    for a in range(0, vocab, LOGITS_CHUNK):
        out[:, a:a + LOGITS_CHUNK] = F.linear(x, weight[a:a + LOGITS_CHUNK])
    return out
