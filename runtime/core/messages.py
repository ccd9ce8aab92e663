"""The messages that cross the engine core's boundary, declared once.

Out of the core: per step, each request's new tokens (`StepOutput`); each finished request's
timeline (`Timings`); replies. Into it: requests as token ids (`SubmitRequest`), aborts, control
calls. In-process (`Engine`) the StepOutputs travel through runtime/output_channel.py; with the
core in its own process (runtime/core_client.py, runtime/core_process.py) every message here is
msgpack-encoded with msgspec over one ZMQ socket. A step's message carries O(new tokens), never
a request's whole output: cumulative text and `output_ids` are rebuilt on the consumer side
(runtime/stream_chunks.py).
"""
from __future__ import annotations

from typing import Any, Union

import msgspec

from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.stats import RequestTiming

# (token, its logprob or None, its top alternatives [(token, logprob)] or None)
LogprobEntry = tuple[int, float | None, list[tuple[int, float]] | None]


class RequestOutput(msgspec.Struct, frozen=True, kw_only=True):
    """What one request produced since its previous RequestOutput.

    `new_token_ids` / `new_logprobs`: its output tokens since then (logprob entries only when
    asked for); `text_delta`: the visible text they completed (in-process only: the engine
    process sends token ids alone, its client makes the text). The first message
    of a request carries `input_logprobs` when asked for; the last one its `finish_reason` and
    `finished_stats` (miss tokens, timings), and an embedding request's last its `embedding`.
    `cached_tokens`: its prefix-cache hit.
    """

    rid: str
    new_token_ids: list[int]
    text_delta: str = ""
    new_logprobs: list[LogprobEntry] = []
    cached_tokens: int = 0
    finish_reason: dict[str, Any] | None = None
    input_logprobs: list[LogprobEntry] | None = None
    finished_stats: dict[str, Any] | None = None
    embedding: list[float] | None = None


class StepOutput(msgspec.Struct, frozen=True, tag="step"):
    """One step's outputs for one consumer: a single message however many requests it holds.

    The common decode case travels in columns: a request whose only news is one token (tokens
    only, no logprobs, neither its first message nor its last) is `token_rids[i]`, `tokens[i]`
    and `cached_tokens[i]`, with no RequestOutput of its own to build, encode and decode. The
    others are `outputs`. Consumers read both through `request_outputs()`.
    """

    outputs: list[RequestOutput] = []
    token_rids: list[str] = []
    tokens: list[int] = []
    cached_tokens: list[int] = []

    def request_outputs(self) -> list[RequestOutput]:
        """Every request's output, the columns' made into RequestOutputs (on the consumer's side)."""
        if not self.token_rids:
            return self.outputs
        return self.outputs + [RequestOutput(rid=rid, new_token_ids=[token], cached_tokens=cached)
                               for rid, token, cached in zip(self.token_rids, self.tokens, self.cached_tokens)]


# -- into the core process --------------------------------------------------------------------------

class Hello(msgspec.Struct, frozen=True, kw_only=True, tag="hello"):
    """A client's first message: the core answers with CoreInfo and from then on sends it the
    Timings of every finished request (each API server keeps complete histograms). `pid` and
    `host` name the client's process: a client on the core's host whose process is gone has
    its requests aborted (it can no longer abort them itself)."""

    pid: int = 0
    host: str = ""


class SubmitRequest(msgspec.Struct, frozen=True, kw_only=True, tag="submit"):
    """One request, already tokenized and validated by the client (the core checks again).
    `group`: the rid of the n > 1 request it is a sample (or the prefill) of: an abort of that
    rid from any client ends it (the client that got `/abort_request` may not be the one that
    runs the samples). `lora_version`: the weights its `lora` meant when the request began
    (Engine.adapter_version): a sample is refused rather than run on other weights than its
    group's first samples."""

    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int = 0
    lora: str | None = None
    session_id: str | None = None
    group: str | None = None
    lora_version: str | None = None
    embed: bool = False  # an embedding request (Engine.encode): its sampling is prefill-only
    priority: int | None = None  # with priority scheduling, its rank (runtime/core/priority.py)
    return_hidden_states: bool = False  # its last output's finished_stats carry them


class AbortRequest(msgspec.Struct, frozen=True, tag="abort"):
    """End `rid`: a client gone (reason abort), or a stop string or regex the client found in
    the text (`reason` is that stop: the core finishes the request with it). `notify`: an
    /abort_request, which may name a request another client runs but has not submitted yet (an
    n > 1 request between its shared prefill and its samples): the core tells every other client
    (AbortNotice)."""

    rid: str
    reason: dict[str, Any] | None = None
    notify: bool = False


class ControlCall(msgspec.Struct, frozen=True, tag="call"):
    """A rare call (stats, flush_cache, adapters, abort_all, test hooks): `args` is a pickle of
    (args, kwargs), since its values are engine objects; requests and outputs never use pickle."""

    call_id: int
    method: str
    args: bytes


# -- out of the core process ------------------------------------------------------------------------

class CoreInfo(msgspec.Struct, frozen=True, kw_only=True, tag="info"):
    """The answer to Hello: what a client needs to validate prompts on its side."""

    vocab_size: int
    max_context_len: int
    kv_capacity: int
    healthy: bool
    pid: int
    hidden_size: int = 0  # an embedding's length


class Rejected(msgspec.Struct, frozen=True, kw_only=True, tag="rejected"):
    """A SubmitRequest the core refused; `kind` names the exception the caller gets."""

    rid: str
    kind: str  # value | queue_full | closed | dead
    message: str

    @classmethod
    def of(cls, rid: str, exc: BaseException) -> Rejected:
        from radixflow.runtime.errors import EngineClosedError, EngineDeadError, QueueFullError

        kinds = ((QueueFullError, "queue_full"), (EngineDeadError, "dead"), (EngineClosedError, "closed"))
        kind = next((k for t, k in kinds if isinstance(exc, t)), "value")
        return cls(rid=rid, kind=kind, message=str(exc))

    def error(self) -> Exception:
        """The exception its caller raises."""
        from radixflow.runtime.errors import EngineClosedError, EngineDeadError, QueueFullError

        kinds = {"value": ValueError, "queue_full": QueueFullError, "closed": EngineClosedError,
                 "dead": EngineDeadError}
        return kinds.get(self.kind, RuntimeError)(self.message)


def undecodable_submit_rid(payload: bytes) -> str | None:
    """The rid of a submit whose fields do not decode as their types (None: not a readable submit)."""
    try:
        loose = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError:
        return None
    if isinstance(loose, dict) and loose.get("type") == "submit" and isinstance(loose.get("rid"), str):
        return loose["rid"]
    return None


class ControlReply(msgspec.Struct, frozen=True, tag="reply"):
    """`value` is a pickle of the call's return value, or of its exception when not `ok`."""

    call_id: int
    ok: bool
    value: bytes


class Timings(msgspec.Struct, frozen=True, tag="timings"):
    """Finished requests' timelines, for the client's finish listeners (metrics)."""

    timings: list[RequestTiming]


class Health(msgspec.Struct, frozen=True, tag="health"):
    """Sent when the core stops serving (its loop died or it shut down)."""

    healthy: bool
    message: str


class AbortNotice(msgspec.Struct, frozen=True, tag="abort_notice"):
    """Another client's /abort_request named `rid`: the client that runs a request under that
    rid (or group) ends what it submits of it from now on."""

    rid: str


ToCore = Union[Hello, SubmitRequest, AbortRequest, ControlCall]
FromCore = Union[StepOutput, CoreInfo, Rejected, ControlReply, Timings, Health, AbortNotice]


def ended_by_token(reason: dict[str, Any] | None) -> bool:
    """Whether a finish reason is a stop token id's or EOS's (its token is the output's last)."""
    return reason is not None and reason.get("type") == "stop" and isinstance(reason.get("matched"), int)
