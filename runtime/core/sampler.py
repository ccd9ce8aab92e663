"""Vectorized sampling over a batch of logit rows: logit bias, penalties, filters, seeds, logprobs.

Per step, whatever the batch: a constant number of tensor ops (no per-row tensor work), one
top-k over the candidates instead of a full-vocabulary sort where top_k / top_p allow, one
uniform per sampled row (inverse-CDF sampling), and one host sync (all results in one copy).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixflow.kernels.logits_mask import apply_token_bitmask, apply_token_bitmask_ref
from radixflow.runtime.core.logit_bias import apply_logit_bias
from radixflow.runtime.core.penalties import RowState, apply_penalties
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.core.seeded import counter_uniforms
from radixflow.runtime.core.upload import to_device, upload

TopLogprobs = list[tuple[int, float]]
# Candidates taken for a top_p row without top_k; a nucleus wider than this (rare: a very flat
# distribution) costs a second sync and a full sort of that row.
TOP_P_CANDIDATES = 1024
# Logit rows scored at once by `score_tokens`: bounds its fp32 temporaries to [chunk, vocab].
LOGPROB_CHUNK_ROWS = 256

__all__ = ["RowState", "SampleResult", "SampleRow", "logprobs_of", "sample", "sample_on_device", "score_tokens",
           "top_logprobs"]


@dataclass
class SampleRow:
    """What the sampler needs of one request: its parameters, token history and persistent state.

    `state` lives as long as the request (step.py keeps it on the Req); a fresh one is correct
    too, only slower (penalty counts are rebuilt, seeded draws restart at the first).
    """

    sampling: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None  # a seeded request's; its initial_seed() seeds the row
    blocked_ids: list[int]      # tokens forbidden this step (e.g. EOS before min_new_tokens)
    top_logprobs_num: int = 0
    want_logprob: bool = False
    state: RowState = field(default_factory=RowState)
    penalized: bool = field(init=False)  # a frequency, presence or repetition penalty
    biased: bool = field(init=False)     # a logit_bias
    plain: bool = field(init=False)      # greedy, nothing blocked, penalized or biased, no logprob: an argmax

    def __post_init__(self) -> None:
        sp = self.sampling
        self.penalized = sp.is_penalized
        self.biased = bool(sp.logit_bias)
        self.plain = sp.is_greedy and not (self.penalized or self.biased or self.blocked_ids or self.want_logprob)


@dataclass
class SampleResult:
    tokens: list[int]
    logprobs: list[float] | None          # per row: logprob of its token (raw model distribution), 0.0 if unasked
    top_logprobs: list[TopLogprobs] | None  # per row: its top_logprobs_num best, [] if unasked


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


def score_tokens(logits: torch.Tensor, token_ids: torch.Tensor, top_n: int) -> tuple[list[float], list[TopLogprobs]]:
    """Logprob of token_ids[i] under logits[i] [rows, vocab], and the top_n best per row.

    In chunks of LOGPROB_CHUNK_ROWS rows, without a log-softmax copy (logit - logsumexp on the
    few entries read); one host copy at the end.
    """
    chosen, top_v, top_i = [], [], []
    for a in range(0, logits.shape[0], LOGPROB_CHUNK_ROWS):
        part = logits[a:a + LOGPROB_CHUNK_ROWS].float()  # [chunk, vocab]
        lse = torch.logsumexp(part, dim=-1, keepdim=True)
        chosen.append(part.gather(1, token_ids[a:a + LOGPROB_CHUNK_ROWS, None].long()) - lse)
        if top_n:
            v, i = part.topk(top_n, dim=-1)
            top_v.append(v - lse)
            top_i.append(i)
    rows = logits.shape[0]
    if rows == 0:
        return [], []
    packed = _pack([torch.cat(chosen)[:, 0]] + ([torch.cat(top_v), torch.cat(top_i)] if top_n else [])).tolist()
    tops = [[] for _ in range(rows)]
    if top_n:
        v, i = packed[rows: rows + rows * top_n], packed[rows + rows * top_n:]
        tops = [[(int(i[r * top_n + j]), v[r * top_n + j]) for j in range(top_n)] for r in range(rows)]
    return packed[:rows], tops


BROKEN_ROW = ("this request's logits were not finite (NaN or inf): from the model, or from a sampling "
              "option such as a tiny repetition_penalty")


def sample(logits: torch.Tensor, rows: list[SampleRow], generator: torch.Generator | None,
           bitmask: tuple[torch.Tensor, torch.Tensor] | None = None, plain: bool | None = None) -> SampleResult:
    """Choose one token per row of `logits` [B, vocab] (fp32, modified in place).

    Order: each row's logit_bias, then `bitmask`, when given, which marks the allowed tokens
    (grammar), packed: (int32 [R, >= vocab/32] bits, int64 [R] logits rows they apply to), see
    kernels/logits_mask.py (after the bias, so no bias unmasks a token), then penalties, blocked
    ids, temperature and filters. Logprobs are of the raw distribution, before all of these
    (the logit bias too), computed only for rows with `want_logprob`. Mutates each row's `state`. A row whose
    logits hold a NaN (the model broke for that request), or are not finite after its penalties
    and temperature, gets token -1 (BROKEN_ROW). `plain`: whether every
    row is `plain`, when the caller knows (else it is found here).
    """
    device = logits.device
    if plain is None:
        plain = all(r.plain for r in rows)
    if plain:  # an argmax each (after a grammar's mask, if any)
        broken = torch.isnan(logits.amax(dim=-1))  # [B]; amax propagates NaN (one vectorized pass)
        _mask(logits, bitmask)
        return SampleResult(argmax_rows(logits).masked_fill(broken, -1).tolist(), None, None)
    want = [i for i, r in enumerate(rows) if r.want_logprob]
    raw = logits.index_select(0, torch.tensor(want, device=device)) if want else None  # [len(want), vocab], a copy
    apply_logit_bias(logits, rows)
    _mask(logits, bitmask)
    apply_penalties(logits, rows)
    _block(logits, rows)
    peak = logits.amax(dim=-1)  # [B]: NaN from the model, or inf from a tiny repetition_penalty
    broken = ~torch.isfinite(peak)
    tokens = choose(logits, rows, generator, peak).masked_fill(broken, -1)  # [B] int64, on device
    if raw is None:
        return SampleResult(tokens.tolist(), None, None)
    return _with_logprobs(raw, tokens, want, rows)


def sample_on_device(logits: torch.Tensor, rows: list[SampleRow], generator: torch.Generator | None) -> torch.Tensor:
    """Token ids [B] int64 on the logits' device, -1 where a row's logits hold a NaN, with no
    host sync, except where a row has top_p without top_k (checking whether its nucleus is wider
    than TOP_P_CANDIDATES reads one flag back). Only for rows without
    grammar, penalties, logit bias, blocked ids, logprobs or seed: the overlapped decode steps' rows
    (runtime/core/overlap.py), whose tokens the host reads a step later. For such rows it
    picks what `sample` picks."""
    peak = logits.amax(dim=-1)  # [B]
    return choose(logits, rows, generator, peak).masked_fill(torch.isnan(peak), -1)


def _with_logprobs(raw: torch.Tensor, tokens: torch.Tensor, want: list[int], rows: list[SampleRow]) -> SampleResult:
    """Tokens plus the asked-for logprobs, brought to the host in one copy."""
    top_n = max(rows[i].top_logprobs_num for i in want)
    want_idx = torch.tensor(want, device=raw.device, dtype=torch.long)
    lse = torch.logsumexp(raw, dim=-1, keepdim=True)  # [W, 1]
    parts = [tokens, (raw.gather(1, tokens.index_select(0, want_idx)[:, None]) - lse)[:, 0]]
    if top_n:
        v, i = raw.topk(top_n, dim=-1)
        parts += [v - lse, i]
    packed = _pack(parts).tolist()
    n, w = len(rows), len(want)
    logprobs, tops = [0.0] * n, [[] for _ in range(n)]
    for j, i in enumerate(want):
        logprobs[i] = packed[n + j]
        k = rows[i].top_logprobs_num
        base_v, base_i = n + w + j * top_n, n + w + w * top_n + j * top_n
        tops[i] = [(int(packed[base_i + x]), packed[base_v + x]) for x in range(k)]
    return SampleResult([int(t) for t in packed[:n]], logprobs, tops)


def _pack(parts: list[torch.Tensor]) -> torch.Tensor:
    """One float64 vector of everything the host needs (token ids < 2^53 stay exact)."""
    return torch.cat([p.reshape(-1).to(torch.float64) for p in parts])


def _block(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """-inf on each row's blocked ids; a row left with nothing (e.g. a grammar that can only end
    while min_new_tokens holds EOS back) keeps what it had rather than nothing."""
    pairs = [(i, t) for i, r in enumerate(rows) for t in r.blocked_ids if t < logits.shape[1]]
    if not pairs:
        return
    idx = torch.tensor(pairs, device=logits.device)
    before = logits[idx[:, 0], idx[:, 1]]
    logits[idx[:, 0], idx[:, 1]] = float("-inf")
    dead = torch.isneginf(logits).all(dim=1)  # [B]
    logits[idx[:, 0], idx[:, 1]] = torch.where(dead[idx[:, 0]], before, float("-inf"))


ARGMAX_BLOCK = 64


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """`logits.argmax(dim=-1)` [B] int64, same result (first maximal index; a NaN counts as the
    maximum). On CPU torch's argmax is not vectorized (~15 ms for 256 x 49,152 fp32 on one
    thread): there, the maximum of each block of 64 (a vectorized amax), the first block holding
    the row's maximum, and the argmax within it, ~6x faster. Earlier blocks hold only smaller
    values, so the first maximal index lies in that block."""
    rows, vocab = logits.shape
    blocks = vocab // ARGMAX_BLOCK
    if logits.is_cuda or blocks < 2:
        return logits.argmax(dim=-1)
    head = logits[:, : blocks * ARGMAX_BLOCK].view(rows, blocks, ARGMAX_BLOCK)
    block = head.amax(dim=-1).argmax(dim=-1)  # [B]
    picked = block * ARGMAX_BLOCK + head[torch.arange(rows, device=logits.device), block].argmax(dim=-1)
    if blocks * ARGMAX_BLOCK == vocab:
        return picked
    tail_value, tail_index = logits[:, blocks * ARGMAX_BLOCK:].max(dim=-1)
    head_value = logits.gather(1, picked[:, None])[:, 0]
    later = (tail_value > head_value) | (torch.isnan(tail_value) & ~torch.isnan(head_value))
    return torch.where(later, blocks * ARGMAX_BLOCK + tail_index, picked)


def _mask(logits: torch.Tensor, bitmask: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    if bitmask is not None:
        apply = apply_token_bitmask if logits.is_cuda else apply_token_bitmask_ref
        apply(logits, bitmask[0], bitmask[1])


def choose(logits: torch.Tensor, rows: list[SampleRow], generator: torch.Generator | None,
           peak: torch.Tensor) -> torch.Tensor:
    """Token ids [B] int64 (device): argmax for greedy rows, a filtered draw for the others;
    -1 for a sampled row whose largest logit `peak` [B] over its temperature leaves fp32's range."""
    tokens = argmax_rows(logits)
    sampled = [i for i, r in enumerate(rows) if not r.sampling.is_greedy]
    if not sampled:
        return tokens
    device, vocab = logits.device, logits.shape[1]
    params = [rows[i].sampling for i in sampled]
    top_ks = [p.top_k if p.top_k > 0 else 0 for p in params]
    table = to_device(torch.tensor([[p.temperature, k, p.top_p, p.min_p] for p, k in zip(params, top_ks)],
                                   dtype=torch.float32), device)  # [S, 4]
    u = _uniforms([rows[i] for i in sampled], generator, device)  # [S]
    plain = [j for j, p in enumerate(params) if top_ks[j] == 0 and p.top_p >= 1.0]
    ranked = [j for j, p in enumerate(params) if top_ks[j] > 0 or p.top_p < 1.0]
    sampled_t, plain_t, ranked_t = upload([sampled, plain, ranked], device)  # one asynchronous copy
    scaled = logits.index_select(0, sampled_t) / table[:, :1]  # [S, vocab]
    picks = torch.empty(len(sampled), dtype=torch.long, device=device)
    overflow = ~torch.isfinite(peak.index_select(0, sampled_t) / table[:, 0])  # [S]
    if plain:
        j = plain_t
        picks[j] = _draw_unsorted(scaled[j], table[j, 3], u[j], any(params[x].min_p > 0 for x in plain))
    if ranked:
        j = ranked_t
        width = min(vocab, max(top_ks[x] or TOP_P_CANDIDATES for x in ranked))
        picked, uncovered = _draw_ranked(scaled[j], table[j], u[j], width)
        if width < vocab and any(top_ks[x] == 0 for x in ranked) and bool(uncovered.any()):
            wide = j[uncovered]  # nucleus wider than the candidates: sort those rows in full
            picked[uncovered] = _draw_ranked(scaled[wide], table[wide], u[wide], vocab)[0]
        picks[j] = picked
    tokens[sampled_t] = picks.masked_fill_(overflow, -1)
    return tokens


def _uniforms(rows: list[SampleRow], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """One uniform in [0, 1) per row [S]: from `generator` for unseeded rows; for seeded rows a
    counter-based hash of (seed, draws so far), so a seeded request's draws depend on nothing else."""
    u = torch.rand(len(rows), generator=generator, device=device)
    seeded = [j for j, r in enumerate(rows) if r.generator is not None]
    if seeded:
        seeds = [rows[j].generator.initial_seed() for j in seeded]  # type: ignore[union-attr]
        counters = [rows[j].state.num_draws for j in seeded]
        u[torch.tensor(seeded, device=device)] = counter_uniforms(seeds, counters, device)
        for j in seeded:
            rows[j].state.num_draws += 1
    return u


def _invert(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index [R] drawn from unnormalized weights [R, K] (>= 0) by inverse CDF with uniforms u [R].
    A zero-weight entry is never returned: the first cdf entry above u * total has weight > 0."""
    cdf = weights.cumsum(dim=-1)
    target = (u * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=weights.shape[1] - 1)


def _draw_unsorted(scaled: torch.Tensor, min_p: torch.Tensor, u: torch.Tensor, use_min_p: bool) -> torch.Tensor:
    """Rows with neither top_k nor top_p: the whole vocabulary in token order, no sort."""
    probs = torch.softmax(scaled, dim=-1)  # [R, vocab]
    if use_min_p:
        probs = probs.masked_fill(probs < min_p[:, None] * probs.max(dim=-1, keepdim=True).values, 0.0)
    return _invert(probs, u)


def _draw_ranked(scaled: torch.Tensor, table: torch.Tensor, u: torch.Tensor,
                 width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows with top_k and/or top_p, over their `width` best tokens (sorted, from one topk).
    Returns the picks and `uncovered` (`_ranked_probs`)."""
    probs, ids, uncovered = _ranked_probs(scaled, table, width)
    pick = _invert(probs, u)
    return ids.gather(1, pick[:, None])[:, 0], uncovered


def _ranked_probs(scaled: torch.Tensor, table: torch.Tensor,
                  width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The filtered probabilities [R, width] (unnormalized, 0 where dropped) of each row's
    `width` best tokens, their ids [R, width], and `uncovered` [R].

    top_k renormalizes over the k best (as SGLang and vLLM do), then top_p and min_p filter.
    A row without top_k keeps its full-vocabulary probabilities; `uncovered` marks such rows
    whose top_p nucleus reaches past `width` (to be redone wider).
    """
    top_k, top_p, min_p = table[:, 1], table[:, 2], table[:, 3]
    vals, ids = scaled.topk(width, dim=-1)  # [R, width], descending
    has_k = top_k > 0
    in_k = torch.arange(width, device=scaled.device)[None, :] < torch.where(has_k, top_k, width)[:, None]
    lse = torch.logsumexp(vals.masked_fill(~in_k, float("-inf")), dim=-1)
    if width < scaled.shape[1]:
        lse = torch.where(has_k, lse, torch.logsumexp(scaled, dim=-1))
    probs = torch.exp(vals - lse[:, None]).masked_fill_(~in_k, 0.0)
    cum = probs.cumsum(dim=-1)
    drop = ((cum - probs) > top_p[:, None]) | (probs < min_p[:, None] * probs[:, :1])
    drop[:, 0] = False  # the most likely token always survives
    uncovered = ~has_k & (cum[:, -1] < top_p)
    return probs.masked_fill_(drop, 0.0), ids, uncovered


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """[R, vocab]: for each row of `logits` (a sampled row's: temperature > 0) the distribution
    `choose` draws its token from, unnormalized (0 on what top_k, top_p and min_p drop); a row
    whose largest logit over its temperature leaves fp32's range holds NaN or inf."""
    device, vocab = logits.device, logits.shape[1]
    top_ks = [p.top_k if p.top_k > 0 else 0 for p in params]
    table = to_device(torch.tensor([[p.temperature, k, p.top_p, p.min_p] for p, k in zip(params, top_ks)],
                                   dtype=torch.float32), device)  # [R, 4]
    scaled = logits / table[:, :1]
    out = torch.zeros_like(scaled)
    plain = [j for j, p in enumerate(params) if top_ks[j] == 0 and p.top_p >= 1.0]
    ranked = [j for j, p in enumerate(params) if top_ks[j] > 0 or p.top_p < 1.0]
    if plain:
        j = torch.tensor(plain, device=device)
        probs = torch.softmax(scaled[j], dim=-1)
        out[j] = probs.masked_fill(probs < table[j, 3:4] * probs.max(dim=-1, keepdim=True).values, 0.0)
    if ranked:
        j = torch.tensor(ranked, device=device)
        width = min(vocab, max(top_ks[x] or TOP_P_CANDIDATES for x in ranked))
        probs, ids, uncovered = _ranked_probs(scaled[j], table[j], width)
        rows = torch.zeros(len(ranked), vocab, dtype=out.dtype, device=device).scatter_(1, ids, probs)
        if width < vocab and bool(uncovered.any()):
            wide = uncovered.nonzero().flatten()
            probs, ids, _ = _ranked_probs(scaled[j[wide]], table[j[wide]], vocab)
            rows[wide] = torch.zeros_like(probs).scatter_(1, ids, probs)
        out[j] = rows
    return out
