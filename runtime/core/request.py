"""A request's life inside the engine: its tokens, its KV, its output so far, its timestamps."""
from __future__ import annotations

import enum
import itertools
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixflow.runtime.core.slot_list import SlotIds, SlotList
from radixflow.runtime.sampling_params import SamplingParams

if TYPE_CHECKING:  # the API server process imports this module, and never torch
    import torch


def long_rope_namespace(namespace: str | None) -> str:
    """Where the KV of a sequence rotated with LongRoPE's long factors is cached: apart from the
    same tokens' KV under the short factors, per adapter namespace."""
    return "longrope:" + (namespace or "")


def adapter_namespaces(namespace: str) -> tuple[str, str]:
    """Every namespace an adapter's KV is cached in (what unloading it frees)."""
    return namespace, long_rope_namespace(namespace)


class Status(enum.Enum):
    WAITING = "waiting"      # queued (new, or retracted and to be recomputed)
    RUNNING = "running"      # holds KV and a slot-table row
    FINISHED = "finished"


MAX_TOP_LOGPROBS = 20  # the most alternatives per position a request may ask for (as OpenAI)


class _RidSource:
    """Request ids: a random prefix per process (made again after a fork) and a counter. A
    uuid4 per request read os.urandom each time, ~40 µs on this machine's kernel."""

    def __init__(self) -> None:
        self.pid, self.prefix, self.counter = -1, "", itertools.count()

    def new(self) -> str:
        if self.pid != os.getpid():
            self.pid, self.prefix, self.counter = os.getpid(), uuid.uuid4().hex[:20], itertools.count()
        return f"{self.prefix}{next(self.counter):x}"


_RIDS = _RidSource()


def new_rid() -> str:
    """A request id no other request of any process shares."""
    return _RIDS.new()


def check_finish_reason(reason: object) -> None:
    """ValueError unless `reason` is None or a finish reason a caller may end a request with:
    {"type": "abort" | "stop" | "error", ...} with a str `message` and a str, int or None `matched`."""
    if reason is None:
        return
    ok = (isinstance(reason, dict) and reason.get("type") in CALLER_FINISH_TYPES
          and isinstance(reason.get("message", ""), str) and isinstance(reason.get("matched"), (str, int, type(None))))
    if not ok:
        raise ValueError(f"an abort reason must be None or a dict with type one of {CALLER_FINISH_TYPES} "
                         f"(message: a str), got {reason!r}")


CALLER_FINISH_TYPES = ("abort", "stop", "error")


@dataclass
class OutputOptions:
    """What a request's output carries beside its tokens: logprobs, and its final hidden states
    (top-level fields of a native /generate request)."""

    return_logprob: bool = False
    logprob_start_len: int | None = None   # None or -1: output only (as SGLang); k: prompt from position k
    top_logprobs_num: int = 0
    # the final hidden state (after the model's last norm) of every position it feeds the model:
    # its prompt's and each output token's but the last (meta_info["hidden_states"])
    return_hidden_states: bool = False

    def validate(self, prompt_len: int, vocab_size: int) -> None:
        """ValueError naming the option when a request asks for what cannot be given."""
        limit = min(MAX_TOP_LOGPROBS, vocab_size)
        if not 0 <= self.top_logprobs_num <= limit:
            raise ValueError(f"top_logprobs_num must be between 0 and {limit}, got {self.top_logprobs_num}")
        start = self.logprob_start_len
        if self.return_logprob and start is not None and not -1 <= start < prompt_len:
            raise ValueError(f"logprob_start_len must be -1 (output only) or a prompt position in "
                             f"[0, {prompt_len}), got {start}")

    def prompt_start(self, prompt_len: int) -> int | None:
        """First prompt position whose logprob is returned, or None for none."""
        start = self.logprob_start_len
        if not self.return_logprob or start is None or start == -1:
            return None
        return start if start < prompt_len else None


@dataclass
class Timestamps:
    arrival: float = field(default_factory=time.monotonic)
    scheduled: float | None = None
    prefill_done: float | None = None
    first_token: float | None = None
    tokens: list[float] = field(default_factory=list)
    finished: float | None = None


@dataclass(eq=False)
class Req:
    """One sequence being generated. The scheduler and engine thread own it exclusively. Two
    requests are equal only when they are the same object (the scheduler's lists find and remove
    requests by identity).

    Token layout (`all_ids` = prompt + output):

        | KV computed: slots[:kv_len]               | not yet in KV |
        | tree-owned: [:tree_len] | req-owned       |               |

    `slots[:tree_len]` belong to the radix tree (locked through `last_node`); the rest were
    allocated for this request and are freed or handed to the tree when it finishes.
    While running between steps, `len(all_ids) == kv_len + 1` once decoding has begun, or more
    after grammar jump-forward appended forced tokens (the next step extends them all).
    `grammar`: a GrammarState (runtime/grammar/state.py) for constrained requests, else None.
    """

    rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    options: OutputOptions = field(default_factory=OutputOptions)
    namespace: str | None = None
    long_rope: bool = False      # LongRoPE: rotated with the long factors (its KV in long_rope_namespace)
    lora_id: int = -1            # device slot of its adapter while it holds KV, else -1
    lora: Any = None             # its LoraAdapter (runtime/lora/adapter.py), None = the base model
    lora_name: str | None = None  # the adapter name it asked for (metrics)
    on_output: Callable[[Req, bool], None] | None = None  # (req, finished) once it finished
    sink: Any = None             # an OutputSink (runtime/core/publish.py): its outputs after each step
    cursor: Any = None           # with a sink: its StreamCursor (what was posted so far)
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    row: int | None = None
    slots: SlotList = field(default_factory=SlotList)
    tree_len: int = 0
    last_node: Any = None
    cached_len: int = 0          # prefix-cache hit of the first admission (reported to users)
    num_retractions: int = 0
    num_failed_steps: int = 0    # steps whose forward failed while this request was in them
    prefix_counted: bool = False  # its prefix query and hit went into the cache's counters
    divergent_at: int | None = None  # first admission: matched length where it left a cached path
    miss_tokens: dict[str, int] = field(default_factory=dict)  # prefill tokens computed, by reason
    session_id: str | None = None  # requests of one conversation or program run (session goodput)
    group: str | None = None     # the rid an n > 1 request came under: abort(group) ends each of its parts
    priority: int | None = None  # None: the engine's default (runtime/core/priority.py)
    finish_reason: dict[str, Any] | None = None
    output_text: Any = None      # an OutputText (runtime/text/output_text.py); None: tokens only
    deferred_text: Any = None    # an OutputText made from all output tokens at the finish (then output_text)
    generator: torch.Generator | None = None
    sampler_state: Any = None    # runtime/core/penalties.py RowState, set at the first sampled step
    sample_row: Any = None       # its SampleRow (runtime/core/sampler.py) once nothing is blocked
    finish_ids: frozenset[int] | None = None  # token ids that end it (runtime/core/output.py finish_limits)
    output_limit: int = 0        # output tokens that end it by length (the same)
    grammar: Any = None
    ngram: Any = None            # its NgramIndex (runtime/core/speculative.py) once drafted for
    drafts: list[int] | None = None  # this step's drafts, appended to output_ids until its forward ran
    embed: bool = False          # an embedding request: prefill only, its last token's final hidden state
    embedding: list[float] | None = None  # that state, L2-normalized, once computed
    # with options.return_hidden_states: final hidden states of positions 0.. in order, [n, hidden]
    # fp32 on the host per forward that computed some (runtime/core/step.py _record_hidden_states)
    hidden_states: list[torch.Tensor] = field(default_factory=list)
    num_hidden: int = 0          # positions in hidden_states
    num_verify_steps: int = 0    # steps that verified drafts of it (meta_info spec_verify_ct)
    weight_version: str | None = None  # the weights its latest admission ran on (meta_info weight_version)
    input_logprobs: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)
    output_logprobs: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)
    times: Timestamps = field(default_factory=Timestamps)

    @property
    def text(self) -> str:
        """The detokenized output so far (stop strings trimmed); "" for a tokens-only request."""
        return "" if self.output_text is None else self.output_text.text

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def ids_range(self, start: int, end: int) -> list[int]:
        """`all_ids[start:end]` without building all_ids."""
        p = len(self.prompt_ids)
        if end <= p:
            return self.prompt_ids[start:end]
        if start >= p:
            return self.output_ids[start - p: end - p]
        return self.prompt_ids[start:] + self.output_ids[: end - p]

    @property
    def kv_len(self) -> int:
        return len(self.slots)

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def wants_sample(self) -> bool:
        """Whether computing the remaining KV ends in sampling a token (not prefill-only)."""
        return self.sampling.max_new_tokens > 0

    @property
    def wants_last_row(self) -> bool:
        """Whether computing the remaining KV ends in its last row's logits (a sample) or final
        hidden state (an embedding)."""
        return self.sampling.max_new_tokens > 0 or self.embed

    def owned_slots(self) -> SlotIds:
        return self.slots[self.tree_len:]

    def finish(self, reason: dict[str, Any]) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
            self.times.finished = time.monotonic()
