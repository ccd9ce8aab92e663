"""Generative scoring (SGLang's /v1/score): how likely each label token is right after query + item.

Each (item, label) pair is one prefill-only request of `query + item + [label]` that returns the
logprob of its last prompt position: a prompt position's logprob is that of its token given every
token before it, so this is the label's logprob as the next token after query + item, over the
whole vocabulary. The requests share KV through the prefix cache: every item's prompt starts with
the query (unless `item_first`), and an item's label requests differ in their last token only.
So the query is computed once, and an item longer than the scheduler's in-batch de-duplication
threshold (32 tokens) once, its other labels then computing one token each; a shorter item is
computed again beside each label of the same step (cheaper than waiting a step for it).

    item i, label j  →  request i * len(labels) + j:   [ query | item i | label j ]
                                                                          ^ logprob_start_len
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from radixflow.runtime.request_inputs import normalize_inputs
from radixflow.runtime.sampling_params import SamplingParams

PREFILL_ONLY = SamplingParams.from_dict({"max_new_tokens": 0})


@dataclass(frozen=True)
class ScoreBatch:
    """The prompts of one scoring request, one per item, and its label token ids."""

    prompts: list[list[int]]
    labels: list[int]

    def requests(self) -> list[tuple[list[int], int]]:
        """(input ids, logprob_start_len) per (item, label), item-major."""
        return [(prompt + [label], len(prompt)) for prompt in self.prompts for label in self.labels]

    def scores(self, results: list[dict[str, Any]], apply_softmax: bool) -> list[list[float]]:
        """Per item, each label's probability from the requests' native results (in `requests()`
        order); ValueError when one was aborted or failed before its logprob."""
        logprobs = [_label_logprob(result) for result in results]
        n = len(self.labels)
        out = []
        for i in range(len(self.prompts)):
            row = logprobs[i * n: (i + 1) * n]
            if apply_softmax:  # the labels' logits minus one shared log-normalizer: their softmax is the logprobs'
                top = max(row)
                row = [lp - top - math.log(sum(math.exp(x - top) for x in row)) for lp in row]
            out.append([math.exp(lp) for lp in row])
        return out


def _label_logprob(result: dict[str, Any]) -> float:
    meta = result["meta_info"]
    entries = meta.get("input_token_logprobs") or []
    if not entries or entries[-1][0] is None:
        reason = meta.get("finish_reason") or {}
        raise ValueError(f"a scoring request ended before its score: {reason.get('type', 'no result')}"
                         f"{': ' + reason['message'] if reason.get('message') else ''}")
    return float(entries[-1][0])


def score_requests(tokenizer: Any, query: str | list[int], items: str | list[str] | list[list[int]],
                   label_token_ids: list[int], item_first: bool, vocab_size: int) -> ScoreBatch:
    """The batch for a scoring request; ValueError naming the field for bad input. Text query and
    items are joined as text and tokenized as a prompt is; token ids are joined as lists."""
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list) or not items:
        raise ValueError("items must be a non-empty list of strings or of token id lists (or one string)")
    text = isinstance(query, str)
    if not text and not (isinstance(query, list) and all(_is_id(t) for t in query)):
        raise ValueError("query must be a string or a list of token ids")
    if not all(isinstance(item, str) if text else (isinstance(item, list) and all(map(_is_id, item)))
               for item in items):
        raise ValueError(f"items must be {'strings, as the query is text' if text else 'token id lists, as the query is'}")
    if not text:
        _check_vocab("query", query, vocab_size)
        for item in items:
            _check_vocab("items", item, vocab_size)
    if not isinstance(label_token_ids, list) or not label_token_ids or not all(map(_is_id, label_token_ids)):
        raise ValueError("label_token_ids must be a non-empty list of token ids")
    _check_vocab("label_token_ids", label_token_ids, vocab_size)
    if not isinstance(item_first, bool):
        raise ValueError(f"item_first must be true or false, got {item_first!r}")
    joined = [item + query if item_first else query + item for item in items]
    prompts = normalize_inputs(tokenizer, joined, None)[0] if text else [list(p) for p in joined]
    if not all(prompts):
        raise ValueError("items: query + item is empty for an item; a label is scored after at least one token")
    return ScoreBatch(prompts, list(label_token_ids))


def _check_vocab(field: str, ids: list[int], vocab_size: int) -> None:
    outside = next((t for t in ids if not 0 <= t < vocab_size), None)
    if outside is not None:
        raise ValueError(f"{field}: token id {outside} is outside the vocabulary (0..{vocab_size - 1})")


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
