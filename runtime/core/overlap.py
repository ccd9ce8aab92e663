"""Overlap scheduling: a decode step computes on the device while the host appends the last one's tokens.

    engine thread:   sched N │ launch N │ append N-1's tokens, stop checks, release, publish │ sched N+1 │ ...
    device / worker: ── step N-1 ──────┴── step N: forward, sample (input: N-1's tokens, on the device) ──┴── ...

Decode steps overlap while nothing prefills and no waiting request can be admitted; before any
other step, and before anything changes the requests between steps (aborts, calls), the engine
finishes the step in flight (StepRunner.drain) and then runs steps as without it. On CPU the
forward runs on one worker thread (torch ops release the GIL); on CUDA launching is asynchronous
already, so it runs inline and the tokens come back through a pinned buffer.

Rows of plain requests (`is_plain`) are sampled on the device by the step's job. The others
(grammar, penalties, logit bias, logprobs, a seed, stop tokens held back by min_new_tokens) are
host rows: their sampling needs the request's state after its previous token (the grammar
advanced, the penalty counts, the output count), so the engine thread prepares them (grammar
plans and masks) once that token is appended, while the step's forward runs, samples them from
the step's logits once it is done, and writes their tokens into the step's device tokens before
the next step is launched from them (runtime/core/overlap_steps.py). Only those rows
wait for the previous token; appending, stop checks, releasing and publishing still overlap.
A jump-forward appends forced tokens after a sampled one: the step launched on that token
computed its KV (kept) but sampled after the wrong position, so its row is dropped unsampled
and the forced tokens are extended by the next, ordinary step.
"""
from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from radixflow.runtime.core.model_runner import ModelRunner
from radixflow.runtime.core.request import Req
from radixflow.runtime.core.sampler import SampleRow, sample_on_device
from radixflow.runtime.core.scheduled_batch import ScheduledBatch
from radixflow.runtime.core.upload import upload

# What a launched step's job returns: its tokens [B] int64 on the device (-1: NaN logits; 0 on
# host rows until the engine thread samples them), the same on the host (pinned, filled
# asynchronously on CUDA), the event that marks the copy, and the logits when there are host rows.
StepTokens = tuple[torch.Tensor, torch.Tensor, "torch.cuda.Event | None", "torch.Tensor | None"]


def is_plain(req: Req, num_pending: int) -> bool:
    """Whether req's next token can be sampled on the device with no host work
    (`sample_on_device`): no grammar, penalties, logit bias, logprobs or seed, and min_new_tokens
    no longer holding stop tokens back once its `num_pending` tokens still on the device are
    appended."""
    sp = req.sampling
    return (req.grammar is None and req.generator is None and not req.options.return_logprob
            and not req.options.top_logprobs_num and not sp.is_penalized and not sp.logit_bias
            and len(req.output_ids) + num_pending >= sp.min_new_tokens)


def host_rows(reqs: list[Req], num_pending: int) -> list[int]:
    """Indices of the requests whose next token is sampled on the host (not `is_plain`)."""
    return [i for i, r in enumerate(reqs) if not is_plain(r, num_pending)]


def plain_rows(reqs: list[Req]) -> list[SampleRow]:
    """The sampler's rows of plain requests: their parameters only (no live token lists, which
    the engine thread changes while the job runs)."""
    return [SampleRow(r.sampling, [], [], None, []) for r in reqs]


@dataclass
class InFlight:
    """A launched decode step whose tokens the host has not appended yet."""

    batch: ScheduledBatch
    step: int                  # its step number (the fault injector's)
    result: Future             # -> StepTokens, or the forward's error
    host_rows: list[int] = field(default_factory=list)  # rows the engine thread samples
    # once sampled, by host row: its outcome (sample_rows.Sampled), or None for a row not sampled (its
    # request finished, or its input was not its last token: a jump-forward); None before
    outcomes: dict[int, object] | None = None
    prepared: object = None  # its host rows ready to sample (sample_rows.RowsToSample), once made
    checked: bool = False               # whether its forward's outcome is known (StepRunner)
    error: Exception | None = None      # its forward's error, injected or raised, once checked

    @property
    def has_failed(self) -> bool:
        """Whether it is known already that its forward failed (without waiting)."""
        return self.error is not None or (self.result.done() and self.result.exception() is not None)

    def logits(self) -> torch.Tensor:
        """Its logits [B, vocab] (kept when it has host rows); raises its error."""
        return self.result.result()[3]

    def device_tokens(self) -> torch.Tensor:
        """Its tokens [B] int64 on the device (the next step's input); raises its error."""
        return self.result.result()[0]

    def host_tokens(self) -> list[int]:
        """Wait for the step; its tokens on the host, or its forward's error raised."""
        _, host, copied, _ = self.result.result()
        if copied is not None:
            copied.synchronize()
        return host.tolist()

    def wait(self) -> None:
        """Wait until the step's job ended, whatever its outcome."""
        concurrent.futures.wait([self.result])


def failed(exc: Exception) -> Future:
    """A step result that is `exc` (a launch that failed before anything ran)."""
    fut: Future = Future()
    fut.set_exception(exc)
    return fut


def run_step(run: Callable[[torch.Tensor], torch.Tensor], input_ids: Callable[[], torch.Tensor],
             plain: torch.Tensor | None, rows: list[SampleRow], generator: torch.Generator) -> StepTokens:
    """The job of one launched step: forward, sample the plain rows (`plain`: their indices,
    None for all rows; `rows`: theirs), start the copy of the tokens to the host."""
    logits = run(input_ids())
    if plain is None:
        tokens, kept = sample_on_device(logits, rows, generator), None  # [B] int64
    else:
        tokens, kept = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device), logits
        if rows:
            tokens.index_copy_(0, plain, sample_on_device(logits.index_select(0, plain), rows, generator))
    if not tokens.is_cuda:
        return tokens, tokens, None, kept
    host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
    host.copy_(tokens, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    return tokens, host, copied, kept


class Launcher:
    """Starts overlapped decode steps, which run in launch order: on one worker thread on CPU
    (torch ops release the GIL), inline on CUDA (kernel launches are asynchronous already)."""

    def __init__(self, runner: ModelRunner, generator: torch.Generator) -> None:
        self.runner, self.generator = runner, generator
        self._worker = (None if runner.device.type == "cuda"
                        else ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixflow-forward"))

    def launch(self, batch: ScheduledBatch, prev: InFlight | None, step: int, host: list[int]) -> InFlight:
        """Start the forward of `batch`, a decode batch, and the sampling of its rows but `host`
        (engine thread). Its input ids are `prev`'s tokens, still on the device (prev decoded
        all of batch's requests; its host rows sampled), or without `prev` the requests' last
        tokens."""
        try:
            run = self.runner.prepare_decode(batch)
        except Exception as exc:  # the step's forward failed: reported where its tokens are read
            return InFlight(batch, step, failed(exc), host)
        plain, reqs = None, batch.reqs
        if host:
            skip = set(host)
            picks = [i for i in range(len(reqs)) if i not in skip]
            plain, reqs = upload([picks], self.runner.device)[0], [reqs[i] for i in picks]
        input_ids, rows, generator = self._input_ids(batch, prev), plain_rows(reqs), self.generator
        return InFlight(batch, step, self._submit(lambda: run_step(run, input_ids, plain, rows, generator)), host)

    def close(self, wait: bool = True) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=wait)

    def _input_ids(self, batch: ScheduledBatch, prev: InFlight | None) -> Callable[[], torch.Tensor]:
        """The step's input ids [B] int64 on the device, as a function its job calls."""
        dev = self.runner.device
        if prev is None:
            ids = upload([[r.ids_range(p, p + 1)[0] for r, p in zip(batch.reqs, batch.prefix_lens)]], dev)[0]
            return lambda: ids
        where = {id(r): i for i, r in enumerate(prev.batch.reqs)}
        picks = [where[id(r)] for r in batch.reqs]
        # a NaN row's -1 becomes token 0: its request fails when prev's tokens are appended
        if picks == list(range(len(prev.batch.reqs))):
            return lambda: prev.device_tokens().clamp(min=0)
        index = upload([picks], dev)[0]
        return lambda: prev.device_tokens().index_select(0, index).clamp(min=0)

    def _submit(self, job: Callable[[], StepTokens]) -> Future:
        if self._worker is not None:
            return self._worker.submit(job)
        fut: Future = Future()
        try:
            fut.set_result(job())
        except Exception as exc:  # the step's error, raised where its tokens are read
            fut.set_exception(exc)
        return fut
