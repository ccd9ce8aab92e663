"""apply_token_bitmask (Triton) against apply_token_bitmask_ref, and the bit order spelled out."""
from __future__ import annotations

import pytest
import torch

from radixflow.kernels.logits_mask import apply_token_bitmask, apply_token_bitmask_ref


def _bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """[num_rows, vocab] bool -> [num_rows, ceil(vocab / 32)] int32, token t at bit t % 32 of word t // 32."""
    num_words = (allowed.shape[1] + 31) // 32
    padded = torch.zeros(allowed.shape[0], num_words * 32, dtype=torch.int64)
    padded[:, : allowed.shape[1]] = allowed.long()
    words = (padded.view(-1, num_words, 32) << torch.arange(32)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # bit 31 set -> negative int32


@pytest.mark.parametrize("op", [apply_token_bitmask, apply_token_bitmask_ref])
def test_bit_order_explicit(op, device):
    logits = torch.zeros(1, 40, device=device)
    word0 = 0b101 - 2**31  # bits 0, 2 and 31 (the sign bit of an int32)
    bitmask = torch.tensor([[word0, 0b1]], dtype=torch.int32, device=device)
    op(logits, bitmask)
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed == [0, 2, 31, 32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("vocab, with_rows", [(33, False), (1000, True), (5001, False)])
def test_op_matches_ref(device, dtype, vocab, with_rows):
    gen = torch.Generator().manual_seed(vocab)
    num_logit_rows = 5
    logits = torch.randn(num_logit_rows, vocab, generator=gen).to(device, dtype)
    allowed = torch.rand(3 if with_rows else num_logit_rows, vocab, generator=gen) < 0.3
    bitmask = _bitmask(allowed).to(device)
    rows = torch.tensor([4, 0, 2], device=device) if with_rows else None
    got, want = logits.clone(), logits.clone()
    apply_token_bitmask(got, bitmask, rows)
    apply_token_bitmask_ref(want, bitmask, rows)
    assert torch.equal(got, want)
    expected = logits.clone()
    target = rows.tolist() if with_rows else list(range(num_logit_rows))
    for i, r in enumerate(target):
        expected[r, ~allowed[i].to(device)] = float("-inf")
    assert torch.equal(got, expected)  # forbidden -> -inf, allowed and other rows untouched


def test_wider_bitmask_ignores_extra_bits(device):
    logits = torch.zeros(2, 10, device=device)
    bitmask = torch.full((2, 3), -1, dtype=torch.int32, device=device)
    bitmask[1, 0] = 0
    apply_token_bitmask(logits, bitmask)
    assert torch.isfinite(logits[0]).all() and torch.isinf(logits[1]).all()


@pytest.mark.parametrize("op", [apply_token_bitmask, apply_token_bitmask_ref])
def test_validation_errors(op):
    logits = torch.zeros(2, 64)
    good = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="bitmask must have dtype"):
        op(logits, good.long())
    with pytest.raises(ValueError, match="needs >= 2 int32 words"):
        op(logits, good[:, :1])
    with pytest.raises(ValueError, match="must equal logits rows"):
        op(logits, good[:1])
    with pytest.raises(ValueError, match="rows must have 2 entries"):
        op(logits, good, torch.tensor([0]))
    with pytest.raises(ValueError, match="logits must have dtype"):
        op(logits.long(), good)


@pytest.mark.gpu
def test_gpu_large_vocab():
    logits = torch.randn(64, 152064, device="cuda", dtype=torch.bfloat16)
    bitmask = torch.randint(-2**31, 2**31 - 1, (32, 4752), dtype=torch.int32, device="cuda")
    rows = torch.randperm(64, device="cuda")[:32]
    got, want = logits.clone(), logits.clone()
    apply_token_bitmask(got, bitmask, rows)
    apply_token_bitmask_ref(want, bitmask, rows)
    assert torch.equal(got, want)
