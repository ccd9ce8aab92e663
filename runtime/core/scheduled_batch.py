"""ScheduledBatch: what the scheduler hands the engine for one step."""
from __future__ import annotations

from dataclasses import dataclass, field

from radixflow.runtime.core.kv_pool import SlotIds
from radixflow.runtime.core.request import Req


@dataclass
class ScheduledBatch:
    """What one step computes: for each request, `extend_lens[i]` new tokens after its
    `prefix_lens[i]` cached ones. `completes[i]`: this step computes the rest of its known
    tokens (its prefill ends here); `sample[i]`: a token is then sampled from its last position.
    `misses[i]`: why the prefill tokens of row i were not cached, reason -> tokens (empty for a
    decode round's rows, and no list at all for a decode step); the counts are for the engine to
    record once the step succeeded.
    `is_decode`: every row adds one token. `is_decode_round`: every row is a running request
    (one new token, or several its grammar's jump-forward appended)."""

    reqs: list[Req]
    prefix_lens: list[int]
    extend_lens: list[int]
    completes: list[bool]
    sample: list[bool]
    is_decode: bool
    misses: list[dict[str, int]] = field(default_factory=list)
    is_decode_round: bool = False
    new_slots: SlotIds | None = None  # a decode step's: each row's one new slot (else None)
    rows: list[int] | None = None     # with new_slots: each request's slot-table row
