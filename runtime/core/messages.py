"""The messages that leave the engine core, declared once: per step, each request's new tokens.

Today they travel in-process (runtime/output_channel.py hands them from the engine thread to an
asyncio loop); the engine-process split will send the same structs over a socket with msgspec.
Each carries O(new tokens), never a request's whole output: cumulative text and `output_ids`
are rebuilt on the consumer side (runtime/stream_chunks.py).
"""
from __future__ import annotations

from typing import Any

import msgspec

# (token, its logprob or None, its top alternatives [(token, logprob)] or None)
LogprobEntry = tuple[int, float | None, list[tuple[int, float]] | None]


class RequestOutput(msgspec.Struct, frozen=True, kw_only=True):
    """What one request produced since its previous RequestOutput.

    `new_token_ids` / `new_logprobs`: its output tokens since then (logprob entries only when
    asked for); `text_delta`: the visible text they completed (NOTE: detokenization and stop
    strings still run in the core until the process split moves them out). The first message
    of a request carries `input_logprobs` when asked for; the last one its `finish_reason` and
    `finished_stats` (miss tokens, timings). `cached_tokens`: its prefix-cache hit.
    """

    rid: str
    new_token_ids: list[int]
    text_delta: str = ""
    new_logprobs: list[LogprobEntry] = []
    cached_tokens: int = 0
    finish_reason: dict[str, Any] | None = None
    input_logprobs: list[LogprobEntry] | None = None
    finished_stats: dict[str, Any] | None = None


class StepOutput(msgspec.Struct, frozen=True):
    """One step's outputs for one consumer: a single message however many requests it holds."""

    outputs: list[RequestOutput]
