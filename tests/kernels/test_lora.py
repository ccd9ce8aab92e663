"""LoRA shrink/expand kernels against their fp32 references (Triton interpreter on CPU)."""
from __future__ import annotations

import pytest
import torch

from radixflow import kernels


def _segments(lens: list[int], slots: list[int], device: torch.device):
    starts = torch.tensor([0] + lens[:-1], dtype=torch.int64).cumsum(0)
    return (starts.to(device), torch.tensor(lens, dtype=torch.int64, device=device),
            torch.tensor(slots, dtype=torch.int64, device=device))


CASES = [  # (rank, segment lengths, slot per segment (-1 base))
    (1, [1], [0]),
    (8, [1, 3, 1], [1, -1, 0]),
    (16, [7, 1, 13], [2, 2, -1]),
    (64, [1, 1, 1, 1, 1], [0, 3, -1, 1, 3]),
    (16, [17, 2], [1, 0]),
]


@pytest.mark.parametrize("rank,lens,slots", CASES)
@pytest.mark.parametrize("k,o", [(64, 80), (37, 19)])
def test_shrink_expand_match_reference(device, rank, lens, slots, k, o):
    gen = torch.Generator().manual_seed(rank + sum(lens))
    num_slots, n, rows = 4, 3 * rank, sum(lens)
    x = torch.randn(rows, k, generator=gen).to(device)
    a = torch.randn(num_slots, k, n, generator=gen).to(device)
    b = torch.randn(num_slots, n, o, generator=gen).to(device) * 0.1
    segs = _segments(lens, slots, device)
    xa = kernels.lora_shrink(x, a, *segs, max(lens))
    xa_ref = kernels.lora_shrink_ref(x, a, *segs, max(lens))
    torch.testing.assert_close(xa, xa_ref, rtol=1e-4, atol=1e-4)
    y0 = torch.randn(rows, o, generator=gen).to(device)
    y = kernels.lora_expand(y0.clone(), xa_ref, b, *segs, max(lens))
    y_ref = kernels.lora_expand_ref(y0.clone(), xa_ref, b, *segs, max(lens))
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    base_rows = torch.cat([torch.arange(s, s + n_) for s, n_, sl in zip(segs[0].tolist(), lens, slots) if sl < 0]
                          or [torch.zeros(0, dtype=torch.int64)])
    assert torch.equal(y[base_rows.to(device)], y0[base_rows.to(device)])  # base rows untouched
    assert (xa[base_rows.to(device)] == 0).all()


def test_reference_is_the_per_row_product(device):
    """The reference against a plain row-by-row product: slot 1 for row 0, base for row 1."""
    x = torch.randn(2, 5)
    a = torch.randn(2, 5, 3)
    segs = _segments([1, 1], [1, -1], torch.device("cpu"))
    xa = kernels.lora_shrink_ref(x, a, *segs, 1)
    torch.testing.assert_close(xa[0], x[0] @ a[1])
    assert (xa[1] == 0).all()


def test_bad_shapes_raise_before_launch(device):
    x = torch.randn(3, 8, device=device)
    a = torch.randn(2, 9, 4, device=device)
    segs = _segments([3], [0], device)
    with pytest.raises(ValueError, match="K ="):
        kernels.lora_shrink(x, a, *segs, 3)
    with pytest.raises(ValueError, match="dtype"):
        kernels.lora_expand(torch.randn(3, 4, device=device), torch.randn(3, 2, device=device).half(),
                            torch.randn(2, 2, 4, device=device), *segs, 3)


def test_expand_into_column_views(device):
    """The model's use: one part's rank block of xa into its own output columns of y (both views)."""
    gen = torch.Generator().manual_seed(7)
    rank, widths = 8, [24, 8, 8]  # q | k | v
    xa = torch.randn(9, 3 * rank, generator=gen).to(device)
    segs = _segments([4, 5], [1, 0], device)
    y, y_ref = torch.zeros(9, sum(widths), device=device), torch.zeros(9, sum(widths), device=device)
    col = 0
    for j, w in enumerate(widths):
        b = torch.randn(2, rank, w, generator=gen).to(device)
        kernels.lora_expand(y[:, col:col + w], xa[:, j * rank:(j + 1) * rank], b, *segs, 5)
        kernels.lora_expand_ref(y_ref[:, col:col + w], xa[:, j * rank:(j + 1) * rank].contiguous(), b, *segs, 5)
        col += w
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    assert (y != 0).all()  # every column of every row got its part's delta
