"""Sampler units: filters, blocking, seeds, and a row with nothing left to sample."""
from __future__ import annotations

import pytest
import torch

from radixflow.runtime.core.sampler import SampleRow, sample
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


# -- distributions: many identical rows in one batch, frequencies against the exact filtered law --

N_ROWS = 20000
FREQ_TOL = 0.015  # ~4 standard deviations of a frequency over 20000 draws


def _frequencies(logits_row, vocab, seed=0, **sp):
    logits = logits_row.repeat(N_ROWS, 1)
    rows = [_row(**sp) for _ in range(N_ROWS)]
    tokens = sample(logits, rows, torch.Generator().manual_seed(seed)).tokens
    return torch.bincount(torch.tensor(tokens), minlength=vocab).double() / N_ROWS


def _law(logits_row, keep, temperature=1.0):
    p = torch.softmax(logits_row.double() / temperature, dim=-1) * keep
    return p / p.sum()


LOGITS8 = torch.tensor([2.0, 0.5, 1.5, -1.0, 1.0, 0.0, 0.7, -0.3])


def test_plain_temperature_draws_follow_softmax():
    freq = _frequencies(LOGITS8, 8, temperature=0.7)
    torch.testing.assert_close(freq, _law(LOGITS8, torch.ones(8), 0.7), rtol=0, atol=FREQ_TOL)


def test_top_k_renormalizes_over_the_k_best():
    freq = _frequencies(LOGITS8, 8, temperature=1.0, top_k=3)
    keep = torch.zeros(8)
    keep[[0, 2, 4]] = 1
    assert freq[keep == 0].sum() == 0
    torch.testing.assert_close(freq, _law(LOGITS8, keep), rtol=0, atol=FREQ_TOL)


def test_top_p_keeps_the_nucleus():
    p = torch.softmax(LOGITS8, -1)  # sorted: 0 (.32), 2 (.20), 4 (.12), 6 (.09), 1 (.07) ...
    freq = _frequencies(LOGITS8, 8, temperature=1.0, top_p=0.6)
    keep = torch.zeros(8)
    keep[[0, 2, 4]] = 1  # cumulative mass before token 4 is .52 < .6; before token 6, .64 > .6
    assert p[[0, 2]].sum() < 0.6 < p[[0, 2, 4]].sum()
    assert freq[keep == 0].sum() == 0
    torch.testing.assert_close(freq, _law(LOGITS8, keep), rtol=0, atol=FREQ_TOL)


def test_nucleus_wider_than_the_candidates_falls_back_to_a_full_sort(monkeypatch):
    from radixflow.runtime.core import sampler
    monkeypatch.setattr(sampler, "TOP_P_CANDIDATES", 2)
    logits = torch.linspace(1.0, 0.0, 10)  # flat-ish: the 0.9 nucleus holds ~9 tokens
    freq = _frequencies(logits, 10, temperature=1.0, top_p=0.9)
    p = torch.softmax(logits, -1)
    cum_before = p.cumsum(0) - p
    keep = (cum_before <= 0.9).double()
    assert keep.sum() > 2 and freq[2:].sum() > 0.5
    torch.testing.assert_close(freq, _law(logits, keep), rtol=0, atol=FREQ_TOL)


def test_min_p_and_top_k_with_top_p_in_one_batch():
    logits = torch.stack([LOGITS8, LOGITS8])
    rows = [_row(temperature=1.0, min_p=0.5), _row(temperature=1.0, top_k=2, top_p=0.99)]
    g = torch.Generator().manual_seed(5)
    seen = [set(), set()]
    for _ in range(300):
        for i, t in enumerate(sample(logits.clone(), rows, g).tokens):
            seen[i].add(t)
    p = torch.softmax(LOGITS8, -1)
    assert seen[0] == set(torch.nonzero(p >= 0.5 * p.max())[:, 0].tolist())  # {0, 2}
    assert seen[1] == {0, 2}


# -- seeds --

def _seeded(seed, **sp):
    return SampleRow(SamplingParams.from_dict({"temperature": 1.0, **sp}), [], [], torch.Generator().manual_seed(seed), [])


def test_seeded_request_sequence_is_reproducible_and_batch_independent():
    logits = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    alone, batched = _seeded(11), _seeded(11)
    others = [_seeded(12), _row(temperature=1.0), _seeded(13, top_k=5)]
    seq_alone, seq_batched, seq_other = [], [], []
    for step in range(12):
        seq_alone.append(sample(logits[:1].clone(), [alone], None).tokens[0])
        out = sample(logits[[2, 0, 3, 4]].clone(), [others[0], batched, others[1], others[2]],
                     torch.Generator().manual_seed(step)).tokens
        seq_batched.append(out[1])
        seq_other.append(out[0])
    assert seq_alone == seq_batched
    assert len(set(seq_alone)) > 3  # draws advance from step to step
    assert alone.state.num_draws == 12
    different = sum(a != b for a, b in zip(seq_alone, [sample(logits[:1].clone(), [_seeded(99)], None).tokens[0]
                                                        for _ in range(12)]))
    assert different > 0


def test_counter_uniforms_look_uniform():
    from radixflow.runtime.core.seeded import counter_uniforms
    u = counter_uniforms([7] * 20000, list(range(20000)), torch.device("cpu"))
    assert 0 <= u.min() and u.max() < 1
    hist = torch.histc(u, bins=10, min=0, max=1) / 20000
    torch.testing.assert_close(hist, torch.full((10,), 0.1), rtol=0, atol=0.01)
    v = counter_uniforms(list(range(20000)), [0] * 20000, torch.device("cpu"))
    assert abs(float(torch.corrcoef(torch.stack([u, v]))[0, 1])) < 0.03


# -- penalties: vectorized and incremental against a per-row reference --

def _penalized_ref(logits, row):
    out = logits.clone()
    sp = row.sampling
    counts = torch.bincount(torch.tensor(row.output_ids, dtype=torch.long), minlength=logits.shape[0])
    out -= sp.frequency_penalty * counts + sp.presence_penalty * (counts > 0)
    seen = sorted(set(row.prompt_ids) | set(row.output_ids))
    vals = out[seen]
    out[seen] = torch.where(vals > 0, vals / sp.repetition_penalty, vals * sp.repetition_penalty)
    return out


@pytest.mark.parametrize("dense", [False, True])  # the CPU (sparse) and the CUDA (dense) path
def test_penalties_match_reference_as_outputs_grow(monkeypatch, dense):
    from radixflow.runtime.core import penalties
    from radixflow.runtime.core.penalties import apply_penalties
    monkeypatch.setattr(penalties, "DENSE_ON_CPU", dense)
    gen = torch.Generator().manual_seed(4)
    vocab = 40
    params = [{"frequency_penalty": 0.7}, {"presence_penalty": -0.5, "repetition_penalty": 1.3}, {},
              {"frequency_penalty": 0.2, "presence_penalty": 0.1, "repetition_penalty": 0.8}]
    rows = [SampleRow(SamplingParams.from_dict({"temperature": 0, **p}),
                      torch.randint(0, vocab, (6,), generator=gen).tolist(), [], None, []) for p in params]
    for _ in range(5):  # the same row objects (states) across steps; 1-3 new tokens per step
        for r in rows:
            r.output_ids.extend(torch.randint(0, vocab, (int(torch.randint(1, 4, (1,), generator=gen)),),
                                              generator=gen).tolist())
        logits = torch.randn(len(rows), vocab, generator=gen)
        got = logits.clone()
        apply_penalties(got, rows)
        want = torch.stack([_penalized_ref(logits[i], r) for i, r in enumerate(rows)])
        torch.testing.assert_close(got, want)
    assert rows[2].state.counts is None  # no penalty, no counts
    assert int(rows[0].state.counts.sum()) == len(rows[0].output_ids)


# -- logprobs --

def test_logprobs_only_for_rows_that_ask_and_equal_log_softmax():
    logits = torch.randn(3, 30, generator=torch.Generator().manual_seed(8))
    rows = [_row(temperature=0), _row(temperature=1.0), _row(temperature=0)]
    rows[1].want_logprob, rows[1].top_logprobs_num = True, 4
    rows[2].want_logprob = True
    out = sample(logits.clone(), rows, torch.Generator().manual_seed(0))
    lp = torch.log_softmax(logits, -1)
    assert out.top_logprobs[0] == [] and out.top_logprobs[2] == []
    for i in (1, 2):
        assert abs(out.logprobs[i] - float(lp[i, out.tokens[i]])) < 1e-5
    top = lp[1].topk(4)
    assert [t for t, _ in out.top_logprobs[1]] == top.indices.tolist()
    torch.testing.assert_close(torch.tensor([v for _, v in out.top_logprobs[1]]), top.values)


def test_score_tokens_in_chunks_equals_log_softmax(monkeypatch):
    from radixflow.runtime.core import sampler
    monkeypatch.setattr(sampler, "LOGPROB_CHUNK_ROWS", 3)
    logits = torch.randn(8, 20, generator=torch.Generator().manual_seed(9))
    toks = torch.randint(0, 20, (8,), generator=torch.Generator().manual_seed(1))
    chosen, tops = sampler.score_tokens(logits, toks, 2)
    lp = torch.log_softmax(logits, -1)
    torch.testing.assert_close(torch.tensor(chosen), lp.gather(1, toks[:, None])[:, 0])
    assert [[t for t, _ in row] for row in tops] == lp.topk(2).indices.tolist()


@pytest.mark.parametrize("vocab", [3, 64, 130, 3072, 49152 + 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocked_argmax_equals_torch_argmax(vocab, dtype):
    """argmax_rows (blocked on CPU) gives torch's argmax: first maximal index on ties, a NaN's
    index when a row holds one, a maximum in the ragged tail."""
    from radixflow.runtime.core.sampler import argmax_rows

    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(9, vocab, generator=g).to(dtype)
    x[1, vocab // 2] = x[1, -1] = 50.0  # a tie: the first wins
    x[2, -1] = 60.0  # the maximum in the last (possibly partial) block
    x[3, vocab // 3] = float("nan")
    x[4, :] = 0.0
    x[5, 0] = float("inf")
    x[6, -1] = float("nan")
    x[7, :] = float("-inf")
    assert argmax_rows(x).tolist() == x.argmax(dim=-1).tolist()
