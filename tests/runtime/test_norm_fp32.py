"""Norms whose weight multiplies in fp32 before the result is rounded to the model's dtype, as
transformers' Gemma (1 + w, in fp32) and gpt-oss (weights kept fp32) compute them: the weights are
kept fp32 at load, and every RMSNorm path (CPU torch here, the Triton kernel in
tests/kernels/test_fused_ops.py) then multiplies in fp32, so a bf16 model's norms give
transformers' bits."""
from __future__ import annotations

import pytest
import torch

from radixflow.runtime.model.model import RMSNorm
from radixflow.runtime.model.model_config import load_model_args
from radixflow.runtime.model.weights import build_model


def _inputs(dim: int = 64, rows: int = 7):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(rows, dim, generator=g) * 3).to(torch.bfloat16)
    w = (torch.randn(dim, generator=g) * 0.5).to(torch.bfloat16)  # a checkpoint's bf16 weight
    return x, w


def test_gemma_and_gpt_oss_norms_in_bf16_give_transformers_bits():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRMSNorm

    x, w = _inputs()
    gemma, oss = Gemma3RMSNorm(64, eps=1e-6), GptOssRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        gemma.weight.copy_(w.float())  # transformers computes 1 + w in fp32
        oss.weight.copy_(w.float())    # and keeps gpt-oss's norm weights fp32
    for ref, weight in ((gemma, w.float() + 1), (oss, w.float())):
        ours = RMSNorm(64, 1e-6)
        ours.weight = torch.nn.Parameter(weight)  # as loaded: fp32 (ModelArgs.fp32_parameters)
        with torch.no_grad():
            want = ref(x)
            got, _ = ours(x)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)


@pytest.mark.parametrize("family", ["gemma", "gemma2", "gemma3", "gpt_oss"])
def test_norm_weights_are_kept_fp32_in_a_bf16_model(hf_checkpoint, family):
    src, _ = hf_checkpoint(family)
    model = build_model(load_model_args(src), src, torch.bfloat16, torch.device("cpu"), 64)
    norms = {n: p.dtype for n, p in model.named_parameters() if n.endswith("norm.weight")}
    assert norms and set(norms.values()) == {torch.float32}
    assert model.layers[0].self_attn.qkv_proj.weight.dtype == torch.bfloat16
