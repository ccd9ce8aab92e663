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
    (one new token, or several its grammar's jump-forward appended). `num_decode_rows`: a mixed
    step's last rows, running requests' decode rows next to the prefill rows before them
    (`mixed`); 0 in any other step."""

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
    num_decode_rows: int = 0


def mixed(prefill: ScheduledBatch, decode: ScheduledBatch) -> ScheduledBatch:
    """One step computing both: `prefill`'s rows, then `decode`'s (each a running request's
    new token, or its jump-forward tokens)."""
    n = len(decode.reqs)
    return ScheduledBatch(prefill.reqs + decode.reqs, prefill.prefix_lens + decode.prefix_lens,
                          prefill.extend_lens + decode.extend_lens, prefill.completes + decode.completes,
                          prefill.sample + decode.sample, is_decode=False,
                          misses=prefill.misses + [{} for _ in range(n)], num_decode_rows=n)
