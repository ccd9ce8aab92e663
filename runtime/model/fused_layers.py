"""A CPU bf16 forward through every decoder layer in one native call.

At one to a few rows a decode step's kernels are a small part of each layer's time: the rest is
the ~25 torch ops and ctypes calls a layer costs from Python (10-20 µs each), and at prefill
sizes those ops still convert, zero and copy whole activations. Where a step allows,
`CausalLM.forward` hands the layers to kernels/cpu_layers.c, which runs the same kernels in the
same order on the same values (its result is the layer-by-layer path's, bit for bit). A step
takes it when all of these hold, else it runs layer by layer:

- the model: bf16 on CPU, every projection on the packed layout (PackedLinear.lanes), no q/k
  norm, norms before the attention and MLP only (not OLMo 2's or Gemma 3's after), no
  mixture-of-experts layer, no o_proj or MLP bias, RoPE in every layer, no sliding window or
  soft-capped attention, a SiLU MLP, no residual multiplier, and the native RMSNorm copies torch's summation order
  (native_layers.sum_lanes());
- the caches: bf16 rows the native kernels read (native.supports, native.supports_extend);
- the step: decode or extend, not mixed; no LoRA rows; a decode step's every context read whole
  by the decode kernel (no shared prefix read once for a group, no context cut into pieces for
  idle threads: kernels/torch_decode.py). The attention (runtime/model/attention.py
  `fused_layout`) checks the step's inputs and describes it for the kernel
  (native_layers.fused_decode_step, fused_extend_step).

`ENABLED = False` turns it off (tests compare the two paths).
"""
from __future__ import annotations

from typing import Any

import torch

from radixflow.kernels import native, native_layers
from radixflow.runtime.core.forward_batch import ForwardBatch

ENABLED = True


class FusedLayers:
    """The addresses the native call needs, gathered once per model and KV pool: per layer (the
    order of cpu_layers.c's LAYER_PTRS) its norms, packed projections, qkv bias and caches."""

    def __init__(self, model: Any, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor]) -> None:
        args = model.args
        rows = []
        for layer, kc, vc in zip(model.layers, k_caches, v_caches, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            bias = attn.qkv_proj.bias_f32
            rows.append([layer.input_layernorm.weight.data_ptr(), attn.qkv_proj.lanes.data_ptr(),
                         0 if bias is None else bias.data_ptr(), attn.o_proj.lanes.data_ptr(),
                         layer.post_attention_layernorm.weight.data_ptr(), mlp.gate_up_proj.lanes.data_ptr(),
                         mlp.down_proj.lanes.data_ptr(), kc.data_ptr(), vc.data_ptr()])
        self.table = torch.tensor(rows, dtype=torch.int64)
        self.dims = torch.tensor([args.hidden_size, args.num_heads, args.num_kv_heads, args.head_dim,
                                  args.intermediate_size, k_caches[0].shape[0]], dtype=torch.int64)
        self.caches = (k_caches, v_caches)  # the addresses above stay valid while these live
        self.eps = args.rms_norm_eps

    @staticmethod
    def fits(model: Any, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor]) -> bool:
        """Whether this model and these caches can take the native call (the step aside)."""
        args = model.args
        lanes = native_layers.sum_lanes()
        unfused = (args.qk_norm, args.qk_norm_whole, args.post_norms, not args.pre_norms, args.moe_layers, args.o_bias,
                   args.mlp_bias, args.nope_layers, args.window_layers, args.hidden_act != "silu",
                   args.attn_logit_softcapping is not None, args.attention_sinks,
                   args.residual_multiplier != 1.0, args.mla, args.qk_norm_weightless, args.layer_norm,
                   args.parallel_block, args.attn_temperature is not None)
        if any(unfused) or not lanes or args.hidden_size < lanes or len(k_caches) != len(model.layers):
            return False
        for layer in model.layers:
            projections = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                           layer.mlp.down_proj)
            norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
            if (any(getattr(p, "lanes", None) is None for p in projections)
                    or any(w.dtype != torch.bfloat16 or not w.is_contiguous() for w in norms)):
                return False
        return all(kc.dtype == torch.bfloat16 and native.supports(kc, vc, args.num_heads)
                   and native.supports_extend(kc, vc, args.num_heads) for kc, vc in zip(k_caches, v_caches))

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, out_slots: torch.Tensor,
            step: torch.Tensor, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) after the last layer for the step's embeddings x [tokens, hidden] bf16;
        `step` the attention's description (native_layers.fused_decode_step, fused_extend_step)."""
        tokens = x.shape[0]
        x = x.contiguous()  # written in place: the step's embedding rows, used by nothing else
        residual = torch.empty(tokens, x.shape[1], dtype=torch.float32)
        out_slots = out_slots.to(torch.int64).contiguous()
        status = native.library().forward_layers_bf16(
            self.table.shape[0], self.table.data_ptr(), self.dims.data_ptr(), tokens, self.eps, sm_scale,
            native_layers.sum_lanes(), x.data_ptr(), residual.data_ptr(), cos.data_ptr(), sin_signed.data_ptr(),
            out_slots.data_ptr(), step.data_ptr(), torch.get_num_threads())
        if status == -2:
            raise ValueError("forward step: a new token's KV slot is out of the pool's range")
        if status == -3:
            raise ValueError("extend attention: a request's row, lengths, q rows or slot ids are out of range")
        if status != 0:
            raise MemoryError("the fused forward could not allocate its scratch memory")
        return x, residual


def run_layers(model: Any, fb: ForwardBatch, attn: Any, x: torch.Tensor, cos: torch.Tensor,
               sin_signed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The step's (x, residual) after all layers through the native call, or None where this step,
    model or attention does not take it (the caller runs the layers one by one)."""
    layout = getattr(attn, "fused_layout", None)
    if (not ENABLED or fb.parts is not None or fb.lora is not None or layout is None or x.shape[0] == 0
            or x.dtype != torch.bfloat16 or x.device.type != "cpu" or native.library() is None):
        return None
    known = model.fused_layers  # (the caches it was decided for, FusedLayers or None: they do not fit)
    caches = attn.pool.k_caches
    if known is None or known[0] is not caches:
        fits = FusedLayers.fits(model, caches, attn.pool.v_caches)
        known = (caches, FusedLayers(model, caches, attn.pool.v_caches) if fits else None)
        model.fused_layers = known
    fused = known[1]
    if fused is None:
        return None
    step = layout(fb, model.args.num_heads, model.args.head_dim)
    if step is None:
        return None
    return fused.run(x, cos, sin_signed, fb.out_slots, step[0], attn.sm_scale)
