"""Mixture-of-experts MLP (Mixtral, Qwen2/3-MoE): routing, and each token's top-k experts' SwiGLU
MLPs weighted and summed.

    moe_route(router_logits [T, E], k, renormalize) → (weights fp32 [T, k], expert ids int64 [T, k])
    fused_moe(x [T, H], weights, ids, w_gate_up [E, 2I, H], w_down [E, H, I]) → [T, H], x's dtype

`fused_moe_ref` groups the step's (token, slot) pairs by expert and runs one gate|up and one down
matmul per expert in use; it reads each expert's pair count back to the host (the CPU path).
`fused_moe` is its Triton twin with no read-back: `align_pairs` sorts the pairs by expert and pads
each expert's run to BLOCK_M rows in torch ops of fixed sizes, then a grouped matmul kernel runs
each block of one expert's pairs against a BLOCK_N slice of that expert's weights: pass 1 gate|up
of every pair's token → [T*k, 2I], SiLU-and-mul (activation.py) → [T*k, I], pass 2 down scaled by
the pair's weight → fp32 [T*k, H], summed over the k slots.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import _triton as tr
from ._attention import dot_precision
from ._checks import FLOAT_DTYPES, INDEX_DTYPES, check, check_same_device, check_tensor
from ._triton import tl, triton
from .activation import silu_and_mul, silu_and_mul_ref

BLOCK_M = 16  # pairs per program: tl.dot needs M >= 16; a decode step sends an expert a few


def moe_route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] → (weights fp32 [T, k], expert ids int64 [T, k]): the softmax over all
    experts, its k largest, renormalized to sum to 1 when `renormalize`."""
    check_tensor("router_logits", router_logits, 2, FLOAT_DTYPES)
    check(1 <= top_k <= router_logits.shape[1], f"top_k must be in [1, {router_logits.shape[1]}], got {top_k}")
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def moe_route_grouped(router_logits: torch.Tensor, top_k: int, renormalize: bool, correction: torch.Tensor | None,
                      n_group: int, topk_group: int, scaling: float, scoring: str = "sigmoid",
                      group_score: str = "top2") -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's and GLM-4.5's routing (MiniMax-M2's with one group; ERNIE 4.5 MoE's with
    softmax `scoring`): router_logits [T, E] → (weights fp32 [T, k], expert ids int64 [T, k]).
    Each expert's score is sigmoid(logit) (or the softmax's); `correction` [E] added to the scores ranks
    the groups (E / n_group experts each, by the sum of each group's top two), the best `topk_group`
    groups hold the candidates, and the k best of them by corrected score are chosen; their plain
    scores are the weights, renormalized to sum to 1 when `renormalize`, then times `scaling`."""
    check_tensor("router_logits", router_logits, 2, FLOAT_DTYPES)
    tokens, experts = router_logits.shape
    check(n_group >= 1 and experts % n_group == 0 and 1 <= topk_group <= n_group,
          f"n_group {n_group} must divide the {experts} experts and topk_group {topk_group} be in [1, n_group]")
    check(1 <= top_k <= topk_group * (experts // n_group),
          f"top_k must be in [1, {topk_group * (experts // n_group)}], got {top_k}")
    check(scoring in ("sigmoid", "softmax"), f"scoring must be sigmoid or softmax, got {scoring!r}")
    check(group_score in ("top2", "max"), f"group_score must be top2 or max, got {group_score!r}")
    logits = router_logits.float()
    scores = torch.sigmoid(logits) if scoring == "sigmoid" else torch.softmax(logits, dim=-1)
    chosen = scores if correction is None else scores + correction.float()
    if n_group > 1:
        grouped = chosen.view(tokens, n_group, -1)
        groups = grouped.amax(dim=-1) if group_score == "max" else grouped.topk(2, dim=-1).values.sum(dim=-1)
        keep = torch.zeros_like(groups).scatter_(1, groups.topk(topk_group, dim=-1).indices, 1.0)
        chosen = chosen.masked_fill(keep.repeat_interleave(experts // n_group, dim=1) == 0, float("-inf"))
    ids = chosen.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling, ids


def _check_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w_gate_up: torch.Tensor,
               w_down: torch.Tensor, b_gate_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None) -> None:
    check_tensor("x", x, 2, FLOAT_DTYPES)
    check_tensor("weights", weights, 2, (torch.float32,))
    check_tensor("ids", ids, 2, INDEX_DTYPES)
    check_tensor("w_gate_up", w_gate_up, 3, (x.dtype,))
    check_tensor("w_down", w_down, 3, (x.dtype,))
    experts, inter2, hidden = w_gate_up.shape
    check(hidden == x.shape[1] and inter2 % 2 == 0,
          f"w_gate_up [E, 2I, H] must have H = x's {x.shape[1]} and an even 2I, got {tuple(w_gate_up.shape)}")
    check(tuple(w_down.shape) == (experts, hidden, inter2 // 2),
          f"w_down must be [{experts}, {hidden}, {inter2 // 2}], got {tuple(w_down.shape)}")
    check(tuple(weights.shape) == tuple(ids.shape) and ids.shape[0] == x.shape[0],
          f"weights {tuple(weights.shape)} and ids {tuple(ids.shape)} must both be [{x.shape[0]}, k]")
    check_same_device(x=x, weights=weights, ids=ids, w_gate_up=w_gate_up, w_down=w_down)
    for name, bias, weight in (("b_gate_up", b_gate_up, w_gate_up), ("b_down", b_down, w_down)):
        if bias is not None:
            check_tensor(name, bias, 2, (x.dtype,))
            check(tuple(bias.shape) == tuple(weight.shape[:2]) and bias.device == x.device,
                  f"{name} must be [{weight.shape[0]}, {weight.shape[1]}] on x's device, got {tuple(bias.shape)}")


def fused_moe_ref(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w_gate_up: torch.Tensor,
                  w_down: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor] = silu_and_mul_ref,
                  b_gate_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None) -> torch.Tensor:
    """The weighted sum over each token's experts [T, H] in x's dtype, summed in fp32 expert by
    expert; `act` [n, 2I] → [n, I] is the activation (SiLU-and-mul; the CPU path passes its native
    one); b_gate_up [E, 2I] and b_down [E, H] the experts' biases (gpt-oss), or None."""
    _check_moe(x, weights, ids, w_gate_up, w_down, b_gate_up, b_down)

    def expert_mlp(e: int, rows: torch.Tensor) -> torch.Tensor:
        gate_up = F.linear(rows, w_gate_up[e], None if b_gate_up is None else b_gate_up[e])
        return F.linear(act(gate_up), w_down[e], None if b_down is None else b_down[e])

    return grouped_experts(x, weights, ids, w_gate_up.shape[0], expert_mlp)


def grouped_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, num_experts: int,
                    expert_mlp: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`fused_moe_ref`'s grouping with each expert's MLP given as `expert_mlp(e, rows [n, H]) → [n, H]`
    (the CPU's packed experts: runtime/model/packed_linear.py). Inputs as fused_moe_ref's, unchecked."""
    top_k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # the (token, slot) pairs grouped by expert
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    pair_weights = weights.reshape(-1)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    start = 0
    for expert, n in enumerate(counts):
        if n == 0:
            continue
        pairs = order[start:start + n]
        start += n
        tokens = torch.div(pairs, top_k, rounding_mode="floor")
        y = expert_mlp(expert, x.index_select(0, tokens)).float().mul_(pair_weights.index_select(0, pairs)[:, None])
        out.index_add_(0, tokens, y)
    return out.to(x.dtype)


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] → (sorted_pairs int32 [blocks * block_m], block_experts int32 [blocks]).

    sorted_pairs lists the pair indices t * k + slot grouped by expert, in pair order within an
    expert, each expert's run padded with T * k (no pair) to a multiple of block_m;
    block_experts[b] is the expert of pairs [b * block_m, (b + 1) * block_m), -1 past the last run.
    Sizes depend on T, k and E only (at most min(E, T*k) runs pad), so nothing is read back.
    """
    pairs = ids.numel()
    flat = ids.reshape(-1).to(torch.int64)
    device = ids.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    run_ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    first = counts.cumsum(0) - counts  # where each expert's pairs start in `order`
    rank = torch.arange(pairs, device=device) - first[expert_of]
    blocks = triton.cdiv(pairs + min(num_experts, pairs) * (block_m - 1), block_m) if pairs else 0
    sorted_pairs = torch.full((blocks * block_m,), pairs, dtype=torch.int32, device=device)
    sorted_pairs[(run_ends - padded)[expert_of] + rank] = order.to(torch.int32)
    block_starts = torch.arange(blocks, device=device) * block_m
    block_experts = torch.searchsorted(run_ends, block_starts, right=True)
    return sorted_pairs, torch.where(block_experts < num_experts, block_experts, -1).to(torch.int32)


@triton.jit
def _grouped_kernel(a, w, c, sorted_pairs, block_experts, scales, bias, num_pairs, N, K, ROW_DIV, stride_a,
                    stride_we, stride_wn, stride_c, stride_be, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # grid: (block of sorted pairs, block of N);
    # c[pair, n-block] = (a[pair // ROW_DIV] @ w[expert]^T + bias[expert]) (* scale)
    expert = tl.load(block_experts + tl.program_id(0)).to(tl.int64)
    if expert < 0:
        return
    pair = tl.load(sorted_pairs + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    m_mask = pair < num_pairs
    rows = pair // ROW_DIV
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k_mask = kk < K
        at = tl.load(a + rows[:, None] * stride_a + kk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        wt = tl.load(w + expert * stride_we + rn[None, :] * stride_wn + kk[:, None],
                     mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc += tl.dot(at, wt, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias + expert * stride_be + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_SCALE:
        acc = acc * tl.load(scales + pair, mask=m_mask, other=0.0)[:, None]
    tl.store(c + pair[:, None] * stride_c + rn[None, :], acc.to(c.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])


def _grouped(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, aligned: tuple[torch.Tensor, torch.Tensor],
             row_div: int, scales: torch.Tensor | None, bias: torch.Tensor | None = None) -> None:
    sorted_pairs, block_experts = aligned
    n, k = w.shape[1], w.shape[2]
    if block_experts.shape[0] == 0 or n == 0:
        return
    block_n = max(16, min(64, triton.next_power_of_2(n)))
    block_k = max(16, min(64, triton.next_power_of_2(k)))
    grid = (block_experts.shape[0], triton.cdiv(n, block_n))
    _grouped_kernel[grid](a, w, out, sorted_pairs, block_experts, out if scales is None else scales,
                          out if bias is None else bias, out.shape[0], n, k, row_div, a.stride(0), w.stride(0),
                          w.stride(1), out.stride(0), 0 if bias is None else bias.stride(0),
                          HAS_SCALE=scales is not None, HAS_BIAS=bias is not None,
                          DOT_PRECISION=dot_precision(a.dtype), BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k,
                          num_warps=4)


def fused_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w_gate_up: torch.Tensor,
              w_down: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor] | None = None,
              b_gate_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None) -> torch.Tensor:
    """Triton twin of `fused_moe_ref` (same contract; `act` None: the SiLU-and-mul kernel; the
    biases added in the grouped matmuls; the k slots' parts summed in slot order, not expert order)."""
    _check_moe(x, weights, ids, w_gate_up, w_down, b_gate_up, b_down)
    tr.require_triton("fused_moe")
    check(w_gate_up.is_contiguous() and w_down.is_contiguous(), "w_gate_up and w_down must be contiguous")
    tokens, top_k = ids.shape
    pairs = tokens * top_k
    aligned = align_pairs(ids, w_gate_up.shape[0])
    gate_up = torch.empty((pairs, w_gate_up.shape[1]), dtype=x.dtype, device=x.device)
    _grouped(x, w_gate_up, gate_up, aligned, top_k, None, b_gate_up)
    hidden = silu_and_mul(gate_up) if act is None else act(gate_up)
    down = torch.empty((pairs, w_down.shape[1]), dtype=torch.float32, device=x.device)
    _grouped(hidden, w_down, down, aligned, 1, weights.reshape(-1).contiguous(), b_down)
    return down.view(tokens, top_k, w_down.shape[1]).sum(dim=1).to(x.dtype)
