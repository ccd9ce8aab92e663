"""Loads the model, sizes the KV memory, and runs one forward step for a ScheduledBatch."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from radixflow.runtime.model.attention import AttentionOps, PoolAttention, default_kv_splits, resolve_backend
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.model.cpu_features import has_native_bf16
from radixflow.runtime.core.cuda_graph import Capture, CudaGraphCapture, DecodeGraphRunner
from radixflow.runtime.core.forward_batch import ForwardBatch
from radixflow.runtime.core.kv_pool import KVPool, ReqToTokenPool
from radixflow.runtime.model.quant_config import check_quantization_flag
from radixflow.runtime.model.model_config import ModelArgs, load_model_args
from radixflow.runtime.model.random_weights import build_random_model
from radixflow.runtime.core.request import Req
from radixflow.runtime.core.scheduled_batch import ScheduledBatch
from radixflow.runtime.core.upload import upload
from radixflow.runtime.lora.batch import make_lora_batch
from radixflow.runtime.lora.slots import LoraSlots
from radixflow.runtime.model.packed_linear import can_prepack, prepack_linears
from radixflow.runtime.model.weight_update import StagedWeights, stage_model, stage_weights
from radixflow.runtime.model.weights import TensorReader, build_model, read_kv_scales

log = logging.getLogger(__name__)

# the default context where the model has more positions (Llama 4 Scout: 10M): the request-to-slot table
# (max_num_seqs x context int32) and the RoPE tables grow with it; max_model_len asks for more
DEFAULT_MAX_CONTEXT = 262_144
CPU_DEFAULT_KV_TOKENS = 65536  # CPU cap: more slots than a CPU can fill only cost start-up time
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# GPU memory kept out of the KV budget for activations, logits and the CUDA graph pool.
GPU_ACTIVATION_RESERVE_BYTES = 2 << 30
_IDS_LATER = torch.empty(0, dtype=torch.int64)  # prepare_decode's placeholder until run(input_ids)


@dataclass(frozen=True)
class RuntimeShape:
    """Quantities derived from the config and the model: fixed for the engine's lifetime."""

    device: torch.device
    dtype: torch.dtype
    max_context_len: int
    attention_backend: str
    cuda_graph_max_bs: int  # largest decode batch replayed from a CUDA graph; 0: graphs off


def derive_shape(cfg: EngineConfig, args: ModelArgs) -> RuntimeShape:
    """Pure function of config + model (and whether CUDA exists): device, dtype, context."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is available")
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    if cfg.dtype != "auto":
        dtype = _DTYPES[cfg.dtype]
    elif use_cuda:
        dtype = _DTYPES.get(args.torch_dtype, torch.bfloat16)
        dtype = torch.bfloat16 if dtype == torch.float32 else dtype
    else:  # bf16 halves the bytes each decode step reads, but is slower than fp32 when emulated
        dtype = torch.bfloat16 if has_native_bf16() else torch.float32
    max_len = cfg.max_model_len or min(args.max_position_embeddings, DEFAULT_MAX_CONTEXT)
    if cfg.max_model_len is None and args.max_position_embeddings > DEFAULT_MAX_CONTEXT:
        log.info("context capped at %d of the model's %d positions (the slot and RoPE tables grow with it): "
                 "set max_model_len for more", DEFAULT_MAX_CONTEXT, args.max_position_embeddings)
    if (args.rope_scaling or {}).get("rope_type") == "dynamic" and max_len > args.max_position_embeddings:
        raise ValueError(f"max_model_len {max_len} is past the model's max_position_embeddings "
                         f"{args.max_position_embeddings}, where its dynamic RoPE scaling would stretch the base "
                         "with every sequence's length: not supported (within it the RoPE is plain)")
    backend = resolve_backend(cfg.attention_backend, device)
    # the torch references read lengths back to the host, which a graph capture forbids; a model
    # with experts decodes eagerly until its kernel's capture (tests/kernels/test_moe.py, -m gpu)
    # has run on a GPU
    use_graphs = use_cuda and backend == "triton" and not cfg.disable_cuda_graph and not args.moe_layers
    graph_bs = min(cfg.cuda_graph_max_bs, cfg.max_num_seqs) if use_graphs else 0
    return RuntimeShape(device, dtype, max_len, backend, graph_bs)


def kv_pool_tokens(cfg: EngineConfig, args: ModelArgs, shape: RuntimeShape, fp8: bool) -> int:
    """KV slots to allocate: the explicit budget, else a CPU default or a GPU memory share."""
    if cfg.kv_cache_tokens is not None:
        return cfg.kv_cache_tokens
    per_token = KVPool.bytes_per_token(args.num_layers, args.num_kv_heads, args.head_dim, shape.dtype, fp8, args.mla)
    if shape.device.type != "cuda":
        fit = cfg.cpu_kv_cache_bytes // per_token
        if fit < 16:
            raise ValueError(f"cpu_kv_cache_bytes={cfg.cpu_kv_cache_bytes} holds {fit} tokens of KV "
                             f"({per_token} bytes each): raise it or set kv_cache_tokens")
        return int(min(fit, CPU_DEFAULT_KV_TOKENS, cfg.max_num_seqs * shape.max_context_len))
    _, total = torch.cuda.mem_get_info(shape.device)
    budget = total * cfg.mem_fraction - torch.cuda.memory_allocated(shape.device) - GPU_ACTIVATION_RESERVE_BYTES
    if budget < per_token * 1024:
        raise ValueError(f"mem_fraction={cfg.mem_fraction} leaves {budget / 2**30:.2f} GiB for the KV "
                         "cache after the weights: raise it or use a smaller model")
    # More slots than every running request could fill at full context only grow the free list.
    return int(min(budget // per_token, cfg.max_num_seqs * shape.max_context_len))


class ModelRunner:
    """Owns the model weights, the KV pool and the slot table; turns batches into logits."""

    def __init__(self, cfg: EngineConfig, model_dir: str) -> None:
        self.args = load_model_args(model_dir)
        self.serves_hidden_states = cfg.enable_return_hidden_states
        self.shape = derive_shape(cfg, self.args)
        dev = self.shape.device
        if cfg.load_format != "dummy":
            check_quantization_flag(cfg.quantization, model_dir)
        if cfg.load_format == "dummy":
            self.model = build_random_model(self.args, self.shape.dtype, dev, self.shape.max_context_len, cfg.seed)
        else:
            self.model = build_model(self.args, model_dir, self.shape.dtype, dev, self.shape.max_context_len)
        if can_prepack(dev, self.shape.dtype):
            log.info("%d projections on oneDNN's prepacked bf16 layout", prepack_linears(self.model))
        # adapter slots, allocated once and before the KV pool is sized from what is left;
        # None: the engine serves no adapters
        self.lora_slots = LoraSlots(self.args, cfg.lora_targets, cfg.max_loras, cfg.max_lora_rank,
                                    self.shape.dtype, dev) if cfg.lora_enabled else None
        fp8 = cfg.kv_cache_dtype == "fp8_e4m3"
        num_tokens = kv_pool_tokens(cfg, self.args, self.shape, fp8)
        self.kv_pool = KVPool(num_tokens + 1, self.args.num_layers, self.args.num_kv_heads,
                              self.args.head_dim, self.shape.dtype, dev, fp8=fp8, shared_kv=self.args.mla)
        scales = read_kv_scales(model_dir, self.args.num_layers) if fp8 and cfg.load_format != "dummy" else None
        if scales is not None:
            self.kv_pool.set_scales(*scales)
        if fp8:
            log.info("fp8 KV scales: %s", "from the checkpoint" if scales else "from each layer's first prefill")
        self.req_pool = ReqToTokenPool(cfg.max_num_seqs, self.shape.max_context_len, dev)
        ops = AttentionOps.for_backend(self.shape.attention_backend)
        self.attention = PoolAttention(self.kv_pool, ops, self.args.sm_scale, default_kv_splits(dev),
                                       self.args.layer_windows, self.args.attn_logit_softcapping,
                                       self.args.layer_chunks)
        log.info("KV pool: %d tokens, %.2f GiB (%s, %s), max context %d, attention backend %s",
                 num_tokens, num_tokens * KVPool.bytes_per_token(
                     self.args.num_layers, self.args.num_kv_heads, self.args.head_dim, self.shape.dtype, fp8,
                     self.args.mla) / 2**30, "fp8_e4m3" if fp8 else self.shape.dtype, dev,
                 self.shape.max_context_len, self.shape.attention_backend)
        self.graph_runner: DecodeGraphRunner | None = None
        self.num_weight_updates = 0  # apply_staged's
        # NOTE: a graph bakes in the KV scales its store and attention kernels were launched with,
        # so fp8 scales still to come from the first prefill defer the capture until they are fixed
        self.graph_capture: Capture | None = CudaGraphCapture(dev) if self.shape.cuda_graph_max_bs > 0 else None
        self._maybe_capture_graphs()

    @property
    def device(self) -> torch.device:
        return self.shape.device

    def stage_weights(self, model_path: str, quantization: str | None) -> StagedWeights:
        """Load another checkpoint of the served model beside it (runtime/model/weight_update.py),
        with its fp8 KV scales when the pool is fp8; safe on any thread while steps run.
        `apply_staged` puts it in place."""
        staged = stage_weights(self.model, self.args, model_path, self.shape.dtype, self.device,
                               self.shape.max_context_len, quantization)
        if self.kv_pool.is_fp8:
            staged.kv_scales = read_kv_scales(staged.model_path, self.args.num_layers)
        return staged

    def stage_tensors(self, reader: TensorReader) -> StagedWeights:
        """As stage_weights, from tensors named as in the model's checkpoint (no KV scales)."""
        return stage_model(self.model, self.args, reader, self.shape.dtype, self.device, self.shape.max_context_len)

    def apply_staged(self, staged: StagedWeights) -> None:
        """The staged weights in place of the served ones; only between steps, with no KV stored
        (an fp8 pool's scales belong to the old weights: the checkpoint's, else calibrated again,
        and decode graphs, which bake the scales in, captured again once they are final)."""
        staged.apply()
        self.num_weight_updates += 1
        if self.kv_pool.is_fp8:
            if staged.kv_scales is not None:
                self.kv_pool.set_scales(*staged.kv_scales)
            else:
                self.kv_pool.reset_scales()
            self.graph_runner = None
            self._maybe_capture_graphs()

    def _maybe_capture_graphs(self) -> None:
        """Capture the decode graphs once graphs are on and the KV scales are final."""
        if self.graph_runner is None and self.graph_capture is not None and self.kv_pool.scales_final:
            self.graph_runner = DecodeGraphRunner(self.model, self.attention, self.req_pool.table,
                                                  self.shape.cuda_graph_max_bs, self.graph_capture,
                                                  lora_slots=self.lora_slots)

    def forward(self, batch: ScheduledBatch, logit_offsets: list[list[int]]) -> torch.Tensor:
        """Logits [sum(len(o) for o in logit_offsets), vocab] fp32: for request i, the rows at
        offsets `logit_offsets[i]` (0-based within its new tokens), in order.

        A decode round whose grammar jump-forward gave some rows several new tokens runs in two
        parts: its one-token rows through the CUDA graph, the others as a small eager extend.
        NOTE: a decode step replayed from a CUDA graph returns a view of the graph's output
        buffer, which the next forward overwrites: use (or copy) the logits before then.
        """
        self._maybe_capture_graphs()
        if self._can_replay(batch, logit_offsets):
            return self._replay(batch.reqs, batch.prefix_lens, batch.new_slots, _rows(batch))
        graph_rows = self._graph_rows(batch, logit_offsets)
        if graph_rows:
            return self._forward_split(batch, logit_offsets, graph_rows)
        if batch.is_decode_round and not batch.is_decode:
            fb = self._decode_rows_batch(batch, logit_offsets)
        else:
            fb = self.make_forward_batch(batch, logit_offsets)
        return self.model(self._with_hidden_rows(fb, batch), self.attention)

    def _decode_tail(self, batch: ScheduledBatch) -> int | None:
        """Where a mixed step's trailing run of one-token decode rows starts, when the torch
        backend is to attend to them apart (its extend attention runs request by request, its
        decode attention batched); None: attend to the batch as one extend."""
        if not batch.num_decode_rows or not self.attention.is_torch:
            return None
        first = len(batch.reqs) - batch.num_decode_rows
        k = len(batch.reqs)
        while k > first and batch.extend_lens[k - 1] == 1:
            k -= 1
        return k if 0 < k < len(batch.reqs) else None

    def prepare_decode(self, batch: ScheduledBatch) -> Callable[[torch.Tensor], torch.Tensor]:
        """For a decode batch (one token each, one logit row each) whose input tokens may
        not be on the host yet (overlap scheduling: the previous step's samples). Reads all it
        needs of the requests now, on the engine thread, and returns `run(input_ids)`:
        input_ids [len(batch.reqs)] int64 on the device -> logits [len(batch.reqs), vocab] fp32,
        which reads no request state, so it may run on another thread while the engine thread
        goes on. On CUDA without graphs or on CPU it runs eagerly; with graphs it replays them
        (the graph-output NOTE of `forward` applies)."""
        assert batch.is_decode and all(n == 1 for n in batch.extend_lens)
        self._maybe_capture_graphs()
        offsets = [[0]] * len(batch.reqs)
        if self._can_replay(batch, offsets):
            graphs = self.graph_runner
            assert graphs is not None
            positions, rows = list(batch.prefix_lens), _rows(batch)
            out_slots = _decode_slots(batch.reqs, batch.prefix_lens, batch.new_slots)
            loras, rope = [r.lora_id for r in batch.reqs], self.rope_offsets(batch.reqs)
            return lambda ids: graphs.run(ids, positions, out_slots, rows, lora_slots=loras, rope_offsets=rope)
        fb = self.make_forward_batch(batch, offsets, input_ids=_IDS_LATER)
        return lambda ids: self.model(dataclasses.replace(fb, input_ids=ids), self.attention)

    def _replay(self, reqs: list[Req], prefix_lens: list[int], new_slots: np.ndarray | None = None,
                rows: list[int] | None = None) -> torch.Tensor:
        """Logits [len(reqs), vocab] of one decode token per request, from the graphs.
        `new_slots` / `rows`: each request's slot at its position and its slot-table row (read
        from the requests if None)."""
        assert self.graph_runner is not None
        return self.graph_runner.run(
            input_ids=last_ids(reqs), positions=list(prefix_lens),
            out_slots=_decode_slots(reqs, prefix_lens, new_slots),
            req_rows=[r.row for r in reqs] if rows is None else rows, lora_slots=[r.lora_id for r in reqs],
            rope_offsets=self.rope_offsets(reqs))

    def wants_hidden_states(self, reqs: list[Req]) -> bool:
        """Whether a request of `reqs` asks for its hidden states: never (and no pass over the
        batch) unless the engine serves them."""
        return self.serves_hidden_states and any(r.options.return_hidden_states for r in reqs)

    def _with_hidden_rows(self, fb: ForwardBatch, batch: ScheduledBatch) -> ForwardBatch:
        """`fb` keeping the final hidden states (`model.kept_hidden`) of every new token of each
        request that asks for them, in batch order; their logits are not computed unless sampled
        or scored. Each request's new tokens are contiguous in both flat layouts (one row per
        request, one row per new token)."""
        if not self.wants_hidden_states(batch.reqs):
            return fb
        rows, start = [], 0
        for req, n in zip(batch.reqs, batch.extend_lens):
            if req.options.return_hidden_states:
                rows.extend(range(start, start + n))
            start += n
        return dataclasses.replace(fb, hidden_rows=torch.tensor(rows, dtype=torch.int64, device=self.device))

    def _can_replay(self, batch: ScheduledBatch, logit_offsets: list[list[int]]) -> bool:
        """A decode batch that fits a captured graph and wants exactly each request's one logit
        row, and no request's hidden states (a replay keeps none)."""
        return (self.graph_runner is not None and batch.is_decode and len(batch.reqs) <= self.graph_runner.max_bs
                and all(n == 1 for n in batch.extend_lens) and all(o == [0] for o in logit_offsets)
                and not self.wants_hidden_states(batch.reqs))

    def _graph_rows(self, batch: ScheduledBatch, logit_offsets: list[list[int]]) -> list[int]:
        """In a decode round with jump-forward rows, the one-token rows a graph can replay
        (all of them, or none when they are too many for the graphs or there is nothing else)."""
        if (self.graph_runner is None or not batch.is_decode_round
                or self.wants_hidden_states(batch.reqs)):
            return []
        rows = [i for i, (n, o) in enumerate(zip(batch.extend_lens, logit_offsets)) if n == 1 and o == [0]]
        return rows if len(rows) <= self.graph_runner.max_bs and len(rows) < len(batch.reqs) else []

    def _forward_split(self, batch: ScheduledBatch, logit_offsets: list[list[int]],
                       graph_rows: list[int]) -> torch.Tensor:
        """Rows `graph_rows` through the graph, the rest as an eager extend; logits in batch order.

            logits:  | req 0's rows | req 1's rows | ... |   (len(logit_offsets[i]) rows each)
        """
        in_graph = set(graph_rows)
        eager = [i for i in range(len(batch.reqs)) if i not in in_graph]

        def pick(xs: list) -> list:
            return [xs[i] for i in eager]

        sub = ScheduledBatch(pick(batch.reqs), pick(batch.prefix_lens), pick(batch.extend_lens),
                             pick(batch.completes), pick(batch.sample), is_decode=False)
        eager_logits = self.model(self.make_forward_batch(sub, [logit_offsets[i] for i in eager]), self.attention)
        graph_logits = self._replay([batch.reqs[i] for i in graph_rows], [batch.prefix_lens[i] for i in graph_rows])
        starts = [0]
        for offs in logit_offsets:
            starts.append(starts[-1] + len(offs))
        out = graph_logits.new_empty((starts[-1], graph_logits.shape[1]))
        out[[starts[i] for i in graph_rows]] = graph_logits
        out[[r for i in eager for r in range(starts[i], starts[i + 1])]] = eager_logits
        return out

    def _decode_forward_batch(self, batch: ScheduledBatch, input_ids: torch.Tensor | None) -> ForwardBatch:
        """`make_forward_batch` of a decode step (one new token and one logit row each): a few
        passes over the requests, no per-token work."""
        reqs, prefix = batch.reqs, batch.prefix_lens
        assert batch.new_slots is not None
        n, dev = len(reqs), self.device
        after = np.asarray(prefix, dtype=np.int64) + 1
        rows = np.arange(n)
        ids, positions, out_slots, req_rows, extend_lens, seq_lens, starts = upload(
            [last_ids(reqs) if input_ids is None else (), prefix, batch.new_slots, _rows(batch),
             np.ones(n, dtype=np.int64), after, rows], dev)
        return ForwardBatch(
            is_decode=True, input_ids=ids if input_ids is None else input_ids, positions=positions,
            out_slots=out_slots, req_to_token=self.req_pool.table, req_rows=req_rows, prefix_lens=positions,
            extend_lens=extend_lens, seq_lens=seq_lens, extend_starts=starts, logit_rows=starts,
            prefix_lens_cpu=list(prefix), extend_lens_cpu=[1] * n,
            lora=None if self.lora_slots is None else make_lora_batch(
                self.lora_slots, [r.lora_id for r in reqs], [1] * n, dev, dev.type == "cuda"))

    def _decode_rows_batch(self, batch: ScheduledBatch, logit_offsets: list[list[int]]) -> ForwardBatch:
        """A decode round whose requests add several tokens (drafts to verify, a grammar's forced
        tokens) as a decode batch of one row per new token: the token at position q attends to
        its request's first q + 1 slots (the step writes every new token's KV before attending),
        as a one-token step at q would, so its logits are the ones plain decoding computes, by
        the decode kernels (the fused layers on a CPU with bf16)."""
        ids, positions, slots, rows, loras, logit_rows = [], [], [], [], [], []
        for req, prefix, n, offs in zip(batch.reqs, batch.prefix_lens, batch.extend_lens, logit_offsets):
            logit_rows.extend(len(ids) + o for o in offs)
            ids.extend(req.ids_range(prefix, prefix + n))
            positions.extend(range(prefix, prefix + n))
            slots.append(req.slots[prefix: prefix + n])
            rows.extend([req.row] * n)
            loras.extend([req.lora_id] * n)
        t, dev = len(ids), self.device
        ids_t, positions_t, out_slots, req_rows, ones, seq_lens, starts, logit_rows_t = upload(
            [ids, positions, np.concatenate(slots), rows, np.ones(t, dtype=np.int64),
             np.asarray(positions, dtype=np.int64) + 1, np.arange(t), logit_rows], dev)
        return self._with_rope_rows(ForwardBatch(
            is_decode=True, input_ids=ids_t, positions=positions_t, out_slots=out_slots,
            req_to_token=self.req_pool.table, req_rows=req_rows, prefix_lens=positions_t, extend_lens=ones,
            seq_lens=seq_lens, extend_starts=starts, logit_rows=logit_rows_t, prefix_lens_cpu=positions,
            extend_lens_cpu=[1] * t, lora=None if self.lora_slots is None else make_lora_batch(
                self.lora_slots, loras, [1] * t, dev, dev.type == "cuda")), batch)

    def make_forward_batch(self, batch: ScheduledBatch, logit_offsets: list[list[int]],
                           input_ids: torch.Tensor | None = None) -> ForwardBatch:
        """The ForwardBatch of `batch`; its input ids are the requests' tokens, or `input_ids`
        (on the device, one per new token) when given."""
        if batch.new_slots is not None and all(o == [0] for o in logit_offsets):
            return self._with_rope_rows(self._decode_forward_batch(batch, input_ids), batch)
        ids, positions, slots, logit_rows, starts = [], [], [], [], []
        num_tokens = 0
        for req, prefix, n, offs in zip(batch.reqs, batch.prefix_lens, batch.extend_lens, logit_offsets):
            starts.append(num_tokens)
            logit_rows.extend(num_tokens + o for o in offs)
            if input_ids is None:
                ids.extend(req.ids_range(prefix, prefix + n))
            num_tokens += n
            positions.extend(range(prefix, prefix + n))
            slots.append(req.slots[prefix: prefix + n])
        dev = self.device
        seq_lens = [p + n for p, n in zip(batch.prefix_lens, batch.extend_lens)]
        (ids_t, positions_t, out_slots, req_rows, prefix_lens, extend_lens, seq_lens_t, starts_t,
         logit_rows_t) = upload([ids, positions, np.concatenate(slots), [r.row for r in batch.reqs],
                                 batch.prefix_lens, batch.extend_lens, seq_lens, starts, logit_rows], dev)
        fb = ForwardBatch(
            is_decode=batch.is_decode, input_ids=ids_t if input_ids is None else input_ids,
            positions=positions_t, out_slots=out_slots, req_to_token=self.req_pool.table, req_rows=req_rows,
            prefix_lens=prefix_lens, extend_lens=extend_lens, seq_lens=seq_lens_t, extend_starts=starts_t,
            logit_rows=logit_rows_t, prefix_lens_cpu=list(batch.prefix_lens), extend_lens_cpu=list(batch.extend_lens),
            lora=None if self.lora_slots is None else make_lora_batch(
                self.lora_slots, [r.lora_id for r in batch.reqs], list(batch.extend_lens), dev, dev.type == "cuda"))
        fb = self._with_rope_rows(fb, batch)
        tail = self._decode_tail(batch)
        return fb if tail is None else dataclasses.replace(fb, parts=fb.split(tail))

    def rope_offsets(self, reqs: list[Req]) -> list[int] | None:
        """LongRoPE: each request's offset into the RoPE tables, past the short factors' rows for a
        long sequence (model.rope_tables); None when no request is long."""
        if self.args.long_rope_len is None or not any(r.long_rope for r in reqs):
            return None
        return [self.shape.max_context_len if r.long_rope else 0 for r in reqs]

    def _with_rope_rows(self, fb: ForwardBatch, batch: ScheduledBatch) -> ForwardBatch:
        """LongRoPE: `fb` with its long sequences' tokens reading the long factors' table rows;
        `fb` itself when none is long."""
        offsets = self.rope_offsets(batch.reqs)
        if offsets is None:
            return fb
        per_token = np.repeat(np.asarray(offsets, dtype=np.int64), batch.extend_lens)
        return dataclasses.replace(fb, rope_positions=fb.positions + torch.from_numpy(per_token).to(fb.positions.device))


def last_ids(reqs: list[Req]) -> list[int]:
    """Each request's last known token: a decode step's input (at position kv_len, the one
    token whose KV the step computes)."""
    return [r.output_ids[-1] if r.output_ids else r.prompt_ids[-1] for r in reqs]


def _rows(batch: ScheduledBatch) -> list[int]:
    """Each request's slot-table row (the scheduler's list for a decode step)."""
    return batch.rows if batch.rows is not None else [r.row for r in batch.reqs]


def _decode_slots(reqs: list[Req], prefix_lens: list[int], new_slots: np.ndarray | None) -> list[int]:
    """Each request's slot at its decode position: the step's `new_slots`, or read from the requests."""
    return new_slots.tolist() if new_slots is not None else [r.slots[p] for r, p in zip(reqs, prefix_lens)]
