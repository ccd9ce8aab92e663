"""RoPE layouts other than whole-head rotate-half (Phi-4-mini: 3/4 of each head; GLM: half, in
interleaved pairs; ERNIE 4.5: interleaved pairs) on the whole-head kernels: q and k head dims
reordered at load (runtime/model/rope_layout.py). Prefill logits and greedy output against
transformers are in test_model_parity.py (FAMILIES' phi3_partial, glm, glm4, ernie4_5); here the
reordering itself, adapters on the reordered projections, and LongRoPE over part of the head."""
from __future__ import annotations

import pytest
import torch

from radixflow.runtime import Engine
from radixflow.runtime.model.rope_layout import pass_through_columns, rotary_order, to_rotary_order

GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("head_dim, rotary_dim", [(16, 8), (16, 12), (128, 96), (8, 2), (16, 16)])
def test_the_reordering_pairs_the_rotated_dims_as_the_checkpoint_does(head_dim, rotary_dim, interleaved):
    order = rotary_order(head_dim, rotary_dim, interleaved)
    assert sorted(order.tolist()) == list(range(head_dim))  # a permutation
    half, rot_half = head_dim // 2, rotary_dim // 2
    for j in range(rot_half):  # our pair (j, j + D/2) is the checkpoint's pair j: (j, j + r/2) or (2j, 2j + 1)
        want = (2 * j, 2 * j + 1) if interleaved else (j, rot_half + j)
        assert (order[j].item(), order[half + j].item()) == want
    passed = set(pass_through_columns(head_dim, rotary_dim).tolist())
    assert {order[c].item() for c in passed} == set(range(rotary_dim, head_dim))  # the checkpoint's pass dims
    rows = torch.arange(3 * head_dim * 2, dtype=torch.float32).reshape(3 * head_dim, 2)
    moved = to_rotary_order(rows, head_dim, rotary_dim, interleaved)
    assert torch.equal(moved.reshape(3, head_dim, 2), rows.reshape(3, head_dim, 2)[:, order])


@pytest.mark.parametrize("family, targets", [
    ("phi3_partial", ("qkv_proj", "o_proj")),                         # fused q | k | v
    ("glm4", ("q_proj", "k_proj", "v_proj", "gate_up_proj")),         # half of each head, interleaved pairs
    ("ernie4_5", ("q_proj", "k_proj", "down_proj")),                  # whole heads, interleaved pairs
])
def test_an_adapter_on_the_reordered_projections_equals_its_merged_weights(hf_checkpoint, tmp_path, family,
                                                                          targets):
    """lora_B's q and k rows are reordered as the base's are."""
    from lora_adapters import assert_adapter_equals_merged, write_adapter

    model_dir, _ = hf_checkpoint(family)
    prompts = [[5, 77, 300, 12, 41, 8], [901, 44, 2, 17, 17, 250, 9, 3, 3]]
    adapter = write_adapter(str(tmp_path / "a"), model_dir, targets=targets)
    assert_adapter_equals_merged(model_dir, adapter, prompts, str(tmp_path / "merged"), GREEDY)


def test_longrope_over_part_of_each_head_matches_transformers(tmp_path):
    """Phi-4-mini's form: 3/4 of each head rotated, LongRoPE factors for those dims only, the
    pass-through dims left unscaled by the attention factor; greedy output across the switch."""
    from test_longrope import SWITCH, _factors, _prompt, save_tiny_phi3
    from test_model_parity import _hf_greedy

    hf = save_tiny_phi3(str(tmp_path), seed=3, partial_rotary_factor=0.75, tie_word_embeddings=True,
                        rope_scaling={"type": "longrope", "short_factor": _factors(1, 1.0, 3.0)[:6],
                                      "long_factor": _factors(2, 4.0, 40.0)[:6]})
    assert SWITCH == hf.config.original_max_position_embeddings
    prompts = [_prompt(n, seed=4) for n in (6, 12, 20)]
    with Engine(str(tmp_path), dtype="float32", kv_cache_tokens=512) as engine:
        outs = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
    assert outs == [_hf_greedy(hf, p, GREEDY["max_new_tokens"]) for p in prompts]


@pytest.mark.parametrize("family", ["phi3_partial", "glm4", "ernie4_5"])
@pytest.mark.gpu
def test_gpu_reordered_heads_match_transformers(hf_checkpoint, family):
    """On CUDA (Triton RoPE over the reordered heads, decode graphs): fp32 greedy as transformers'."""
    from test_model_parity import _hf_greedy

    model_dir, hf = hf_checkpoint(family)
    prompts = [[5, 77, 300, 12, 41, 8], [901, 44, 2, 17, 17, 250, 9, 3, 3]]
    with Engine(model_dir, device="cuda", dtype="float32", kv_cache_tokens=1024, cuda_graph_max_bs=4) as engine:
        outs = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
    assert outs == [_hf_greedy(hf, p, GREEDY["max_new_tokens"]) for p in prompts]
