"""Mixture-of-experts ops: routing, the pair alignment, the Triton grouped experts against the
torch reference (Triton interpreter on CPU, fp32 / fp16; bf16 on a GPU), and the reference against
each token run through its own experts."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixflow import kernels
from radixflow.kernels.moe import align_pairs


def _case(tokens: int, experts: int, top_k: int, hidden: int, inter: int, dtype: torch.dtype, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    w_gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) * hidden ** -0.5
    w_down = torch.randn(experts, hidden, inter, generator=g) * inter ** -0.5
    # a router that favours expert 0 and never picks the last one when it can avoid it
    logits = torch.randn(tokens, experts, generator=g)
    logits[:, 0] += 1.0
    logits[:, -1] -= 50.0
    weights, ids = kernels.moe_route(logits, top_k, renormalize=True)
    to = lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)  # noqa: E731
    return to(x), weights.to(device), ids.to(device), to(w_gate_up), to(w_down)


def test_route_takes_the_top_k_of_the_softmax_and_renormalizes_when_asked():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 0.0, 0.0, 1.0]])
    probs = torch.softmax(logits, dim=-1)
    weights, ids = kernels.moe_route(logits, 2, renormalize=False)
    assert ids.tolist() == [[3, 2], [0, 3]]
    torch.testing.assert_close(weights, probs.gather(1, ids))
    weights, ids = kernels.moe_route(logits, 2, renormalize=True)
    want = probs.gather(1, ids)
    torch.testing.assert_close(weights, want / want.sum(-1, keepdim=True))
    assert weights.dtype == torch.float32
    with pytest.raises(ValueError, match="top_k must be in"):
        kernels.moe_route(logits, 5, renormalize=True)


@pytest.mark.parametrize("tokens, experts, top_k", [(0, 4, 2), (1, 8, 2), (5, 4, 1), (7, 6, 3), (40, 8, 2)])
def test_align_pairs_lists_every_pair_once_in_blocks_of_one_expert(tokens, experts, top_k):
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts - 1, generator=g)[:top_k] for _ in range(tokens)]) if tokens else \
        torch.zeros(0, top_k, dtype=torch.int64)
    block = 4
    pairs, block_experts = align_pairs(ids, experts, block)
    n = tokens * top_k
    assert pairs.dtype == block_experts.dtype == torch.int32 and pairs.shape[0] == block_experts.shape[0] * block
    real = pairs[pairs < n]
    assert sorted(real.tolist()) == list(range(n))  # every pair once
    flat = ids.reshape(-1)
    for b, expert in enumerate(block_experts.tolist()):
        chunk = pairs[b * block:(b + 1) * block]
        chunk = chunk[chunk < n]
        if expert < 0:
            assert chunk.numel() == 0
        else:
            assert chunk.numel() > 0 and (flat[chunk.long()] == expert).all()
            assert chunk.tolist() == sorted(chunk.tolist())  # pair order within an expert
    used = {e for e in flat.tolist()}
    assert sum(e >= 0 for e in block_experts.tolist()) == sum(-(-int((flat == e).sum()) // block) for e in used)


@pytest.mark.parametrize("tokens, experts, top_k, hidden, inter", [
    (1, 4, 2, 32, 24), (3, 4, 1, 32, 16), (17, 6, 2, 48, 40), (33, 8, 3, 64, 32), (0, 4, 2, 32, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_moe_matches_the_reference(device, tokens, experts, top_k, hidden, inter, dtype):
    if dtype == torch.bfloat16 and device.type != "cuda":
        pytest.skip("the Triton interpreter's bf16 dots are wrong (see tests/kernels/conftest.py); bf16 runs on a GPU")
    x, weights, ids, w_gate_up, w_down = _case(tokens, experts, top_k, hidden, inter, dtype, device, seed=tokens)
    got = kernels.fused_moe(x, weights, ids, w_gate_up, w_down)
    want = kernels.fused_moe_ref(x, weights, ids, w_gate_up, w_down)
    assert got.shape == (tokens, hidden) and got.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("tokens", [1, 6])
def test_reference_equals_each_token_through_its_own_experts(tokens):
    x, weights, ids, w_gate_up, w_down = _case(tokens, 5, 2, 16, 12, torch.float32, torch.device("cpu"), seed=3)
    want = torch.zeros(tokens, 16, dtype=torch.float64)
    for t in range(tokens):
        for w, e in zip(weights[t].tolist(), ids[t].tolist()):
            gate, up = F.linear(x[t].double(), w_gate_up[e].double()).chunk(2)
            want[t] += w * F.linear(F.silu(gate) * up, w_down[e].double())
    torch.testing.assert_close(kernels.fused_moe_ref(x, weights, ids, w_gate_up, w_down).double(), want,
                               rtol=1e-5, atol=1e-5)


def _clamped(gate_up: torch.Tensor) -> torch.Tensor:  # gpt-oss's activation, limit 0.5 so that it clamps here
    from radixflow.runtime.model.model import swiglu_clamped

    return swiglu_clamped(gate_up, 1.702, 0.5)


@pytest.mark.parametrize("tokens", [1, 6, 33])
def test_biased_experts_with_another_activation_match_each_token_through_its_own_experts(device, tokens):
    """gpt-oss's experts: gate | up and down with biases, the clamped SwiGLU; the Triton kernels
    (biases added in the grouped matmuls, before the pair's weight) and the reference against
    each token run through its own experts in fp64."""
    x, weights, ids, w_gate_up, w_down = _case(tokens, 5, 2, 32, 16, torch.float32, device, seed=7)
    g = torch.Generator().manual_seed(8)
    b_gate_up = (torch.randn(5, 32, generator=g) * 0.5).to(device)
    b_down = (torch.randn(5, 32, generator=g) * 0.5).to(device)
    want = torch.zeros(tokens, 32, dtype=torch.float64)
    for t in range(tokens):
        for w, e in zip(weights[t].tolist(), ids[t].tolist()):
            gate_up = F.linear(x[t].double().cpu(), w_gate_up[e].double().cpu(), b_gate_up[e].double().cpu())
            want[t] += w * F.linear(_clamped(gate_up[None])[0], w_down[e].double().cpu(), b_down[e].double().cpu())
    ref = kernels.fused_moe_ref(x, weights, ids, w_gate_up, w_down, _clamped, b_gate_up, b_down)
    torch.testing.assert_close(ref.double().cpu(), want, rtol=1e-5, atol=1e-5)
    got = kernels.fused_moe(x, weights, ids, w_gate_up, w_down, _clamped, b_gate_up, b_down)
    torch.testing.assert_close(got.double().cpu(), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="b_down must be"):
        kernels.fused_moe(x, weights, ids, w_gate_up, w_down, _clamped, b_gate_up, b_down[:, :8])


def test_bad_shapes_raise_before_launch(device):
    x, weights, ids, w_gate_up, w_down = _case(3, 4, 2, 32, 16, torch.float32, device)
    with pytest.raises(ValueError, match="w_down must be"):
        kernels.fused_moe(x, weights, ids, w_gate_up, w_down[:, :, :8])
    with pytest.raises(ValueError, match="weights .* and ids .* must both be"):
        kernels.fused_moe(x, weights[:2], ids, w_gate_up, w_down)
    with pytest.raises(ValueError, match="w_gate_up .* must have H"):
        kernels.fused_moe_ref(x[:, :16], weights, ids, w_gate_up, w_down)


@pytest.mark.gpu
def test_gpu_bf16_qwen3_moe_shape_and_cuda_graph_replay():
    """Qwen3-30B-A3B's expert shape (128 experts, top 8, H 2048, I 768) at a decode batch, then the
    op captured in a CUDA graph and replayed on new routing: align_pairs reads nothing back."""
    device = torch.device("cuda")
    x, weights, ids, w_gate_up, w_down = _case(64, 128, 8, 2048, 768, torch.bfloat16, device)
    want = kernels.fused_moe_ref(x, weights, ids, w_gate_up, w_down)
    torch.testing.assert_close(kernels.fused_moe(x, weights, ids, w_gate_up, w_down), want, rtol=3e-2, atol=3e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.fused_moe(x, weights, ids, w_gate_up, w_down)
    _, new_weights, new_ids, _, _ = _case(64, 128, 8, 2048, 768, torch.bfloat16, device, seed=9)
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    graph.replay()
    torch.testing.assert_close(out, kernels.fused_moe_ref(x, weights, ids, w_gate_up, w_down), rtol=3e-2, atol=3e-2)


@pytest.mark.gpu
def test_gpu_bf16_gpt_oss_experts_with_biases_and_grouped_routing():
    """gpt-oss-20b's expert shape (32 experts, top 4, H = I = 2880) with biases and the clamped
    SwiGLU, compiled, against the reference; GLM-4.5's grouped routing on the device."""
    device = torch.device("cuda")
    x, weights, ids, w_gate_up, w_down = _case(48, 32, 4, 2880, 2880, torch.bfloat16, device)
    g = torch.Generator().manual_seed(4)
    b_gate_up = (torch.randn(32, 5760, generator=g) * 0.1).to(device, torch.bfloat16)
    b_down = (torch.randn(32, 2880, generator=g) * 0.1).to(device, torch.bfloat16)
    want = kernels.fused_moe_ref(x, weights, ids, w_gate_up, w_down, _clamped, b_gate_up, b_down)
    got = kernels.fused_moe(x, weights, ids, w_gate_up, w_down, _clamped, b_gate_up, b_down)
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)
    logits, bias = torch.randn(48, 160, generator=g), torch.randn(160, generator=g)
    weights, ids = kernels.moe_route_grouped(logits.to(device), 8, True, bias.to(device), 8, 4, 2.5)
    cpu_weights, cpu_ids = kernels.moe_route_grouped(logits, 8, True, bias, 8, 4, 2.5)
    assert torch.equal(ids.sort(dim=1).values.cpu(), cpu_ids.sort(dim=1).values)
    torch.testing.assert_close(weights.sort(dim=1).values.cpu(), cpu_weights.sort(dim=1).values)


@pytest.mark.parametrize("experts, n_group, topk_group, top_k, renormalize, scaling", [
    (8, 1, 1, 2, True, 1.0), (8, 2, 1, 2, True, 2.5), (16, 4, 2, 3, False, 1.0), (16, 8, 3, 4, True, 0.7),
    (6, 3, 3, 6, True, 1.0)])
def test_grouped_routing_matches_transformers_router(experts, n_group, topk_group, top_k, renormalize, scaling):
    """GLM-4.5's router (transformers' Glm4MoeTopkRouter) against moe_route_grouped: the same experts
    and weights for random logits and correction biases, the group restriction deciding some rows."""
    import transformers as tf
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter

    cfg = tf.Glm4MoeConfig(hidden_size=16, n_routed_experts=experts, num_experts_per_tok=top_k, n_group=n_group,
                           topk_group=topk_group, norm_topk_prob=renormalize, routed_scaling_factor=scaling)
    g = torch.Generator().manual_seed(experts * 10 + n_group)
    router = Glm4MoeTopkRouter(cfg)
    with torch.no_grad():
        router.weight.normal_(0.0, 1.0, generator=g)
        router.e_score_correction_bias.normal_(0.0, 0.5, generator=g)
    x = torch.randn(64, 16, generator=g)
    _, want_w, want_ids = router(x)
    weights, ids = kernels.moe_route_grouped(x @ router.weight.T, top_k, renormalize, router.e_score_correction_bias,
                                             n_group, topk_group, scaling)
    order, want_order = ids.argsort(dim=1), want_ids.argsort(dim=1)
    assert torch.equal(ids.gather(1, order), want_ids.gather(1, want_order))
    torch.testing.assert_close(weights.gather(1, order), want_w.gather(1, want_order), rtol=1e-6, atol=1e-6)
    if n_group > topk_group:  # the groups decided something: ungrouped routing differs on some row
        plain, _ = kernels.moe_route_grouped(x @ router.weight.T, top_k, renormalize, router.e_score_correction_bias,
                                             1, 1, scaling)
        assert not torch.equal(plain.sort(dim=1).values, weights.sort(dim=1).values)


@pytest.mark.parametrize("experts, n_group, topk_group, top_k, scaling", [
    (8, 1, 1, 2, 1.0), (16, 4, 2, 3, 1.5), (16, 8, 3, 4, 16.0), (12, 3, 1, 2, 1.0)])
def test_deepseek_v2_routing_matches_transformers_router(experts, n_group, topk_group, top_k, scaling):
    """DeepSeek-V2's router (transformers' DeepseekV2TopkRouter: softmax scores, greedy or limited
    to the groups of best single score, never renormalized) against moe_route_grouped with
    group_score "max" and no correction."""
    import transformers as tf
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    method = "greedy" if n_group == 1 else "group_limited_greedy"
    cfg = tf.DeepseekV2Config(hidden_size=16, num_attention_heads=4, n_routed_experts=experts, num_experts_per_tok=top_k, n_group=n_group,
                              topk_group=topk_group, topk_method=method, routed_scaling_factor=scaling)
    g = torch.Generator().manual_seed(experts * 10 + n_group)
    router = DeepseekV2TopkRouter(cfg)
    with torch.no_grad():
        router.weight.normal_(0.0, 1.0, generator=g)
    x = torch.randn(256, 16, generator=g)
    _, want_w, want_ids = router(x)
    route = lambda score: kernels.moe_route_grouped(x @ router.weight.T, top_k, False, None, n_group,  # noqa: E731
                                                    topk_group, scaling, "softmax", score)
    weights, ids = route("max")
    order, want_order = ids.argsort(dim=1), want_ids.argsort(dim=1)
    assert torch.equal(ids.gather(1, order), want_ids.gather(1, want_order))
    torch.testing.assert_close(weights.gather(1, order), want_w.gather(1, want_order), rtol=1e-6, atol=1e-6)
    if n_group > topk_group:  # ranking the groups by their top two (V3's) differs on some row
        other, _ = route("top2")
        assert not torch.equal(other.sort(dim=1).values, weights.sort(dim=1).values)


def test_grouped_routing_refuses_groups_that_cannot_hold_the_choice():
    logits = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="n_group 3 must divide the 8 experts"):
        kernels.moe_route_grouped(logits, 2, True, torch.zeros(8), 3, 1, 1.0)
    with pytest.raises(ValueError, match=r"top_k must be in \[1, 4\]"):
        kernels.moe_route_grouped(logits, 5, True, torch.zeros(8), 2, 1, 1.0)
