"""CPU bfloat16 projections on a prepacked weight layout, reordered once at load.

Where the native kernels build with AVX512-BF16, the layout is kernels/cpu_linear.c's (each
vector lane a pair of one output column's weights; `native_layers.linear_bf16`): exact products, fp32
sums in a fixed order per row whatever the batch, one rounding to bf16: a decode step's 120
projections of SmolLM2-135M 1.70x as fast as on oneDNN's layout at one row, 1.04-1.28x at 4-256
rows (benchmarks/cpu_linear.py, results/cpu_linear_cpu.json). Elsewhere the layout is oneDNN's, as follows.

`F.linear` on bf16 CPU tensors runs oneDNN, which reorders the weight into its blocked layout on
every call. Reordered once, the same products (bit for bit) cost less: a decode step's 120
projections of SmolLM2-135M, weights streamed from memory as in a real step, 52 → 31 ms at 16
rows and 34 → 20 ms at one row (one core, avx512_bf16); ~3% at prefill sizes. The LM head too:
SmolLM2's 49,152 x 576 logits matmul at 16 rows 16.6 → 6.9 ms (15.3 → 5.2 at one row) against
the cache-sized vocabulary chunks it ran in before (model.project_logits).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from radixflow.kernels import native, native_layers

# The decoder layers' projections (runtime/model/model.py). The LM head gets a packed copy
# beside its plain weight (`CausalLM.packed_lm_head`): the embedding shares that weight when tied.
PACKED_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj",
                      "q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa")  # the last four: latent attention's
BATCH_HINT = 16  # rows oneDNN picks the layout for; any row count gives the same products


def can_prepack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether projections on `device` in `dtype` take the prepacked path (CPU bf16 with oneDNN)."""
    return (device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """A bias-optional linear whose weight is held in oneDNN's layout; same outputs as the
    nn.Linear it was made from."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """x @ weight.T (+ bias) for weight [out, in]; the plain weight is not kept."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bias = None if bias is None else bias.detach()
        self.bias_f32 = None if bias is None else self.bias.float().contiguous()  # what linear_bf16 adds
        self.lanes: torch.Tensor | None = None  # cpu_linear.c's layout, else oneDNN's in `packed`
        self.packed: torch.Tensor | None = None
        with torch.no_grad():
            if native_layers.linear_supports(weight):
                self.lanes = native_layers.pack_linear_weight(weight)
            else:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), BATCH_HINT)

    @classmethod
    def of(cls, linear: nn.Linear) -> PackedLinear:
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lanes is None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if x.dtype == torch.bfloat16 and native.library() is not None:
            return native_layers.linear_bf16(x, self.lanes, self.bias_f32)
        # not a bf16 model's input, or the native kernels switched off since load: torch's linear
        return F.linear(x, native_layers.unpack_linear_weight(self.lanes).to(x.dtype),
                        None if self.bias is None else self.bias.to(x.dtype))


def prepack_linears(model: nn.Module) -> int:
    """Swap every PACKED_PROJECTIONS nn.Linear of `model` for a PackedLinear, and give a model
    with an LM head (`lm_head_weight()`) its packed copy; returns how many were packed."""
    count = 0
    if hasattr(model, "lm_head_weight"):
        model.packed_lm_head = PackedLinear(model.lm_head_weight())
        count += 1
    for module in list(model.modules()):
        for name in PACKED_PROJECTIONS:
            child = getattr(module, name, None)
            if isinstance(child, nn.Linear):
                setattr(module, name, PackedLinear.of(child))
                count += 1
        if getattr(module, "experts_gate_up", None) is not None and module.packed_experts is None:
            count += _pack_experts(module)  # once: the stacked parameters are emptied
    return count


def _pack_experts(moe: nn.Module) -> int:
    """A mixture of experts' stacked weights as one packed (gate | up, down) pair per expert
    (`SparseMoE.packed_experts`): a layer's experts 2.25-2.47x as fast as on the stacked bf16
    weights at 1-16 decode tokens, 1.31-1.39x at a 256-token chunk (GraniteMoE-3B's and OLMoE's
    shapes, one core: benchmarks/moe_cpu.py).

    NOTE: the stacked parameters are then replaced by zero-stride views of their shape, which
    hold no memory: the packed copies are the only ones (the experts are most of such a model).
    """
    gate_up, down = moe.experts_gate_up, moe.experts_down
    up_bias, down_bias = moe.experts_gate_up_bias, moe.experts_down_bias  # gpt-oss's, else None
    moe.packed_experts = [(PackedLinear(gate_up[e], None if up_bias is None else up_bias[e]),
                           PackedLinear(down[e], None if down_bias is None else down_bias[e]))
                          for e in range(gate_up.shape[0])]
    for name, weight in (("experts_gate_up", gate_up), ("experts_down", down)):
        shape_only = torch.zeros((), dtype=weight.dtype, device=weight.device).expand(weight.shape)
        setattr(moe, name, nn.Parameter(shape_only, requires_grad=False))
    return 2 * gate_up.shape[0]
