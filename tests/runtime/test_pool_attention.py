"""PoolAttention: per-step decode splits on the Triton path, the planned CPU decode path, both against the reference."""
from __future__ import annotations

import torch

from radixflow import kernels
from radixflow.runtime.model.attention import AttentionOps, PoolAttention
from radixflow.runtime.core.forward_batch import ForwardBatch
from radixflow.runtime.core.kv_pool import KVPool


def _decode_batch(pool: KVPool, seq_lens: list[int], gen: torch.Generator) -> ForwardBatch:
    """Requests whose first seq_len - 1 tokens are stored at scattered slots; one new token each."""
    table = torch.zeros(len(seq_lens) + 1, max(seq_lens) + 3, dtype=torch.int32)
    slots = (torch.randperm(pool.num_slots - 1, generator=gen) + 1).tolist()
    for i, n in enumerate(seq_lens):
        table[i + 1, :n] = torch.tensor([slots.pop() for _ in range(n)], dtype=torch.int32)
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    rows = list(range(1, len(seq_lens) + 1))
    return ForwardBatch(
        is_decode=True, input_ids=t([0] * len(seq_lens)), positions=t([n - 1 for n in seq_lens]),
        out_slots=t([int(table[r, n - 1]) for r, n in zip(rows, seq_lens)]), req_to_token=table,
        req_rows=t(rows), prefix_lens=t([n - 1 for n in seq_lens]), extend_lens=t([1] * len(seq_lens)),
        seq_lens=t(seq_lens), extend_starts=t(list(range(len(seq_lens)))), logit_rows=t(list(range(len(seq_lens)))),
        prefix_lens_cpu=[n - 1 for n in seq_lens], extend_lens_cpu=[1] * len(seq_lens))


def _run_layers(backend: str, fp8: bool, num_kv_splits: int | None) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    pool = KVPool(600, 3, 2, 16, torch.float32, torch.device("cpu"), fp8=fp8)
    for caches in (pool.k_caches, pool.v_caches):
        for c in caches:
            c.copy_(kernels.quantize_fp8(torch.randn(c.shape, generator=gen), 1.0) if fp8 else torch.randn(c.shape, generator=gen))
    attn = PoolAttention(pool, AttentionOps.for_backend(backend), 0.25, num_kv_splits)
    outs = []
    for seq_lens in ([300, 7, 1], [5, 260]):  # two steps: the CPU plan must follow the new batch
        fb = _decode_batch(pool, seq_lens, gen)
        for layer in range(3):
            q = torch.randn(len(seq_lens), 4, 16, generator=gen)
            kv = torch.randn(2, len(seq_lens), 2, 16, generator=gen)
            outs.append(attn(layer, q, kv[0], kv[1], fb))
    return outs


def test_triton_per_step_splits_and_torch_plan_agree_with_reference():
    want = _run_layers("torch", False, 1)
    triton_outs = _run_layers("triton", False, None)
    for got, ref in zip(triton_outs, want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_torch_plan_with_fp8_cache_matches_checked_path():
    # layer 0 runs the checked decode_attention_torch; layers 1-2 the planned fast path
    outs = _run_layers("torch", True, 1)
    assert all(o.isfinite().all() for o in outs)
    gen = torch.Generator().manual_seed(0)
    pool = KVPool(600, 3, 2, 16, torch.float32, torch.device("cpu"), fp8=True)
    for caches in (pool.k_caches, pool.v_caches):
        for c in caches:
            c.copy_(kernels.quantize_fp8(torch.randn(c.shape, generator=gen), 1.0))
    fb = _decode_batch(pool, [300, 7, 1], gen)
    for layer in range(3):
        q = torch.randn(3, 4, 16, generator=gen)
        kv = torch.randn(2, 3, 2, 16, generator=gen)
        kernels.store_kv_ref(pool.k_caches[layer], pool.v_caches[layer], fb.out_slots, kv[0], kv[1])
        ref = kernels.decode_attention_ref(q, pool.k_caches[layer], pool.v_caches[layer], fb.req_to_token,
                                           fb.req_rows, fb.seq_lens, 0.25)
        torch.testing.assert_close(outs[layer], ref, rtol=1e-5, atol=1e-5)


def test_kv_splits_for_uses_fixed_count_or_choice():
    pool = KVPool(16, 1, 8, 16, torch.float32, torch.device("cpu"))
    ops = AttentionOps.for_backend("triton")
    assert PoolAttention(pool, ops, 1.0, 3).kv_splits_for(1, 10_000) == 3
    per_step = PoolAttention(pool, ops, 1.0, None)
    assert per_step.kv_splits_for(1, 10_000) == kernels.choose_kv_splits(1, 8, 10_000, per_step.num_sms)


def test_pool_hands_out_ascending_runs_and_a_freed_run_comes_back_in_order():
    """A fresh pool's allocations are ascending runs, back to back (a long prefill in chunks is
    one run, which CPU attention reads as a view); a freed run is handed out again in its order."""
    pool = KVPool(100, 1, 1, 1, torch.float32, torch.device("cpu"))
    a, b = pool.alloc(10), pool.alloc(5)
    assert a.tolist() == list(range(1, 11)) and b.tolist() == list(range(11, 16))
    pool.free(a)
    assert pool.alloc(10).tolist() == list(range(1, 11))
    pool.free(b[::-1])  # freed in any order: handed out as freed
    assert pool.alloc(5).tolist() == list(range(15, 10, -1))
    assert pool.num_free == 99 - 15


def _mixed_batch(pool: KVPool, prefill: list[tuple[int, int]], decode_lens: list[int], gen: torch.Generator) -> ForwardBatch:
    """Prefill rows (prefix, new tokens) then decode rows (context after the new token), at
    scattered slots: a mixed step's layout."""
    rows = [(p, n) for p, n in prefill] + [(n - 1, 1) for n in decode_lens]
    table = torch.zeros(len(rows) + 1, max(p + n for p, n in rows) + 2, dtype=torch.int32)
    slots = (torch.randperm(pool.num_slots - 1, generator=gen) + 1).tolist()
    out_slots, positions, starts, total = [], [], [], 0
    for i, (p, n) in enumerate(rows):
        table[i + 1, :p + n] = torch.tensor([slots.pop() for _ in range(p + n)], dtype=torch.int32)
        out_slots += table[i + 1, p:p + n].tolist()
        positions += list(range(p, p + n))
        starts.append(total)
        total += n
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    return ForwardBatch(
        is_decode=False, input_ids=t([0] * total), positions=t(positions), out_slots=t(out_slots),
        req_to_token=table, req_rows=t(list(range(1, len(rows) + 1))), prefix_lens=t([p for p, _ in rows]),
        extend_lens=t([n for _, n in rows]), seq_lens=t([p + n for p, n in rows]), extend_starts=t(starts),
        logit_rows=t(starts), prefix_lens_cpu=[p for p, _ in rows], extend_lens_cpu=[n for _, n in rows])


def test_mixed_step_attends_to_its_decode_rows_apart_as_to_the_whole_batch():
    """The torch backend attends to a mixed step's decode rows through its batched decode path
    (`ForwardBatch.parts`); the outputs and the stored K/V equal one extend over the batch."""
    import dataclasses

    outs = {}
    for split in (False, True):
        gen = torch.Generator().manual_seed(3)
        pool = KVPool(900, 3, 2, 16, torch.float32, torch.device("cpu"))
        for caches in (pool.k_caches, pool.v_caches):
            for c in caches:
                c.copy_(torch.randn(c.shape, generator=gen))
        attn = PoolAttention(pool, AttentionOps.for_backend("torch"), 0.25, 1)
        fb = _mixed_batch(pool, [(0, 9), (40, 5)], [300, 7, 1, 64], gen)
        if split:
            fb = dataclasses.replace(fb, parts=fb.split(2))
            head, tail = fb.parts
            assert head.num_tokens == 14 and tail.is_decode and tail.batch_size == 4
        got = []
        for layer in range(3):
            q = torch.randn(fb.num_tokens, 4, 16, generator=gen)
            kv = torch.randn(2, fb.num_tokens, 2, 16, generator=gen)
            got.append(attn(layer, q, kv[0], kv[1], fb))
        outs[split] = got, [c.clone() for c in pool.k_caches + pool.v_caches]
    for a, b in zip(outs[False][0], outs[True][0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for a, b in zip(outs[False][1], outs[True][1]):
        assert torch.equal(a, b)
