"""Extend (prefill) attention: new tokens attend to their cached prefix and causally to each other."""
from __future__ import annotations

import functools

import torch

from . import _triton as tr
from ._attention import (LOG2E, LOG2E_JIT, NO_WINDOW, attend_kv_range, dot_precision, gather_kv, softcap_args, softcap_scores,
                         softmax_with_sinks)
from ._checks import check, check_attention, check_index, check_same_device, check_scales, check_sinks
from ._triton import tl, triton
from .decode_attention import choose_kv_splits, merge_splits


def _check_extend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                  req_rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                  extend_starts: torch.Tensor, sm_scale: float, k_scale: float, v_scale: float,
                  max_extend_len: int | None, max_seq_len: int | None = None,
                  num_kv_splits: int | None = None, window: int | None = None, softcap: float | None = None,
                  sinks: torch.Tensor | None = None) -> None:
    check_attention(q, k_cache, v_cache, req_to_token, sm_scale, softcap)
    check_sinks(sinks, q)
    check(window is None or (isinstance(window, int) and not isinstance(window, bool) and window >= 1),
          f"window must be None or an int >= 1, got {window!r}")
    check_scales(k_scale, v_scale)
    batch = req_rows.shape[0] if isinstance(req_rows, torch.Tensor) else -1
    for name, t in (("req_rows", req_rows), ("prefix_lens", prefix_lens), ("extend_lens", extend_lens),
                    ("extend_starts", extend_starts)):
        check_index(name, t, batch)
    check(max_extend_len is None or (isinstance(max_extend_len, int) and max_extend_len >= 0),
          f"max_extend_len must be None or an int >= 0, got {max_extend_len!r}")
    check(max_seq_len is None or (isinstance(max_seq_len, int) and max_seq_len >= 0),
          f"max_seq_len must be None or an int >= 0, got {max_seq_len!r}")
    check(num_kv_splits is None or (isinstance(num_kv_splits, int) and 1 <= num_kv_splits <= 256),
          f"num_kv_splits must be None or an int in [1, 256], got {num_kv_splits!r}")
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, req_to_token=req_to_token, req_rows=req_rows,
                      prefix_lens=prefix_lens, extend_lens=extend_lens, extend_starts=extend_starts)


def extend_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                         req_rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                         extend_starts: torch.Tensor, sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                         max_extend_len: int | None = None, max_seq_len: int | None = None,
                         num_kv_splits: int | None = None, window: int | None = None,
                         softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of the new tokens of each request over its whole context (or its last
    `window` positions: a sliding window), scores soft-capped to softcap * tanh(score / softcap)
    where `softcap` is given; `sinks` [num_heads] (gpt-oss): each head's logit joins its
    softmax's denominator (a key without a value: see _attention.softmax_with_sinks).

        q rows:   | req0 new tokens | req1 new tokens | ...      [num_tokens, num_heads, head_dim]
                  ^ extend_starts[0] ^ extend_starts[1]
        context of req i: slots req_to_token[req_rows[i], :prefix_lens[i] + extend_lens[i]]

    Query j of request i (position p = prefix_lens[i] + j) sees positions 0..p, or with a
    `window` the positions p - window + 1..p (transformers' sliding window).
    The new tokens' K/V must already be stored. GQA: head h reads KV head
    h // (num_heads // num_kv_heads). uint8 caches hold fp8 e4m3, dequantized as
    fp8 * scale (scales are unused otherwise). Returns a new [num_tokens, num_heads,
    head_dim] tensor of q's dtype; rows no request covers are zero. fp32 math;
    the launch hints `max_extend_len`, `max_seq_len` and `num_kv_splits` are unused here.
    Memory: num_heads * extend_len * seq_len floats.
    """
    _check_extend(q, k_cache, v_cache, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts,
                  sm_scale, k_scale, v_scale, max_extend_len, max_seq_len, num_kv_splits, window, softcap, sinks)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    head_sinks = None if sinks is None else sinks.float().view(num_kv_heads, group, 1, 1)
    out = torch.zeros((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    per_req = zip(req_rows.tolist(), prefix_lens.tolist(), extend_lens.tolist(), extend_starts.tolist())
    for row, prefix_len, extend_len, start in per_req:
        if extend_len == 0:
            continue
        seq_len = prefix_len + extend_len
        slots = req_to_token[row, :seq_len]
        k = gather_kv(k_cache, slots, k_scale)  # [seq_len, num_kv_heads, head_dim]
        v = gather_kv(v_cache, slots, v_scale)
        qi = q[start:start + extend_len].to(torch.float32).reshape(extend_len, num_kv_heads, group, head_dim)
        scores = torch.einsum("ekgd,skd->kges", qi, k) * sm_scale  # [num_kv_heads, group, extend_len, seq_len]
        scores = softcap_scores(scores, softcap)
        query_pos = prefix_len + torch.arange(extend_len, device=q.device)
        key_pos = torch.arange(seq_len, device=q.device)[None, :]
        visible = key_pos <= query_pos[:, None]  # [extend_len, seq_len]
        if window is not None:
            visible &= key_pos > query_pos[:, None] - window
        probs = softmax_with_sinks(scores.masked_fill(~visible, float("-inf")), head_sinks)
        oi = torch.einsum("kges,skd->ekgd", probs, v)  # [extend_len, num_kv_heads, group, head_dim]
        out[start:start + extend_len] = oi.reshape(extend_len, num_heads, head_dim).to(q.dtype)
    return out


@triton.jit
def _extend_attention_kernel(
    q, k_cache, v_cache, out, part_out, part_lse, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts,
    sinks, qk_scale, v_scale, window, cap,
    stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
    stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head, stride_r2t_row, num_heads, num_splits,
    GROUP_SIZE: tl.constexpr, HEAD_BLOCKS: tl.constexpr, HEADS_PER_TILE: tl.constexpr,
    TOKENS_PER_TILE: tl.constexpr, HEAD_DIM: tl.constexpr, IS_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_WHILE: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    # grid: (request, KV head x HEAD_BLOCKS, token block x num_splits). A tile stacks the
    # query heads of one KV head into its M rows, token-major, so each K/V tile is loaded
    # once for all of them:
    #   tile row r:  token m_block * TOKENS_PER_TILE + r // HEADS_PER_TILE,
    #                query head kv_head * GROUP_SIZE + head_block * HEADS_PER_TILE + r % HEADS_PER_TILE
    req = tl.program_id(0)
    kv_head = tl.program_id(1) // HEAD_BLOCKS
    head_block = tl.program_id(1) % HEAD_BLOCKS
    m_block = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits
    extend_len = tl.load(extend_lens + req).to(tl.int32)
    if m_block * TOKENS_PER_TILE >= extend_len:
        return
    prefix_len = tl.load(prefix_lens + req).to(tl.int32)
    first_tok = tl.load(extend_starts + req).to(tl.int64)
    row = tl.load(req_rows + req).to(tl.int64)

    offs_r = tl.arange(0, BLOCK_M)
    offs_t = m_block * TOKENS_PER_TILE + offs_r // HEADS_PER_TILE  # [BLOCK_M] token within the extend
    offs_g = head_block * HEADS_PER_TILE + offs_r % HEADS_PER_TILE  # [BLOCK_M] head within the group
    mask_r = (offs_r < TOKENS_PER_TILE * HEADS_PER_TILE) & (offs_t < extend_len) & (offs_g < GROUP_SIZE)
    heads = kv_head * GROUP_SIZE + offs_g
    toks = first_tok + offs_t
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask_rd = mask_r[:, None] & mask_d[None, :]
    q_blk = tl.load(q + toks[:, None] * stride_q_tok + heads[:, None] * stride_q_head + offs_d[None, :],
                    mask=mask_rd, other=0.0)  # [BLOCK_M, BLOCK_D]

    # the tile's last query sits at prefix_len + min(end of tile, extend_len) - 1; its first one,
    # at prefix_len + m_block * TOKENS_PER_TILE, sees nothing before its window
    hi = prefix_len + tl.minimum((m_block + 1) * TOKENS_PER_TILE, extend_len)
    base = tl.maximum(prefix_len + m_block * TOKENS_PER_TILE - window + 1, 0) // BLOCK_N * BLOCK_N
    #   context [base, hi): | split 0 | split 1 | ... | empty splits |, each split_len long (a
    #   multiple of BLOCK_N); an empty split, or one past a row's causal limit or window, gives lse -inf
    split_len = (hi - base + num_splits * BLOCK_N - 1) // (num_splits * BLOCK_N) * BLOCK_N
    lo = base + split * split_len
    hi = tl.minimum(lo + split_len, hi)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # see attend_kv_range
    acc, l_i, m_i = attend_kv_range(
        acc, l_i, m_i, q_blk, k_cache + kv_head * stride_kc_head, v_cache + kv_head * stride_vc_head,
        req_to_token + row * stride_r2t_row, lo, hi, prefix_len + offs_t, window, qk_scale, cap,
        stride_kc_slot, stride_vc_slot, offs_d, mask_d, BLOCK_N, IS_FP8, DOT_PRECISION, USE_WHILE, SOFTCAP)

    has_keys = l_i > 0
    l_safe = tl.where(has_keys, l_i, 1.0)
    if not IS_SPLIT:
        if HAS_SINKS:  # the head's sink joins the denominator (split launches add it in the merge)
            sink = tl.load(sinks + heads, mask=mask_r, other=0.0).to(tl.float32) * LOG2E_JIT
            m_s = tl.maximum(m_i, sink)
            alpha = tl.exp2(m_i - m_s)
            acc = acc * alpha[:, None]
            l_safe = l_i * alpha + tl.exp2(sink - m_s)
        o = acc / l_safe[:, None] * v_scale
        o_ptrs = out + toks[:, None] * stride_o_tok + heads[:, None] * stride_o_head + offs_d[None, :]
        tl.store(o_ptrs, o.to(out.dtype.element_ty), mask=mask_rd)
    else:
        # scratch as decode's: part_out [num_tokens, num_heads, num_splits, HEAD_DIM], part_lse without HEAD_DIM
        part = (toks * num_heads + heads) * num_splits + split  # [BLOCK_M]
        lse = tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf"))  # log2 domain
        tl.store(part_out + part[:, None] * HEAD_DIM + offs_d[None, :], acc / l_safe[:, None], mask=mask_rd)
        tl.store(part_lse + part, lse, mask=mask_r)


def _launch_config(dtype: torch.dtype, block_d: int, is_cuda: bool, fp8_kv: bool = False) -> dict[str, int]:
    """Tile sizes. head_dim <= 128, bf16/fp16 K/V: timed on an H200 (triton 3.6, benchmarks/attention_kernels.py
    --extend-sweep, results/gpu_h200_s25/), the fastest of eight at five of its six shapes and
    1.4-1.9x faster than the 64 x 32 tile of 8 warps at all six, register spills (552 bytes under
    triton 3.6) included. fp8 K/V keeps that older tile
    (chosen from sm90 compiles without spills, tests/kernels/test_compile_sm90.py): the new one
    spills more there and was not timed with it."""
    if not is_cuda:  # interpreter: fewer, larger blocks run faster
        return dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=1)
    if dtype == torch.float32 or block_d > 128:  # larger tiles spill
        return dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2)
    if fp8_kv:
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2)
    return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)


def stack_heads(group: int, block_m: int) -> tuple[int, int, int]:
    """(head_blocks, heads_per_tile, tokens_per_tile): how a KV head's `group` query heads
    share tiles of `block_m` rows. Up to block_m heads go in one tile (all of them, with
    block_m // group tokens); a larger group is cut into head blocks of equal size, one token each.
    """
    head_blocks = -(-group // block_m)
    heads_per_tile = -(-group // head_blocks)
    return head_blocks, heads_per_tile, block_m // heads_per_tile


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_extend_splits(num_tiles: int, max_seq_len: int, num_sms: int) -> int:
    """KV splits for an extend whose launch has `num_tiles` programs per split: as decode's
    (choose_kv_splits), enough programs to give every SM two, no split under MIN_SPLIT_LEN.

    A 16-token turn on a 100K-token prefix, Llama-3-8B shapes (8 KV heads, 16 tokens x 4 query
    heads per tile): 8 tiles on 132 SMs get 33 splits; a 4K-token prefill (2,048 tiles) gets 1.
    """
    return choose_kv_splits(num_tiles, 1, max_seq_len, num_sms)


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                     req_rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                     extend_starts: torch.Tensor, sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                     max_extend_len: int | None = None, max_seq_len: int | None = None,
                     num_kv_splits: int | None = None, window: int | None = None,
                     softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Triton twin of `extend_attention_ref` (same contract).

    One launch for all requests: grid (batch, num_kv_heads * head_blocks, token tiles * splits),
    a tile holding a KV head's query heads for a few tokens (see stack_heads). With more than one
    KV split, each split's partial softmax goes to fp32 scratch and a second launch (decode's
    stage 2, one program per token and head) merges them; the split count is a runtime argument,
    so the per-step choice compiles two variants at most. `num_kv_splits` None: chosen on CUDA
    from `max_seq_len` (the longest prefix + extend) and the SM count, else 1.
    Pass `max_extend_len` (an upper bound is fine) to avoid a device-to-host sync.
    The caller must keep num_tokens >= every extend_starts[i] + extend_lens[i]
    (not checked: that would sync).
    """
    _check_extend(q, k_cache, v_cache, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts,
                  sm_scale, k_scale, v_scale, max_extend_len, max_seq_len, num_kv_splits, window, softcap, sinks)
    tr.require_triton("extend_attention")
    num_tokens, num_heads, head_dim = q.shape
    batch, num_kv_heads = req_rows.shape[0], k_cache.shape[1]
    group = num_heads // num_kv_heads
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max()) if batch else 0
    if batch == 0 or num_tokens == 0 or max_extend_len == 0:
        return torch.zeros((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    is_fp8 = k_cache.dtype == torch.uint8
    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs K >= 16
    cfg = _launch_config(q.dtype, block_d, q.is_cuda, is_fp8)
    head_blocks, heads_per_tile, tokens_per_tile = stack_heads(group, cfg["BLOCK_M"])
    num_tiles = batch * num_kv_heads * head_blocks * triton.cdiv(max_extend_len, tokens_per_tile)
    if window is not None and max_seq_len is not None:  # a tile reads its window and its own tokens
        max_seq_len = min(max_seq_len, window + tokens_per_tile)
    if num_kv_splits is None:
        use_splits = q.is_cuda and max_seq_len is not None
        num_kv_splits = choose_extend_splits(num_tiles, max_seq_len, _num_sms(q.device)) if use_splits else 1
    if num_kv_splits == 1:  # the kernel writes the output itself; rows no request covers stay zero
        out = torch.zeros((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
        part_out = part_lse = out  # unused
    else:  # rows no request covers keep lse -inf in every split: the merge writes zeros there
        out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
        part_out = torch.empty((num_tokens, num_heads, num_kv_splits, head_dim), dtype=torch.float32, device=q.device)
        part_lse = torch.full((num_tokens, num_heads, num_kv_splits), float("-inf"), device=q.device)
    grid = (batch, num_kv_heads * head_blocks, triton.cdiv(max_extend_len, tokens_per_tile) * num_kv_splits)
    cap, use_cap = softcap_args(softcap)
    _extend_attention_kernel[grid](
        q, k_cache, v_cache, out, part_out, part_lse, req_to_token, req_rows, prefix_lens, extend_lens, extend_starts,
        q if sinks is None else sinks, sm_scale * (k_scale if is_fp8 else 1.0) * LOG2E, v_scale if is_fp8 else 1.0,
        NO_WINDOW if window is None else window, cap,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), req_to_token.stride(0),
        num_heads, num_kv_splits, GROUP_SIZE=group, HEAD_BLOCKS=head_blocks, HEADS_PER_TILE=heads_per_tile,
        TOKENS_PER_TILE=tokens_per_tile, HEAD_DIM=head_dim, IS_SPLIT=num_kv_splits > 1, BLOCK_D=block_d,
        IS_FP8=is_fp8, DOT_PRECISION=dot_precision(q.dtype), USE_WHILE=tr.use_while_loop(q.device), SOFTCAP=use_cap,
        HAS_SINKS=sinks is not None, **cfg,
    )
    if num_kv_splits > 1:
        merge_splits(part_out, part_lse, out, v_scale if is_fp8 else 1.0, sinks)
    return out
