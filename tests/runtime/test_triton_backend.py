"""The engine on the Triton kernels equals the engine on the torch references (greedy, tiny model).

On CPU the kernels run in the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1),
which is slow: a few short prompts only. Also: the fp8 KV cache stays close to the fp32 one.
"""
from __future__ import annotations

import random

import pytest
import torch

from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 weights on either device, so both backends do the same arithmetic up to summation order.
# Chunks of 16 tokens split the longer prompts; max_num_seqs=4 keeps the CUDA graphs few.
BASE_CONFIG = dict(device=DEVICE, dtype="float32", kv_cache_tokens=2048, chunked_prefill_size=16, max_num_seqs=4)
# |logprob with fp8 KV - logprob with fp32 KV| of the fp32 greedy tokens: measured at most 0.15
# (e4m3 rounds K/V by up to 2^-4 relative); a wrong scale or rounding shows as whole units.
FP8_LOGPROB_TOL = 0.3


def _prompts(vocab: int) -> tuple[list[int], list[list[int]]]:
    """A warm-up prompt, then a batch mixing cached prefixes of it with fresh prompts."""
    rng = random.Random(7)
    shared = [rng.randrange(vocab) for _ in range(30)]
    warm = shared + [rng.randrange(vocab) for _ in range(5)]
    batch = [
        shared + [rng.randrange(vocab) for _ in range(6)],  # 30 cached tokens, then 6 new
        [rng.randrange(vocab) for _ in range(11)],          # fresh
        shared[:20] + [rng.randrange(vocab) for _ in range(3)],  # 20 cached, split inside a node
        [rng.randrange(vocab) for _ in range(37)],          # fresh, three chunks
    ]
    return warm, batch


def _run(backend: str, **config) -> tuple[list[list[int]], list[int]]:
    """Greedy outputs of the mixed batch, and the cached-token counts it reported."""
    with Engine(demo_model("tiny"), attention_backend=backend, check_invariants=True, **{**BASE_CONFIG, **config}) as engine:
        warm, batch = _prompts(engine.runner.args.vocab_size)
        assert engine.runner.shape.attention_backend == backend
        engine.generate(input_ids=warm, sampling_params=GREEDY)
        results = engine.generate(input_ids=batch, sampling_params=GREEDY)
        assert not engine.invariant_violations
    return [r["output_ids"] for r in results], [r["meta_info"]["cached_tokens"] for r in results]


@pytest.fixture(scope="module")
def torch_outputs() -> dict[str, tuple[list[list[int]], list[int]]]:
    return {kv: _run("torch", kv_cache_dtype=kv) for kv in ("auto", "fp8_e4m3")}


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_triton_backend_greedy_equals_torch(torch_outputs, kv_cache_dtype):
    want_ids, want_cached = torch_outputs[kv_cache_dtype]
    got_ids, got_cached = _run("triton", kv_cache_dtype=kv_cache_dtype)
    assert got_cached == want_cached and got_cached[0] >= 30 and got_cached[2] >= 20  # prefix hits happened
    assert got_ids == want_ids
    assert all(len(ids) == GREEDY["max_new_tokens"] for ids in got_ids)


def test_environment_variable_selects_backend(monkeypatch):
    monkeypatch.setenv("RADIXFLOW_ATTENTION_BACKEND", "torch")
    with Engine(demo_model("tiny"), attention_backend="triton", **BASE_CONFIG) as engine:
        assert engine.runner.shape.attention_backend == "torch"


def _teacher_forced_logprobs(kv_cache_dtype: str, prompts: list[list[int]],
                             outputs: list[list[int]]) -> list[list[float]]:
    """Logprobs the model gives each token of `outputs` after its prompt (one prefill, no sampling)."""
    with Engine(demo_model("tiny"), attention_backend="torch", kv_cache_dtype=kv_cache_dtype, **BASE_CONFIG) as engine:
        results = engine.generate(
            input_ids=[p + o for p, o in zip(prompts, outputs)], return_logprob=True,
            logprob_start_len=len(prompts[0]) - 1,  # all prompts of one length here
            sampling_params={"temperature": 0, "max_new_tokens": 1})
    return [[lp for lp, _tok, *_ in r["meta_info"]["input_token_logprobs"][-len(o):]]
            for r, o in zip(results, outputs)]


def test_fp8_kv_cache_stays_close_to_fp32(torch_outputs):
    rng = random.Random(3)
    with Engine(demo_model("tiny"), attention_backend="torch", **BASE_CONFIG) as engine:
        vocab = engine.runner.args.vocab_size
        prompts = [[rng.randrange(vocab) for _ in range(24)] for _ in range(3)]
        fp32 = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
    with Engine(demo_model("tiny"), attention_backend="torch", kv_cache_dtype="fp8_e4m3", **BASE_CONFIG) as engine:
        fp8 = [r["output_ids"] for r in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
    # e4m3 keeps 3 mantissa bits: the random tiny model drifts within a few tokens, but not at once
    assert [o[:2] for o in fp8] == [o[:2] for o in fp32]
    exact = _teacher_forced_logprobs("auto", prompts, fp32)
    approx = _teacher_forced_logprobs("fp8_e4m3", prompts, fp32)
    diffs = [abs(a - b) for row_a, row_b in zip(exact, approx) for a, b in zip(row_a, row_b)]
    assert len(diffs) == 3 * GREEDY["max_new_tokens"]
    assert max(diffs) < FP8_LOGPROB_TOL, diffs


@pytest.mark.gpu
def test_gpu_triton_backend_greedy_equals_torch(torch_outputs):
    # the same checks as above with compiled kernels and CUDA graphs; runs under `pytest -m gpu`
    for kv in ("auto", "fp8_e4m3"):
        got_ids, got_cached = _run("triton", kv_cache_dtype=kv)
        assert (got_ids, got_cached) == torch_outputs[kv]
