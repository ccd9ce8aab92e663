"""Loads the model, sizes the KV memory, and runs one forward step for a ScheduledBatch."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from radixflow.runtime.model.attention import AttentionOps, PoolAttention, default_kv_splits, resolve_backend
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.model.cpu_features import has_native_bf16
from radixflow.runtime.core.cuda_graph import CudaGraphCapture, DecodeGraphRunner
from radixflow.runtime.core.forward_batch import ForwardBatch
from radixflow.runtime.core.kv_pool import KVPool, ReqToTokenPool
from radixflow.runtime.model.model_config import ModelArgs, load_model_args
from radixflow.runtime.model.random_weights import build_random_model
from radixflow.runtime.core.scheduler import ScheduledBatch
from radixflow.runtime.lora.batch import make_lora_batch
from radixflow.runtime.lora.slots import LoraSlots
from radixflow.runtime.model.weights import build_model

log = logging.getLogger(__name__)

CPU_DEFAULT_KV_TOKENS = 65536  # CPU cap: more slots than a CPU can fill only cost start-up time
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# GPU memory kept out of the KV budget for activations, logits and the CUDA graph pool.
GPU_ACTIVATION_RESERVE_BYTES = 2 << 30


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
    max_len = cfg.max_model_len or args.max_position_embeddings
    backend = resolve_backend(cfg.attention_backend, device)
    # the torch references read lengths back to the host, which a graph capture forbids
    use_graphs = use_cuda and backend == "triton" and not cfg.disable_cuda_graph
    graph_bs = min(cfg.cuda_graph_max_bs, cfg.max_num_seqs) if use_graphs else 0
    return RuntimeShape(device, dtype, max_len, backend, graph_bs)


def kv_pool_tokens(cfg: EngineConfig, args: ModelArgs, shape: RuntimeShape, fp8: bool) -> int:
    """KV slots to allocate: the explicit budget, else a CPU default or a GPU memory share."""
    if cfg.kv_cache_tokens is not None:
        return cfg.kv_cache_tokens
    per_token = KVPool.bytes_per_token(args.num_layers, args.num_kv_heads, args.head_dim, shape.dtype, fp8)
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
        self.shape = derive_shape(cfg, self.args)
        dev = self.shape.device
        if cfg.load_format == "dummy":
            self.model = build_random_model(self.args, self.shape.dtype, dev, self.shape.max_context_len, cfg.seed)
        else:
            self.model = build_model(self.args, model_dir, self.shape.dtype, dev, self.shape.max_context_len)
        fp8 = cfg.kv_cache_dtype == "fp8_e4m3"
        num_tokens = kv_pool_tokens(cfg, self.args, self.shape, fp8)
        self.kv_pool = KVPool(num_tokens + 1, self.args.num_layers, self.args.num_kv_heads,
                              self.args.head_dim, self.shape.dtype, dev, fp8=fp8)
        self.req_pool = ReqToTokenPool(cfg.max_num_seqs, self.shape.max_context_len, dev)
        # adapter slots, allocated once like the KV pool; None: the engine serves no adapters
        self.lora_slots = LoraSlots(self.args, cfg.lora_targets, cfg.max_loras, cfg.max_lora_rank,
                                    self.shape.dtype, dev) if cfg.lora_enabled else None
        ops = AttentionOps.for_backend(self.shape.attention_backend)
        self.attention = PoolAttention(self.kv_pool, ops, 1.0 / math.sqrt(self.args.head_dim),
                                       default_kv_splits(dev))
        log.info("KV pool: %d tokens, %.2f GiB (%s, %s), max context %d, attention backend %s",
                 num_tokens, num_tokens * KVPool.bytes_per_token(
                     self.args.num_layers, self.args.num_kv_heads, self.args.head_dim, self.shape.dtype, fp8) / 2**30, "fp8_e4m3" if fp8 else self.shape.dtype, dev,
                 self.shape.max_context_len, self.shape.attention_backend)
        self.graph_runner: DecodeGraphRunner | None = None
        if self.shape.cuda_graph_max_bs > 0:
            self.graph_runner = DecodeGraphRunner(self.model, self.attention, self.req_pool.table,
                                                  self.shape.cuda_graph_max_bs, CudaGraphCapture(dev),
                                                  lora_slots=self.lora_slots)

    @property
    def device(self) -> torch.device:
        return self.shape.device

    def forward(self, batch: ScheduledBatch, logit_offsets: list[list[int]]) -> torch.Tensor:
        """Logits [sum(len(o) for o in logit_offsets), vocab] fp32: for request i, the rows at
        offsets `logit_offsets[i]` (0-based within its new tokens), in order.

        NOTE: a decode step replayed from a CUDA graph returns a view of the graph's output
        buffer, which the next forward overwrites: use (or copy) the logits before then.
        """
        if self._can_replay(batch, logit_offsets):
            assert self.graph_runner is not None
            reqs, prefix_lens = batch.reqs, batch.prefix_lens
            return self.graph_runner.run(
                input_ids=[r.ids_range(p, p + 1)[0] for r, p in zip(reqs, prefix_lens)],
                positions=list(prefix_lens), out_slots=[r.slots[p] for r, p in zip(reqs, prefix_lens)],
                req_rows=[r.row for r in reqs], lora_slots=[r.lora_id for r in reqs])
        fb = self.make_forward_batch(batch, logit_offsets)
        return self.model(fb, self.attention)

    def _can_replay(self, batch: ScheduledBatch, logit_offsets: list[list[int]]) -> bool:
        """A decode batch that fits a captured graph and wants exactly each request's one logit row."""
        return (self.graph_runner is not None and batch.is_decode and len(batch.reqs) <= self.graph_runner.max_bs
                and all(n == 1 for n in batch.extend_lens) and all(o == [0] for o in logit_offsets))

    def make_forward_batch(self, batch: ScheduledBatch, logit_offsets: list[list[int]]) -> ForwardBatch:
        ids, positions, slots, logit_rows, starts = [], [], [], [], []
        for req, prefix, n, offs in zip(batch.reqs, batch.prefix_lens, batch.extend_lens, logit_offsets):
            starts.append(len(ids))
            logit_rows.extend(len(ids) + o for o in offs)
            ids.extend(req.ids_range(prefix, prefix + n))
            positions.extend(range(prefix, prefix + n))
            slots.append(req.slots[prefix: prefix + n])
        dev = self.device

        def t(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int64, device=dev)

        out_slots = torch.from_numpy(np.concatenate(slots).astype(np.int64)).to(dev)
        return ForwardBatch(
            is_decode=batch.is_decode, input_ids=t(ids), positions=t(positions), out_slots=out_slots,
            req_to_token=self.req_pool.table, req_rows=t([r.row for r in batch.reqs]),
            prefix_lens=t(batch.prefix_lens), extend_lens=t(batch.extend_lens),
            seq_lens=t([p + n for p, n in zip(batch.prefix_lens, batch.extend_lens)]),
            extend_starts=t(starts), logit_rows=t(logit_rows),
            prefix_lens_cpu=list(batch.prefix_lens), extend_lens_cpu=list(batch.extend_lens),
            lora=None if self.lora_slots is None else make_lora_batch(
                self.lora_slots, [r.lora_id for r in batch.reqs], list(batch.extend_lens), dev, dev.type == "cuda"))
