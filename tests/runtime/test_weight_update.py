"""Engine.update_weights_from_disk: another checkpoint of the same model served in place."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixflow.runtime import Engine
from radixflow.runtime.model.demo import SIZES, demo_model, write_demo_model
from radixflow.runtime.model.packed_linear import can_prepack
from radixflow.runtime.model.weight_update import model_tensors

GREEDY = {"max_new_tokens": 12, "temperature": 0}
PROMPTS = ["hello there", "the quick brown fox jumps"]
LONG_PROMPT = "once upon a time"
LONG_LEN = 300


@pytest.fixture(scope="module")
def second_tiny(tmp_path_factory) -> str:
    """The tiny demo model's architecture with other random weights."""
    return write_demo_model("tiny", tmp_path_factory.mktemp("tiny-b"), dataclasses.replace(SIZES["tiny"], seed=999))


def outputs(engine, prompts=PROMPTS, sp=GREEDY) -> list[list[int]]:
    return [r["output_ids"] for r in engine.generate(prompts, sp)]


def fresh_outputs(path: str, **config) -> list[list[int]]:
    with Engine(path, **config) as e:
        return outputs(e)


def long_sp(max_new_tokens: int) -> dict:
    return {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def long_output() -> list[int]:
    """The tiny model's uninterrupted greedy output for LONG_PROMPT, LONG_LEN tokens."""
    with Engine(demo_model("tiny")) as ref:
        return ref.generate(LONG_PROMPT, long_sp(LONG_LEN))["output_ids"]


def start_long(engine, got: dict, max_new_tokens: int = 1500) -> threading.Thread:
    """A long greedy request on a thread (its result: got["long"]), returned once it runs."""
    sp = long_sp(max_new_tokens)
    running = threading.Thread(target=lambda: got.update(long=engine.generate(LONG_PROMPT, sp)))
    running.start()
    while engine.stats().num_running == 0:
        time.sleep(0.001)
    return running


@pytest.mark.parametrize("dtype", ["auto", "float32"])  # auto: bf16 where the CPU has it (packed projections)
def test_update_serves_the_new_weights_and_drops_the_old_kv(second_tiny, dtype):
    first = demo_model("tiny")
    want_first, want_second = fresh_outputs(first, dtype=dtype), fresh_outputs(second_tiny, dtype=dtype)
    assert want_first != want_second
    with Engine(first, dtype=dtype, check_invariants=True) as e:
        assert outputs(e) == want_first  # the prompts are in the prefix cache now
        reply = e.update_weights_from_disk(second_tiny)
        assert reply["success"] and reply["num_paused_requests"] == 0
        results = e.generate(PROMPTS, GREEDY)
        assert [r["output_ids"] for r in results] == want_second
        assert [r["meta_info"]["cached_tokens"] for r in results] == [0, 0]  # the old weights' KV is gone
        e.update_weights_from_disk(first)
        assert outputs(e) == want_first
        e.check_accounting()
        assert e.invariant_violations == []
        assert e.stats().kv_slots_used == 0


def test_every_tensor_is_the_new_checkpoints(second_tiny):
    """Nothing of the served model keeps the old values: each tensor (packed projections, the
    packed LM head) equals a model loaded from the new checkpoint."""
    with Engine(demo_model("tiny")) as e, Engine(second_tiny) as fresh:
        outputs(e)  # the native layer call (CPU bf16) takes the weights' addresses on first use
        addresses = {name: t.data_ptr() for name, t in model_tensors(e.runner.model).items()}
        e.update_weights_from_disk(second_tiny)
        served, want = model_tensors(e.runner.model), model_tensors(fresh.runner.model)
        assert served.keys() == want.keys()
        for name, t in want.items():
            assert torch.equal(served[name], t), name
        assert {name: t.data_ptr() for name, t in served.items()} == addresses  # in place


def test_a_running_request_ends_on_the_old_weights_and_the_queue_waits(second_tiny, long_output):
    first = demo_model("tiny")
    want_second = fresh_outputs(second_tiny)
    got: dict = {}
    with Engine(first) as e:
        running = start_long(e, got, LONG_LEN)
        update = threading.Thread(target=lambda: got.update(reply=e.update_weights_from_disk(
            second_tiny, weight_version="v2")))
        update.start()
        while not e.scheduler.admission_paused:
            time.sleep(0.001)
        assert e.stats().num_running == 1, "the long request ended before the update paused admission"
        queued = e.generate(PROMPTS, GREEDY)  # submitted while paused: waits, then runs on the new weights
        running.join()
        update.join()
        assert got["long"]["output_ids"] == long_output
        assert got["long"]["meta_info"]["weight_version"] == "default"
        assert [r["meta_info"]["weight_version"] for r in queued] == ["v2", "v2"]
        assert got["reply"]["num_paused_requests"] == 2
        assert [r["output_ids"] for r in queued] == want_second
        assert not e.scheduler.admission_paused
        e.check_accounting()


def test_abort_all_requests_ends_what_runs(second_tiny):
    with Engine(demo_model("tiny")) as e:
        got: dict = {}
        running = start_long(e, got)
        reply = e.update_weights_from_disk(second_tiny, abort_all_requests=True)
        running.join()
        assert reply["success"]
        assert got["long"]["meta_info"]["finish_reason"] == {"type": "abort", "message": "aborted for a weight update"}
        assert len(got["long"]["output_ids"]) < 1500
        assert outputs(e) == fresh_outputs(second_tiny)
        e.check_accounting()


def test_weight_version(second_tiny):
    with Engine(demo_model("tiny")) as e:
        assert e.get_weight_version() == "default"
        assert e.generate("hi", GREEDY)["meta_info"]["weight_version"] == "default"
        e.update_weights_from_disk(second_tiny, weight_version="step-1")
        assert e.get_weight_version() == "step-1"
        assert e.generate("hi", GREEDY)["meta_info"]["weight_version"] == "step-1"
        e.update_weights_from_disk(demo_model("tiny"))  # no version given: the name stays
        assert e.get_weight_version() == "step-1"


def _copy_with_config(src: str, dst: str, **fields) -> str:
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(fields)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return dst


def _copy_with_tensor(src: str, dst: str, name: str, value: torch.Tensor) -> str:
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    tensors = load_file(path)
    tensors[name] = value
    save_file(tensors, path, metadata={"format": "pt"})
    return dst


def test_a_refused_checkpoint_changes_nothing(tmp_path, second_tiny):
    first = demo_model("tiny")
    want = fresh_outputs(first)
    deeper = _copy_with_config(first, str(tmp_path / "deeper"), num_hidden_layers=5)
    wrong_shape = _copy_with_tensor(first, str(tmp_path / "wrong-shape"), "model.norm.weight", torch.ones(32))
    with Engine(first, check_invariants=True) as e:
        outputs(e)
        cases = [(str(tmp_path / "absent"), "does not exist"), (deeper, "num_layers (4 served, 5 new)"),
                 (wrong_shape, "model.norm.weight"), ("", "non-empty string")]
        for path, message in cases:
            with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
                e.update_weights_from_disk(path)
        with pytest.raises(ValueError, match="weight_version"):
            e.update_weights_from_disk(second_tiny, weight_version=3)
        with pytest.raises(ValueError, match="abort_all_requests"):
            e.update_weights_from_disk(second_tiny, abort_all_requests="yes")
        assert outputs(e) == want
        assert e.get_weight_version() == "default"
        assert not e.scheduler.admission_paused
        e.check_accounting()
        assert e.invariant_violations == []


@pytest.mark.parametrize("family", ["olmoe", "deepseek_v3"])
def test_mixture_of_experts_packed_experts(hf_checkpoint, tmp_path, family):
    """The experts are packed per expert on CPU bf16 (their stacked tensors emptied): the update
    reaches each packed copy. DeepSeek-V3 adds latent attention, whose KV down-projection's shape
    the native kernel does not take: it is held in oneDNN's layout."""
    first, _ = hf_checkpoint(family)
    second = str(tmp_path / f"{family}-b")
    shutil.copytree(first, second)
    path = os.path.join(second, "model.safetensors")
    gen = torch.Generator().manual_seed(7)
    tensors = {k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.dim() >= 2 else v
               for k, v in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})
    want_first, want_second = fresh_outputs(first), fresh_outputs(second)
    assert want_first != want_second
    with Engine(first) as e:
        assert outputs(e) == want_first
        e.update_weights_from_disk(second)
        assert outputs(e) == want_second


def test_a_pending_update_fails_at_shutdown(second_tiny):
    """An update waiting for a running request gets an error when the engine shuts down."""
    from radixflow.runtime.errors import EngineClosedError

    e = Engine(demo_model("tiny"))
    got: dict = {}
    running = start_long(e, got)

    def update() -> None:
        try:
            e.update_weights_from_disk(second_tiny)
        except EngineClosedError as exc:
            got["error"] = exc

    waiting = threading.Thread(target=update)
    waiting.start()
    while not e.scheduler.admission_paused:
        time.sleep(0.001)
    e.shutdown()
    waiting.join(timeout=10)
    running.join(timeout=10)
    assert isinstance(got.get("error"), EngineClosedError)
    assert got["long"]["meta_info"]["finish_reason"]["type"] == "abort"


@pytest.mark.gpu
def test_update_under_cuda_graphs(second_tiny):
    """On CUDA the new weights stage in host memory and are copied into the tensors the decode
    graphs were captured on: replays compute with the new weights."""
    config = {"device": "cuda", "dtype": "float32"}
    want_second = fresh_outputs(second_tiny, **config)
    with Engine(demo_model("tiny"), **config) as e:
        assert e.runner.graph_runner is not None
        outputs(e)
        e.update_weights_from_disk(second_tiny)
        assert outputs(e) == want_second
        e.check_accounting()


def _wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_pause_abort_then_update_then_continue(second_tiny):
    """SGLang's RL sequence: pause (aborting what runs), update, continue; a request sent while
    paused waits and then runs on the new weights."""
    want_second = fresh_outputs(second_tiny)
    with Engine(demo_model("tiny"), check_invariants=True) as e:
        got: dict = {}
        running = start_long(e, got)
        e.pause_generation()  # mode abort
        running.join()
        assert got["long"]["meta_info"]["finish_reason"] == {"type": "abort", "message": "aborted: generation paused"}
        queued = threading.Thread(target=lambda: got.update(queued=e.generate(PROMPTS, GREEDY)))
        queued.start()
        _wait_until(lambda: e.stats().num_waiting == 2)
        time.sleep(0.2)
        assert "queued" not in got and e.stats().num_running == 0
        assert e.update_weights_from_disk(second_tiny, weight_version="v1")["num_paused_requests"] == 2
        assert e.stats().num_waiting == 2  # still paused after the update
        e.continue_generation()
        queued.join()
        assert [r["output_ids"] for r in got["queued"]] == want_second
        assert {r["meta_info"]["weight_version"] for r in got["queued"]} == {"v1"}
        e.check_accounting()
        assert e.invariant_violations == []


def test_pause_retract_keeps_the_request_and_its_kv(long_output):
    with Engine(demo_model("tiny"), check_invariants=True) as e:
        got: dict = {}
        running = start_long(e, got, LONG_LEN)
        e.pause_generation("retract")
        assert (e.stats().num_running, e.stats().num_waiting) == (0, 1)
        assert e.scheduler.cache.evictable_size() > 0  # its KV went to the prefix cache
        time.sleep(0.1)
        assert "long" not in got
        e.continue_generation()
        running.join()
        assert got["long"]["output_ids"] == long_output
        assert got["long"]["meta_info"]["finish_reason"]["type"] == "length"
        assert e.stats().num_preemptions == 0  # a pause is not a preemption
        e.check_accounting()


def test_pause_in_place_stops_steps_and_refuses_an_update(second_tiny, long_output):
    with Engine(demo_model("tiny"), check_invariants=True) as e:
        got: dict = {}
        running = start_long(e, got, LONG_LEN)
        e.pause_generation("in_place")
        steps = e.stats().num_steps
        time.sleep(0.2)
        assert e.stats().num_steps == steps and e.stats().num_running == 1
        with pytest.raises(ValueError, match="paused in place"):
            e.update_weights_from_disk(second_tiny)
        e.continue_generation()
        running.join()
        assert got["long"]["output_ids"] == long_output
        e.check_accounting()
        with pytest.raises(ValueError, match="mode must be one of abort, retract, in_place"):
            e.pause_generation("sleep")


def test_pausing_in_place_while_an_update_waits_is_refused(second_tiny):
    with Engine(demo_model("tiny")) as e:
        got: dict = {}
        running = start_long(e, got)
        update = threading.Thread(target=lambda: got.update(reply=e.update_weights_from_disk(second_tiny)))
        update.start()
        _wait_until(lambda: e.scheduler.admission_paused)
        with pytest.raises(ValueError, match="a weight update is waiting"):
            e.pause_generation("in_place")
        e.pause_generation("abort")  # ends the running request: the update goes through
        update.join()
        running.join()
        assert got["reply"]["success"]
        e.continue_generation()
        assert outputs(e) == fresh_outputs(second_tiny)


def test_update_from_tensors_in_parts(second_tiny):
    """A trainer's tensors, named as in the checkpoint, in three buckets: the weights change with
    the one that completes the set."""
    tensors = load_file(os.path.join(second_tiny, "model.safetensors"))
    names = sorted(tensors)
    parts = [names[i::3] for i in range(3)]
    first = demo_model("tiny")
    want_first, want_second = fresh_outputs(first), fresh_outputs(second_tiny)
    with Engine(first, check_invariants=True) as e:
        for part in parts[:2]:
            reply = e.update_weights_from_tensor([(n, tensors[n]) for n in part])
            assert reply["success"] and "still missing" in reply["message"]
            assert outputs(e) == want_first
        reply = e.update_weights_from_tensor({n: tensors[n] for n in parts[2]}, weight_version="t1")
        assert reply["message"] == "weights updated from tensors"
        assert outputs(e) == want_second and e.get_weight_version() == "t1"
        e.check_accounting()


def test_refused_tensors_change_nothing(second_tiny):
    tensors = load_file(os.path.join(second_tiny, "model.safetensors"))
    first = demo_model("tiny")
    want_first = fresh_outputs(first)
    with Engine(first) as e:
        with pytest.raises(ValueError, match="'model.layers.0.extra.weight' are not among"):
            e.update_weights_from_tensor({**tensors, "model.layers.0.extra.weight": torch.ones(2)})
        with pytest.raises(ValueError, match="named_tensors must be"):
            e.update_weights_from_tensor([("model.norm.weight", [1.0, 2.0])])
        with pytest.raises(ValueError, match="model.norm.weight"):  # a whole set that does not load
            e.update_weights_from_tensor({**tensors, "model.norm.weight": torch.ones(3)})
        assert outputs(e) == want_first and e.get_weight_version() == "default"
        # nothing of the refused calls was kept: half a set waits for the other half
        half = dict(list(tensors.items())[: len(tensors) // 2])
        assert "still missing" in e.update_weights_from_tensor(half)["message"]
        assert outputs(e) == want_first


def test_an_abort_of_what_an_update_waits_for_lets_it_run(second_tiny):
    """The request an update waits for may end without a step (an abort, a client's stop
    string): the update then runs at once, not at the next unrelated command."""
    with Engine(demo_model("tiny")) as e:
        got: dict = {}
        sp = long_sp(1500)
        running = threading.Thread(target=lambda: got.update(long=e.generate(LONG_PROMPT, sp, rid="long")))
        running.start()
        _wait_until(lambda: e.stats().num_running == 1)
        update = threading.Thread(target=lambda: got.update(reply=e.update_weights_from_disk(second_tiny)))
        update.start()
        _wait_until(lambda: e.scheduler.admission_paused)
        e.abort("long")
        update.join(timeout=10)
        assert not update.is_alive(), "the update still waits after the request it waited for was aborted"
        running.join()
        assert got["reply"]["success"] and not e.scheduler.admission_paused
        assert outputs(e) == fresh_outputs(second_tiny)


@pytest.mark.skipif(not can_prepack(torch.device("cpu"), torch.bfloat16), reason="no oneDNN bf16 on this CPU")
def test_projections_on_onednns_layout(second_tiny, monkeypatch):
    """Where the native bf16 kernel does not take a projection (no AVX512-BF16, or its shape),
    its weight is held in oneDNN's opaque layout, which cannot be written in place: the update
    puts the new packed tensor in its place."""
    from radixflow.kernels import native_layers

    monkeypatch.setattr(native_layers, "linear_supports", lambda weight: False)
    config = {"dtype": "bfloat16"}
    want_second = fresh_outputs(second_tiny, **config)
    with Engine(demo_model("tiny"), **config) as e:
        assert e.runner.model.layers[0].self_attn.qkv_proj.packed is not None
        outputs(e)
        e.update_weights_from_disk(second_tiny)
        assert outputs(e) == want_second


def test_fp8_kv_scales_follow_the_new_checkpoint(tmp_path):
    """An fp8 KV cache's scales belong to the weights: the new checkpoint's `k_scale` /
    `v_scale` when it has them, else calibrated again on the first prefill after the update."""
    first = demo_model("tiny")
    with_scales = str(tmp_path / "scaled")
    shutil.copytree(first, with_scales)
    path = os.path.join(with_scales, "model.safetensors")
    tensors = load_file(path)
    for i in range(SIZES["tiny"].num_hidden_layers):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(0.05)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(0.04)
    save_file(tensors, path, metadata={"format": "pt"})
    bigger = _copy_with_tensor(first, str(tmp_path / "bigger-kv"), "model.layers.0.self_attn.k_proj.weight",
                               8 * load_file(os.path.join(first, "model.safetensors"))[
                                   "model.layers.0.self_attn.k_proj.weight"])
    config = {"kv_cache_dtype": "fp8_e4m3", "dtype": "float32"}
    with Engine(first, **config) as e:
        outputs(e)
        calibrated = list(e.runner.kv_pool.k_scales)
        e.update_weights_from_disk(with_scales)
        assert e.runner.kv_pool.k_scales == pytest.approx([0.05] * 4)  # fp32 in the file
        assert e.runner.kv_pool.v_scales == pytest.approx([0.04] * 4)
        assert outputs(e) == fresh_outputs(with_scales, **config)
        e.update_weights_from_disk(bigger)
        assert not e.runner.kv_pool.scales_final  # calibrated again by the next prefill
        assert outputs(e) == fresh_outputs(bigger, **config)
        assert e.runner.kv_pool.k_scales[0] > 4 * calibrated[0]


def test_a_gguf_served_model_takes_its_safetensors_checkpoints(tmp_path, second_tiny):
    """A GGUF file and a safetensors directory of one model hold the same config (floats kept as
    float32, a rotary_dim of 0 meaning the whole head): either updates the other."""
    from gguf_writer import write_gguf

    first = demo_model("tiny")
    gguf_path = write_gguf(first, str(tmp_path / "tiny.gguf"), "F32")
    prompts = [[3067, 258, 75, 357], [3067, 2593, 1008, 90, 91]]  # token ids: the two tokenizers add BOS alike

    def ids_outputs(path_or_engine) -> list[list[int]]:
        if isinstance(path_or_engine, str):
            with Engine(path_or_engine, dtype="float32") as fresh:
                return ids_outputs(fresh)
        return [r["output_ids"] for r in path_or_engine.generate(input_ids=prompts, sampling_params=GREEDY)]

    want_first = ids_outputs(first)
    with Engine(gguf_path, dtype="float32") as e:
        assert ids_outputs(e) == want_first
        e.update_weights_from_disk(second_tiny)
        assert ids_outputs(e) == ids_outputs(second_tiny)
        e.update_weights_from_disk(gguf_path)
        assert ids_outputs(e) == want_first


def test_update_weight_version_names_without_changing(second_tiny):
    with Engine(demo_model("tiny")) as e:
        want = outputs(e)
        got: dict = {}
        running = start_long(e, got, LONG_LEN)
        e.update_weight_version("v9", abort_all_requests=False)  # the running request keeps its name
        assert e.generate("hi", GREEDY)["meta_info"]["weight_version"] == "v9"
        running.join()
        assert got["long"]["meta_info"]["weight_version"] == "default"
        assert got["long"]["meta_info"]["finish_reason"]["type"] == "length"
        running = start_long(e, got)
        e.update_weight_version("v10")  # SGLang's default: what runs is aborted
        running.join()
        assert got["long"]["meta_info"]["finish_reason"]["message"] == "aborted for a weight version update"
        assert e.get_weight_version() == "v10" and outputs(e) == want
        with pytest.raises(ValueError, match="new_version must be a string"):
            e.update_weight_version(None)


def test_a_disk_update_discards_tensors_kept_from_an_earlier_set(tmp_path, second_tiny):
    """Half of one checkpoint's tensors, then an update from disk, then the other half of another
    checkpoint's: the kept half belonged to weights no longer wanted, so nothing completes."""
    third = write_demo_model("tiny", tmp_path / "third", dataclasses.replace(SIZES["tiny"], seed=5))
    c, b = (load_file(os.path.join(d, "model.safetensors")) for d in (third, second_tiny))
    names = sorted(c)
    with Engine(demo_model("tiny")) as e:
        e.update_weights_from_tensor({n: c[n] for n in names[::2]})
        e.update_weights_from_disk(second_tiny)
        reply = e.update_weights_from_tensor({n: b[n] for n in names[1::2]})
        assert "still missing" in reply["message"]
        assert outputs(e) == fresh_outputs(second_tiny)


def test_sent_tensors_are_copied(second_tiny):
    """A trainer may reuse its bucket buffers once a call returns: what was sent is what loads."""
    tensors = load_file(os.path.join(second_tiny, "model.safetensors"))
    names = sorted(tensors)
    with Engine(demo_model("tiny")) as e:
        first_half = {n: tensors[n].clone() for n in names[::2]}
        e.update_weights_from_tensor(first_half)
        for t in first_half.values():
            t.zero_()  # the buffer reused for the next bucket
        e.update_weights_from_tensor({n: tensors[n] for n in names[1::2]})
        assert outputs(e) == fresh_outputs(second_tiny)


def test_tensors_on_the_meta_device_are_a_value_error(second_tiny):
    tensors = load_file(os.path.join(second_tiny, "model.safetensors"))
    with Engine(demo_model("tiny")) as e:
        with pytest.raises(ValueError, match="meta"):
            e.update_weights_from_tensor({n: t.to("meta") for n, t in tensors.items()})
        e.update_weights_from_tensor({"vision_tower.blocks.0.weight": torch.ones(2),
                                      **tensors})  # a VLM's vision tower: skipped, as from disk
        assert outputs(e) == fresh_outputs(second_tiny)
