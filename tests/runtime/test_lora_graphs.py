"""LoRA under decode CUDA graphs: each row's adapter slot id is a graph input (static buffer)."""
from __future__ import annotations

import pytest

from lora_adapters import ALL, ATTN, write_adapter
from radixflow.runtime import Engine
from radixflow.runtime.core.cuda_graph import DecodeGraphRunner
from radixflow.runtime.model.demo import demo_model
from test_cuda_graph import EagerCapture
from test_lora import concurrent

SP = {"max_new_tokens": 5, "temperature": 0.0, "ignore_eos": True}
JOBS = [("the river ran", "a"), ("a small cat sat", None), ("numbers one two", "b"), ("red green blue", "a")]


@pytest.fixture(scope="module")
def mods(tmp_path_factory):
    root = tmp_path_factory.mktemp("graph_adapters")
    model = demo_model("tiny")
    return [f"a={write_adapter(str(root / 'a'), model, rank=8, targets=ATTN, seed=5)}",
            f"b={write_adapter(str(root / 'b'), model, rank=4, targets=ALL, seed=6)}"]


def test_static_buffer_replay_with_adapters_equals_eager_on_cpu(mods):
    """The graph path (static slot-id buffer, SGMV kernels in the interpreter) on an eager
    stand-in for the capture gives the eager engine's greedy tokens, row by row."""
    config = dict(device="cpu", attention_backend="torch", dtype="float32", kv_cache_tokens=1024,
                  max_num_seqs=8, lora_modules=mods)
    with Engine(demo_model("tiny"), **config) as eager:
        want = [r["output_ids"] for r in concurrent(eager, JOBS, SP)]
    capture = EagerCapture()
    with Engine(demo_model("tiny"), **config) as engine:
        r = engine.runner
        r.graph_runner = DecodeGraphRunner(r.model, r.attention, r.req_pool.table, 4, capture, lora_slots=r.lora_slots)
        got = [x["output_ids"] for x in concurrent(engine, JOBS, SP)]
    assert got == want
    assert sum(capture.replays.values()) > 0  # decode steps did replay


@pytest.mark.gpu
def test_gpu_graphs_with_mixed_adapters_equal_eager(mods):
    config = dict(device="cuda", dtype="float32", kv_cache_tokens=4096, max_num_seqs=8, cuda_graph_max_bs=8,
                  lora_modules=mods)
    with Engine(demo_model("tiny"), disable_cuda_graph=True, **config) as eager:
        want = [r["output_ids"] for r in concurrent(eager, JOBS, SP)]
    with Engine(demo_model("tiny"), **config) as engine:
        assert engine.runner.graph_runner is not None
        got = [x["output_ids"] for x in concurrent(engine, JOBS, SP)]
    assert got == want
