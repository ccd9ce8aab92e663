"""One engine step: schedule → forward → logprobs and sampling → append tokens → release."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from radixflow.runtime.grammar.mask import grammar_bitmask
from radixflow.runtime.grammar.state import advance as advance_grammar
from radixflow.runtime.model_runner import ModelRunner
from radixflow.runtime.output import append_token, finalize_text
from radixflow.runtime.request import Req
from radixflow.runtime.sampler import RowState, SampleRow, sample, score_tokens
from radixflow.runtime.scheduler import ScheduledBatch, Scheduler

log = logging.getLogger(__name__)


@dataclass
class _LogitPlan:
    """Which logit rows a request gets this step and what each is for."""

    offsets: list[int]          # rows within the request's new tokens, ascending
    prompt_positions: list[int]  # for offsets[:len(prompt_positions)]: prompt position scored
    sample: bool                 # the last offset is sampled from


def plan_logits(req: Req, prefix: int, n: int, sample_last: bool) -> _LogitPlan:
    """Rows needed: those scoring prompt tokens still owed as input logprobs (position q's
    logits score token q+1), and the last row when sampling."""
    rows: list[int] = []
    scored: list[int] = []
    start = req.logprob.prompt_start(len(req.prompt_ids))
    if start is not None:
        next_pos = start + len(req.input_logprobs)   # first prompt position not yet scored
        for q in range(max(prefix, next_pos - 1), prefix + n):
            if q + 1 < len(req.prompt_ids) and q + 1 >= max(next_pos, 1):
                rows.append(q - prefix)
                scored.append(q + 1)
    if sample_last and (not rows or rows[-1] != n - 1):
        rows.append(n - 1)
    return _LogitPlan(rows, scored, sample_last)


def notify(req: Req, finished: bool) -> None:
    """Hand req's progress to its consumer; a failing consumer never stops the engine loop."""
    if req.on_output is None:
        return
    try:
        req.on_output(req, finished)
    except Exception:  # the consumer's bug: log it, keep serving everyone else
        log.exception("output callback of request %s failed", req.rid)


class StepRunner:
    """Runs steps for the engine thread; counts prefill tokens, generated tokens, steps."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, eos_ids: frozenset[int],
                 max_context_len: int, generator: torch.Generator) -> None:
        self.runner, self.scheduler = runner, scheduler
        self.eos_ids, self.max_context_len = eos_ids, max_context_len
        self.generator = generator
        self.prefill_tokens = 0
        self.generated_tokens = 0
        self.num_steps = 0

    def run_one(self) -> tuple[list[Req], bool]:
        """Schedule and run one step. Returns (finished requests, whether a step ran)."""
        batch = self.scheduler.schedule()
        if batch is None:
            return [], False
        plans = [plan_logits(r, p, n, s) for r, p, n, s in
                 zip(batch.reqs, batch.prefix_lens, batch.extend_lens, batch.sample)]
        try:
            logits = self.runner.forward(batch, [p.offsets for p in plans])
        except (RuntimeError, ValueError) as exc:
            log.exception("forward step failed; aborting its %d requests", len(batch.reqs))
            for req in batch.reqs:
                req.finish({"type": "abort", "message": f"internal error: {exc}"})
            return self.scheduler.finish_step(batch), True
        self.num_steps += 1
        if not batch.is_decode:
            self.prefill_tokens += sum(batch.extend_lens)
        self._record_prompt_logprobs(batch, plans, logits)
        self._sample_and_append(batch, plans, logits)
        finished = self.scheduler.finish_step(batch)
        for req in batch.reqs:
            if req.stream and not req.is_finished and req.output_ids:
                notify(req, False)
        return finished, True

    def _record_prompt_logprobs(self, batch: ScheduledBatch, plans: list[_LogitPlan],
                                logits: torch.Tensor) -> None:
        base = 0
        for req, plan in zip(batch.reqs, plans):
            if not req.input_logprobs and req.logprob.prompt_start(len(req.prompt_ids)) == 0:
                req.input_logprobs.append((req.prompt_ids[0], None, None))
            if plan.prompt_positions:
                k = len(plan.prompt_positions)
                toks = torch.tensor([req.prompt_ids[p] for p in plan.prompt_positions], device=logits.device)
                chosen, tops = score_tokens(logits[base: base + k], toks, req.logprob.top_logprobs_num)
                for pos, c, t in zip(plan.prompt_positions, chosen, tops):
                    req.input_logprobs.append((req.prompt_ids[pos], c, t if req.logprob.top_logprobs_num else None))
            base += len(plan.offsets)

    def _sample_and_append(self, batch: ScheduledBatch, plans: list[_LogitPlan], logits: torch.Tensor) -> None:
        rows, reqs, base = [], [], 0
        for req, plan in zip(batch.reqs, plans):
            base += len(plan.offsets)
            if plan.sample:
                rows.append(base - 1)
                reqs.append(req)
            elif req.kv_len == len(req.all_ids) and not req.wants_sample:
                req.finish({"type": "length", "length": 0})  # prefill-only request is done
                finalize_text(req)
        if not reqs:
            return
        sample_rows = [self._sample_row(r) for r in reqs]
        bitmask = grammar_bitmask(reqs, logits.device)
        result = sample(logits[torch.tensor(rows, device=logits.device)], sample_rows, self.generator,
                        bitmask=bitmask)
        for i, (req, token) in enumerate(zip(reqs, result.tokens)):
            if req.grammar is not None and req.grammar.error is not None:
                req.finish({"type": "abort", "message": req.grammar.error})
                finalize_text(req)
                continue
            if result.logprobs is not None and req.logprob.return_logprob:
                tops = result.top_logprobs[i] if req.logprob.top_logprobs_num else None
                req.output_logprobs.append((token, result.logprobs[i], tops))
            append_token(req, token, self.eos_ids, self.max_context_len)
            self.generated_tokens += 1
            if req.grammar is not None:  # may finish req, or append forced tokens (jump-forward)
                self.generated_tokens += advance_grammar(req, token, self.eos_ids, self.max_context_len)

    def _sample_row(self, req: Req) -> SampleRow:
        sp = req.sampling
        blocked = []
        if len(req.output_ids) < sp.min_new_tokens:
            blocked = sorted(set(sp.stop_token_ids or ()) | (set() if sp.ignore_eos else set(self.eos_ids)))
        if req.sampler_state is None:
            req.sampler_state = RowState()
        return SampleRow(sp, req.prompt_ids, req.output_ids, req.generator, blocked,
                         req.logprob.top_logprobs_num, req.logprob.return_logprob, req.sampler_state)
