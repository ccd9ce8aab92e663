"""What a step hands out: each streaming request's RequestOutput, one StepOutput per consumer."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from radixflow.runtime.core.messages import RequestOutput, StepOutput
from radixflow.runtime.core.output import visible_len
from radixflow.runtime.core.request import Req
from radixflow.runtime.result import finished_stats

log = logging.getLogger(__name__)


class OutputSink(Protocol):
    """Where a streaming request's outputs go (runtime/output_channel.py); `post` is called on
    the engine thread and must only hand the message over."""

    def post(self, step: StepOutput) -> None: ...


@dataclass
class StreamCursor:
    """How much of a request's output its RequestOutputs have carried so far."""

    tokens: int = 0
    logprobs: int = 0
    text_len: int = 0
    is_first: bool = True


def take_output(req: Req, cursor: StreamCursor) -> RequestOutput:
    """req's output since its previous RequestOutput, O(new tokens); advances `cursor`.
    A finished request's is its last, with the finish reason and stats."""
    new_ids = req.output_ids[cursor.tokens:]
    cursor.tokens += len(new_ids)
    finished = req.finish_reason is not None
    if req.output_text is None and not req.logprob.return_logprob and not (finished or cursor.is_first):
        return RequestOutput(rid=req.rid, new_token_ids=new_ids, cached_tokens=req.cached_len)  # the common case
    end = visible_len(req)
    asked = req.logprob.return_logprob
    out = RequestOutput(
        rid=req.rid, new_token_ids=new_ids, text_delta=req.text[cursor.text_len: end],
        new_logprobs=req.output_logprobs[cursor.logprobs:] if asked else [], cached_tokens=req.cached_len,
        finish_reason=req.finish_reason,
        input_logprobs=list(req.input_logprobs) if asked and cursor.is_first else None,
        finished_stats=finished_stats(req) if finished else None)
    cursor.logprobs, cursor.is_first = len(req.output_logprobs), False
    cursor.text_len = max(cursor.text_len, end)
    return out


def publish(reqs: list[Req]) -> None:
    """Post the new output of each streaming request in `reqs` (new tokens, or its finish), one
    StepOutput per sink. A failing sink never stops the engine loop."""
    batches: dict[int, tuple[OutputSink, list[RequestOutput]]] = {}
    current: OutputSink | None = None
    outputs: list[RequestOutput] = []
    for req in reqs:
        if req.sink is None or (req.finish_reason is None and len(req.output_ids) == req.cursor.tokens):
            continue
        try:
            out = take_output(req, req.cursor)
        except Exception:  # its text or stats: log it, the others still get theirs
            log.exception("building the output of request %s failed", req.rid)
            continue
        if req.sink is not current:  # one sink's requests are usually all of them, or come in runs
            current = req.sink
            outputs = batches.setdefault(id(current), (current, []))[1]
        outputs.append(out)
    for sink, outputs in batches.values():
        try:
            sink.post(StepOutput(outputs))
        except Exception:  # the consumer's side: log it, keep serving everyone else
            log.exception("posting a step's output to %r failed", sink)
