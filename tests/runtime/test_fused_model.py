"""The model on the fused Triton ops (norm + residual, RoPE in place, SiLU-and-mul) equals the torch path.

On CPU the Triton ops run in the interpreter (tests/conftest.py sets TRITON_INTERPRET=1): a tiny
model, a few tokens.
"""
from __future__ import annotations

import random

import torch

from radixflow.runtime import Engine
from radixflow.runtime.model import model
from radixflow.runtime.model.demo import demo_model

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
CONFIG = dict(model=demo_model("tiny"), device="cpu", dtype="float32", kv_cache_tokens=1024, attention_backend="torch")


def _run(monkeypatch, fused: bool) -> tuple[list[list[int]], list[list[float]]]:
    monkeypatch.setattr(model, "FORCE_TRITON_OPS", fused)
    with Engine(**CONFIG) as engine:
        rng = random.Random(3)
        prompts = [[rng.randrange(engine.runner.args.vocab_size) for _ in range(n)] for n in (5, 13)]
        results = engine.generate(input_ids=prompts, sampling_params=GREEDY, return_logprob=True)
    return ([r["output_ids"] for r in results],
            [[lp for lp, _, _ in r["meta_info"]["output_token_logprobs"]] for r in results])


def test_fused_ops_model_equals_torch_path(monkeypatch):
    want_ids, want_lps = _run(monkeypatch, False)
    got_ids, got_lps = _run(monkeypatch, True)
    assert got_ids == want_ids
    torch.testing.assert_close(torch.tensor(got_lps), torch.tensor(want_lps), rtol=1e-4, atol=1e-4)
