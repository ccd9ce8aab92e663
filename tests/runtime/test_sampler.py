"""Sampler units: filters, blocking, seeds, and a row with nothing left to sample."""
from __future__ import annotations

import torch

from radixflow.runtime.sampler import SampleRow, sample
from radixflow.runtime.sampling_params import SamplingParams


def _row(blocked=(), **sp) -> SampleRow:
    return SampleRow(SamplingParams.from_dict(sp), [1, 2], [], None, list(blocked))


def test_blocked_token_is_never_chosen():
    logits = torch.tensor([[0.0, 5.0, 1.0, 0.5]])
    out = sample(logits.clone(), [_row(blocked=[1], temperature=0)], None)
    assert out.tokens == [2]


def test_row_whose_only_allowed_token_is_blocked_still_samples():
    # The grammar allows only token 3 (say EOS) while min_new_tokens blocks it: sampling must
    # not fail for the whole batch; the row falls back to what the grammar allows.
    bitmask = torch.tensor([[1 << 3]], dtype=torch.int32)
    rows = [_row(blocked=[3], temperature=1.0), _row(temperature=1.0)]
    logits = torch.zeros(2, 4)
    out = sample(logits, rows, torch.Generator().manual_seed(0),
                 bitmask=(bitmask, torch.tensor([0])))
    assert out.tokens[0] == 3 and 0 <= out.tokens[1] < 4


def test_top_k_top_p_min_p_keep_the_most_likely():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    g = torch.Generator().manual_seed(0)
    for sp in ({"top_k": 1}, {"top_p": 0.01}, {"min_p": 0.99}):
        assert sample(logits.clone(), [_row(temperature=1.5, **sp)], g).tokens == [1]


def test_seeded_rows_do_not_depend_on_batch():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    def seeded():
        return SampleRow(SamplingParams.from_dict({"temperature": 1.0}), [], [], torch.Generator().manual_seed(7), [])
    alone = sample(logits[:1].clone(), [seeded()], None).tokens[0]
    batch = sample(logits.clone(), [seeded(), _row(temperature=1.0), _row(temperature=1.0)],
                   torch.Generator().manual_seed(3)).tokens[0]
    assert alone == batch


def test_penalties_move_the_argmax():
    logits = torch.tensor([[0.0, 3.0, 2.5, 1.0]])
    row = SampleRow(SamplingParams.from_dict({"temperature": 0, "frequency_penalty": 1.0}), [], [1], None, [])
    assert sample(logits.clone(), [row], None).tokens == [2]   # 3.0 - 1.0 < 2.5
    row = SampleRow(SamplingParams.from_dict({"temperature": 0, "presence_penalty": 0.4}), [], [1, 1], None, [])
    assert sample(logits.clone(), [row], None).tokens == [1]   # presence counts once: 2.6 > 2.5
    row = SampleRow(SamplingParams.from_dict({"temperature": 0, "repetition_penalty": 2.0}), [1], [], None, [])
    assert sample(logits.clone(), [row], None).tokens == [2]   # 3.0 / 2 < 2.5 (prompt tokens count)
