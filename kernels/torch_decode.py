"""CPU-fast torch decode attention: a step's contexts gathered in chunks of rows of like length,
each padded to its longest row, and context prefixes that several requests share (the radix
cache's shared KV slots) read once for all of them.

    request i's context:  | shared prefix of its group (if any) | its own suffix |
    attention:            one matmul for the group's queries    + per-request padded gather
                          └──────────── merged by their softmax statistics ────────────┘

Without sharing, a 1,024-token few-shot prefix is read (gathered, fp32) once per request; shared,
once per group of n requests, its n x group query heads the rows of one matmul per KV head.

Where the native kernels build (kernels/native.py; fp32 / bf16 caches) the decode kernel reads each
request's own suffix in place, and a shared prefix that spares enough reads once, by the decode
kernel (up to 64 query heads) or the extend kernel (more). The gathered chunks are the fallback
(no C compiler, fp16 or fp8 caches, RADIXFLOW_NATIVE_KERNELS=0).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import native
from ._attention import sink_scale, softcap_scores, softmax_with_sinks
from .decode_attention import _check_decode

# Context tokens gathered at once by decode (see decode_attention_gathered): rows of like length,
# each chunk padded to its longest row.
GATHER_CHUNK_TOKENS = 1024
# A prefix is read once for its requests when at least this many of their leading slots are the
# same (and at least two requests share it). Shared prefixes are read in chunks of this many tokens.
MIN_SHARED_PREFIX_TOKENS = 64
SHARED_CHUNK_TOKENS = 4096
# A row whose own context is longer is read by itself in chunks of SHARED_CHUNK_TOKENS (as a
# shared prefix of one) rather than gathered whole: a 100K-token row's K alone would be ~77 MB of
# fp32 per layer at 3 KV heads x 64.
LONG_ROW_TOKENS = 4096
# The native kernel cuts a context into pieces for idle threads (fewer requests than threads) only
# in pieces of at least this many tokens: a thread's share must outweigh merging the pieces.
SPLIT_PIECE_TOKENS = 2048
# The native kernels read a shared prefix once only where that spares this many token reads (its
# length times the other members): below, splitting and merging cost more (benchmarks/README.md).
NATIVE_SHARED_MIN_READS = 16384


Parts = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (row max, sum of exp, unnormalized output)


@dataclass(frozen=True)
class SharedPrefix:
    """Batch rows `rows` whose contexts all begin with the KV at `slots`."""

    rows: torch.Tensor   # [n] int64, n >= 2
    slots: torch.Tensor  # [prefix_len] int64
    pieces: NativeRows | None = None  # native plans: the prefix as the kernel's pieces (one per idle thread)


@dataclass(frozen=True)
class GatherChunk:
    """Batch rows whose own contexts are gathered together, padded to the longest of them:

        slots row i:  | rows[i]'s own slot ids | its first own slot, repeated (hidden) |
                      0                        its own length                          length

    Padding repeats a slot the request owns, so no stale table entry or the dummy slot 0 (any
    bytes) is read; hidden columns get probability 0. Rows: span[0]..span[1] of the `order`."""

    rows: torch.Tensor     # [n] int64 batch rows, longest first
    slots: torch.Tensor    # [n * length] int64, row-major [n, length]
    visible: torch.Tensor  # [n, 1, 1, length] bool
    length: int
    span: tuple[int, int]


@dataclass(frozen=True)
class NativeRows:
    """Every request's own slots, flat in batch order, for the native kernel (kernels/native.py):
    piece i reads slots[offsets[i]:offsets[i + 1]]. A piece is a whole request, or (`rows` set)
    part of one: with more threads than requests, a long context is cut into pieces the threads
    read at once, merged by their softmax statistics (the kernel splits the batch by piece)."""

    slots: torch.Tensor    # [sum of own lengths] int64
    offsets: torch.Tensor  # [pieces + 1] int64
    rows: torch.Tensor | None = None  # [pieces] int64: each piece's batch row; None: piece i is row i


@dataclass(frozen=True)
class DecodeGather:
    """A decode step's context layout, computed once and shared by every layer.

    A request's own slots are its whole context, or what follows its group's shared prefix
    (`shared`). Rows are sorted by own length (`order`) and gathered in chunks of like length
    (`chunks`, about GATHER_CHUNK_TOKENS slots each): a batch of mixed lengths reads close to the
    sum of its lengths, not its size times the longest. A seq_len 0 row (CUDA-graph padding)
    reads one column, zeroed afterwards. A row whose own part passes LONG_ROW_TOKENS (`long`)
    keeps one column in its chunk (its first own slot, a placeholder) and is read by itself."""

    chunks: list[GatherChunk]
    empty: torch.Tensor  # [batch, 1, 1] bool, rows with seq_len 0
    shared: list[SharedPrefix] = field(default_factory=list)
    long: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (batch row, its own slots [n] int64)
    order: torch.Tensor | None = None  # [batch] int64 batch rows, longest first; None: the batch's own order
    native: NativeRows | None = None  # set: the own parts go to the native kernel (no chunks, no long rows)


def plan_decode(req_to_token: torch.Tensor, req_rows: torch.Tensor, seq_lens: torch.Tensor,
                use_native: bool = False) -> DecodeGather:
    """The layout of a decode step, its shared prefixes found; a few host syncs. `use_native`:
    the requests' own slots flat for the native kernel instead of gathered chunks."""
    batch = seq_lens.shape[0]
    max_len = max(int(seq_lens.max()), 1) if batch else 1
    table = req_to_token[req_rows.long(), :max_len].long()  # [batch, max_len]
    shared, starts = _shared_prefixes(table, seq_lens, NATIVE_SHARED_MIN_READS if use_native else 0)
    if use_native:
        threads = torch.get_num_threads()
        cols = torch.arange(max_len, device=table.device)[None, :]
        own = (cols >= starts[:, None]) & (cols < seq_lens[:, None])
        shared = [SharedPrefix(p.rows, p.slots, _native_rows(p.slots, torch.tensor([p.slots.shape[0]]), threads))
                  for p in shared]
        return DecodeGather([], (seq_lens == 0)[:, None, None], shared,
                            native=_native_rows(table[own], own.sum(dim=1), threads))
    first = starts.tolist()
    own = (seq_lens - starts).tolist()
    long = [(r, table[r, first[r]: first[r] + n].clone()) for r, n in enumerate(own) if n > LONG_ROW_TOKENS]
    lengths = [1 if n > LONG_ROW_TOKENS else max(n, 1) for n in own]  # a long row: its placeholder column
    order = sorted(range(batch), key=lambda r: -lengths[r])
    order_t = torch.tensor(order, dtype=torch.int64, device=table.device)
    in_order = order == list(range(batch))
    return DecodeGather(_chunks(table, starts, lengths, order, order_t), (seq_lens == 0)[:, None, None], shared,
                        long, None if in_order else order_t)


def _native_rows(slots: torch.Tensor, lengths: torch.Tensor, threads: int) -> NativeRows:
    """The native kernel's pieces: a request each, or, when there are fewer requests than threads,
    long contexts cut into up to threads // batch pieces of at least SPLIT_PIECE_TOKENS."""
    batch = lengths.shape[0]
    offsets = torch.zeros(batch + 1, dtype=torch.int64, device=slots.device)
    torch.cumsum(lengths, 0, out=offsets[1:])
    if batch == 0 or threads < 2 * batch or int(lengths.max()) < 2 * SPLIT_PIECE_TOKENS:
        return NativeRows(slots, offsets)
    most = threads // batch
    starts, rows = [], []
    for b, (a, n) in enumerate(zip(offsets[:-1].tolist(), lengths.tolist())):
        pieces = max(1, min(most, n // SPLIT_PIECE_TOKENS))
        starts += [a + n * k // pieces for k in range(pieces)]
        rows += [b] * pieces
    bounds = torch.tensor(starts + [int(offsets[-1])], dtype=torch.int64, device=slots.device)
    return NativeRows(slots, bounds, torch.tensor(rows, dtype=torch.int64, device=slots.device))


def _chunks(table: torch.Tensor, starts: torch.Tensor, lengths: list[int], order: list[int],
            order_t: torch.Tensor) -> list[GatherChunk]:
    """The rows in `order` (longest own length first; `lengths`, from `starts` on in `table`;
    `order_t` the same as a tensor), cut into chunks of about GATHER_CHUNK_TOKENS slots, each
    padded to its first row's length."""
    chunks, i = [], 0
    while i < len(order):
        length = lengths[order[i]]
        j = min(len(order), i + max(1, GATHER_CHUNK_TOKENS // length))
        rows = order_t[i:j]
        own = torch.tensor([lengths[r] for r in order[i:j]], device=table.device)
        cols = (starts[rows, None] + torch.arange(length, device=table.device)[None, :]).clamp_(max=table.shape[1] - 1)
        slots = table[rows[:, None], cols]
        visible = torch.arange(length, device=table.device)[None, :] < own[:, None]
        slots = torch.where(visible, slots, slots[:, :1])
        chunks.append(GatherChunk(rows, slots.reshape(-1), visible[:, None, None, :], length, (i, j)))
        i = j
    return chunks


def _shared_prefixes(table: torch.Tensor, seq_lens: torch.Tensor,
                     min_reads: int) -> tuple[list[SharedPrefix], torch.Tensor]:
    """Groups of rows whose first MIN_SHARED_PREFIX_TOKENS or more slots are the same (sparing
    min_reads token reads or more), each with its longest common prefix (short of every member's
    last token), and each row's prefix length (0 outside the groups). Grouped by first slot."""
    starts = torch.zeros_like(seq_lens)
    candidates = (seq_lens > MIN_SHARED_PREFIX_TOKENS).nonzero().flatten()
    if candidates.numel() < 2:
        return [], starts
    firsts, group_of, counts = torch.unique(table[candidates, 0], return_inverse=True, return_counts=True)
    shared = []
    for g in (counts >= 2).nonzero().flatten().tolist():
        rows = candidates[group_of == g]
        cap = int(seq_lens[rows].min()) - 1  # every member's last token is its own
        same = (table[rows, :cap] == table[rows[:1], :cap]).all(dim=0)
        differs = (~same).nonzero()
        prefix_len = int(differs[0]) if differs.numel() else cap
        if prefix_len >= MIN_SHARED_PREFIX_TOKENS and (rows.numel() - 1) * prefix_len >= min_reads:
            shared.append(SharedPrefix(rows, table[rows[0], :prefix_len].clone()))
            starts[rows] = prefix_len
    return shared, starts


def _gather_padded(cache: torch.Tensor, slots: torch.Tensor, max_len: int, dtype: torch.dtype,
                   scale: float) -> torch.Tensor:
    """cache rows at slots [rows * max_len] as a contiguous [rows, num_kv_heads, max_len, head_dim]
    of `dtype`: the conversion and the head-major transpose in one copy (a matmul over a permuted
    view would copy it again)."""
    num_kv_heads, head_dim = cache.shape[1:]
    rows = cache.index_select(0, slots)  # [rows * max_len, num_kv_heads, head_dim]
    if cache.dtype == torch.uint8:
        rows = rows.view(torch.float8_e4m3fn)
    heads = rows.view(-1, max_len, num_kv_heads, head_dim).transpose(1, 2)
    out = torch.empty(heads.shape, dtype=dtype, device=cache.device).copy_(heads)
    return out.mul_(scale) if cache.dtype == torch.uint8 and scale != 1.0 else out


def decode_attention_gathered(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodeGather,
                              sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                              softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention of q [batch, num_heads, head_dim] over the contexts of `plan`: per chunk of
    requests of like length, one gather per cache (to fp32) and two matmuls with a KV head's query heads stacked
    as rows (GQA); each shared prefix once for its requests, merged by softmax statistics; a row
    with a long own context by itself, in chunks (as a shared prefix of one).
    Unchecked: the engine's per-layer hot path, with inputs `decode_attention_torch` validates.
    Math in fp32 whatever the cache dtype; returns q's dtype. A `softcap` needs a plan without the
    native kernel (plan_decode(use_native=False)), which has none. `sinks` [num_heads]: each head's
    sink logit joins its denominator (the native kernel's outputs rescaled by their log-sum-exp).

    NOTE: not SDPA: for one query per request torch's CPU flash kernel ran ~7x slower than these
    two matmuls in bf16 (~1 ms vs 0.14-0.19 ms at 4 requests x 260 tokens, 9/3 heads, one core),
    60% of SmolLM2's bf16 decode step at batch 16. Chunks of about GATHER_CHUNK_TOKENS context
    tokens keep the gathered K/V in cache between the gather and the matmuls; one gather of a
    whole large batch ran ~3x slower (one core).
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    if plan.native is not None:
        assert softcap is None, "the native decode kernel has no soft-cap: plan with use_native=False"
        return _native_decode(q, k_cache, v_cache, plan, sm_scale, sinks)
    qg = q.to(torch.float32).view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    head_sinks = None if sinks is None else sinks.float().view(num_kv_heads, num_heads // num_kv_heads)
    order = plan.order
    qs = qg if order is None else qg.index_select(0, order)  # rows longest first: the chunks are spans
    if not plan.shared and not plan.long:
        out = torch.empty(batch, num_heads, head_dim, dtype=q.dtype, device=q.device)
        for chunk, k, v in _own_chunks(k_cache, v_cache, plan, k_scale, v_scale):
            a, b = chunk.span
            scores = torch.matmul(qs[a:b], k.transpose(-1, -2)).mul_(sm_scale)  # [rows, num_kv_heads, group, length]
            softcap_scores(scores, softcap).masked_fill_(~chunk.visible, float("-inf"))
            probs = softmax_with_sinks(scores, None if head_sinks is None else head_sinks[..., None])
            o = torch.matmul(probs, v)  # [rows, num_kv_heads, group, head_dim]
            out[a:b] = o.view(b - a, num_heads, head_dim)
        return _unsorted(out, order).masked_fill_(plan.empty, 0.0)
    m = torch.empty(qg.shape[:-1], dtype=torch.float32, device=q.device)  # [batch, num_kv_heads, group]
    l, o = torch.empty_like(m), torch.empty_like(qg)
    for chunk, k, v in _own_chunks(k_cache, v_cache, plan, k_scale, v_scale):
        a, b = chunk.span
        scores = torch.matmul(qs[a:b], k.transpose(-1, -2)).mul_(sm_scale)
        softcap_scores(scores, softcap).masked_fill_(~chunk.visible, float("-inf"))
        m[a:b], l[a:b], o[a:b] = _softmax_parts(scores, v)
    m, l, o = (_unsorted(x, order) for x in (m, l, o))  # batch order from here on
    for row, slots in plan.long:  # in place of its placeholder column's parts
        m[row:row + 1], l[row:row + 1], o[row:row + 1] = _prefix_parts(
            qg[row:row + 1], k_cache, v_cache, slots, sm_scale, k_scale, v_scale, softcap)
    return _with_shared(qg, k_cache, v_cache, plan, sm_scale, k_scale, v_scale, (m, l, o), softcap=softcap,
                        sinks=head_sinks).to(q.dtype)


def _with_shared(qg: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodeGather, sm_scale: float,
                 k_scale: float, v_scale: float, own: Parts, prefix_parts=None,
                 softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The attention output [batch, num_heads, head_dim] (fp32, padding rows zero): the rows' own
    parts (batch order) merged with their shared prefixes' parts (`prefix_parts(qg rows, prefix)`;
    default: the gathered matmuls of _prefix_parts); `sinks` fp32 [num_kv_heads, group] join the
    denominators."""
    m, l, o = own
    for prefix in plan.shared:
        rows = qg[prefix.rows]
        part = (_prefix_parts(rows, k_cache, v_cache, prefix.slots, sm_scale, k_scale, v_scale, softcap)
                if prefix_parts is None else prefix_parts(rows, prefix))
        m[prefix.rows], l[prefix.rows], o[prefix.rows] = _merge((m[prefix.rows], l[prefix.rows], o[prefix.rows]),
                                                                part)
    batch, num_kv_heads, group, head_dim = qg.shape
    if sinks is not None:
        l = l + (sinks - m).exp_()
    return o.div_(l[..., None]).view(batch, num_kv_heads * group, head_dim).masked_fill_(plan.empty, 0.0)


def _native_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodeGather,
                   sm_scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The own parts by the native kernel (in place from the cache), merged with the shared
    prefixes' parts, also by the kernel, by their softmax statistics (a part's output
    normalized: m = lse, l = 1); `sinks` [num_heads] join the denominators."""
    rows = plan.native
    assert rows is not None
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    out, lse = _native_pieces(q, k_cache, v_cache, rows, batch, sm_scale)
    if plan.shared:
        group = num_heads // num_kv_heads
        m, o = lse.view(batch, num_kv_heads, group), out.view(batch, num_kv_heads, group, head_dim)
        qg = q.to(torch.float32).view(batch, num_kv_heads, group, head_dim)
        out = _with_shared(qg, k_cache, v_cache, plan, sm_scale, 1.0, 1.0, (m, torch.ones_like(m), o),
                           lambda rows, prefix: _native_prefix_parts(rows, k_cache, v_cache, prefix, sm_scale),
                           sinks=None if sinks is None else sinks.float().view(num_kv_heads, group))
    elif sinks is not None:
        out = out * sink_scale(lse, sinks.float())[..., None]
    return out.to(q.dtype)  # a padding row (seq_len 0) has no slots: the kernel wrote zeros


def _native_pieces(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: NativeRows, batch: int,
                   sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's (out, lse) per batch row over `rows`; pieces of one row (several threads)
    merged."""
    if rows.rows is None:
        return native.decode_attention_native(q, k_cache, v_cache, rows.slots, rows.offsets, sm_scale)
    out, lse = native.decode_attention_native(q.index_select(0, rows.rows), k_cache, v_cache, rows.slots,
                                              rows.offsets, sm_scale)
    return _merge_pieces(out, lse, rows.rows, batch)


def _native_prefix_parts(qg: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix: SharedPrefix,
                         sm_scale: float) -> Parts:
    """As _prefix_parts, each prefix token's K / V read once for the group. Up to native.MAX_HEADS
    query heads: the decode kernel, the n requests' queries stacked as one row of n x group heads
    (whole cache rows read at once suit few rows per KV head: memory-bound). More: the extend
    kernel, not causal, every request's heads the rows of one tile per KV head (compute-bound;
    benchmarks/README.md, decode_lengths.py's shared shapes). Else the gathered matmuls."""
    n, num_kv_heads, group, head_dim = qg.shape
    if n * num_kv_heads * group <= native.MAX_HEADS and prefix.pieces is not None:
        stacked = qg.permute(1, 0, 2, 3).reshape(1, num_kv_heads * n * group, head_dim)  # KV head-major
        out, lse = _native_pieces(stacked, k_cache, v_cache, prefix.pieces, 1, sm_scale)
        m, o = lse.view(num_kv_heads, n, group), out.view(num_kv_heads, n, group, head_dim)
        m, o = m.transpose(0, 1), o.transpose(0, 1)
    elif native.supports_extend(k_cache, v_cache, num_kv_heads * group):
        out, lse = native.prefix_attention_native(qg.reshape(n, -1, head_dim), k_cache, v_cache, prefix.slots, sm_scale)
        m, o = lse.view(n, num_kv_heads, group), out.view(n, num_kv_heads, group, head_dim)
    else:
        return _prefix_parts(qg, k_cache, v_cache, prefix.slots, sm_scale, 1.0, 1.0)
    return m, torch.ones_like(m), o


def _merge_pieces(out: torch.Tensor, lse: torch.Tensor, rows: torch.Tensor,
                  batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pieces' (out [pieces, heads, dim], lse [pieces, heads]) combined per batch row `rows[i]`:
    each piece weighted by its share of the row's softmax denominator. A row whose pieces are
    all empty gets zeros and lse -inf."""
    heads = lse.shape[1]
    top = torch.full((batch, heads), float("-inf"), dtype=lse.dtype).scatter_reduce_(
        0, rows[:, None].expand(-1, heads), lse, "amax")
    weight = torch.exp(lse - top[rows]).nan_to_num_(0.0)  # an empty piece: exp(-inf) = 0; -inf - -inf: 0
    total = torch.zeros(batch, heads, dtype=lse.dtype).index_add_(0, rows, weight)
    merged = torch.zeros(batch, heads, out.shape[2], dtype=out.dtype).index_add_(0, rows, out * weight[..., None])
    return merged.div_(total.clamp_min(1e-30)[..., None]), top + total.log()


def _unsorted(x: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """x, whose rows are in `order` (batch rows longest first), back in batch order."""
    return x if order is None else torch.empty_like(x).index_copy_(0, order, x)


def _own_chunks(k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodeGather, k_scale: float, v_scale: float):
    """(chunk, k, v) per chunk of rows: their own slots gathered padded, fp32
    [rows, num_kv_heads, length, head_dim]."""
    for chunk in plan.chunks:
        yield (chunk, _gather_padded(k_cache, chunk.slots, chunk.length, torch.float32, k_scale),
               _gather_padded(v_cache, chunk.slots, chunk.length, torch.float32, v_scale))


def _softmax_parts(scores: torch.Tensor, v: torch.Tensor) -> Parts:
    """softmax(scores) @ v kept apart as (m, l, o): o / l is the attention output. scores [..., n]
    with at least one finite entry per row; v [..., n, head_dim]."""
    m = scores.amax(dim=-1)
    p = scores.sub_(m[..., None]).exp_()
    return m, p.sum(dim=-1), torch.matmul(p, v)


def _merge(x: Parts, y: Parts) -> Parts:
    """The parts of attention over two disjoint sets of keys, combined."""
    m = torch.maximum(x[0], y[0])
    a, b = (x[0] - m).exp_(), (y[0] - m).exp_()
    return m, x[1] * a + y[1] * b, x[2] * a[..., None] + y[2] * b[..., None]


def _prefix_parts(qg: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                  sm_scale: float, k_scale: float, v_scale: float, softcap: float | None = None) -> Parts:
    """Attention parts of qg [n, num_kv_heads, group, head_dim] over the shared prefix at `slots`:
    per KV head one matmul with every request's query heads as rows, in chunks of the prefix."""
    n, num_kv_heads, group, head_dim = qg.shape
    rows = qg.permute(1, 0, 2, 3).reshape(num_kv_heads, n * group, head_dim)  # row = request * group + g
    parts = None
    for a in range(0, slots.shape[0], SHARED_CHUNK_TOKENS):
        chunk = slots[a: a + SHARED_CHUNK_TOKENS]
        k = _gather_padded(k_cache, chunk, chunk.shape[0], torch.float32, k_scale)[0]  # [num_kv_heads, len, head_dim]
        v = _gather_padded(v_cache, chunk, chunk.shape[0], torch.float32, v_scale)[0]
        part = _softmax_parts(softcap_scores(torch.matmul(rows, k.transpose(-1, -2)).mul_(sm_scale), softcap), v)
        parts = part if parts is None else _merge(parts, part)
    assert parts is not None
    m, l, o = parts  # [num_kv_heads, n * group] ...
    return (m.view(num_kv_heads, n, group).transpose(0, 1), l.view(num_kv_heads, n, group).transpose(0, 1),
            o.view(num_kv_heads, n, group, head_dim).transpose(0, 1))


def decode_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           req_to_token: torch.Tensor, req_rows: torch.Tensor, seq_lens: torch.Tensor,
                           sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                           num_kv_splits: int = 8, softcap: float | None = None,
                           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """CPU-fast twin of `decode_attention_ref` (same contract); `num_kv_splits` is unused.

    Batched over requests in chunks of like context length (see DecodeGather); syncs on seq_lens
    and the shared prefixes. The engine plans once per step and calls `decode_attention_gathered`
    per layer.
    """
    plan = plan_checked_decode(q, k_cache, v_cache, req_to_token, req_rows, seq_lens, sm_scale, k_scale, v_scale,
                               num_kv_splits, softcap, sinks)
    return decode_attention_gathered(q, k_cache, v_cache, plan, sm_scale, k_scale, v_scale, softcap, sinks)


def plan_checked_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                        req_rows: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float, k_scale: float = 1.0,
                        v_scale: float = 1.0, num_kv_splits: int = 8, softcap: float | None = None,
                        sinks: torch.Tensor | None = None) -> DecodeGather:
    """`plan_decode` after the checks of `decode_attention_torch` (ValueError on a bad input); the
    native kernel where it takes the caches and there is no `softcap`."""
    _check_decode(q, k_cache, v_cache, req_to_token, req_rows, seq_lens, sm_scale, k_scale, v_scale, num_kv_splits,
                  softcap, sinks)
    use_native = softcap is None and native.supports(k_cache, v_cache, q.shape[1])
    return plan_decode(req_to_token, req_rows, seq_lens, use_native=use_native)
