"""Decode on CPU reads a prefix the radix cache shares once for the requests that share it
(kernels/torch_decode.py): greedy outputs equal those of every request reading its own context."""
from __future__ import annotations

import random

import pytest
import torch

from radixflow.kernels import torch_decode
from radixflow.runtime.engine import Engine
from radixflow.runtime.model.demo import demo_model

GREEDY = {"temperature": 0, "ignore_eos": True}


def _prompts(num_groups: int, per_group: int, prefix_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(num_groups):
        prefix = [rng.randrange(3, 3000) for _ in range(prefix_len)]
        out += [prefix + [rng.randrange(3, 3000) for _ in range(rng.randrange(1, 9))] for _ in range(per_group)]
    return out + [[rng.randrange(3, 3000) for _ in range(90)]]  # and one that shares nothing


@pytest.mark.parametrize("native_kernel", ["0", "1"])
def test_greedy_outputs_equal_with_shared_prefix_reads_on_and_off(monkeypatch, native_kernel):
    """On the torch path (gathered matmuls) or the native kernel's (the prefix read in place)."""
    monkeypatch.setenv("RADIXFLOW_NATIVE_KERNELS", native_kernel)
    monkeypatch.setattr(torch_decode, "NATIVE_SHARED_MIN_READS", 0)  # small groups split too (the mechanism)
    prompts = _prompts(num_groups=2, per_group=3, prefix_len=120)
    taken = []
    name = "_native_prefix_parts" if native_kernel == "1" else "_prefix_parts"
    real = getattr(torch_decode, name)
    monkeypatch.setattr(torch_decode, name, lambda *a: taken.append(a[0].shape[0]) or real(*a))
    outputs = {}
    for name, threshold in (("on", torch_decode.MIN_SHARED_PREFIX_TOKENS), ("off", 1 << 62)):
        monkeypatch.setattr(torch_decode, "MIN_SHARED_PREFIX_TOKENS", threshold)
        with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=8192, check_invariants=True) as e:
            e.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 0})  # cache the prefixes
            results = e.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 12})
            assert not e.invariant_violations
        outputs[name] = [r["output_ids"] for r in results]
        assert all(len(o) == 12 for o in outputs[name])
        if name == "on":  # each decode step of each layer read each group's prefix once, for its 3 requests
            assert taken and set(taken) == {3}
            taken.clear()
    assert not taken
    assert outputs["on"] == outputs["off"]


def test_plan_decode_on_the_engine_s_slot_table(monkeypatch):
    """Requests that hit one cached prefix share its slots in the slot table: the plan finds them
    (plan_checked_decode plans each step at layer 0)."""
    prompts = _prompts(num_groups=1, per_group=4, prefix_len=100, seed=1)[:4]
    monkeypatch.setattr(torch_decode, "NATIVE_SHARED_MIN_READS", 0)  # the native path splits this small group too
    plans = []
    real = torch_decode.plan_decode
    monkeypatch.setattr(torch_decode, "plan_decode", lambda *a, **kw: plans.append(real(*a, **kw)) or plans[-1])
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=4096) as e:
        e.generate(input_ids=prompts[:1], sampling_params={**GREEDY, "max_new_tokens": 0})
        e.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 3})
    shared = [p.shared for p in plans if p.shared]
    assert shared, "no decode step found the shared prefix"
    (prefix,), = shared[:1]
    assert prefix.rows.numel() == 4 and prefix.slots.shape[0] >= 100
    assert prefix.slots.dtype == torch.int64


def test_greedy_outputs_equal_with_long_rows_read_alone_and_gathered(monkeypatch):
    """A request with a long context beside short ones: read by itself in chunks
    (LONG_ROW_TOKENS lowered here) or gathered whole with the others, greedy outputs are the
    same, shared prefixes included (the torch path: the native kernel has no long-row split)."""
    monkeypatch.setenv("RADIXFLOW_NATIVE_KERNELS", "0")
    rng = random.Random(2)
    prompts = _prompts(num_groups=1, per_group=2, prefix_len=80, seed=3)
    prompts += [[rng.randrange(3, 3000) for _ in range(700)], [rng.randrange(3, 3000) for _ in range(9)]]
    plans = []
    real = torch_decode.plan_decode
    monkeypatch.setattr(torch_decode, "plan_decode", lambda *a, **kw: plans.append(real(*a, **kw)) or plans[-1])
    outputs = {}
    for name, threshold in (("alone", 256), ("gathered", 1 << 62)):
        monkeypatch.setattr(torch_decode, "LONG_ROW_TOKENS", threshold)
        monkeypatch.setattr(torch_decode, "SHARED_CHUNK_TOKENS", 256)
        plans.clear()
        with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=8192, check_invariants=True) as e:
            results = e.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 10})
            assert not e.invariant_violations
        outputs[name] = [r["output_ids"] for r in results]
        long_rows = {len(slots) for p in plans for _, slots in p.long}
        assert bool(long_rows) == (name == "alone")
        assert name == "gathered" or max(long_rows) > 700  # the long prompt's row among them
    assert outputs["alone"] == outputs["gathered"]
