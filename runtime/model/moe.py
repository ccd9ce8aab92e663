"""Mixture-of-experts MLP arithmetic (Mixtral, Qwen2-MoE, Qwen3-MoE): routing and the experts' pass.

A router scores every expert for each token; the token goes through its top-k experts' MLPs and
their outputs are summed, weighted by the router's softmax probabilities (renormalized over the
k chosen where the family does). The experts run grouped: the step's (token, expert) pairs are
sorted by expert, and each expert that any token chose runs one gate|up and one down matmul over
its tokens, so a step costs one matmul pair per expert in use, not per token.

NOTE: the grouping reads each expert's token count back to the host, which a CUDA graph capture
forbids: a model with experts runs its decode steps eagerly (model_runner.derive_shape).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] → (weights fp32 [T, k], expert ids int64 [T, k]): the softmax over all
    experts, its k largest, renormalized to sum to 1 when `renormalize`."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def run_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w_gate_up: torch.Tensor,
                w_down: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """x [T, H]; weights fp32 / ids [T, k] from `route`; w_gate_up [E, 2I, H] (gate | up rows per
    expert), w_down [E, H, I]; act: [n, 2I] → [n, I] (SiLU-and-mul) → the weighted sum [T, H] in
    x's dtype, summed in fp32 (each expert's part added in expert order)."""
    top_k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # the (token, slot) pairs grouped by expert
    counts = torch.bincount(flat, minlength=w_gate_up.shape[0]).tolist()
    pair_weights = weights.reshape(-1)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    start = 0
    for expert, n in enumerate(counts):
        if n == 0:
            continue
        pairs = order[start:start + n]
        start += n
        tokens = torch.div(pairs, top_k, rounding_mode="floor")
        h = act(F.linear(x.index_select(0, tokens), w_gate_up[expert]))
        y = F.linear(h, w_down[expert]).float().mul_(pair_weights.index_select(0, pairs)[:, None])
        out.index_add_(0, tokens, y)
    return out.to(x.dtype)
