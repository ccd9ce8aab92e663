"""StepRunner's overlapped decode steps (runtime/core/overlap.py): launch a step while the one
before it is in flight, sample its host rows once their previous tokens are appended, append
its tokens a step late."""
from __future__ import annotations

from radixflow.runtime.core.faults import NO_FAULTS
from radixflow.runtime.core.overlap import InFlight, host_rows
from radixflow.runtime.core.sampler import BROKEN_ROW
from radixflow.runtime.core.upload import upload


class OverlappedSteps:
    """The overlap half of StepRunner (runtime/core/step.py). It relies on StepRunner for the
    state (`scheduler`, `faults`, `launcher`, `_in_flight`, the step counters) and the parts
    both kinds of step share: `_prepare_rows`, `_sample_rows`, `_append_outcomes`, `_append`, `_fail`,
    `_forward_failed`, `_fail_batch`, `_check_batch_faults`."""

    def drain(self) -> None:
        """Append the tokens of the step in flight, if any, and release what finished."""
        step, self._in_flight = self._in_flight, None
        if step is not None:
            self._finish_in_flight(step, None)

    def discard(self) -> None:
        """Before the loop fails every request after an error outside the steps' isolation: wait
        for the step in flight and free its new slots uncached; its tokens are dropped."""
        step, self._in_flight = self._in_flight, None
        if step is not None:
            step.wait()
            self.scheduler.undo_step(step.batch)

    def close(self, wait: bool = True) -> None:
        if self.launcher is not None:
            self.launcher.close(wait)

    def _run_overlapped(self, prev: InFlight) -> bool:
        """Sample prev's host rows, launch the decode step after prev from its tokens on the
        device, then append prev's tokens and prepare the new step's host rows while it runs;
        when the next step cannot overlap (something to prefill or admit, a jump-forward's
        tokens to extend), only finish prev."""
        batch = None
        assert self.launcher is not None
        if prev.host_rows:
            self._resolve(prev)
        if not prev.has_failed and all(r.seq_len == r.kv_len for r in self.scheduler.running):
            batch = self.scheduler.schedule_decode_ahead()
        if batch is None:
            self.drain()
            return True
        ahead = self._in_flight = self.launcher.launch(batch, prev, self.num_steps + 1,  # prev uncounted
                                                       host_rows(batch.reqs, 1))
        self.num_overlapped_steps += 1
        self._finish_in_flight(prev, ahead)
        if self._in_flight is not None and all(r.is_finished for r in ahead.batch.reqs):
            self.drain()  # nothing of it is wanted; nothing would run it out either
        elif self._in_flight is not None and ahead.host_rows:
            self._prepare_host_rows(ahead)  # its masks are filled while its forward runs
        return True

    def _finish_in_flight(self, step: InFlight, ahead: InFlight | None) -> None:
        """Append `step`'s tokens and release what finished. `ahead`: the step launched after
        it, whose rows of requests that finish now are dropped (or which is undone with
        `step` when step's forward failed). Injected faults see only the rows still wanted."""
        live = [r for r in step.batch.reqs if not r.is_finished]
        exc = self._forward_error(step)
        if exc is None:
            try:
                tokens = step.host_tokens()
            except Exception as copy_error:  # the copy of its tokens to the host
                exc = copy_error
        if exc is not None:  # step's forward failed, and ahead's with it (its input)
            step.wait()
            if ahead is not None:
                ahead.wait()
                self.scheduler.undo_step(ahead.batch)
                self._in_flight = None
            self._forward_failed(step.batch, exc)
            return
        if step.host_rows:
            self._resolve(step)
        self.num_steps += 1
        try:
            self._check_batch_faults(live)
            self._append_tokens(step, tokens)
        except Exception as exc:  # batch-wide handling failed: no one request owns the error
            self._fail_batch(step.batch, exc)
        if ahead is not None:
            self.scheduler.drop_ahead(ahead.batch)
        self.scheduler.finish_step(step.batch)
        self._publish([r for r in step.batch.reqs if not r.is_finished])

    def _forward_error(self, step: InFlight) -> Exception | None:
        """Wait for `step`'s job; its forward's error (an injected one included), or None.
        Checked once per step (an injected fault is drawn once)."""
        if not step.checked:
            step.checked = True
            try:
                self.faults.check("forward", [r for r in step.batch.reqs if not r.is_finished], step.step)
                step.result.result()
            except Exception as exc:  # reported by the caller: the whole step's fault
                step.error = exc
        return step.error

    def _prepare_host_rows(self, step: InFlight) -> None:
        """Make `step`'s host rows ready to sample: grammar plans, sampler rows, the grammar
        bitmask. Needs only their requests' previous tokens appended, so it runs while the
        step's forward does. A row is left out when its request finished or its input was not
        its last token (a jump-forward appended tokens after it: its KV is right, its logits are
        for the wrong position)."""
        if step.prepared is not None:
            return
        rows, reqs = [], []
        for i in step.host_rows:
            req = step.batch.reqs[i]
            if req.is_finished:
                continue
            if req.seq_len != step.batch.prefix_lens[i] + 1:
                self.num_stale_rows += 1
                continue
            rows.append(i)
            reqs.append(req)
        step.prepared = self._prepare_rows(rows, reqs, step.step)

    def _resolve(self, step: InFlight) -> None:
        """Sample `step`'s host rows from its logits and write their tokens into its device
        tokens (the next step's input)."""
        if step.outcomes is not None or self._forward_error(step) is not None:
            return  # sampled already, or failed: reported where its tokens are appended
        self._prepare_host_rows(step)
        step.outcomes = dict.fromkeys(step.host_rows)
        prepared = step.prepared
        if not prepared.reqs:
            return
        self.num_host_rows += len(prepared.reqs)
        values = []
        for i, (req, outcome) in zip(prepared.rows, self._sample_rows(step.logits(), prepared, step.step)):
            step.outcomes[i] = outcome
            values.append(outcome[0] if isinstance(outcome, tuple) else 0)
        tokens = step.device_tokens()
        rows_t, values_t = upload([prepared.rows, values], tokens.device)
        tokens.index_copy_(0, rows_t, values_t.to(tokens.dtype))

    def _append_tokens(self, flight: InFlight, tokens: list[int]) -> None:
        """Append each unfinished request's sampled token (-1: its logits held a NaN); a host
        row's is its outcome, if it was sampled."""
        step = self.num_steps - 1
        host = flight.outcomes or {}
        faults = self.faults is not NO_FAULTS
        sampled: list = []
        for i, (req, token) in enumerate(zip(flight.batch.reqs, tokens)):
            if req.finish_reason is not None:
                continue  # finished on the token before (its row computed past its end), or aborted
            if i in host:
                if host[i] is not None:
                    sampled.append((req, host[i]))
                continue
            try:
                if faults:
                    self.faults.check("sampler", (req,), step)
                if token < 0:
                    raise ValueError(BROKEN_ROW)
                sampled.append((req, (token, None, None)))
            except Exception as exc:  # its sampling row's error
                sampled.append((req, exc))
        self._append_outcomes(sampled)  # its detokenizer, stop checks or grammar failing fail it alone
