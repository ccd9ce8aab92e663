"""A few-shot classification pipeline over many inputs with `run_batch`: the few-shot prefix
is prefilled once and every other request hits it.

    python examples/few_shot_batch.py
"""
from __future__ import annotations

import radixflow.lang as rf
from _common import backend_from_args, report_cache

SHOTS = [("The delivery came two days late.", "negative"), ("Lovely staff and quick service.", "positive"),
         ("It works, nothing special.", "neutral"), ("The soup was cold and bland.", "negative"),
         ("Best coffee in town!", "positive")]
REVIEWS = ["Great prices and friendly people.", "The app crashes every morning.", "It was fine.",
           "Wonderful views from the terrace.", "Support never answered my email.", "Average food."]


@rf.function
def classify(s, review):
    for text, label in SHOTS:
        s += f"Review: {text}\nSentiment: {label}\n\n"
    s += f"Review: {review}\nSentiment: " + rf.select("label", ["positive", "negative", "neutral"])


def main(backend: rf.Engine) -> None:
    before = backend.engine.stats()
    states = classify.run_batch([{"review": r} for r in REVIEWS], backend=backend, num_threads=4,
                                temperature=0)
    for review, st in zip(REVIEWS, states):
        print(f"{st['label']:9s} <- {review}")
    assert [st["label"] in ("positive", "negative", "neutral") for st in states] == [True] * len(REVIEWS)
    hits = report_cache(backend, before)
    assert hits["hit_tokens"] > 0


if __name__ == "__main__":
    main(backend_from_args(__doc__))
