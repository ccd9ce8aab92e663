"""Decode CUDA graphs: batch-size buckets, padding, the switch, and greedy output with and without.

The bucketing and packing are pure functions. The static-buffer plumbing runs on CPU too: an
eager stand-in for the capture re-runs the model over the static buffers on every replay, so a
wrong row, position, slot or padding shows as a changed greedy output without a GPU.
"""
from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest
import torch

from radixflow.runtime import Engine
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.core.cuda_graph import (
    INPUT_IDS, NUM_FIELDS, OUT_SLOTS, POSITIONS, PREFIX_LENS, REQ_ROWS, ROPE_ROWS, SEQ_LENS, DecodeGraphRunner,
    capture_batch_sizes,
    pack_decode_inputs, padded_batch_size,
)
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.model.model_config import load_model_args
from radixflow.runtime.core.model_runner import derive_shape

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


def test_capture_batch_sizes():
    assert capture_batch_sizes(1) == [1]
    assert capture_batch_sizes(2) == [1, 2]
    assert capture_batch_sizes(5) == [1, 2, 4, 5]
    assert capture_batch_sizes(8) == [1, 2, 4, 8]
    assert capture_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = capture_batch_sizes(256)
    assert sizes[:6] == [1, 2, 4, 8, 16, 24] and sizes[-1] == 256 and len(sizes) == 3 + 32
    with pytest.raises(ValueError):
        capture_batch_sizes(0)


def test_padded_batch_size():
    sizes = capture_batch_sizes(20)
    assert [padded_batch_size(bs, sizes) for bs in (1, 2, 3, 4, 5, 8, 9, 17, 20)] == [1, 2, 4, 4, 8, 8, 16, 20, 20]
    assert padded_batch_size(21, sizes) is None


def test_pack_decode_inputs_pads_with_empty_rows():
    packed = pack_decode_inputs([11, 12, 13], [5, 0, 9], [40, 41, 42], [3, 1, 2], padded_bs=4)
    assert packed.shape == (NUM_FIELDS, 4) == (7, 4) and packed.dtype == torch.int64
    assert packed[INPUT_IDS].tolist() == [11, 12, 13, 0]
    assert packed[POSITIONS].tolist() == [5, 0, 9, 0]
    assert packed[OUT_SLOTS].tolist() == [40, 41, 42, 0]  # padding writes the dummy slot 0
    assert packed[REQ_ROWS].tolist() == [3, 1, 2, 0]
    assert packed[SEQ_LENS].tolist() == [6, 1, 10, 0]  # padding: empty context, zero attention output
    assert packed[PREFIX_LENS].tolist() == [5, 0, 9, 0]
    assert packed[ROPE_ROWS].tolist() == [5, 0, 9, 0]  # each row's own position
    long = pack_decode_inputs([11, 12, 13], [5, 0, 9], [40, 41, 42], [3, 1, 2], padded_bs=4, rope_offsets=[0, 64, 64])
    assert long[ROPE_ROWS].tolist() == [5, 64, 73, 0]  # LongRoPE: past the short factors' rows
    assert long[POSITIONS].tolist() == [5, 0, 9, 0]


@pytest.mark.parametrize("config, want", [
    ({}, 8),
    ({"cuda_graph_max_bs": 64}, 8),  # capped by max_num_seqs: a larger batch never runs
    ({"cuda_graph_max_bs": 4}, 4),
    ({"disable_cuda_graph": True}, 0),
    ({"attention_backend": "torch"}, 0),  # the references sync: not capturable
])
def test_graphs_only_on_cuda_with_triton(monkeypatch, config, want):
    monkeypatch.delenv("RADIXFLOW_ATTENTION_BACKEND", raising=False)
    args = load_model_args(demo_model("tiny"))
    assert derive_shape(EngineConfig(device="cpu", max_num_seqs=8, **config), args).cuda_graph_max_bs == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    shape = derive_shape(EngineConfig(device="cuda", max_num_seqs=8, **config), args)
    assert shape.cuda_graph_max_bs == want


class EagerCapture:
    """Stand-in for CudaGraphCapture on CPU: a replay re-runs the forward over the static buffers."""

    def __init__(self) -> None:
        self.replays: Counter[int] = Counter()

    def __call__(self, forward: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        out = forward()

        def replay() -> None:
            with torch.inference_mode():
                new = forward()
                out.copy_(new)
            self.replays[new.shape[0]] += 1

        return replay, out


def _prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(3, 20))] for _ in range(n)]


def _generate(engine: Engine, batches: list[list[list[int]]]) -> list[list[list[int]]]:
    return [[r["output_ids"] for r in engine.generate(input_ids=b, sampling_params=GREEDY)] for b in batches]


def test_static_buffer_replay_equals_eager_on_cpu():
    config = dict(device="cpu", attention_backend="torch", kv_cache_tokens=1024, max_num_seqs=8)
    with Engine(demo_model("tiny"), **config) as eager:
        vocab = eager.runner.args.vocab_size
        batches = [_prompts(vocab, n, seed=n) for n in (1, 3, 6)]
        want = _generate(eager, batches)
    capture = EagerCapture()
    with Engine(demo_model("tiny"), **config, check_invariants=True) as engine:
        runner = engine.runner
        assert runner.graph_runner is None  # CPU: no graphs by default
        runner.graph_runner = DecodeGraphRunner(runner.model, runner.attention, runner.req_pool.table, 4, capture)
        got = _generate(engine, batches)
        assert not engine.invariant_violations
    assert got == want
    # batch 1 replays as 1, batch 3 padded to 4, batch 6 exceeds the largest graph: eager
    assert capture.replays == Counter({1: GREEDY["max_new_tokens"] - 1, 4: GREEDY["max_new_tokens"] - 1})


@pytest.mark.gpu
def test_gpu_greedy_identical_with_and_without_cuda_graphs():
    # fp32: eager batches of 3 and graphs padded to 4 may run different GEMM kernels; fp32 keeps
    # their rounding differences far below the logit gaps greedy decisions depend on
    config = dict(device="cuda", dtype="float32", kv_cache_tokens=4096, max_num_seqs=16, cuda_graph_max_bs=8)
    with Engine(demo_model("tiny"), disable_cuda_graph=True, **config) as eager:
        assert eager.runner.graph_runner is None
        vocab = eager.runner.args.vocab_size
        batches = [_prompts(vocab, n, seed=n) for n in (1, 3, 8, 11)]
        want = _generate(eager, batches)
    with Engine(demo_model("tiny"), **config, check_invariants=True) as engine:
        runner = engine.runner.graph_runner
        assert runner is not None and runner.batch_sizes == [1, 2, 4, 8]
        calls = Counter()
        run = runner.run

        def counting_run(input_ids, *args, **kwargs):
            calls[len(input_ids)] += 1
            return run(input_ids, *args, **kwargs)

        runner.run = counting_run
        got = _generate(engine, batches)
    assert got == want
    steps = GREEDY["max_new_tokens"] - 1
    assert calls == Counter({1: steps, 3: steps, 8: steps})  # the batch of 11 ran eagerly


# Long forced property names: jump-forward appends several tokens at once for the grammar row.
FORCED_SCHEMA = {
    "type": "object",
    "properties": {f"field_number_{i}": {"enum": ["alpha", "beta"]} for i in range(3)},
    "required": [f"field_number_{i}" for i in range(3)],
    "additionalProperties": False,
}


def test_jump_forward_rows_leave_the_decode_rows_in_the_graph():
    # fp32: the split runs the rows in two matmul batches of other shapes than the eager step; bf16
    # rounding would differ between them (as test_gpu_greedy_identical_with_and_without_cuda_graphs)
    config = dict(device="cpu", dtype="float32", attention_backend="torch", kv_cache_tokens=4096, max_num_seqs=8,
                  jump_forward=True)
    params = [{"json_schema": FORCED_SCHEMA, "temperature": 0, "max_new_tokens": 80},
              {**GREEDY, "max_new_tokens": 40}, {**GREEDY, "max_new_tokens": 40}]
    prompts = ["Form:", "Once upon", "The"]
    with Engine(demo_model("tiny"), **config) as eager:
        want = [r["output_ids"] for r in eager.generate(prompts, params)]
    capture = EagerCapture()
    with Engine(demo_model("tiny"), **config, check_invariants=True) as engine:
        runner = engine.runner
        runner.graph_runner = DecodeGraphRunner(runner.model, runner.attention, runner.req_pool.table, 4, capture)
        mixed_steps = []  # (extend_lens, graph replays) of decode rounds with jump-forward and one-token rows
        forward = runner.forward

        def spy(batch, logit_offsets):
            before = sum(capture.replays.values())
            out = forward(batch, logit_offsets)
            lens = list(batch.extend_lens)
            if batch.is_decode_round and 1 in lens and max(lens) > 1:
                mixed_steps.append((lens, sum(capture.replays.values()) - before))
            return out

        runner.forward = spy
        got = [r["output_ids"] for r in engine.generate(prompts, params)]
        assert not engine.invariant_violations
    assert got == want
    assert mixed_steps, "no step mixed jump-forward rows with decode rows"
    assert all(replays == 1 for _, replays in mixed_steps), mixed_steps  # the decode rows: one graph replay


def test_fp8_graphs_wait_for_the_first_prefill_scales(monkeypatch):
    from dataclasses import replace

    from radixflow.runtime.core import model_runner

    def with_graphs(cfg, args):
        return replace(derive_shape(cfg, args), cuda_graph_max_bs=4)

    config = dict(device="cpu", attention_backend="torch", kv_cache_tokens=1024, max_num_seqs=8,
                  kv_cache_dtype="fp8_e4m3")
    with Engine(demo_model("tiny"), **config) as eager:
        batches = [_prompts(eager.runner.args.vocab_size, n, seed=n) for n in (1, 3)]
        want = _generate(eager, batches)
    capture = EagerCapture()
    monkeypatch.setattr(model_runner, "derive_shape", with_graphs)
    monkeypatch.setattr(model_runner, "CudaGraphCapture", lambda device: capture)
    with Engine(demo_model("tiny"), **config) as engine:
        runner = engine.runner
        assert runner.graph_runner is None and not runner.kv_pool.scales_final  # a capture now would bake 1.0
        got = _generate(engine, batches)
        assert runner.graph_runner is not None and runner.kv_pool.scales_final
        assert runner.kv_pool.k_scales != [1.0] * len(runner.kv_pool.k_scales)
    assert got == want
    assert capture.replays == Counter({1: GREEDY["max_new_tokens"] - 1, 4: GREEDY["max_new_tokens"] - 1})
