"""Engine.score (SGLang's generative scoring) against transformers' next-token probabilities."""
from __future__ import annotations

import math

import pytest
import torch

from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model

QUERY = "The capital of France is"
ITEMS = [" Paris", " Rome", " a city"]
LABELS = [5, 7, 100, 2000]


@pytest.fixture(scope="module")
def engine():
    with Engine(demo_model("tiny"), dtype="float32", check_invariants=True) as e:
        yield e


@pytest.fixture(scope="module")
def next_token_probs():
    """probs(ids) -> transformers' next-token distribution after `ids` (fp64 softmax)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(demo_model("tiny"), dtype=torch.float32).eval()

    def probs(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.softmax(model(torch.tensor([ids])).logits[0, -1].double(), -1)
    return probs


def _close(got: list[list[float]], want: list[list[float]]) -> None:
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-12), (got, want)


@pytest.mark.parametrize("item_first", [False, True])
def test_text_scores_are_next_token_probabilities(engine, next_token_probs, item_first):
    got = engine.score(QUERY, ITEMS, LABELS, item_first=item_first)
    texts = [item + QUERY if item_first else QUERY + item for item in ITEMS]
    want = [[next_token_probs(engine.tokenizer.encode(t))[label].item() for label in LABELS] for t in texts]
    _close(got, want)


def test_token_ids_and_softmax_over_labels(engine, next_token_probs):
    query = engine.tokenizer.encode(QUERY)
    items = [engine.tokenizer.encode(item, add_special_tokens=False) for item in ITEMS]
    got = engine.score(query, items, LABELS, apply_softmax=True)
    want = []
    for item in items:
        p = next_token_probs(query + item)[LABELS]
        want.append((p / p.sum()).tolist())
    _close(got, want)
    assert all(math.isclose(sum(row), 1.0, rel_tol=1e-9) for row in got)
    assert engine.score(query, [items[0]], [LABELS[0]], apply_softmax=True) == [[1.0]]


@pytest.mark.parametrize("item_len, per_label", [(40, 1), (2, 3)])
def test_items_share_the_querys_kv(engine, item_len, per_label):
    """The query is computed once for all items. Each item is computed once for all its labels
    when it is longer than the in-batch de-duplication threshold (the labels wait a step for its
    KV); a short one is computed again beside each label in the same step."""
    query = list(range(10 + item_len, 210 + item_len))  # 200 tokens nobody cached yet
    items = [[300 + 50 * i + j for j in range(item_len)] for i in range(8)]
    before = engine.stats().prefill_tokens_computed
    engine.score(query, items, [1, 2, 3])
    computed = engine.stats().prefill_tokens_computed - before
    want = 200 + 8 * item_len + 8 * 3 if per_label == 1 else 200 + 8 * 3 * (item_len + 1)
    assert want - 16 <= computed <= want + 16, (computed, want)  # within two tokens an item
    engine.check_accounting()


@pytest.mark.parametrize("args, message", [
    ((QUERY, [], [1]), "items must be a non-empty list"),
    ((QUERY, [" a", [1, 2]], [1]), "items must be strings"),
    (([1, 2], [" a"], [1]), "items must be token id lists"),
    (([1, "x"], [[1]], [1]), "query must be a string or a list of token ids"),
    ((QUERY, ITEMS, []), "label_token_ids must be a non-empty list"),
    ((QUERY, ITEMS, [True]), "label_token_ids must be a non-empty list"),
    ((QUERY, ITEMS, [10**9]), "label_token_ids: token id 1000000000 is outside the vocabulary"),
    (([], [[]], [1]), "query \\+ item is empty"),
    (([1], [[10**9]], [1]), "outside the vocabulary"),
])
def test_refusals(engine, args, message):
    with pytest.raises(ValueError, match=message):
        engine.score(*args)
    assert engine.score(QUERY, ITEMS[:1], [5])[0][0] > 0  # still serving
    engine.check_accounting()
    assert engine.invariant_violations == []


def test_item_first_must_be_a_bool(engine):
    with pytest.raises(ValueError, match="item_first must be true or false"):
        engine.score(QUERY, ITEMS, [5], item_first="yes")


def test_pairs_past_the_queue_are_refused_before_submitting():
    with Engine(demo_model("tiny"), max_num_seqs=4, max_queued_requests=4) as e:
        with pytest.raises(ValueError, match="9 item-label pairs"):
            e.score(QUERY, [" a", " b", " c"], [1, 2, 3])
        assert e.stats().num_finished == 0  # nothing was submitted
        assert len(e.score(QUERY, [" a", " b"], [1, 2, 3, 4])) == 2
