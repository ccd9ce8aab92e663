"""CPU bf16 projections on oneDNN's prepacked layout give nn.Linear's outputs bit for bit."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from radixflow.runtime.core import model_runner
from radixflow.runtime.engine import Engine
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.model.model import project_logits
from radixflow.runtime.model.packed_linear import PACKED_PROJECTIONS, PackedLinear, can_prepack, prepack_linears

needs_onednn_bf16 = pytest.mark.skipif(not can_prepack(torch.device("cpu"), torch.bfloat16),
                                       reason="needs oneDNN bf16 on this CPU")


def test_only_cpu_bf16_prepacks():
    assert not can_prepack(torch.device("cpu"), torch.float32)
    assert not can_prepack(torch.device("meta"), torch.bfloat16)


@needs_onednn_bf16
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_linear(bias):
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias).to(torch.bfloat16)
    packed = PackedLinear.of(linear)
    for rows in (1, 7, 16, 300):
        x = torch.randn(rows, 96).to(torch.bfloat16)
        assert torch.equal(packed(x), linear(x)), rows
    x = torch.randn(8, 130).to(torch.bfloat16)[:, 17:113]  # a strided view, as a fused projection's slice
    assert torch.equal(packed(x), linear(x))


@needs_onednn_bf16
def test_packed_lm_head_equals_the_chunked_logits():
    torch.manual_seed(0)
    weight = torch.randn(1500, 64).to(torch.bfloat16)  # 1,500 vocabulary rows: chunks of 512 and a rest
    packed = PackedLinear(weight)
    for rows in (1, 16, 70):
        x = torch.randn(rows, 64).to(torch.bfloat16)
        assert torch.equal(packed(x).float(), project_logits(x, weight)), rows


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv_proj, self.other = nn.Linear(8, 24), nn.Linear(8, 8)
        self.mlp = nn.Module()
        self.mlp.down_proj = nn.Linear(16, 8, bias=False)


@needs_onednn_bf16
def test_prepack_swaps_the_named_projections_only():
    block = _Block().to(torch.bfloat16)
    assert prepack_linears(block) == 2  # no LM head: no packed copy of one
    assert isinstance(block.qkv_proj, PackedLinear) and isinstance(block.mlp.down_proj, PackedLinear)
    assert isinstance(block.other, nn.Linear)
    assert "other" not in PACKED_PROJECTIONS


@needs_onednn_bf16
def test_engine_outputs_equal_with_and_without_prepacking(monkeypatch):
    prompts = [[5 + i for i in range(n)] for n in (3, 17, 40)]
    params = {"temperature": 0, "ignore_eos": True, "max_new_tokens": 10}
    outputs = {}
    for prepack in (True, False):
        if not prepack:
            monkeypatch.setattr(model_runner, "can_prepack", lambda *a: False)
        with Engine(demo_model("tiny"), dtype="bfloat16", kv_cache_tokens=2048) as e:
            layers = e.runner.model.layers
            kinds = {type(layers[0].self_attn.qkv_proj), type(layers[0].mlp.down_proj)}
            assert kinds == ({PackedLinear} if prepack else {nn.Linear})
            assert isinstance(e.runner.model.packed_lm_head, PackedLinear) == prepack
            outputs[prepack] = [r["output_ids"] for r in e.generate(input_ids=prompts, sampling_params=params)]
    assert outputs[True] == outputs[False]
