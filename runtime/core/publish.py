"""What a step hands out: each streaming request's RequestOutput, one StepOutput per consumer."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from radixflow.runtime.core.messages import RequestOutput, StepOutput
from radixflow.runtime.core.request import Req
from radixflow.runtime.result import finished_stats

log = logging.getLogger(__name__)


class OutputSink(Protocol):
    """Where a streaming request's outputs go (runtime/output_channel.py); `post` is called on
    the engine thread and must only hand the message over."""

    def post(self, step: StepOutput) -> None: ...


@dataclass
class StreamCursor:
    """How much of a request's output its RequestOutputs have carried so far (token ids only:
    its text is made by the consumer). `plain`: after its first message, a step's one new token
    goes in its StepOutput's columns (no logprobs asked: see messages.StepOutput)."""

    tokens: int = 0
    logprobs: int = 0
    is_first: bool = True
    plain: bool = False


def take_output(req: Req, cursor: StreamCursor) -> RequestOutput:
    """req's output since its previous RequestOutput, O(new tokens); advances `cursor`.
    A finished request's is its last, with the finish reason and stats."""
    new_ids = req.output_ids[cursor.tokens:]
    cursor.tokens += len(new_ids)
    finished = req.finish_reason is not None
    if cursor.plain and not finished:
        return RequestOutput(rid=req.rid, new_token_ids=new_ids, cached_tokens=req.cached_len)  # a jump-forward's
    asked = req.options.return_logprob
    out = RequestOutput(
        rid=req.rid, new_token_ids=new_ids,
        new_logprobs=req.output_logprobs[cursor.logprobs:] if asked else [], cached_tokens=req.cached_len,
        finish_reason=req.finish_reason,
        input_logprobs=list(req.input_logprobs) if asked and cursor.is_first else None,
        finished_stats=finished_stats(req) if finished else None, embedding=req.embedding if finished else None)
    cursor.logprobs, cursor.is_first = len(req.output_logprobs), False
    cursor.plain = not asked
    return out


class _SinkStep:
    """One sink's part of a step, while `publish` builds it."""

    __slots__ = ("sink", "outputs", "rids", "tokens", "cached")

    def __init__(self, sink: OutputSink) -> None:
        self.sink = sink
        self.outputs: list[RequestOutput] = []
        self.rids: list[str] = []
        self.tokens: list[int] = []
        self.cached: list[int] = []


def publish(reqs: list[Req]) -> None:
    """Post the new output of each streaming request in `reqs` (new tokens, or its finish), one
    StepOutput per sink. A failing sink never stops the engine loop. The engine's per-step
    loop: a plain request's one new token costs three list appends (the StepOutput's columns)."""
    steps: dict[int, _SinkStep] = {}
    current: OutputSink | None = None
    rids = tokens = cached = outputs = None
    for req in reqs:
        sink = req.sink
        if sink is None:
            continue
        cursor = req.cursor
        ids = req.output_ids
        n = len(ids)
        if req.finish_reason is None:
            if n == cursor.tokens:
                continue
            if cursor.plain and n == cursor.tokens + 1:
                if sink is not current:
                    rids, tokens, cached, outputs = _step_of(steps, sink)
                    current = sink
                rids.append(req.rid)
                tokens.append(ids[-1])
                cached.append(req.cached_len)
                cursor.tokens = n
                continue
        try:
            out = take_output(req, cursor)
        except Exception:  # its text or stats: log it, the others still get theirs
            log.exception("building the output of request %s failed", req.rid)
            continue
        if sink is not current:  # one sink's requests are usually all of them, or come in runs
            rids, tokens, cached, outputs = _step_of(steps, sink)
            current = sink
        outputs.append(out)
    for step in steps.values():
        try:
            step.sink.post(StepOutput(step.outputs, step.rids, step.tokens, step.cached))
        except Exception:  # the consumer's side: log it, keep serving everyone else
            log.exception("posting a step's output to %r failed", step.sink)


def _step_of(steps: dict[int, _SinkStep], sink: OutputSink) -> tuple[list, list, list, list]:
    """`sink`'s part of the step: its columns and outputs."""
    step = steps.get(id(sink))
    if step is None:
        step = steps[id(sink)] = _SinkStep(sink)
    return step.rids, step.tokens, step.cached, step.outputs
