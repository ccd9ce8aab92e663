"""CUDA graphs for decode steps: capture the model's decode forward once per batch size, replay with padding.

A decode step of an 8B model launches hundreds of small kernels; at small batch the CPU cannot
launch them as fast as the GPU runs them. A captured graph launches them all at once. Graphs
replay fixed device addresses, so each captured batch size reads static input buffers that
every step overwrites, and a batch runs in the smallest captured size that holds it:

    static rows:  | batch rows [0, bs)   | padding [bs, padded_bs) | unused [padded_bs, max_bs) |
    padding row:  token 0 at position 0, K/V written to slot 0 (the pool's dummy), slot-table
                  row 0, seq_len 0 (decode attention returns zeros for it); its logits are dropped.

Only the Triton backend is graph-safe (the torch references read lengths back to the host).
A decode round in which grammar jump-forward gave some requests several new tokens still
replays its one-token rows here; the model runner runs the others as a small eager extend.
"""
from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from typing import Protocol

import torch

from radixflow.runtime.core.forward_batch import ForwardBatch
from radixflow.runtime.lora.batch import LoraBatch
from radixflow.runtime.lora.slots import LoraSlots
from radixflow.runtime.model.model import AttentionFn, CausalLM

log = logging.getLogger(__name__)

SMALL_BATCH_SIZES = (1, 2, 4)
BATCH_SIZE_STEP = 8
WARMUP_RUNS = 2  # compile the Triton kernels and settle cuBLAS workspaces outside the capture

# Rows of the packed static buffer [NUM_FIELDS, max_bs] int64, one H2D copy per step; ROPE_ROWS:
# each row's RoPE table row (its position, past the short rows for a LongRoPE long sequence)
INPUT_IDS, POSITIONS, OUT_SLOTS, REQ_ROWS, SEQ_LENS, PREFIX_LENS, ROPE_ROWS = range(7)
NUM_FIELDS = 7


def capture_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, then every multiple of 8 up to `max_bs`, and `max_bs` itself."""
    if max_bs < 1:
        raise ValueError(f"max_bs must be >= 1, got {max_bs}")
    sizes = {s for s in SMALL_BATCH_SIZES if s < max_bs}
    sizes.update(range(BATCH_SIZE_STEP, max_bs + 1, BATCH_SIZE_STEP))
    sizes.add(max_bs)
    return sorted(sizes)


def padded_batch_size(bs: int, sizes: list[int]) -> int | None:
    """The smallest captured size >= bs, or None when bs is larger than all of them."""
    i = bisect.bisect_left(sizes, bs)
    return sizes[i] if i < len(sizes) else None


def pack_decode_inputs(input_ids: list[int], positions: list[int], out_slots: list[int], req_rows: list[int],
                       padded_bs: int, pin: bool = False, rope_offsets: list[int] | None = None) -> torch.Tensor:
    """Host tensor [NUM_FIELDS, padded_bs] int64: one decode batch plus its padding rows (all
    zeros); `pin`: in pinned memory, for an asynchronous copy (runtime/core/upload.py);
    `rope_offsets`: added to each row's position for its RoPE table row (LongRoPE)."""
    bs = len(input_ids)
    assert bs == len(positions) == len(out_slots) == len(req_rows) and bs <= padded_bs
    packed = torch.zeros((NUM_FIELDS, padded_bs), dtype=torch.int64, pin_memory=pin)
    host = packed.numpy()
    for field, values in ((INPUT_IDS, input_ids), (POSITIONS, positions), (OUT_SLOTS, out_slots),
                          (REQ_ROWS, req_rows)):
        host[field, :bs] = values
    # the new token sits at `position`, so its context holds position + 1 tokens
    host[SEQ_LENS, :bs] = host[POSITIONS, :bs] + 1
    host[PREFIX_LENS, :bs] = host[POSITIONS, :bs]
    host[ROPE_ROWS, :bs] = host[POSITIONS, :bs]
    if rope_offsets is not None:
        host[ROPE_ROWS, :bs] += rope_offsets
    return packed


class Capture(Protocol):
    def __call__(self, forward: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        """Record `forward` (no arguments, reads static buffers) → (replay, output it refreshes)."""
        ...


class CudaGraphCapture:
    """Captures into torch.cuda.CUDAGraphs sharing one memory pool; capture the largest batch
    first, so the smaller graphs fit in its memory."""

    def __init__(self, device: torch.device) -> None:
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)
        self.graphs: list[torch.cuda.CUDAGraph] = []

    def __call__(self, forward: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for _ in range(WARMUP_RUNS):
                forward()
        self.stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = forward()
        torch.cuda.current_stream().wait_stream(self.stream)
        self.graphs.append(graph)
        return graph.replay, out


class DecodeGraphRunner:
    """Decode forward through graphs captured at `capture_batch_sizes(max_bs)`.

    Owns the static input buffers; the captured graphs also read `req_to_token` (the shared
    slot table) and the KV pool through `attention`, both allocated once. `run` returns a view
    of a captured output buffer: valid until the next `run`.
    """

    def __init__(self, model: CausalLM, attention: AttentionFn, req_to_token: torch.Tensor, max_bs: int,
                 capture: Capture, lora_slots: LoraSlots | None = None) -> None:
        self.model, self.attention, self.req_to_token = model, attention, req_to_token
        self.batch_sizes = capture_batch_sizes(max_bs)
        device = req_to_token.device
        self.packed = torch.zeros((NUM_FIELDS, self.batch_sizes[-1]), dtype=torch.int64, device=device)
        self.ones = torch.ones(self.batch_sizes[-1], dtype=torch.int64, device=device)
        self.arange = torch.arange(self.batch_sizes[-1], dtype=torch.int64, device=device)
        # with adapters, each row's slot id (-1: base, also for padding rows) is a graph input
        self.lora_slots = lora_slots
        self.lora_slot_ids = torch.full((self.batch_sizes[-1],), -1, dtype=torch.int64, device=device)
        self.replays: dict[int, tuple[Callable[[], None], torch.Tensor]] = {}
        start = time.perf_counter()
        for bs in reversed(self.batch_sizes):
            fb = self.static_batch(bs)
            self.replays[bs] = capture(lambda fb=fb: self.model(fb, self.attention))
        log.info("captured decode graphs for batch sizes %s in %.1f s", self.batch_sizes,
                 time.perf_counter() - start)

    @property
    def max_bs(self) -> int:
        return self.batch_sizes[-1]

    def static_batch(self, bs: int) -> ForwardBatch:
        """A decode ForwardBatch of `bs` rows whose tensors are views of the static buffers."""
        p = self.packed
        return ForwardBatch(
            is_decode=True, input_ids=p[INPUT_IDS, :bs], positions=p[POSITIONS, :bs],
            out_slots=p[OUT_SLOTS, :bs], req_to_token=self.req_to_token, req_rows=p[REQ_ROWS, :bs],
            prefix_lens=p[PREFIX_LENS, :bs], extend_lens=self.ones[:bs], seq_lens=p[SEQ_LENS, :bs],
            extend_starts=self.arange[:bs], logit_rows=self.arange[:bs],
            prefix_lens_cpu=[0] * bs, extend_lens_cpu=[1] * bs, num_kv_splits=self.kv_splits(bs),
            rope_positions=p[ROPE_ROWS, :bs] if self.model.args.long_rope_len is not None else None,
            lora=None if self.lora_slots is None else LoraBatch(
                self.lora_slots, self.arange[:bs], self.ones[:bs], self.lora_slot_ids[:bs], 1, use_triton=True))

    def kv_splits(self, bs: int) -> int | None:
        """Decode splits baked into the graph of batch size `bs`: sized for the longest context
        (an empty split exits at once), from the attention's per-batch choice where it has one."""
        choose = getattr(self.attention, "kv_splits_for", None)
        return None if choose is None else choose(bs, self.req_to_token.shape[1])

    def run(self, input_ids: list[int] | torch.Tensor, positions: list[int], out_slots: list[int],
            req_rows: list[int], lora_slots: list[int] | None = None,
            rope_offsets: list[int] | None = None) -> torch.Tensor:
        """Logits [bs, vocab] fp32 of one decode step; bs must be <= max_bs. `input_ids` may be
        a device tensor [bs] int64 (overlap scheduling: tokens not yet read back); `rope_offsets`:
        LongRoPE's table offset of each row (model_runner.rope_offsets)."""
        bs = len(positions)
        padded = padded_batch_size(bs, self.batch_sizes)
        assert padded is not None, f"decode batch {bs} exceeds the largest captured size {self.max_bs}"
        on_device = isinstance(input_ids, torch.Tensor)
        pin = self.packed.is_cuda  # asynchronous copies: the host never waits for a step in flight
        host = pack_decode_inputs([0] * bs if on_device else input_ids, positions, out_slots, req_rows, padded, pin,
                                  rope_offsets)
        self.packed[:, :padded].copy_(host, non_blocking=True)
        if on_device:
            self.packed[INPUT_IDS, :bs].copy_(input_ids)
        if self.lora_slots is not None and lora_slots is not None:
            ids = torch.full((padded,), -1, dtype=torch.int64, pin_memory=pin)
            ids.numpy()[:bs] = lora_slots
            self.lora_slot_ids[:padded].copy_(ids, non_blocking=True)
        replay, out = self.replays[padded]
        replay()
        return out[:bs]
