"""POST /v1/score over HTTP (both cores): the engine's scores, and every refusal a 4xx naming its field."""
from __future__ import annotations

import math

import pytest

QUERY = "The capital of France is"
ITEMS = [" Paris", " Rome"]
LABELS = [5, 7, 100]


def test_scores_equal_the_engines(client, engine):
    body = {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "model": "tiny"}
    r = client.post("/v1/score", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    want = engine.score(QUERY, ITEMS, LABELS)
    assert data["object"] == "scoring" and data["model"] == "tiny"
    for got_row, want_row in zip(data["scores"], want, strict=True):
        # the second call extends the query cached by the first: a float sum in another order
        assert all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-7) for a, b in zip(got_row, want_row, strict=True))
    tokens = sum(len(engine.tokenizer.encode(QUERY + item)) for item in ITEMS)
    assert data["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
    ids = client.post("/v1/score", json={"query": engine.tokenizer.encode(QUERY), "items": [[5, 6], [7]],
                                         "label_token_ids": [9, 10], "apply_softmax": True, "item_first": True})
    assert ids.status_code == 200, ids.text
    assert [math.fsum(row) for row in ids.json()["scores"]] == pytest.approx([1.0, 1.0])
    one = client.post("/v1/score", json={"query": QUERY, "items": " Paris", "label_token_ids": [5]})
    assert one.status_code == 200 and len(one.json()["scores"]) == 1


@pytest.mark.parametrize("body, status, param", [
    ({"query": QUERY, "items": [], "label_token_ids": [1]}, 400, "items"),
    ({"query": QUERY, "items": [" a", [1]], "label_token_ids": [1]}, 400, "items"),
    ({"query": [1, 2], "items": [" a"], "label_token_ids": [1]}, 400, "items"),
    ({"query": QUERY, "items": ITEMS, "label_token_ids": []}, 400, "label_token_ids"),
    ({"query": QUERY, "items": ITEMS, "label_token_ids": [10**9]}, 400, "label_token_ids"),
    ({"query": QUERY, "items": ITEMS, "label_token_ids": ["a"]}, 400, "label_token_ids"),
    ({"query": QUERY, "items": ITEMS}, 400, "label_token_ids"),
    ({"query": QUERY, "items": ITEMS, "label_token_ids": [1], "top_k": 3}, 400, "top_k"),
    ({"query": QUERY, "items": ITEMS, "label_token_ids": [1], "model": "nope"}, 404, "model"),
    ({"query": QUERY, "items": [" x"] * 300, "label_token_ids": [1]}, 400, "items"),
    ({"query": QUERY, "items": ITEMS, "label_token_ids": list(range(300))}, 400, "label_token_ids"),
    ({"query": "word " * 40_000, "items": [" a"] * 6, "label_token_ids": [1]}, 400, "items"),  # 1.2M joined chars
    ({"query": list(range(1, 3000)), "items": [[1]], "label_token_ids": [1]}, 400, "items"),
    ({"query": [1], "items": [[10**9]], "label_token_ids": [1]}, 400, "items"),
])
def test_refusals(client, engine, wait_idle, body, status, param):
    r = client.post("/v1/score", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param, r.json()
    wait_idle(engine, kv=False)
    engine.check_accounting()


def test_item_label_pairs_are_bounded_up_front(client):
    """Every (item, label) pair is a request: their product is a limit of its own (a 400 naming
    items, before anything is submitted), not a queue-full 429 that no retry can pass."""
    r = client.post("/v1/score", json={"query": QUERY, "items": [" x"] * 200, "label_token_ids": list(range(10))})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "items" and error["code"] == "limit_exceeded" and "max_score_pairs" in error["message"]


def test_a_bad_query_id_names_the_query(client):
    r = client.post("/v1/score", json={"query": [-1], "items": [[5]], "label_token_ids": [1]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "query", r.json()
