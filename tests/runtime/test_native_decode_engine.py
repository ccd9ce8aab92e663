"""The engine's CPU decode through the native kernel (kernels/native.py) or the torch gather
path: the same greedy outputs, and the kernel really runs when it is on."""
from __future__ import annotations

import random

import pytest

from radixflow.kernels import native
from radixflow.runtime.engine import Engine
from radixflow.runtime.model.demo import demo_model

GREEDY = {"temperature": 0, "ignore_eos": True}


def test_greedy_outputs_equal_with_the_native_kernel_on_and_off(monkeypatch):
    if native._compiler() is None:
        pytest.skip("no C compiler: the native kernel cannot build")
    rng = random.Random(5)
    prefix = [rng.randrange(3, 3000) for _ in range(100)]
    prompts = ([prefix + [rng.randrange(3, 3000) for _ in range(n)] for n in (1, 4, 9)]  # a shared prefix
               + [[rng.randrange(3, 3000) for _ in range(n)] for n in (1, 33, 700)])  # one token; one long row
    calls = []
    real = native.decode_attention_native
    monkeypatch.setattr(native, "decode_attention_native", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    outputs = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(native.ENV_SWITCH, switch)
        with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=8192, check_invariants=True) as e:
            e.generate(input_ids=prompts[:1], sampling_params={**GREEDY, "max_new_tokens": 0})  # cache the prefix
            results = e.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 10})
            assert not e.invariant_violations
        outputs[switch] = [r["output_ids"] for r in results]
        assert bool(calls) == (switch == "1")  # every decode layer went through it, or none
        if calls:
            assert max(calls) == len(prompts)
        calls.clear()
    assert all(len(o) == 10 for o in outputs["1"])
    assert outputs["1"] == outputs["0"]


def test_the_kernel_is_built_when_the_engine_starts_not_on_its_first_step(monkeypatch):
    built = []
    real = native.library
    monkeypatch.setattr(native, "library", lambda: built.append(1) or real())
    monkeypatch.setenv(native.ENV_SWITCH, "1")
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=1024):
        assert built  # asked for (built, or found built) before any request


def test_a_large_group_s_shared_prefix_through_the_extend_kernel_gives_the_same_greedy_outputs(monkeypatch):
    """20 requests x 4 query heads (80 > 64) sharing a 900-token prefix (19 x 900 reads spared:
    past torch_decode.NATIVE_SHARED_MIN_READS): the native path reads the prefix once with the
    extend kernel (not causal), merged with each request's own part; fp32 greedy outputs equal
    to the torch path's."""
    if native._compiler() is None:
        pytest.skip("no C compiler: the native kernel cannot build")
    rng = random.Random(7)
    prefix = [rng.randrange(3, 3000) for _ in range(900)]
    prompts = [prefix + [rng.randrange(3, 3000) for _ in range(1 + i % 5)] for i in range(20)]
    prefix_calls = []
    real = native.prefix_attention_native
    monkeypatch.setattr(native, "prefix_attention_native", lambda *a: prefix_calls.append(a[0].shape) or real(*a))
    outputs = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(native.ENV_SWITCH, switch)
        with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=8192, max_num_seqs=32,
                    check_invariants=True) as e:
            e.generate(input_ids=prompts[:1], sampling_params={**GREEDY, "max_new_tokens": 0})  # cache the prefix
            results = e.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 8})
            assert not e.invariant_violations
        outputs[switch] = [r["output_ids"] for r in results]
        assert bool(prefix_calls) == (switch == "1")
        assert all(shape[0] == 20 for shape in prefix_calls)  # the whole group in each call
        prefix_calls.clear()
    assert all(len(o) == 8 for o in outputs["1"])
    assert outputs["1"] == outputs["0"]
