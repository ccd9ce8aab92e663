"""CPU attention at the `small` demo model's head shapes: the torch references vs the CPU-fast twins.

    python benchmarks/cpu_attention.py                 # fp32 cache, ~1-2 minutes on 2 cores
    python benchmarks/cpu_attention.py --fp8 --repeats 1

One "step" is `--layers` calls (12, the small model's layer count) over one pool whose
slots are shuffled, as the radix cache hands them out. Decode: 64 requests x ~1,050-token
contexts; extend: 8 requests x 1,025 new tokens, no prefix. Times are the best of
`--repeats` steps (the machine may be shared). The hardware yardsticks are the K/V bytes
gathered per second against a large-copy bandwidth measured here, and GFLOP/s of the
attention matmuls (causal FLOPs for extend).
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from radixflow.kernels import (decode_attention_ref, decode_attention_torch, extend_attention_ref,
                               extend_attention_torch, quantize_fp8)

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 12, 4, 64  # runtime/data small model
DECODE_BATCH, DECODE_CONTEXT = 64, 1050
EXTEND_BATCH, EXTEND_LEN = 8, 1025


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def make_pool(seq_lens: list[int], fp8: bool, gen: torch.Generator
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple[float, float]]:
    """Caches [num_slots, NUM_KV_HEADS, HEAD_DIM] (slot 0 NaN), a shuffled slot table, its row ids."""
    num_slots = sum(seq_lens) + 1
    k = torch.randn(num_slots, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(num_slots, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    k[0] = v[0] = float("nan")
    scales = (0.05, 0.05) if fp8 else (1.0, 1.0)
    if fp8:
        k, v = quantize_fp8(k, scales[0]), quantize_fp8(v, scales[1])
    slot_ids = torch.randperm(num_slots - 1, generator=gen).to(torch.int32) + 1
    req_to_token = torch.zeros(len(seq_lens), max(seq_lens) + 8, dtype=torch.int32)
    offset = 0
    for row, seq_len in enumerate(seq_lens):
        req_to_token[row, :seq_len] = slot_ids[offset:offset + seq_len]
        offset += seq_len
    return k, v, req_to_token, torch.arange(len(seq_lens)), scales


def copy_gbps() -> float:
    """Bandwidth of a 256 MiB clone, bytes read + written."""
    src = torch.empty(64 << 20, dtype=torch.float32).uniform_()
    return 2 * src.numel() * 4 / best_ms(src.clone, 3) / 1e6


def report(name: str, ref_ms: float, fast_ms: float, kv_bytes: int, flops: float, peak_gbps: float) -> None:
    for label, ms in (("ref", ref_ms), ("torch", fast_ms)):
        gbps = kv_bytes / ms / 1e6
        print(f"{name:7s} {label:6s} {ms:9.1f} ms/step  K/V {gbps:6.2f} GB/s ({gbps / peak_gbps:5.1%} of copy)"
              f"  {flops / ms / 1e6:6.1f} GFLOP/s")
    print(f"{name:7s} speedup {ref_ms / fast_ms:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fp8", action="store_true", help="fp8 e4m3 cache (uint8 storage + scales)")
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    sm_scale = HEAD_DIM ** -0.5
    peak = copy_gbps()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, copy bandwidth {peak:.1f} GB/s, "
          f"kv cache {'fp8' if args.fp8 else 'fp32'}, {args.layers} layers per step")
    kv_elem_bytes = 1 if args.fp8 else 4

    seq_lens = torch.randint(DECODE_CONTEXT - 20, DECODE_CONTEXT + 21, (DECODE_BATCH,), generator=gen)
    k, v, table, rows, (ks, vs) = make_pool(seq_lens.tolist(), args.fp8, gen)
    q = torch.randn(DECODE_BATCH, NUM_HEADS, HEAD_DIM, generator=gen)
    decode_args = (q, k, v, table, rows, seq_lens, sm_scale, ks, vs)
    torch.testing.assert_close(decode_attention_torch(*decode_args), decode_attention_ref(*decode_args),
                               rtol=1e-5, atol=1e-5)
    tokens = int(seq_lens.sum())
    kv_bytes = args.layers * 2 * tokens * NUM_KV_HEADS * HEAD_DIM * kv_elem_bytes
    flops = args.layers * 4 * tokens * NUM_HEADS * HEAD_DIM
    ref_ms, fast_ms = (best_ms(lambda op=op: [op(*decode_args) for _ in range(args.layers)], args.repeats)
                       for op in (decode_attention_ref, decode_attention_torch))
    report("decode", ref_ms, fast_ms, kv_bytes, flops, peak)

    extend_lens = torch.full((EXTEND_BATCH,), EXTEND_LEN)
    k, v, table, rows, (ks, vs) = make_pool(extend_lens.tolist(), args.fp8, gen)
    q = torch.randn(EXTEND_BATCH * EXTEND_LEN, NUM_HEADS, HEAD_DIM, generator=gen)
    extend_args = (q, k, v, table, rows, torch.zeros_like(extend_lens), extend_lens,
                   torch.arange(EXTEND_BATCH) * EXTEND_LEN, sm_scale, ks, vs)
    torch.testing.assert_close(extend_attention_torch(*extend_args), extend_attention_ref(*extend_args),
                               rtol=1e-5, atol=1e-5)
    kv_bytes = args.layers * 2 * EXTEND_BATCH * EXTEND_LEN * NUM_KV_HEADS * HEAD_DIM * kv_elem_bytes
    flops = args.layers * EXTEND_BATCH * 2 * EXTEND_LEN * (EXTEND_LEN + 1) * NUM_HEADS * HEAD_DIM  # causal half
    ref_ms, fast_ms = (best_ms(lambda op=op: [op(*extend_args) for _ in range(args.layers)], args.repeats)
                       for op in (extend_attention_ref, extend_attention_torch))
    report("extend", ref_ms, fast_ms, kv_bytes, flops, peak)


if __name__ == "__main__":
    main()
