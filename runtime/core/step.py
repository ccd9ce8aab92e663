"""One engine step: schedule → forward → logprobs and sampling → append tokens → release.

Faults are contained where they arise. A failed forward is the whole step's: its new slots are
freed uncached (`Scheduler.undo_step`) and its requests are retried (out of memory) or failed.
An error in one request's part of the rest (its prompt logprobs, its sampling row, its grammar,
its detokenization) fails that request alone with reason `error`; the others go on.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixflow.runtime.core.faults import NO_FAULTS, FaultInjector, NoFaults
from radixflow.runtime.grammar.mask import grammar_bitmask
from radixflow.runtime.grammar.state import advance as advance_grammar
from radixflow.runtime.core.model_runner import ModelRunner
from radixflow.runtime.core.output import append_plain, append_token
from radixflow.runtime.core.overlap import InFlight, Launcher, host_rows
from radixflow.runtime.core.overlap_steps import OverlappedSteps
from radixflow.runtime.core.publish import publish
from radixflow.runtime.core.request import Req
from radixflow.runtime.core.sample_rows import RowsToSample, Sampled, bitmask_row, rows_to_sample, unpack
from radixflow.runtime.core.sampler import RowState, SampleRow, sample, score_tokens
from radixflow.runtime.core.scheduled_batch import ScheduledBatch
from radixflow.runtime.core.scheduler import MAX_STEP_RETRIES, Scheduler
from radixflow.runtime.core.speculative import VerifySteps, take_drafts
from radixflow.runtime.lora.request_counts import AdapterRequestCounts

log = logging.getLogger(__name__)


@dataclass
class _LogitPlan:
    """Which logit rows a request gets this step and what each is for."""

    offsets: list[int]          # rows within the request's new tokens, ascending
    prompt_positions: list[int]  # for offsets[:len(prompt_positions)]: the prompt position each scores
    sample: bool                 # the last offset is sampled from


def plan_logits(req: Req, prefix: int, n: int, sample_last: bool) -> _LogitPlan:
    """Rows needed: those scoring prompt tokens still owed as input logprobs (position q's
    logits score token q+1), and the last row when sampling. (The hidden states a request may ask
    for are kept for all its new tokens apart from these: ModelRunner._with_hidden_rows.)"""
    rows: list[int] = []
    scored: list[int] = []
    start = req.options.prompt_start(len(req.prompt_ids))
    if start is not None:
        next_pos = start + len(req.input_logprobs)   # first prompt position not yet scored
        for q in range(max(prefix, next_pos - 1), prefix + n):
            if q + 1 < len(req.prompt_ids) and q + 1 >= max(next_pos, 1):
                rows.append(q - prefix)
                scored.append(q + 1)
    if sample_last and (not rows or rows[-1] != n - 1):
        rows.append(n - 1)
    return _LogitPlan(rows, scored, sample_last)


_DECODE_PLAN = _LogitPlan([0], [], True)  # a decode row's: its one logit row, sampled (shared, read-only)


def notify(req: Req, finished: bool) -> None:
    """Hand req's progress to its consumer; a failing consumer never stops the engine loop."""
    if req.on_output is None:
        return
    try:
        req.on_output(req, finished)
    except Exception:  # the consumer's bug: log it, keep serving everyone else
        log.exception("output callback of request %s failed", req.rid)


def error_reason(exc: BaseException) -> dict:
    return {"type": "error", "message": f"{type(exc).__name__}: {exc}"}


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


class StepRunner(OverlappedSteps, VerifySteps):
    """Runs steps for the engine thread; counts prefill tokens, generated tokens, steps.

    `faults` is the test-only fault injector (runtime/core/faults.py); serving uses NO_FAULTS.
    `overlap`: overlap scheduling (runtime/core/overlap.py). A decode step is then launched
    and left in flight; the next run_one samples its host rows, launches the step after it and
    only then appends its tokens. Between run_one calls a step may be in flight (its requests'
    last KV slot still being written): `drain` before changing requests outside a step.
    """

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, eos_ids: frozenset[int],
                 max_context_len: int, generator: torch.Generator, overlap: bool = False) -> None:
        self.runner, self.scheduler = runner, scheduler
        self.eos_ids, self.max_context_len = eos_ids, max_context_len
        self.generator = generator
        self.faults: FaultInjector | NoFaults = NO_FAULTS
        self.prefill_tokens = 0
        self.miss_tokens: dict[str, int] = {}  # prefill tokens computed, by reason (sums to prefill_tokens)
        self.by_adapter: AdapterRequestCounts | None = None  # with LoRA: misses by adapter too
        self.generated_tokens = 0
        self.num_steps = 0
        self.num_failed_steps = 0
        self.num_overlapped_steps = 0  # steps launched while the one before was in flight
        self.num_mixed_steps = 0  # prefill steps that also decoded running requests
        self.num_host_rows = 0   # rows of launched steps the engine thread sampled (overlap.py)
        self.num_stale_rows = 0  # rows of launched steps dropped unsampled after a jump-forward
        self.num_draft_tokens = self.num_accepted_drafts = 0  # speculative decoding's (speculative.py)
        self.launcher = Launcher(runner, generator) if overlap else None
        self._in_flight: InFlight | None = None
        self.before_publish: Callable[[], None] = lambda: None  # the loop's stats refresh: see _publish

    def run_one(self) -> bool:
        """Schedule and run one step; finished requests land in `scheduler.done`.
        Returns whether a step ran."""
        if self._in_flight is not None:
            return self._run_overlapped(self._in_flight)
        batch = self.scheduler.schedule()
        if batch is None:
            return False
        hidden = self.runner.wants_hidden_states(batch.reqs)
        if self.launcher is not None and batch.is_decode and not hidden:  # hidden states: read after the forward
            flight = self._in_flight = self.launcher.launch(batch, None, self.num_steps,  # appended next run_one
                                                            host_rows(batch.reqs, 0))
            if flight.host_rows:
                self._prepare_host_rows(flight)  # while its forward runs
            return True
        if batch.is_decode:  # one token each, sampled; prompt logprobs were all taken at prefill
            plans = [_DECODE_PLAN] * len(batch.reqs)
        else:  # a drafted row's logits at every new token (speculative.py)
            plans = [_LogitPlan(list(range(n)), [], True) if r.drafts else plan_logits(r, p, n, s)
                     for r, p, n, s in zip(batch.reqs, batch.prefix_lens, batch.extend_lens, batch.sample)]
        try:
            self.faults.check("forward", batch.reqs, self.num_steps)
            logits = self.runner.forward(batch, [p.offsets for p in plans])
        except Exception as exc:  # the whole step's fault: nothing of it is kept
            take_drafts(batch.reqs)  # none in a decode step
            self._forward_failed(batch, exc)
            return True
        drafted = {} if batch.is_decode else take_drafts(batch.reqs)
        self.num_steps += 1
        self.num_mixed_steps += batch.num_decode_rows > 0
        self._count_misses(batch)
        try:
            self._check_batch_faults(batch.reqs)
            if hidden:
                self._record_hidden_states(batch)
            self._record_prompt_logprobs(batch, plans, logits)
            for i in self._verify_drafts(batch, [len(p.offsets) for p in plans], logits, drafted) if drafted else ():
                plans[i] = _LogitPlan(plans[i].offsets, [], False)  # its tokens are appended
            self._sample_and_append(batch, plans, logits)
        except Exception as exc:  # batch-wide handling failed: no one request owns the error
            for i in drafted:  # not verified: their new slots hold no token of theirs
                self.scheduler.free_from(batch.reqs[i], batch.prefix_lens[i])
            self._fail_batch(batch, exc)
        self.scheduler.finish_step(batch)
        self._publish([r for r in batch.reqs if r.finish_reason is None])  # finished ones: at their hand-out
        return True

    def _publish(self, reqs: list[Req]) -> None:
        """Post the step's outputs, stats refreshed first (a consumer they wake reads this step's)."""
        self.before_publish()
        publish(reqs)

    # -- the steps' parts ------------------------------------------------------------------------

    def _count_misses(self, batch: ScheduledBatch) -> None:
        """Credit the step's prefill tokens, by miss reason, to their requests and the totals."""
        if batch.is_decode:
            return  # no prefill tokens
        for req, misses in zip(batch.reqs, batch.misses):
            for reason, n in misses.items():
                req.miss_tokens[reason] = req.miss_tokens.get(reason, 0) + n
                self.miss_tokens[reason] = self.miss_tokens.get(reason, 0) + n
                self.prefill_tokens += n
                if self.by_adapter is not None:
                    self.by_adapter.prefill(req.lora_name, reason, n)

    def _forward_failed(self, batch: ScheduledBatch, exc: Exception) -> None:
        """Undo the step; retry its requests after an out-of-memory error (a prefill with a
        smaller budget), at most MAX_STEP_RETRIES times each; otherwise fail them."""
        retry = is_out_of_memory(exc)
        self.num_failed_steps += 1
        log.error("forward of a %s step with %d requests failed (%s: %s); %s",
                  "decode" if batch.is_decode else "prefill", len(batch.reqs), type(exc).__name__, exc,
                  "retrying" if retry else "failing them", exc_info=not retry)
        self.scheduler.undo_step(batch)
        for req in batch.reqs:
            req.num_failed_steps += 1
            if not retry or req.num_failed_steps > MAX_STEP_RETRIES:
                self.scheduler.finish(req, error_reason(exc))
        if retry and not batch.is_decode:
            self.scheduler.shrink_prefill_budget()

    def _fail_batch(self, batch: ScheduledBatch, exc: Exception) -> None:
        """Fail every request of a step whose batch-wide handling failed after its forward."""
        log.exception("step %d failed after its forward; failing its %d requests", self.num_steps,
                      len(batch.reqs), exc_info=exc)
        for req in batch.reqs:
            req.finish(error_reason(exc))

    def _fail(self, req: Req, exc: Exception) -> None:
        """Fail one request for an error of its own; its batch-mates are not affected."""
        log.error("request %s failed: %s: %s", req.rid, type(exc).__name__, exc, exc_info=exc)
        req.finish(error_reason(exc))

    def _record_prompt_logprobs(self, batch: ScheduledBatch, plans: list[_LogitPlan],
                                logits: torch.Tensor) -> None:
        if batch.is_decode:
            return  # a decode row scores no prompt token
        base = 0
        for req, plan in zip(batch.reqs, plans):
            try:
                self._prompt_logprobs_of(req, plan, logits[base: base + len(plan.prompt_positions)])
            except Exception as exc:  # this request's logprob options: fail it alone
                self._fail(req, exc)
            base += len(plan.offsets)

    def _record_hidden_states(self, batch: ScheduledBatch) -> None:
        """Keep the final hidden states of the positions this step fed for each request that asks
        for them (the model kept all its new tokens', those requests' in batch order), past those
        it has already: a request readmitted after a retraction computes some positions again."""
        hidden = self.runner.model.kept_hidden
        base = 0
        for req, prefix, n in zip(batch.reqs, batch.prefix_lens, batch.extend_lens):
            if not req.options.return_hidden_states:
                continue
            if req.finish_reason is None:
                try:
                    if hidden is None or base + n > hidden.shape[0]:
                        raise RuntimeError("the step's forward kept no hidden states for its rows")
                    if prefix > req.num_hidden:
                        raise RuntimeError(f"positions {req.num_hidden}..{prefix - 1} came from the cache: their "
                                           "hidden states were never computed")
                    rows = hidden[base + req.num_hidden - prefix: base + n]
                    if rows.shape[0]:
                        req.hidden_states.append(rows.float().cpu())
                        req.num_hidden += rows.shape[0]
                except Exception as exc:  # this request's alone
                    self._fail(req, exc)
            base += n

    def _prompt_logprobs_of(self, req: Req, plan: _LogitPlan, logits: torch.Tensor) -> None:
        if not req.input_logprobs and req.options.prompt_start(len(req.prompt_ids)) == 0:
            req.input_logprobs.append((req.prompt_ids[0], None, None))
        if not plan.prompt_positions:
            return
        toks = torch.tensor([req.prompt_ids[p] for p in plan.prompt_positions], device=logits.device)
        chosen, tops = score_tokens(logits, toks, req.options.top_logprobs_num)
        for pos, c, t in zip(plan.prompt_positions, chosen, tops):
            req.input_logprobs.append((req.prompt_ids[pos], c, t if req.options.top_logprobs_num else None))

    def _sample_and_append(self, batch: ScheduledBatch, plans: list[_LogitPlan], logits: torch.Tensor) -> None:
        if batch.is_decode:  # one sampled row each, in order
            reqs = [r for r in batch.reqs if r.finish_reason is None]
            rows = list(range(len(batch.reqs))) if len(reqs) == len(batch.reqs) else [
                i for i, r in enumerate(batch.reqs) if r.finish_reason is None]
        else:
            rows, reqs = self._rows_of_prefill(batch, plans)
        step = self.num_steps - 1
        self._append_outcomes(self._sample_rows(logits, self._prepare_rows(rows, reqs, step), step), time.monotonic())

    def _prepare_rows(self, rows: list[int], reqs: list[Req], step: int) -> RowsToSample:
        """Grammar plans, sampler rows and the grammar bitmask for logit `rows` of `reqs`. A
        request whose grammar fails is failed and left out."""
        constrained = any(r.grammar is not None for r in reqs)
        if constrained:
            rows, reqs = self._prepare_grammars(rows, reqs, step)
        sample_rows = [r.sample_row or self._sample_row(r) for r in reqs]
        bitmask = grammar_bitmask(reqs, self.runner.device, on_error=self._fail) if constrained and reqs else None
        return RowsToSample(rows, reqs, sample_rows, bitmask, all(r.plain for r in sample_rows))

    def _sample_rows(self, logits: torch.Tensor, prepared: RowsToSample, step: int) -> list[tuple[Req, Sampled]]:
        """Sample the prepared rows (masks, penalties, logprobs): per request, its outcome."""
        if not prepared.reqs:
            return []
        return list(zip(prepared.reqs, self._sample(logits, prepared, step)))

    def _append_outcomes(self, sampled: list[tuple[Req, Sampled]], now: float | None = None) -> None:
        """Append each sampled token, or fail its request for its row's error. Plain rows (most
        decode rows) in one loop (`append_plain`), the rest one by one."""
        if self.faults is NO_FAULTS:
            count, sampled = append_plain(sampled, time.monotonic() if now is None else now)
            self.generated_tokens += count
        for req, outcome in sampled:
            if isinstance(outcome, Exception):
                self._fail(req, outcome)
            elif req.finish_reason is None:
                try:
                    self._append(req, *outcome, now)
                except Exception as exc:  # its detokenizer, stop checks or grammar
                    self._fail(req, exc)

    def _rows_of_prefill(self, batch: ScheduledBatch, plans: list[_LogitPlan]) -> tuple[list[int], list[Req]]:
        """The logit rows to sample and their requests; a prefill-only request whose prompt is
        all computed finishes here, an embedding request with its last row's final hidden state."""
        rows, reqs, base = [], [], 0
        for req, plan in zip(batch.reqs, plans):
            base += len(plan.offsets)
            if req.is_finished:
                continue
            if plan.sample and req.embed:
                self._embed(req, base - 1)
            elif plan.sample:
                rows.append(base - 1)
                reqs.append(req)
            elif req.kv_len == req.seq_len and not req.wants_sample:
                req.finish({"type": "length", "length": 0})  # prefill-only request is done
        return rows, reqs

    def _embed(self, req: Req, row: int) -> None:
        """Finish an embedding request with its last token's final hidden state (the forward's
        logit row `row`), L2-normalized as OpenAI's embeddings are."""
        try:
            hidden = self.runner.model.last_hidden
            if hidden is None or row >= hidden.shape[0]:
                raise RuntimeError("the step's forward kept no hidden state for its embedding rows")
            req.embedding = torch.nn.functional.normalize(hidden[row].float(), dim=0).tolist()
            req.times.first_token = time.monotonic()  # its first (and only) output: prefill and TTFT count to here
            req.finish({"type": "length", "length": 0})
        except Exception as exc:  # this request's alone
            self._fail(req, exc)

    def _check_batch_faults(self, reqs: list[Req]) -> None:
        """Test hook: step-level faults of the per-request points, outside isolation."""
        for point in ("sampler", "grammar", "detokenizer"):
            self.faults.check(point, reqs, self.num_steps - 1, step_level=True)

    def _prepare_grammars(self, rows: list[int], reqs: list[Req], step: int) -> tuple[list[int], list[Req]]:
        """Make each constrained request's forced-token plan; one that fails is failed and not
        sampled. Returns the rows and requests to sample."""
        keep = []
        for i, req in enumerate(reqs):
            if req.grammar is None:
                keep.append(i)
                continue
            try:
                self.faults.check("grammar", (req,), step)
                req.grammar.pinned_token()
                keep.append(i)
            except Exception as exc:  # its grammar's error
                self._fail(req, exc)
        return [rows[i] for i in keep], [reqs[i] for i in keep]

    def _sample(self, logits: torch.Tensor, prepared: RowsToSample, step: int) -> list[Sampled]:
        """Sample all rows at once; if that raises, row by row, so the error stays with the
        rows that cause it (e.g. NaN logits, a bad sampling option)."""
        rows, reqs, sample_rows, bitmask = prepared.rows, prepared.reqs, prepared.sample_rows, prepared.bitmask
        try:
            self.faults.check("sampler", reqs, step)
            return unpack(sample(rows_to_sample(logits, prepared), sample_rows, self.generator, bitmask=bitmask,
                                  plain=prepared.plain))
        except Exception as exc:
            if len(reqs) == 1:
                return [exc]
            log.warning("batched sampling of %d rows failed (%s); sampling row by row", len(reqs), exc)
        out: list[Sampled] = []
        for i, (req, row) in enumerate(zip(reqs, sample_rows)):
            try:
                self.faults.check("sampler", (req,), step)
                out.extend(unpack(sample(logits[rows[i]: rows[i] + 1].clone(), [row], self.generator,
                                          bitmask=bitmask_row(bitmask, i))))
            except Exception as exc:  # this row's own error
                out.append(exc)
        return out

    def _append(self, req: Req, token: int, logprob: float | None, tops: list | None,
                now: float | None = None) -> None:
        grammar = req.grammar
        if grammar is not None and grammar.error is not None:
            req.finish({"type": "abort", "message": grammar.error})
            return
        if self.faults is not NO_FAULTS:
            self.faults.check("detokenizer", (req,), self.num_steps - 1)
        if logprob is not None and req.options.return_logprob:
            req.output_logprobs.append((token, logprob, tops if req.options.top_logprobs_num else None))
        append_token(req, token, self.eos_ids, self.max_context_len, now)
        self.generated_tokens += 1
        if grammar is not None:  # may finish req, or append forced tokens (jump-forward)
            self.generated_tokens += advance_grammar(req, token, self.eos_ids, self.max_context_len)

    def _sample_row(self, req: Req) -> SampleRow:
        """req's sampler row: made once and reused (it reads the live token lists), except while
        min_new_tokens still blocks stop tokens (then a row with those blocked, each step)."""
        if req.sample_row is not None:
            return req.sample_row
        sp = req.sampling
        blocked = []
        if len(req.output_ids) < sp.min_new_tokens:
            blocked = sorted(set(sp.stop_token_ids or ()) | (set() if sp.ignore_eos else set(self.eos_ids)))
        if req.sampler_state is None:
            req.sampler_state = RowState()
        row = SampleRow(sp, req.prompt_ids, req.output_ids, req.generator, blocked,
                        req.options.top_logprobs_num, req.options.return_logprob, req.sampler_state)
        if not blocked:
            req.sample_row = row
        return row
