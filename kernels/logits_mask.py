"""Constrained decoding: forbid tokens by setting their logits to -inf from a packed bitmask."""
from __future__ import annotations

import torch

from . import _triton as tr
from ._checks import FLOAT_DTYPES, check, check_index, check_same_device, check_tensor
from ._triton import tl, triton


def _check_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None) -> None:
    check_tensor("logits", logits, 2, FLOAT_DTYPES)
    check_tensor("bitmask", bitmask, 2, (torch.int32,))
    num_words = (logits.shape[1] + 31) // 32
    check(bitmask.shape[1] >= num_words,
          f"bitmask needs >= {num_words} int32 words per row for vocab {logits.shape[1]}, got {bitmask.shape[1]}")
    if rows is None:
        check(bitmask.shape[0] == logits.shape[0],
              f"without rows, bitmask rows ({bitmask.shape[0]}) must equal logits rows ({logits.shape[0]})")
    else:
        check_index("rows", rows, bitmask.shape[0])
    check_same_device(logits=logits, bitmask=bitmask, rows=rows)


def apply_token_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Set logits[rows[i], t] = -inf wherever bit t of bitmask[i] is 0; mutates `logits` in place.

    logits [num_logit_rows, vocab] float; bitmask [num_rows, >= ceil(vocab / 32)]
    int32, token t at bit t % 32 (LSB first) of word t // 32, extra bits ignored;
    rows [num_rows] int: the logits row each bitmask row applies to (default:
    bitmask row i -> logits row i). Allowed tokens are left untouched.
    """
    _check_bitmask(logits, bitmask, rows)
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1  # [num_rows, num_words, 32]
    forbidden = bits.flatten(1)[:, :vocab] == 0  # [num_rows, vocab]
    if rows is None:
        logits.masked_fill_(forbidden, float("-inf"))
    else:
        idx = rows.long()
        logits[idx] = logits[idx].masked_fill(forbidden, float("-inf"))


@triton.jit
def _apply_token_bitmask_kernel(logits, bitmask, rows, vocab, stride_logits_row, stride_bitmask_row,
                                HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # grid: (bitmask row, block of BLOCK tokens)
    i = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = offs < vocab
    if HAS_ROWS:
        row = tl.load(rows + i).to(tl.int64)
    else:
        row = i.to(tl.int64)
    words = tl.load(bitmask + i.to(tl.int64) * stride_bitmask_row + offs // 32, mask=in_vocab, other=-1)
    forbidden = ((words >> (offs % 32)) & 1) == 0
    ninf = tl.full([BLOCK], float("-inf"), dtype=logits.dtype.element_ty)
    tl.store(logits + row * stride_logits_row + offs, ninf, mask=in_vocab & forbidden)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Triton twin of `apply_token_bitmask_ref` (same contract); writes only the forbidden logits."""
    _check_bitmask(logits, bitmask, rows)
    tr.require_triton("apply_token_bitmask")
    num_rows, vocab = bitmask.shape[0], logits.shape[1]
    if num_rows == 0 or vocab == 0:
        return
    block = 1024 if logits.is_cuda else 4096
    _apply_token_bitmask_kernel[(num_rows, triton.cdiv(vocab, block))](
        logits, bitmask, rows if rows is not None else bitmask, vocab, logits.stride(0), bitmask.stride(0),
        HAS_ROWS=rows is not None, BLOCK=block, num_warps=4,
    )
