"""CPU-fast torch decode attention: a step's contexts gathered padded, and context prefixes that
several requests share (the radix cache's shared KV slots) read once for all of them.

    request i's context:  | shared prefix of its group (if any) | its own suffix |
    attention:            one matmul for the group's queries    + per-request padded gather
                          └──────────── merged by their softmax statistics ────────────┘

Without sharing, every request reads its whole context, gathered and converted to fp32 per
request: a 1,024-token few-shot prefix is read as many times as there are requests. With a
shared prefix of P slots, a group of n requests reads it once, its n x group query heads stacked
as the rows of one matmul per KV head.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .decode_attention import _check_decode

# Context tokens gathered at once by decode (see decode_attention_gathered).
GATHER_CHUNK_TOKENS = 1024
# A prefix is read once for its requests when at least this many of their leading slots are the
# same (and at least two requests share it). Shared prefixes are read in chunks of this many tokens.
MIN_SHARED_PREFIX_TOKENS = 64
SHARED_CHUNK_TOKENS = 4096
# Rows much longer than the rest are read by themselves in chunks of SHARED_CHUNK_TOKENS, not
# padded into the batch's layout (one long request among short ones made every row gather its
# length per layer): see _padded_length. A row read alone costs about this many tokens' reading
# more than its length (its own calls): measured ~800 at 4 x 16 heads over 2 KV heads in fp32,
# ~70 at 9 x 64 over 3 in bf16 (one core; 16 equal rows read alone vs padded).
ALONE_ROW_TOKENS = 1024


@dataclass(frozen=True)
class SharedPrefix:
    """Batch rows `rows` whose contexts all begin with the KV at `slots`."""

    rows: torch.Tensor   # [n] int64, n >= 2
    slots: torch.Tensor  # [prefix_len] int64


@dataclass(frozen=True)
class DecodeGather:
    """A decode step's contexts padded to the longest, computed once and shared by every layer.

        slots row i:  | req i's own slot ids | its first own slot, repeated (hidden) |
                      0                      own_lens[i]                             max_len

    A request's own slots are its whole context, or what follows its group's shared prefix
    (`shared`). Padding repeats a slot the request owns, so no stale table entry or the dummy
    slot 0 (whose bytes may be anything) is ever read; the hidden columns get probability 0.
    A seq_len 0 row (CUDA-graph padding) reads its column 0 and is zeroed afterwards. A row whose
    own part is longer than the others are padded to (`long`, see _padded_length) keeps one column
    here (its first own slot, a placeholder) and is read by itself.
    """

    slots: torch.Tensor    # [batch * max_len] int64, row-major [batch, max_len]
    visible: torch.Tensor  # [batch, 1, 1, max_len] bool
    empty: torch.Tensor    # [batch, 1, 1] bool, rows with seq_len 0
    max_len: int
    shared: list[SharedPrefix] = field(default_factory=list)
    long: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (batch row, its own slots [n] int64)


def plan_decode(req_to_token: torch.Tensor, req_rows: torch.Tensor, seq_lens: torch.Tensor) -> DecodeGather:
    """The padded layout of a decode step, its shared prefixes found; a few host syncs."""
    batch = seq_lens.shape[0]
    max_len = max(int(seq_lens.max()), 1) if batch else 1
    table = req_to_token[req_rows.long(), :max_len].long()  # [batch, max_len]
    shared, starts = _shared_prefixes(table, seq_lens)
    own_lens = seq_lens - starts  # each row's own part: the columns after its shared prefix
    long = []
    lengths = own_lens.tolist()
    pad = _padded_length(lengths) if batch else 1
    if pad < max(lengths, default=0):
        rows = [r for r, n in enumerate(lengths) if n > pad]
        long = [(r, table[r, int(starts[r]): int(seq_lens[r])].clone()) for r in rows]
        own_lens = own_lens.clone()
        own_lens[rows] = 1  # a placeholder column; the row's parts come from its own chunks
    if shared or long:
        max_len = max(int(own_lens.max()), 1)
        cols = (starts[:, None] + torch.arange(max_len, device=table.device)[None, :]).clamp_(max=table.shape[1] - 1)
        table = table.gather(1, cols)
    visible = torch.arange(max_len, device=seq_lens.device)[None, :] < own_lens.clamp(min=1)[:, None]
    slots = torch.where(visible, table, table[:, :1])
    return DecodeGather(slots.reshape(-1), visible[:, None, None, :], (seq_lens == 0)[:, None, None], max_len,
                        shared, long)


def _padded_length(lengths: list[int]) -> int:
    """The length a decode batch's rows are padded to; longer rows are read alone. The one that
    reads the fewest tokens: rows padded to it count it each, a row read alone its own length plus
    ALONE_ROW_TOKENS. Equal rows stay padded; one 20K-token row among 100-token ones is alone."""
    order = sorted((max(n, 1) for n in lengths), reverse=True)
    best, best_cost, alone = order[0], len(order) * order[0], 0
    for i in range(len(order) - 1):  # rows 0..i alone, the rest padded to order[i + 1]
        alone += order[i] + ALONE_ROW_TOKENS
        cost = alone + (len(order) - i - 1) * order[i + 1]
        if cost < best_cost:
            best, best_cost = order[i + 1], cost
    return best


def _shared_prefixes(table: torch.Tensor, seq_lens: torch.Tensor) -> tuple[list[SharedPrefix], torch.Tensor]:
    """Groups of rows whose first MIN_SHARED_PREFIX_TOKENS or more slots are the same, each with
    its longest common prefix (short of every member's last token), and each row's prefix length
    (0 outside the groups). Rows are grouped by their first slot."""
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
        if prefix_len >= MIN_SHARED_PREFIX_TOKENS:
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
                              sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Decode attention of q [batch, num_heads, head_dim] over the contexts of `plan`: per chunk of
    requests, one gather per cache (to fp32) and two matmuls with a KV head's query heads stacked
    as rows (GQA); each shared prefix once for its requests, merged by softmax statistics; a row
    with a long own context by itself, in chunks (as a shared prefix of one).
    Unchecked: the engine's per-layer hot path, with inputs `decode_attention_torch` validates.
    Math in fp32 whatever the cache dtype; returns q's dtype.

    NOTE: not SDPA: for one query per request torch's CPU flash kernel ran ~7x slower than these
    two matmuls in bf16 (~1 ms vs 0.14-0.19 ms at 4 requests x 260 tokens, 9/3 heads, one core),
    60% of SmolLM2's bf16 decode step at batch 16. Chunks of about GATHER_CHUNK_TOKENS context
    tokens keep the gathered K/V in cache between the gather and the matmuls; one gather of a
    whole large batch ran ~3x slower (one core).
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    qg = q.to(torch.float32).view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    if not plan.shared and not plan.long:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        for a, b, k, v in _own_chunks(k_cache, v_cache, plan, k_scale, v_scale):
            scores = torch.matmul(qg[a:b], k.transpose(-1, -2)).mul_(sm_scale)  # [rows, num_kv_heads, group, max_len]
            scores.masked_fill_(~plan.visible[a:b], float("-inf"))
            o = torch.matmul(scores.softmax(dim=-1), v)  # [rows, num_kv_heads, group, head_dim]
            out[a:b] = o.view(b - a, num_heads, head_dim)
        return out.masked_fill_(plan.empty, 0.0)
    m = torch.empty(qg.shape[:-1], dtype=torch.float32, device=q.device)  # [batch, num_kv_heads, group]
    l, o = torch.empty_like(m), torch.empty_like(qg)
    for a, b, k, v in _own_chunks(k_cache, v_cache, plan, k_scale, v_scale):
        scores = torch.matmul(qg[a:b], k.transpose(-1, -2)).mul_(sm_scale)
        scores.masked_fill_(~plan.visible[a:b], float("-inf"))
        m[a:b], l[a:b], o[a:b] = _softmax_parts(scores, v)
    for row, slots in plan.long:  # in place of its placeholder column's parts
        m[row:row + 1], l[row:row + 1], o[row:row + 1] = _prefix_parts(
            qg[row:row + 1], k_cache, v_cache, slots, sm_scale, k_scale, v_scale)
    for prefix in plan.shared:
        part = _prefix_parts(qg[prefix.rows], k_cache, v_cache, prefix.slots, sm_scale, k_scale, v_scale)
        m[prefix.rows], l[prefix.rows], o[prefix.rows] = _merge((m[prefix.rows], l[prefix.rows], o[prefix.rows]), part)
    out = o.div_(l[..., None]).view(batch, num_heads, head_dim).to(q.dtype)
    return out.masked_fill_(plan.empty, 0.0)


def _own_chunks(k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodeGather, k_scale: float, v_scale: float):
    """(a, b, k, v) per chunk of requests a..b: their own slots gathered padded, fp32
    [b - a, num_kv_heads, max_len, head_dim]."""
    batch, max_len = plan.visible.shape[0], plan.max_len
    step = max(1, GATHER_CHUNK_TOKENS // max_len)
    for a in range(0, batch, step):
        b = min(a + step, batch)
        slots = plan.slots[a * max_len: b * max_len]
        yield (a, b, _gather_padded(k_cache, slots, max_len, torch.float32, k_scale),
               _gather_padded(v_cache, slots, max_len, torch.float32, v_scale))


Parts = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (row max, sum of exp, unnormalized output)


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
                  sm_scale: float, k_scale: float, v_scale: float) -> Parts:
    """Attention parts of qg [n, num_kv_heads, group, head_dim] over the shared prefix at `slots`:
    per KV head one matmul with every request's query heads as rows, in chunks of the prefix."""
    n, num_kv_heads, group, head_dim = qg.shape
    rows = qg.permute(1, 0, 2, 3).reshape(num_kv_heads, n * group, head_dim)  # row = request * group + g
    parts = None
    for a in range(0, slots.shape[0], SHARED_CHUNK_TOKENS):
        chunk = slots[a: a + SHARED_CHUNK_TOKENS]
        k = _gather_padded(k_cache, chunk, chunk.shape[0], torch.float32, k_scale)[0]  # [num_kv_heads, len, head_dim]
        v = _gather_padded(v_cache, chunk, chunk.shape[0], torch.float32, v_scale)[0]
        part = _softmax_parts(torch.matmul(rows, k.transpose(-1, -2)).mul_(sm_scale), v)
        parts = part if parts is None else _merge(parts, part)
    assert parts is not None
    m, l, o = parts  # [num_kv_heads, n * group] ...
    return (m.view(num_kv_heads, n, group).transpose(0, 1), l.view(num_kv_heads, n, group).transpose(0, 1),
            o.view(num_kv_heads, n, group, head_dim).transpose(0, 1))


def decode_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           req_to_token: torch.Tensor, req_rows: torch.Tensor, seq_lens: torch.Tensor,
                           sm_scale: float, k_scale: float = 1.0, v_scale: float = 1.0,
                           num_kv_splits: int = 8) -> torch.Tensor:
    """CPU-fast twin of `decode_attention_ref` (same contract); `num_kv_splits` is unused.

    Batched over requests, padded to the longest context (see DecodeGather); syncs on seq_lens
    and the shared prefixes. The engine plans once per step and calls `decode_attention_gathered`
    per layer.
    """
    plan = plan_checked_decode(q, k_cache, v_cache, req_to_token, req_rows, seq_lens, sm_scale, k_scale, v_scale,
                               num_kv_splits)
    return decode_attention_gathered(q, k_cache, v_cache, plan, sm_scale, k_scale, v_scale)


def plan_checked_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                        req_rows: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float, k_scale: float = 1.0,
                        v_scale: float = 1.0, num_kv_splits: int = 8) -> DecodeGather:
    """`plan_decode` after the checks of `decode_attention_torch` (ValueError on a bad input)."""
    _check_decode(q, k_cache, v_cache, req_to_token, req_rows, seq_lens, sm_scale, k_scale, v_scale, num_kv_splits)
    return plan_decode(req_to_token, req_rows, seq_lens)
