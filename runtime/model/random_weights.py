"""Random weights for a model described by config.json alone (`load_format="dummy"`): for speed, never quality.

A Llama-3-8B-shaped model is 16 GB in bf16; building it straight on the device from a seeded
generator takes well under a second on a GPU, where writing and reading a checkpoint would
take minutes and as much disk.
"""
from __future__ import annotations

import torch

from radixflow.runtime.model.model import CausalLM
from radixflow.runtime.model.model_config import ModelArgs
from radixflow.runtime.model.weights import skip_weight_init

INIT_STD = 0.02  # the usual transformer init: activations stay finite through many bf16 layers


def random_state(model: CausalLM, dtype: torch.dtype, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    """A state dict for every parameter of `model` (meta or not), created on `device`.

    Matrices and embeddings ~ N(0, INIT_STD), norm weights 1, biases 0; ModelArgs.fp32_parameters
    in fp32 whatever `dtype` is, as a checkpoint load keeps them.
    """
    gen = torch.Generator(device).manual_seed(seed)
    state = {}
    for name, p in model.named_parameters():
        keep = torch.float32 if name.endswith(model.args.fp32_parameters) else dtype
        t = torch.empty(p.shape, dtype=keep, device=device)
        if name.endswith("norm.weight"):
            t.fill_(1.0)
        elif name.endswith(".bias"):
            t.zero_()
        else:
            t.normal_(0.0, INIT_STD, generator=gen)
        state[name] = t
    return state


def build_random_model(args: ModelArgs, dtype: torch.dtype, device: torch.device, max_len: int,
                       seed: int = 0) -> CausalLM:
    """Like `weights.build_model`, with random weights instead of a checkpoint."""
    with torch.device("meta"), skip_weight_init():
        model = CausalLM(args)
    model.load_state_dict(random_state(model, dtype, device, seed), strict=True, assign=True)
    model.init_rope(max_len, device)
    return model.eval()
