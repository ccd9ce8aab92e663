"""What one model step computes: the flat token batch plus the per-request KV layout."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixflow.runtime.lora.batch import LoraBatch


@dataclass
class ForwardBatch:
    """One forward step over a batch of requests, extend (prefill) or decode.

    Tokens of all requests are laid out flat, request after request:

        flat token dim:  | req0 new tokens | req1 new tokens | ... |
                         ^ extend_starts[0] ^ extend_starts[1]

    Request i already has `prefix_lens[i]` tokens in the KV pool (a radix-cache
    hit and/or earlier chunks) and adds `extend_lens[i]` new ones this step, so
    its context after the step is `seq_lens[i] = prefix_lens[i] + extend_lens[i]`
    tokens whose slot ids are `req_to_token[req_rows[i], :seq_lens[i]]`.
    A decode step is an extend step with every `extend_lens[i] == 1`.

    The attention backend first writes the new tokens' K/V at `out_slots`
    (which equal the tail of each request's slot-table row), then attends over
    the whole row, causally for the new tokens. All tensors live on the model's
    device; the `*_cpu` lists are the same numbers for Python-side loops.
    """

    is_decode: bool
    input_ids: torch.Tensor     # [num_tokens] int64
    positions: torch.Tensor     # [num_tokens] int64
    out_slots: torch.Tensor     # [num_tokens] int64, KV slot written by each new token
    req_to_token: torch.Tensor  # [max_running, max_context_len] int32, the shared slot table
    req_rows: torch.Tensor      # [batch] int64, row of each request in req_to_token
    prefix_lens: torch.Tensor   # [batch] int64
    extend_lens: torch.Tensor   # [batch] int64
    seq_lens: torch.Tensor      # [batch] int64
    extend_starts: torch.Tensor  # [batch] int64, exclusive cumsum of extend_lens
    logit_rows: torch.Tensor    # [num_logit_rows] int64, flat token rows whose logits are returned
    prefix_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    lora: LoraBatch | None = None  # the rows' adapter slots and their deltas; None: all base rows
    # decode KV splits fixed for this batch (a CUDA graph's, sized for the longest context);
    # None: the attention backend picks them from the batch's lengths
    num_kv_splits: int | None = None
    # a mixed step's (prefill rows, one-token decode rows after them), for an attention backend
    # that attends to the two apart (`split`); None: attend to the batch as one extend
    parts: tuple[ForwardBatch, ForwardBatch] | None = None
    # [num_tokens] int64, the RoPE table row of each token where it is not its position: LongRoPE's
    # long sequences read the long factors' rows, after the short ones' (model.rope_tables)
    rope_positions: torch.Tensor | None = None
    # [num_kept] int64, flat token rows whose final hidden states the model keeps apart from the
    # logit rows' (every new token of a request asking for its hidden states); None: none
    hidden_rows: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def max_extend_len(self) -> int:
        return max(self.extend_lens_cpu, default=0)

    @property
    def max_seq_len(self) -> int:
        return max((p + e for p, e in zip(self.prefix_lens_cpu, self.extend_lens_cpu)), default=0)

    def split(self, rows: int) -> tuple[ForwardBatch, ForwardBatch]:
        """This batch as two over the same flat tokens: its first `rows` requests, and the rest,
        one new token each (a decode batch). Views where they can be: nothing is copied but
        the tail's token offsets."""
        tokens = sum(self.extend_lens_cpu[:rows])
        assert all(n == 1 for n in self.extend_lens_cpu[rows:]), "the tail must be decode rows"

        def part(r: slice, t: slice, starts: torch.Tensor, is_decode: bool) -> ForwardBatch:
            return dataclasses.replace(
                self, is_decode=is_decode, input_ids=self.input_ids[t], positions=self.positions[t],
                out_slots=self.out_slots[t], req_rows=self.req_rows[r], prefix_lens=self.prefix_lens[r],
                extend_lens=self.extend_lens[r], seq_lens=self.seq_lens[r], extend_starts=starts,
                logit_rows=starts, prefix_lens_cpu=self.prefix_lens_cpu[r], extend_lens_cpu=self.extend_lens_cpu[r],
                lora=None, parts=None, hidden_rows=None, rope_positions=None if self.rope_positions is None else self.rope_positions[t])
        head = part(slice(0, rows), slice(0, tokens), self.extend_starts[:rows], self.is_decode)
        tail = part(slice(rows, None), slice(tokens, None), self.extend_starts[rows:] - tokens, True)
        return head, tail
