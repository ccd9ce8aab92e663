"""Speculative decoding by n-gram lookup: drafts from a request's own tokens, verified in one step.

A running request whose last few tokens occurred before, in its prompt or its output, gets
the tokens that followed that earlier occurrence as drafts (prompt lookup). The scheduler
gives it 1 + k new slots and the step computes its pending token and its k drafts together,
with logits at every position, as k + 1 decode rows (model_runner._decode_rows_batch: the
arithmetic of plain decoding, so bf16 near-ties fall the same way). A greedy row keeps its
drafts while each equals the argmax before it and appends the argmax after the last kept one,
exactly the tokens one-token steps would append; a sampled row keeps each draft with the
probability its position's distribution gives it and draws the token after them from the rest
(`accept_sampled`), so its tokens are distributed as plain sampling's. A step appends 1 to
k + 1 tokens per drafted row, and the KV of rejected drafts is freed before the radix tree
takes the request's KV.

Drafted rows: no grammar, penalty, logit bias, blocked id or logprob, and no seed (a seeded
request's draws stay those of plain decoding); the others decode as usual in the same step.
Drafts are proposed only while at most `max_batch` requests run (a drafted row costs k + 1
rows of compute: a win where a step is bound by reading the weights, a loss where it is bound
by arithmetic), and only into free or evictable KV slots (speculation never retracts anyone).
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Protocol

import torch

from radixflow.runtime.config import EngineConfig
from radixflow.runtime.core.request import Req
from radixflow.runtime.core.sampler import BROKEN_ROW, filtered_probs, sample
from radixflow.runtime.core.scheduled_batch import ScheduledBatch

# Positions of a request's context the n-gram index reaches back over: the last this many.
NGRAM_WINDOW = 8192
# Positions indexed per lookup at most (newest first), so a long context is indexed over several
# steps instead of stalling one: indexing costs ~1.5 µs a position on this project's CPU (8,192
# at once took ~12 ms, a whole SmolLM2 decode step); a step's own new tokens cost ~3 µs.
INDEX_BUDGET = 512
MAX_BACKOFF = 32  # the longest pause in drafting after rejections, in tokens


def drafter(config: EngineConfig, max_context_len: int) -> Drafter | None:
    """The drafter `config` asks for, or None."""
    if config.speculative_algorithm == "none":
        return None
    return NgramDrafter(config.speculative_num_draft_tokens, config.speculative_ngram_min,
                        config.speculative_ngram_max, config.speculative_max_batch, max_context_len)


class Drafter(Protocol):
    def propose(self, reqs: list[Req], room: int) -> list[list[int]] | None:
        """Drafts for each of `reqs` (empty: none), at most `room` in all; None: none at all."""


def can_speculate(req: Req) -> bool:
    """Whether a verify step can check req's next tokens: it has no grammar, and its sampler row
    (set once nothing blocks, after its first token) is an argmax, or an unseeded draw with no
    penalty, logit bias or logprob (a seeded request's draws stay those of plain decoding), and
    it does not ask for hidden states (a rejected draft's would have to be taken back)."""
    row = req.sample_row
    if row is None or req.grammar is not None or req.options.return_hidden_states:
        return False
    return row.plain or (row.generator is None and not (row.penalized or row.biased or row.want_logprob))


def max_drafts(req: Req, k: int, max_context_len: int) -> int:
    """At most k, and no more than its output limit and the context length leave room for: the
    pending token and k drafts sit at positions seq_len - 1 .. seq_len - 1 + k, and a step may
    append k + 1 tokens."""
    left = req.output_limit - len(req.output_ids) - 1 if req.finish_ids is not None else k
    return max(0, min(k, left, max_context_len - req.seq_len))


class NgramIndex:
    """Where each n-gram (n in [min_n, max_n]) of one request's tokens last ended.

    `ends[tuple]` is the largest end e (exclusive) with `tokens[e - n: e] == tuple`, over the ends
    indexed: those in [lo, next_end). A lookup indexes the ends below the current length first,
    never the current suffix's own end, so what it finds is an earlier occurrence. An index that
    misses occurrences costs drafts, never correctness: every draft is verified."""

    __slots__ = ("ends", "lo", "next_end", "resume_at", "backoff")

    def __init__(self) -> None:
        self.ends: dict[tuple[int, ...], int] = {}
        self.lo = self.next_end = 0
        self.resume_at = 0  # no drafts while the request is shorter than this (after rejections)
        self.backoff = 0    # tokens drafting pauses for after the next fully rejected verify


def record_verify(req: Req, drafted: int, accepted: int) -> None:
    """Back off after a verify step that accepted none of req's drafts: no drafts for the next
    1, 2, 4, ... 32 tokens (each rejection in a row doubles the pause; an acceptance ends it),
    so text the lookup does not predict costs few wasted verify rows."""
    index = req.ngram
    if index is None or not drafted:
        return
    if accepted:
        index.backoff = 0
        return
    index.backoff = min(MAX_BACKOFF, max(1, 2 * index.backoff))
    index.resume_at = req.seq_len + index.backoff


class NgramDrafter:
    """Prompt-lookup drafts: the k tokens after the latest earlier occurrence of the request's
    last n tokens, the longest n in [min_n, max_n] that occurred (cost per step: a few dict
    operations per request, and at most INDEX_BUDGET positions indexed while a long context is
    being indexed)."""

    def __init__(self, num_tokens: int, min_n: int, max_n: int, max_batch: int, max_context_len: int,
                 window: int = NGRAM_WINDOW) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {min_n}, {max_n}")
        self.k, self.min_n, self.max_n = num_tokens, min_n, max_n
        self.max_batch, self.max_context_len, self.window = max_batch, max_context_len, window

    def propose(self, reqs: list[Req], room: int) -> list[list[int]] | None:
        if len(reqs) > self.max_batch or room <= 0:
            return None
        out = []
        for req in reqs:
            drafts = self.draft(req, min(room, max_drafts(req, self.k, self.max_context_len))) \
                if can_speculate(req) else []
            room -= len(drafts)
            out.append(drafts)
        return out

    def draft(self, req: Req, k: int) -> list[int]:
        """Up to k drafts for req (empty when its suffix never occurred before), its index
        brought up to its current length."""
        index = req.ngram
        if index is None:
            index = req.ngram = NgramIndex()
        length = req.seq_len
        if length < index.resume_at:
            return []  # backing off (indexed at its next lookup)
        self._index(req, index, length)
        found = None
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            found = index.ends.get(tuple(req.ids_range(length - n, length)))
            if found is not None:
                break
        if found is None or k <= 0:
            return []
        # The continuation of the earlier occurrence; where it runs into the current suffix the
        # tokens repeat with period length - found (a loop goes on looping).
        seg = req.ids_range(found, min(found + k, length))
        return (seg * -(-k // len(seg)))[:k]

    def _index(self, req: Req, index: NgramIndex, length: int) -> None:
        """Bring the index up to `length`, INDEX_BUDGET ends at most for each of its two parts:
        the new ends (the newest of them, when more came since the last lookup), then older
        ends of the window, newest first, from where the index reaches down."""
        if index.next_end < length:
            start = max(index.next_end, length - INDEX_BUDGET, length - self.window)
            if start > index.next_end:  # the new ends older than `start`: left to the backfill
                index.lo = start
            self._add(req, index, start, length, newest_wins=True)
            index.next_end = length
        floor = max(self.min_n, length - self.window)
        if index.lo > floor:
            lo = max(floor, index.lo - INDEX_BUDGET)
            self._add(req, index, lo, index.lo, newest_wins=False)
            index.lo = lo

    def _add(self, req: Req, index: NgramIndex, start: int, end: int, newest_wins: bool) -> None:
        """Index the n-grams ending at start .. end - 1: over what is there (they are newer), or
        under it (older: an end already indexed keeps its later occurrence)."""
        off = max(0, start - self.max_n)
        ids = req.ids_range(off, end)
        ends = index.ends
        for e in (range(start, end) if newest_wins else range(end - 1, start - 1, -1)):
            for n in range(self.min_n, min(self.max_n, e) + 1):
                key = tuple(ids[e - n - off: e - off])
                if newest_wins:
                    ends[key] = e
                else:
                    ends.setdefault(key, e)


def take_drafts(reqs: list[Req]) -> dict[int, list[int]]:
    """After a step's forward: take each drafted request's drafts off the end of its output ids
    (the verify step appends those it accepts); returns {row in reqs: its drafts}."""
    out = {}
    for i, req in enumerate(reqs):
        drafts = req.drafts
        if drafts:
            del req.output_ids[len(req.output_ids) - len(drafts):]
            req.drafts = None
            out[i] = drafts
    return out


def verify_rows(reqs: list[Req], counts: list[int], logits: torch.Tensor, drafted: dict[int, list[int]],
                generator: torch.Generator | None) -> Iterator[tuple[int, list[int]]]:
    """For each drafted row i (its `counts[i]` logit rows: its pending token's and each draft's),
    the tokens to append, in row order: its accepted drafts, then the token after them (-1 where
    a position's logits are not finite). A greedy row keeps a draft that is the argmax before it
    (as the sampler picks a plain row's token) and appends the argmax after the last kept one;
    a sampled row, see `accept_sampled`."""
    starts = list(itertools.accumulate(counts, initial=0))
    out: dict[int, list[int]] = {}
    for greedy in (True, False):
        mine = [i for i in drafted if reqs[i].sample_row.plain == greedy]
        if not mine:
            continue
        rows = torch.tensor([r for i in mine for r in range(starts[i], starts[i] + counts[i])], device=logits.device)
        if greedy:
            sample_rows = [reqs[i].sample_row for i in mine for _ in range(counts[i])]
            tokens = sample(logits[rows], sample_rows, generator, plain=True).tokens
        else:
            probs = filtered_probs(logits[rows], [reqs[i].sampling for i in mine for _ in range(counts[i])])
        pos = 0
        for i in mine:
            n = counts[i]
            out[i] = (accept_greedy(tokens[pos: pos + n], drafted[i]) if greedy
                      else accept_sampled(probs[pos: pos + n], drafted[i], generator))
            pos += n
    for i in drafted:
        yield i, out[i]


def accept_greedy(argmaxes: list[int], drafts: list[int]) -> list[int]:
    """The drafts while each equals the argmax before it, then the argmax after the last."""
    out = []
    for pos, token in enumerate(argmaxes):
        out.append(token)
        if token < 0 or pos == len(drafts) or token != drafts[pos]:
            break
    return out


def accept_sampled(probs: torch.Tensor, drafts: list[int], generator: torch.Generator | None) -> list[int]:
    """Rejection sampling with drafts that are certain (a lookup, not a draft model's draw):
    draft j is kept with probability p_j(draft) under its position's filtered distribution p_j
    (`filtered_probs`, rows [k + 1, vocab]); at the first draft not kept the token is drawn from
    p_j without it, renormalized; with all kept, from the last position's. Each appended token
    is then distributed as plain sampling's: p(d) [kept] + (1 - p(d)) p(x) / (1 - p(d)) [x != d]."""
    k = len(drafts)
    total = probs.sum(dim=-1)  # [k + 1]
    draws = torch.rand(2, k + 1, generator=generator, device=probs.device)
    keep = probs[torch.arange(k, device=probs.device), torch.tensor(drafts, device=probs.device)] / total[:k]
    kept = (draws[0, :k] < keep).tolist()
    finite = (torch.isfinite(total) & (total > 0)).tolist()
    out = []
    for j in range(k + 1):
        if not finite[j]:
            return out + [-1]
        if j == k or not kept[j]:
            weights = probs[j].clone()
            if j < k:
                weights[drafts[j]] = 0.0
                if not bool(weights.sum() > 0):  # p(d) rounded below 1 where nothing else has mass
                    return out + [drafts[j]]
            cdf = weights.cumsum(dim=0)
            token = int(torch.searchsorted(cdf, draws[1, j] * cdf[-1], right=True).clamp_(max=cdf.shape[0] - 1))
            return out + [token]
        out.append(drafts[j])
    return out


class VerifySteps:
    """StepRunner's part that verifies drafts (a mixin: it uses the runner's scheduler,
    generator, fault injector, counters and `_append` / `_fail`)."""

    def _verify_drafts(self, batch: ScheduledBatch, counts: list[int], logits: torch.Tensor,
                       drafted: dict[int, list[int]]) -> list[int]:
        """Append each drafted row's accepted drafts and the token after them and free the KV
        of the rejected ones; returns the rows done (their plans sample nothing more). `counts`:
        each row's logit rows. All rows are verified at once; if that raises, one by one, so an
        error fails only its own request. Each row done leaves `drafted`: what is left after a
        raise was not verified."""
        step = self.num_steps - 1
        try:
            self.faults.check("sampler", [batch.reqs[i] for i in drafted], step)
            outcomes: dict[int, list[int] | Exception] = dict(
                verify_rows(batch.reqs, counts, logits, drafted, self.generator))
        except Exception as exc:
            outcomes = {i: exc for i in drafted} if len(drafted) == 1 else {}
            for i in drafted if len(drafted) > 1 else ():
                try:
                    self.faults.check("sampler", (batch.reqs[i],), step)
                    outcomes.update(verify_rows(batch.reqs, counts, logits, {i: drafted[i]}, self.generator))
                except Exception as own:  # this row's own error
                    outcomes[i] = own
        now = time.monotonic()
        for i, outcome in outcomes.items():
            req, drafts = batch.reqs[i], drafted.pop(i)
            appended = self._append_verified(req, outcome, now)
            req.num_verify_steps += 1
            self.num_draft_tokens += len(drafts)
            self.num_accepted_drafts += max(appended - 1, 0)
            record_verify(req, len(drafts), max(appended - 1, 0))
            self.scheduler.free_from(req, batch.prefix_lens[i] + appended)
        return list(outcomes)

    def _append_verified(self, req: Req, outcome: list[int] | Exception, now: float) -> int:
        """Append a verified row's tokens until req finishes; an error (its verification's, its
        logits', its detokenizer's) fails it. Returns how many were appended."""
        appended = 0
        try:
            if isinstance(outcome, Exception):
                raise outcome
            for token in outcome:
                if req.finish_reason is not None:
                    break
                if token < 0:
                    raise ValueError(BROKEN_ROW)
                self._append(req, token, None, None, now)
                appended += 1
        except Exception as exc:
            self._fail(req, exc)
        return appended
