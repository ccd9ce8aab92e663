"""Bench workloads: deterministic from their seed, and shaped as each one promises."""
from __future__ import annotations

import asyncio
import statistics

import pytest

from radixflow.frontend.bench.metrics import RequestResult
from radixflow.frontend.bench.runner import run_workload
from radixflow.frontend.bench.workloads import FIRST_ID, GENERATORS, make_workload, unique_tokens

VOCAB = 3072


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_same_seed_same_requests_other_seed_others(name):
    a = make_workload(name, num_prompts=26, vocab_size=VOCAB, seed=1, scale=0.25)
    assert a == make_workload(name, num_prompts=26, vocab_size=VOCAB, seed=1, scale=0.25)
    assert a.requests != make_workload(name, num_prompts=26, vocab_size=VOCAB, seed=2, scale=0.25).requests
    ids = [t for r in a.requests for t in r.new_ids]
    assert min(ids) >= FIRST_ID and max(ids) < VOCAB
    assert all(r.parent is None or r.parent < i for i, r in enumerate(a.requests))


def test_fewshot_shares_its_long_prefix():
    wl = make_workload("fewshot", num_prompts=8, vocab_size=VOCAB, scale=0.5)
    first = wl.requests[0].new_ids
    shared = [_common_prefix(first, r.new_ids) for r in wl.requests[1:]]
    assert all(512 <= s < 512 + 4 for s in shared)  # the 512-token k-shot prefix (+ a chance token)
    assert all(len(r.new_ids) == 512 + 16 for r in wl.requests)
    assert wl.num_roots == 8


def test_agent_turns_add_about_two_percent_to_a_shared_system_prompt():
    wl = make_workload("agent", num_prompts=16, vocab_size=VOCAB, scale=0.5, think_time_s=0.3)
    roots = [r for r in wl.requests if r.parent is None]
    assert len(roots) == 2 and _common_prefix(roots[0].new_ids, roots[1].new_ids) >= 768
    context = len(roots[0].new_ids)
    for r in wl.requests[1:8]:
        context += r.max_new_tokens  # the parent's output joins the context
        assert r.parent is not None and r.think_time_s == 0.3
        assert 0.015 <= len(r.new_ids) / context <= 0.025
        context += len(r.new_ids)


def test_tree_branches_three_ways_twice():
    wl = make_workload("tree", num_prompts=26, vocab_size=VOCAB, scale=0.25)
    assert len(wl.requests) == 26 and wl.num_roots == 2
    children = {i: [j for j, r in enumerate(wl.requests) if r.parent == i] for i in range(13)}
    assert len(children[0]) == 3 and all(len(children[c]) == 3 for c in children[0])


def test_random_shares_nothing_and_has_a_long_tail():
    wl = make_workload("random", num_prompts=200, vocab_size=VOCAB)
    firsts = {r.new_ids[:4] for r in wl.requests}
    assert len(firsts) == 200
    lens = [len(r.new_ids) for r in wl.requests]
    assert max(lens) > 2.5 * statistics.median(lens) and min(lens) >= 4


def test_json_requests_carry_the_schema():
    wl = make_workload("json", num_prompts=4, vocab_size=VOCAB, scale=0.25)
    assert all(r.json_schema and r.json_schema["required"] == ["name", "age", "city"] for r in wl.requests)


def test_bad_arguments_raise_value_error():
    for kwargs in ({"name": "nope"}, {"name": "fewshot", "num_prompts": 0}, {"name": "fewshot", "vocab_size": 100}):
        args = {"name": "fewshot", "num_prompts": 4, "vocab_size": VOCAB, **kwargs}
        with pytest.raises(ValueError):
            make_workload(args.pop("name"), **args)


class _EchoClient:
    """Answers each prompt with [len(prompt) % 97 + 300, ...] so outputs differ per turn."""

    def __init__(self) -> None:
        self.sent: list[list[int]] = []

    async def send(self, prompt_ids, max_new_tokens, json_schema):
        self.sent.append(list(prompt_ids))
        out = [300 + (len(prompt_ids) + k) % 97 for k in range(max_new_tokens)]
        return RequestResult(len(prompt_ids), out, 0.001, 0.002, [], 0)

    async def close(self) -> None:
        return None


def test_multiturn_prompt_extends_previous_prompt_and_output():
    wl = make_workload("multiturn", num_prompts=8, vocab_size=VOCAB, scale=0.25)
    results, prompts, _ = asyncio.run(run_workload(_EchoClient(), wl))
    for i, r in enumerate(wl.requests):
        if r.parent is not None:
            assert prompts[i] == prompts[r.parent] + results[r.parent].output_ids + list(r.new_ids)
    assert sum(r.parent is None for r in wl.requests) == 2  # 2 sessions of 4 turns


def test_unique_tokens_counts_shared_prefixes_once():
    assert unique_tokens([[1, 2, 3], [1, 2, 4], [5]]) == 5
    assert unique_tokens([]) == 0
