"""fp8 KV scales: read from checkpoints that carry them, else calibrated from each layer's first prefill."""
from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixflow import kernels
from radixflow.runtime import Engine
from radixflow.runtime.core.forward_batch import ForwardBatch
from radixflow.runtime.core.kv_pool import KVPool, fp8_scale_for
from radixflow.runtime.model.attention import AttentionOps, PoolAttention
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.model.weights import read_kv_scales

CONFIG = dict(device="cpu", attention_backend="torch", kv_cache_tokens=1024, max_num_seqs=4,
              kv_cache_dtype="fp8_e4m3")
GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
NUM_LAYERS = 4  # the tiny demo model


def _batch(seq_lens: list[int], new: int) -> ForwardBatch:
    """Request i holds slots 1 + 64 i ..; its last `new` tokens are this step's (new == 1: decode)."""
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    table = torch.zeros(len(seq_lens), 64, dtype=torch.int32)
    for i, n in enumerate(seq_lens):
        table[i, :n] = torch.arange(1 + 64 * i, 1 + 64 * i + n, dtype=torch.int32)
    out_slots = [int(table[i, p]) for i, n in enumerate(seq_lens) for p in range(n - new, n)]
    return ForwardBatch(
        is_decode=new == 1, input_ids=t([0] * len(out_slots)), positions=t([0] * len(out_slots)),
        out_slots=t(out_slots), req_to_token=table, req_rows=t(list(range(len(seq_lens)))),
        prefix_lens=t([n - new for n in seq_lens]), extend_lens=t([new] * len(seq_lens)), seq_lens=t(seq_lens),
        extend_starts=t([new * i for i in range(len(seq_lens))]), logit_rows=t([]),
        prefix_lens_cpu=[n - new for n in seq_lens], extend_lens_cpu=[new] * len(seq_lens))


def test_layers_calibrate_from_their_first_prefill_and_every_kernel_gets_the_scales():
    calls: list[tuple[str, float, float]] = []

    def spy(name, op, scale_at):
        def call(*args, **kwargs):
            calls.append((name, args[scale_at], args[scale_at + 1]))
            return op(*args, **kwargs)
        return call

    ops = AttentionOps(spy("store", kernels.store_kv_ref, 5), spy("extend", kernels.extend_attention_ref, 9),
                       spy("decode", kernels.decode_attention_ref, 7))
    pool = KVPool(200, 2, 2, 16, torch.float32, torch.device("cpu"), fp8=True)
    attn = PoolAttention(pool, ops, 0.25, 1)
    assert not pool.scales_final and pool.needs_calibration(0)
    gen = torch.Generator().manual_seed(0)
    first = _batch([5, 3], 3)  # 6 new tokens
    kvs = [torch.randn(2, 6, 2, 16, generator=gen) * (layer + 1) for layer in range(2)]
    for layer in range(2):
        attn(layer, torch.randn(6, 4, 16, generator=gen), kvs[layer][0], kvs[layer][1], first)
    want = [float(kv[i].abs().max()) / 448 for i in (0, 1) for kv in kvs]  # k of layers 0, 1; then v
    assert pool.k_scales + pool.v_scales == pytest.approx(want)
    assert pool.scales_final
    # a later prefill with 10x larger values and a decode step keep them
    for fb, n in ((_batch([9, 4], 4), 8), (_batch([10, 5], 1), 2)):
        for layer in range(2):
            kv = torch.randn(2, n, 2, 16, generator=gen) * 10
            attn(layer, torch.randn(n, 4, 16, generator=gen), kv[0], kv[1], fb)
    assert pool.k_scales + pool.v_scales == pytest.approx(want)
    assert [name for name, *_ in calls] == ["store", "extend"] * 4 + ["store", "decode"] * 2
    for i, (_, ks, vs) in enumerate(calls):
        layer = (i // 2) % 2
        assert (ks, vs) == (pool.k_scales[layer], pool.v_scales[layer])


def test_scale_for_zeros_and_non_fp8_pools():
    assert fp8_scale_for(torch.zeros(3, 2)) == 1.0
    assert fp8_scale_for(torch.tensor([[-896.0, 1.0]])) == 2.0
    pool = KVPool(10, 2, 1, 8, torch.float32, torch.device("cpu"))
    assert pool.scales_final and not pool.needs_calibration(0)
    with pytest.raises(ValueError, match="positive and finite"):
        KVPool(10, 2, 1, 8, torch.float32, torch.device("cpu"), fp8=True).set_scales([1.0, 0.0], [1.0, 1.0])


def _checkpoint_with_scales(tmp_path, names: dict[str, float]) -> str:
    model_dir = tmp_path / "model"
    shutil.copytree(demo_model("tiny"), model_dir)
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    tensors.update({name: torch.tensor(value) for name, value in names.items()})
    save_file(tensors, path, metadata={"format": "pt"})
    return str(model_dir)


VLLM = {**{f"model.layers.{i}.self_attn.k_scale": 0.01 * (i + 1) for i in range(NUM_LAYERS)},
        **{f"model.layers.{i}.self_attn.v_scale": 0.02 * (i + 1) for i in range(NUM_LAYERS)}}
MODELOPT = {**{f"model.layers.{i}.self_attn.k_proj.k_scale": 0.03 for i in range(NUM_LAYERS)},
            **{f"model.layers.{i}.self_attn.v_proj.v_scale": 0.04 for i in range(NUM_LAYERS)}}


@pytest.mark.parametrize("names", [VLLM, MODELOPT], ids=["vllm", "modelopt"])
def test_checkpoint_scales_are_loaded_and_kept(tmp_path, names):
    model_dir = _checkpoint_with_scales(tmp_path, names)
    ks = [v for n, v in names.items() if "k_scale" in n]
    vs = [v for n, v in names.items() if "v_scale" in n]
    assert read_kv_scales(model_dir, NUM_LAYERS) == (pytest.approx(ks), pytest.approx(vs))
    with Engine(model_dir, **CONFIG) as engine:
        pool = engine.runner.kv_pool
        assert pool.scales_final and pool.k_scales == pytest.approx(ks) and pool.v_scales == pytest.approx(vs)
        engine.generate(input_ids=[[5, 6, 7, 8]], sampling_params=GREEDY)
        assert pool.k_scales == pytest.approx(ks) and pool.v_scales == pytest.approx(vs)  # no calibration


def test_partial_checkpoint_scales_are_an_error(tmp_path):
    model_dir = _checkpoint_with_scales(tmp_path, {"model.layers.0.self_attn.k_scale": 0.5,
                                                   "model.layers.0.self_attn.v_scale": 0.5})
    with pytest.raises(ValueError, match="some layers only"):
        read_kv_scales(model_dir, NUM_LAYERS)
    assert read_kv_scales(demo_model("tiny"), NUM_LAYERS) is None


def test_engine_without_checkpoint_scales_calibrates_on_its_first_prefill():
    with Engine(demo_model("tiny"), **CONFIG) as engine:
        pool = engine.runner.kv_pool
        assert not pool.scales_final and pool.k_scales == [1.0] * NUM_LAYERS
        engine.generate(input_ids=[[5, 6, 7, 8, 9, 10]], sampling_params=GREEDY)
        assert pool.scales_final
        first = (list(pool.k_scales), list(pool.v_scales))
        assert all(s != 1.0 for s in first[0] + first[1])
        vocab = engine.runner.args.vocab_size
        engine.generate(input_ids=[list(range(vocab - 40, vocab))], sampling_params=GREEDY)
        assert (pool.k_scales, pool.v_scales) == first
