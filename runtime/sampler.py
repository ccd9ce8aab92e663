"""Vectorized sampling over a batch of logit rows: penalties, filters, seeds, logprobs."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from radixflow.kernels.logits_mask import apply_token_bitmask, apply_token_bitmask_ref
from radixflow.runtime.sampling_params import SamplingParams

TopLogprobs = list[tuple[int, float]]


@dataclass
class SampleRow:
    """What the sampler needs of one request: its parameters and token history."""

    sampling: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None
    blocked_ids: list[int]      # tokens forbidden this step (e.g. EOS before min_new_tokens)
    top_logprobs_num: int = 0
    want_logprob: bool = False


@dataclass
class SampleResult:
    tokens: list[int]
    logprobs: list[float] | None          # logprob of each chosen token (raw model distribution)
    top_logprobs: list[TopLogprobs] | None


def logprobs_of(logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax in fp32 of raw logits [rows, vocab]."""
    return torch.log_softmax(logits.float(), dim=-1)


def top_logprobs(logprobs: torch.Tensor, nums: list[int]) -> list[TopLogprobs]:
    """Per row, the `nums[i]` most likely (token, logprob) pairs."""
    k = max(nums, default=0)
    if k == 0:
        return [[] for _ in nums]
    vals, idx = logprobs.topk(k, dim=-1)
    vals, idx = vals.tolist(), idx.tolist()
    return [list(zip(idx[i][:n], vals[i][:n])) for i, n in enumerate(nums)]


def sample(logits: torch.Tensor, rows: list[SampleRow], generator: torch.Generator | None,
           bitmask: tuple[torch.Tensor, torch.Tensor] | None = None) -> SampleResult:
    """Choose one token per row of `logits` [B, vocab] (fp32, modified in place).

    `bitmask`, when given, marks the allowed tokens (grammar), packed: (int32 [R, >= vocab/32]
    bits, int64 [R] logits rows they apply to), see kernels/logits_mask.py. It applies before
    everything else. Logprobs are of the raw
    distribution, before the grammar, penalties and filters.
    """
    want_lp = any(r.want_logprob for r in rows)
    raw_lp = logprobs_of(logits) if want_lp else None
    if bitmask is not None:
        apply = apply_token_bitmask if logits.is_cuda else apply_token_bitmask_ref
        apply(logits, bitmask[0], bitmask[1])
    _apply_penalties(logits, rows)
    allowed = logits.clone() if any(r.blocked_ids for r in rows) else None
    _block(logits, rows)
    if allowed is not None:
        # A row whose only allowed tokens were blocked (e.g. a grammar that can only end while
        # min_new_tokens holds EOS back) keeps what the grammar allows rather than nothing.
        dead = torch.isneginf(logits).all(dim=1)
        if bool(dead.any()):
            logits[dead] = allowed[dead]
    tokens = _choose(logits, rows, generator)
    if raw_lp is None:
        return SampleResult(tokens, None, None)
    chosen = raw_lp.gather(1, torch.tensor(tokens, device=logits.device)[:, None])[:, 0].tolist()
    tops = top_logprobs(raw_lp, [r.top_logprobs_num for r in rows])
    return SampleResult(tokens, chosen, tops)


def _block(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    pairs = [(i, t) for i, r in enumerate(rows) for t in r.blocked_ids if t < logits.shape[1]]
    if pairs:
        idx = torch.tensor(pairs, device=logits.device)
        logits[idx[:, 0], idx[:, 1]] = float("-inf")


def _apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """OpenAI frequency/presence penalties over output tokens; repetition penalty (CTRL style)
    over prompt and output tokens."""
    device, vocab = logits.device, logits.shape[1]
    for i, r in enumerate(rows):
        sp = r.sampling
        if (sp.frequency_penalty or sp.presence_penalty) and r.output_ids:
            counts = torch.bincount(torch.tensor(r.output_ids, device=device), minlength=vocab)[:vocab]
            logits[i] -= sp.frequency_penalty * counts + sp.presence_penalty * (counts > 0)
        if sp.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(r.prompt_ids) | set(r.output_ids)), device=device, dtype=torch.long)
            vals = logits[i, seen]
            logits[i, seen] = torch.where(vals > 0, vals / sp.repetition_penalty, vals * sp.repetition_penalty)


def _choose(logits: torch.Tensor, rows: list[SampleRow], generator: torch.Generator | None) -> list[int]:
    greedy = [i for i, r in enumerate(rows) if r.sampling.is_greedy]
    out = [0] * len(rows)
    if greedy:
        idx = torch.tensor(greedy, device=logits.device)
        for i, t in zip(greedy, logits[idx].argmax(dim=-1).tolist()):
            out[i] = t
    sampled = [i for i in range(len(rows)) if not rows[i].sampling.is_greedy]
    if sampled:
        probs_sorted, order = _filtered_sorted_probs(logits, [rows[i].sampling for i in sampled], sampled)
        picks = _multinomial(probs_sorted, [rows[i].generator for i in sampled], generator)
        for i, t in zip(sampled, order.gather(1, picks[:, None])[:, 0].tolist()):
            out[i] = t
    return out


def _filtered_sorted_probs(logits: torch.Tensor, params: list[SamplingParams],
                           row_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities sorted descending with top-k, top-p and min-p applied (zeroed, not
    renormalized: multinomial normalizes), and the sort order to map back to token ids."""
    device, vocab = logits.device, logits.shape[1]
    temps = torch.tensor([p.temperature for p in params], device=device)[:, None]
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)[:, None]
    top_p = torch.tensor([p.top_p for p in params], device=device)[:, None]
    min_p = torch.tensor([p.min_p for p in params], device=device)[:, None]
    scaled = logits[torch.tensor(row_ids, device=device)] / temps
    probs_sorted, order = torch.softmax(scaled, dim=-1).sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device)[None, :]
    cum_before = probs_sorted.cumsum(dim=-1) - probs_sorted
    drop = (ranks >= top_k) | (cum_before > top_p) | (probs_sorted < min_p * probs_sorted[:, :1])
    drop[:, 0] = False  # the most likely token always survives
    return probs_sorted.masked_fill(drop, 0.0), order


def _multinomial(probs: torch.Tensor, generators: list[torch.Generator | None],
                 default: torch.Generator | None) -> torch.Tensor:
    """One draw per row; a row with its own generator (a seeded request) uses it alone, so its
    draws do not depend on what else is in the batch."""
    picks = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        idx = torch.tensor(shared, device=probs.device)
        picks[idx] = torch.multinomial(probs[idx], 1, generator=default)[:, 0]
    for i, g in enumerate(generators):
        if g is not None:
            picks[i] = torch.multinomial(probs[i], 1, generator=g)[0]
    return picks
