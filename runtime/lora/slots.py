"""Device memory for adapters: `max_loras` fixed slots per fused projection, allocated once.

Per fused base projection (qkv, o, gate_up, down) and layer, slot s holds one adapter as

    A[layer, s]: [in, parts * R]           B_j[layer, s]: [R, out_j]  for each part j
                  | part 0 | part 1 | ..|                 (q, k, v of qkv; gate, up of gate_up)

where R = max_lora_rank and parts = 3 for qkv, 2 for gate_up, 1 otherwise. One shrink
`xa = x @ A[s]` serves every part; part j adds `xa[:, j*R:(j+1)*R] @ B_j[s]` to its own output
columns. A rank r < R fills the first r rows / columns of its block and leaves zeros; an
untargeted part stays zero; the adapter's scale is folded into B.
"""
from __future__ import annotations

import torch

from radixflow.runtime.lora.adapter import LoraAdapter, module_dims
from radixflow.runtime.model.model_config import ModelArgs

# fused projection -> its PEFT modules in part order
PROJECTIONS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"), "down": ("down_proj",),
}


def projections_for(targets: frozenset[str]) -> list[str]:
    """The fused projections that get slot buffers for a target-module set."""
    return [p for p, mods in PROJECTIONS.items() if any(m in targets for m in mods)]


class LoraSlots:
    """The slot buffers and which adapter (by namespace) each slot holds. Engine-thread only."""

    def __init__(self, args: ModelArgs, targets: frozenset[str], num_slots: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        if args.mla or args.expert_input_scaled:  # latent attention has no q / k / v projections to adapt; Llama 4's
            raise ValueError(f"LoRA adapters are not supported on {args.architecture}")  # layers are untested with them
        self.args, self.num_slots, self.max_rank = args, num_slots, max_rank
        self.a: dict[str, torch.Tensor] = {}
        self.b: dict[str, list[torch.Tensor]] = {}  # proj -> B_j per part, [L, S, R, out_j] each
        for proj in projections_for(targets):
            mods = PROJECTIONS[proj]
            d_in = module_dims(args, mods[0])[0]
            self.a[proj] = torch.zeros(args.num_layers, num_slots, d_in, len(mods) * max_rank, dtype=dtype,
                                       device=device)
            self.b[proj] = [torch.zeros(args.num_layers, num_slots, max_rank, module_dims(args, m)[1], dtype=dtype,
                                        device=device) for m in mods]
        self.holder: list[str | None] = [None] * num_slots  # namespace of the adapter in each slot

    @property
    def nbytes(self) -> int:
        tensors = [*self.a.values(), *(b for parts in self.b.values() for b in parts)]
        return sum(t.numel() * t.element_size() for t in tensors)

    def bytes_per_slot(self) -> int:
        return self.nbytes // max(self.num_slots, 1)

    def write(self, slot: int, adapter: LoraAdapter) -> None:
        """Copy `adapter` into `slot` (whatever it held before is overwritten)."""
        for proj, mods in PROJECTIONS.items():
            if proj not in self.a:
                continue
            a = torch.zeros_like(self.a[proj][:, slot], dtype=torch.float32, device="cpu")  # [L, in, parts*R]
            for j, mod in enumerate(mods):
                b = torch.zeros_like(self.b[proj][j][:, slot], dtype=torch.float32, device="cpu")  # [L, R, out_j]
                r0, r = j * self.max_rank, adapter.rank
                for layer in range(self.args.num_layers):
                    pair = adapter.weights.get((layer, mod))
                    if pair is not None:
                        la, lb = pair  # [r, in], [out_j, r]
                        a[layer, :, r0:r0 + r] = la.t()
                        b[layer, :r] = lb.t() * adapter.scale
                self.b[proj][j][:, slot].copy_(b)
            self.a[proj][:, slot].copy_(a)
        self.holder[slot] = adapter.namespace

