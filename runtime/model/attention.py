"""Attention over the slot pool: store the new K/V, then extend or decode attention.

Which implementation runs is chosen once: the Triton kernels on CUDA, their CPU-fast torch twins
(kernels/torch_attention.py, torch_decode.py; store_kv keeps its reference) on CPU; `attention_backend` /
RADIXFLOW_ATTENTION_BACKEND override (with TRITON_INTERPRET=1 the Triton kernels run on CPU too, slowly).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from radixflow import kernels
from radixflow.kernels import native, native_layers
from radixflow.kernels._checks import check_index
from radixflow.kernels.extend_attention import _check_extend
from radixflow.runtime.core.forward_batch import ForwardBatch
from radixflow.runtime.core.kv_pool import KVPool

ENV_BACKEND = "RADIXFLOW_ATTENTION_BACKEND"
# On CUDA the decode split count is chosen per step (kernels.choose_kv_splits: from the batch,
# the longest context and the SM count); the interpreter pays per program, so it gets a fixed 2.
INTERPRETER_KV_SPLITS = 2


def resolve_backend(requested: str, device: torch.device) -> str:
    """`auto` → triton on CUDA, torch elsewhere; the environment variable wins over the config."""
    choice = os.environ.get(ENV_BACKEND, requested) or "auto"
    if choice not in ("auto", "triton", "torch"):
        raise ValueError(f"{ENV_BACKEND}={choice!r} is not one of auto, triton, torch")
    if choice == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return choice


def default_kv_splits(device: torch.device) -> int | None:
    """A fixed decode split count, or None: chosen per step from the batch (CUDA)."""
    return None if device.type == "cuda" else INTERPRETER_KV_SPLITS


@dataclass(frozen=True)
class AttentionOps:
    store_kv: Callable[..., None]
    extend_attention: Callable[..., torch.Tensor]
    decode_attention: Callable[..., torch.Tensor]

    @classmethod
    def for_backend(cls, name: str) -> AttentionOps:
        if name == "triton":
            return cls(kernels.store_kv, kernels.extend_attention, kernels.decode_attention)
        return cls(kernels.store_kv_ref, kernels.extend_attention_torch, kernels.decode_attention_torch)


class PoolAttention:
    """The model's AttentionFn over a KVPool.

    On the torch backend a decode step's padded context layout (kernels.DecodeGather) is built
    at its first layer and reused by the other layers of the same forward; a layer with a
    sliding window (`windows`) reads a step's contexts cut to the window (kernels.window_context,
    either backend), also built once per step; extend passes the window to the kernel. A layer that
    attends within chunks (`chunks`: Llama 4) reads each context from its chunk's start: decode
    through kernels.chunk_context, extend as pieces that each lie in one chunk (chunk_extend), each a
    causal extend over its chunk's slots; built once per step too. That is the only state kept.
    NOTE: reset at layer 0, not keyed by the ForwardBatch object, since a CUDA-graph runner reuses
    one ForwardBatch over static buffers whose contents change between steps.
    """

    def __init__(self, pool: KVPool, ops: AttentionOps, sm_scale: float, num_kv_splits: int | None = None,
                 windows: dict[int, int] | None = None, softcap: float | None = None,
                 chunks: dict[int, int] | None = None) -> None:
        self.pool, self.ops, self.sm_scale = pool, ops, sm_scale
        self.softcap = softcap  # scores soft-capped to softcap * tanh(s / softcap) (Gemma 2)
        self.num_kv_splits = num_kv_splits  # None: per step, see kv_splits_for
        self.windows = dict(windows or {})  # layer → its sliding window (ModelArgs.layer_windows)
        self.chunks = dict(chunks or {})  # layer → the chunks it attends within (ModelArgs.layer_chunks)
        self._extends: dict[int, tuple] = {}  # one step's chunk_extend layouts, by chunk size
        device = pool.k_caches[0].device
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
        self.is_torch = ops.decode_attention is kernels.decode_attention_torch
        # one step's decode layouts, by context (None: the whole one, a window, or minus a chunk size),
        # rebuilt at layer 0: the torch backend's plans, and the cut contexts of either backend
        self._plans: dict[int | None, kernels.DecodeGather] = {}
        self._contexts: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._planned: ForwardBatch | None = None  # the step fused_layout planned (its layers use _plans[None])
        if self.is_torch and device.type == "cpu":
            native.library()  # the native decode kernel is built now (~0.5 s, once per machine), not mid-step
            native_layers.sum_lanes()  # and the RMSNorm's summation order checked (a few ms)

    def __call__(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 fb: ForwardBatch, sinks: torch.Tensor | None = None) -> torch.Tensor:
        if layer_id == 0:  # a new step (a CUDA graph's capture included: nothing carries over)
            if self._planned is not fb:
                self._plans = {}
            self._planned = None
            self._contexts, self._extends = {}, {}
        return self._attend(layer_id, q, k, v, fb, sinks)

    def _attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                fb: ForwardBatch, sinks: torch.Tensor | None) -> torch.Tensor:
        if fb.parts is not None:  # a mixed step: its decode rows through the batched decode path
            head, tail = fb.parts
            n = head.num_tokens
            return torch.cat([self._attend(layer_id, q[:n], k[:n], v[:n], head, sinks),
                              self._attend(layer_id, q[n:], k[n:], v[n:], tail, sinks)])
        pool = self.pool
        if not fb.is_decode and pool.needs_calibration(layer_id):  # fp8: the layer's first prefill
            pool.calibrate(layer_id, k, v)
        kc, vc = pool.k_caches[layer_id], pool.v_caches[layer_id]
        ks, vs = pool.k_scales[layer_id], pool.v_scales[layer_id]
        window, chunk = self.windows.get(layer_id), self.chunks.get(layer_id)
        if window is not None and window >= fb.req_to_token.shape[1]:  # no context is longer than the window
            window = None
        if chunk is not None and chunk >= fb.req_to_token.shape[1]:  # every context is within its first chunk
            chunk = None
        context = window if chunk is None else -chunk  # a decode context's key (_decode_context)
        if fb.is_decode and self.is_torch:
            return self._decode_torch(layer_id, q, k, v, fb, context, sinks)
        self.ops.store_kv(kc, vc, fb.out_slots, k, v, ks, vs)
        if fb.is_decode:
            table, rows, lens = self._decode_context(fb, context)
            max_len = fb.max_seq_len if context is None else min(fb.max_seq_len, abs(context))
            splits = fb.num_kv_splits or self.kv_splits_for(fb.batch_size, max_len)
            return self.ops.decode_attention(q, kc, vc, table, rows, lens, self.sm_scale, ks, vs, splits,
                                             softcap=self.softcap, sinks=sinks)
        # the kernel picks its KV splits from the longest context (short turns on long prefixes)
        if chunk is not None:
            if chunk not in self._extends:
                self._extends[chunk] = chunk_extend(fb, chunk)
            table, rows, prefix, new, starts, max_new, max_len = self._extends[chunk]
            return self.ops.extend_attention(q, kc, vc, table, rows, prefix, new, starts, self.sm_scale, ks, vs,
                                             max_new, max_len, softcap=self.softcap, sinks=sinks)
        return self.ops.extend_attention(q, kc, vc, fb.req_to_token, fb.req_rows, fb.prefix_lens,
                                         fb.extend_lens, fb.extend_starts, self.sm_scale, ks, vs,
                                         fb.max_extend_len, fb.max_seq_len, window=window, softcap=self.softcap,
                                         sinks=sinks)

    def _decode_context(self, fb: ForwardBatch, context: int | None) -> tuple[torch.Tensor, ...]:
        """(req_to_token, req_rows, seq_lens) a decode step's attention reads: the step's own
        (`context` None), cut to a window (`context` > 0) or to each context's last chunk (minus
        its size), cut once per step and context."""
        if context is None:
            return fb.req_to_token, fb.req_rows, fb.seq_lens
        if context not in self._contexts:
            cut = kernels.window_context if context > 0 else kernels.chunk_context
            self._contexts[context] = cut(fb.req_to_token, fb.req_rows, fb.seq_lens, abs(context))
        return self._contexts[context]

    def kv_splits_for(self, batch_size: int, max_seq_len: int) -> int:
        """Decode KV splits for a batch whose longest context is `max_seq_len` tokens."""
        if self.num_kv_splits is not None:
            return self.num_kv_splits
        return kernels.choose_kv_splits(batch_size, self.pool.k_caches[0].shape[1], max_seq_len, self.num_sms)

    def fused_layout(self, fb: ForwardBatch, num_heads: int, head_dim: int) -> tuple[torch.Tensor, ...] | None:
        """For runtime/model/fused_layers.py, a CPU bf16 step's attention described for the native
        kernels (native_layers.fused_decode_step / fused_extend_step: the description first, then the
        tensors it points into), its inputs checked once; None where it needs the layer path (a
        decode step that reads a shared prefix once for a group, or cuts a context into pieces:
        the plan made here is kept for its layers)."""
        pool = self.pool
        kc, vc = pool.k_caches[0], pool.v_caches[0]
        if not self.is_torch or kc.device.type != "cpu" or kc.dtype != torch.bfloat16 or self.softcap is not None:
            return None
        q = torch.empty(fb.num_tokens, num_heads, head_dim, dtype=torch.bfloat16)  # the checks' shapes
        check_index("out_slots", fb.out_slots, fb.num_tokens)
        if not fb.is_decode:
            index = (fb.req_rows, fb.prefix_lens, fb.extend_lens, fb.extend_starts)
            _check_extend(q, kc, vc, fb.req_to_token, *index, self.sm_scale, 1.0, 1.0, fb.max_extend_len,
                          fb.max_seq_len)
            return native_layers.fused_extend_step(fb.req_to_token, index, fb.num_tokens, kc.shape[0])
        plan = kernels.plan_checked_decode(q, kc, vc, fb.req_to_token, fb.req_rows, fb.seq_lens, self.sm_scale)
        self._plans, self._planned = {None: plan}, fb
        rows = plan.native
        if rows is None or rows.rows is not None or plan.shared:
            return None
        return native_layers.fused_decode_step(rows.slots, rows.offsets)

    def _decode_torch(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      fb: ForwardBatch, context: int | None, sinks: torch.Tensor | None) -> torch.Tensor:
        """Decode on CPU: inputs checked at layer 0; the step's layout planned at its first layer
        of each context (_decode_context; unless fused_layout planned it)."""
        pool = self.pool
        kc, vc = pool.k_caches[layer_id], pool.v_caches[layer_id]
        ks, vs = pool.k_scales[layer_id], pool.v_scales[layer_id]
        if layer_id == 0:
            kernels.store_kv_ref(kc, vc, fb.out_slots, k, v, ks, vs)  # checks the step's shapes once
        elif kc.dtype == torch.uint8:
            kc.index_copy_(0, fb.out_slots, kernels.quantize_fp8(k, ks))
            vc.index_copy_(0, fb.out_slots, kernels.quantize_fp8(v, vs))
        else:
            kc.index_copy_(0, fb.out_slots, k.to(kc.dtype))
            vc.index_copy_(0, fb.out_slots, v.to(vc.dtype))
        plan = self._plans.get(context)
        if plan is None:
            table, rows, lens = self._decode_context(fb, context)
            plan = self._plans[context] = kernels.plan_checked_decode(q, kc, vc, table, rows, lens, self.sm_scale,
                                                                     ks, vs, softcap=self.softcap)
        return kernels.decode_attention_gathered(q, kc, vc, plan, self.sm_scale, ks, vs, self.softcap, sinks)


def chunk_extend(fb: ForwardBatch, chunk: int) -> tuple:
    """An extend step's attention within chunks of `chunk` positions, as the extend kernels take it:
    (req_to_token, req_rows, prefix_lens, extend_lens, extend_starts, max_extend_len, max_seq_len)
    of pieces, each a run of one request's new tokens that lies in one chunk, attending causally over
    a slot table row that starts at its chunk's start. The pieces keep the q rows' order."""
    pieces = []  # (request, chunk start, first position, end position, first q row)
    q_row = 0
    for i, (prefix, new) in enumerate(zip(fb.prefix_lens_cpu, fb.extend_lens_cpu)):
        at = prefix
        while at < prefix + new:
            start = at // chunk * chunk
            end = min(prefix + new, start + chunk)
            pieces.append((i, start, at, end, q_row + at - prefix))
            at = end
        q_row += new
    table = fb.req_to_token
    if not pieces:  # no new token
        return (table, fb.req_rows, fb.prefix_lens, fb.extend_lens, fb.extend_starts, fb.max_extend_len,
                fb.max_seq_len)
    device = table.device
    width = min(chunk, table.shape[1])
    req, start, first, end, rows = (torch.tensor(column, dtype=torch.int64) for column in zip(*pieces))
    cols = (start[:, None] + torch.arange(width)[None, :]).clamp(max=table.shape[1] - 1).to(device)
    cut = table[fb.req_rows[req.to(device)].long()[:, None], cols]
    index = (torch.arange(len(pieces), dtype=torch.int64), first - start, end - first, rows)
    return (cut, *(t.to(device) for t in index), int((end - first).max()), int((end - start).max()))
