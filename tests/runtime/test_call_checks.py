"""The Python API's edges, on both engines (core on a thread, core in a process): a caller's
mistake is a ValueError at the call, a batch that fails submits nothing, and the engine goes on
serving with nothing left running or held."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from radixflow.runtime import Engine, EngineClient
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.sampling_params import SamplingParams

SHORT = {"max_new_tokens": 2, "ignore_eos": True}


@pytest.fixture(scope="module", params=["core-thread", "core-process"])
def engine(request):
    kind = EngineClient if request.param == "core-process" else Engine
    with kind(demo_model("tiny"), dtype="float32", kv_cache_tokens=4096, check_invariants=True) as e:
        yield e
        assert not e.invariant_violations


def _idle(engine, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while True:
        s = engine.stats()
        if not (s.num_running or s.num_waiting or s.kv_slots_used):
            return s
        assert time.monotonic() < deadline, s
        time.sleep(0.01)


def _still_serves(engine):
    assert engine.generate("still here", SHORT)["meta_info"]["completion_tokens"] == 2
    _idle(engine)


@pytest.mark.parametrize("call, match", [
    (dict(prompt=5), "prompt must be"),
    (dict(prompt=None, input_ids=5), "input_ids must be"),
    (dict(prompt=None, input_ids={"a": 1}), "input_ids must be"),
    (dict(prompt=None, input_ids=(1, 2)), "input_ids must be"),
    (dict(sampling_params="x"), "sampling_params must be"),
    (dict(sampling_params=5), "sampling_params must be"),
    (dict(sampling_params=[5]), "sampling_params must be"),
    (dict(rid=5), "rid"),
    (dict(rid=["a", 5]), "rid"),
    (dict(return_logprob=True, top_logprobs_num=2.0), "top_logprobs_num"),
    (dict(return_logprob=True, top_logprobs_num="3"), "top_logprobs_num"),
    (dict(return_logprob=True, logprob_start_len=1.0), "logprob_start_len"),
    (dict(return_logprob="yes"), "return_logprob"),
    (dict(session_id=5), "session_id"),
    (dict(lora=5), "lora"),
])
def test_wrong_types_are_value_errors(engine, call, match):
    kwargs = {"prompt": "a b c", "sampling_params": SHORT, **call}
    with pytest.raises(ValueError, match=match):
        engine.generate(**kwargs)
    _still_serves(engine)


@pytest.mark.parametrize("params, match", [
    ({"seed": 2**64}, "seed"),
    ({"seed": -2**63 - 1}, "seed"),
    ({"top_k": 2**64}, "top_k"),
    ({"max_new_tokens": 2**64}, "max_new_tokens"),
    ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens"),
    ({"stop_token_ids": [10**9]}, "stop_token_ids"),
    ({"stop_token_ids": [2**64]}, "stop_token_ids"),
    ({"stop_regex": ""}, "stop_regex"),
    ({"stop_regex": "x*"}, "stop_regex"),
    ({"json_schema": "[" * 5000 + "]" * 5000}, "json_schema"),
    ({"json_schema": {"type": "integer", "maximum": 2**70}}, "json_schema"),  # the core's messages carry 64 bits
])
def test_out_of_range_sampling_values_are_value_errors(engine, params, match):
    with pytest.raises(ValueError, match=match):
        engine.generate("a b c", {**SHORT, **params})
    _still_serves(engine)


def test_a_sampling_params_object_of_wrong_types_is_a_value_error(engine):
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate("a b c", SamplingParams(max_new_tokens="three"))
    _still_serves(engine)


def test_text_that_is_not_unicode_is_a_value_error(engine):
    with pytest.raises(ValueError, match="Unicode"):
        engine.generate("a\ud800b", SHORT)
    _still_serves(engine)


def test_the_largest_seed_with_n_samples_runs(engine):
    """Each sample's seed is the request's plus its index, wrapped into the seed range."""
    out = engine.generate("a b c", {**SHORT, "seed": 2**64 - 1, "n": 3, "temperature": 1.0})
    assert [o["meta_info"]["completion_tokens"] for o in out] == [2, 2, 2]
    _idle(engine)


@pytest.mark.parametrize("call", [
    dict(input_ids=[[1, 2, 3, 4, 5, 6, 7, 8], [1, 2]], return_logprob=True, logprob_start_len=5),
    dict(input_ids=[[1, 2, 3], [4, 5, 6]], rid=["dup", "dup"]),
])
def test_a_batch_that_fails_submits_nothing(engine, call):
    before = engine.stats().generated_tokens
    with pytest.raises(ValueError):
        engine.generate(sampling_params={"max_new_tokens": 400, "ignore_eos": True}, **call)
    time.sleep(0.3)
    s = _idle(engine, timeout_s=0.5)  # nothing was left running
    assert s.generated_tokens == before


def test_a_full_queue_mid_batch_aborts_what_the_batch_submitted():
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=4096, max_num_seqs=2,
                max_queued_requests=1) as engine:
        with pytest.raises(ValueError, match="in flight"):
            engine.generate(input_ids=[[1, 2], [3, 4], [5, 6], [7, 8]],
                            sampling_params={"max_new_tokens": 400, "ignore_eos": True})
        deadline = time.monotonic() + 5
        while engine.stats().finish_counts.get("abort", 0) < 3:  # the three it submitted
            assert time.monotonic() < deadline, engine.stats()
            time.sleep(0.01)
        assert engine.stats().generated_tokens < 3 * 400
        _still_serves(engine)


def _run_in_thread(fn):
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", fn()), daemon=True)
    thread.start()
    return thread, box


@pytest.mark.parametrize("reason", ["client went away", 5, {"type": []}, {"type": None}, {"message": 5}])
def test_abort_with_a_malformed_reason_is_a_value_error(reason):
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=4096) as engine:
        with pytest.raises(ValueError, match="reason"):
            engine.abort("r1", reason)
        assert engine.is_healthy
        _still_serves(engine)


def test_abort_by_rid_ends_every_sample_of_an_n_request(engine):
    thread, box = _run_in_thread(lambda: engine.generate(
        "a b c", {"max_new_tokens": 1500, "ignore_eos": True, "n": 2}, rid="fan"))
    deadline = time.monotonic() + 5
    while engine.stats().num_running < 2:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    engine.abort("fan")
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert [o["meta_info"]["finish_reason"]["type"] for o in box["out"]] == ["abort", "abort"]
    _idle(engine)


def test_stats_are_current_when_generate_returns(engine):
    """A caller woken by its request's finish reads stats that already count it as done."""
    for _ in range(10):
        engine.generate("a b c", SHORT)
        s = engine.stats()
        assert (s.num_running, s.num_waiting, s.kv_slots_used) == (0, 0, 0)


def test_tiny_temperatures_are_greedy(engine):
    greedy = engine.generate("a b c", {**SHORT, "max_new_tokens": 6, "temperature": 0})["output_ids"]
    for t in (1e-40, 5e-324, 1e-6):
        assert engine.generate("a b c", {**SHORT, "max_new_tokens": 6, "temperature": t})["output_ids"] == greedy


def test_a_penalty_that_breaks_the_logits_ends_the_request_with_an_error(engine):
    out = engine.generate("a b a b", {**SHORT, "repetition_penalty": 1e-45, "temperature": 1.0})
    assert out["meta_info"]["finish_reason"]["type"] == "error"
    assert "finite" in out["meta_info"]["finish_reason"]["message"]
    _still_serves(engine)


def test_a_stream_with_a_wrongly_typed_option_fails_fast(engine):
    async def run():
        async for _ in engine.generate_stream("a b", SHORT, return_logprob=True, top_logprobs_num=2.0):
            pass

    with pytest.raises(ValueError, match="top_logprobs_num"):
        asyncio.run(asyncio.wait_for(run(), timeout=10))
    _still_serves(engine)


def test_the_core_refuses_a_submit_of_wrong_types(engine, monkeypatch):
    """A submit that got past the client's checks but does not decode in the core process is
    answered (ValueError), not dropped with its caller waiting forever."""
    if not isinstance(engine, EngineClient):
        pytest.skip("the process boundary only")
    import radixflow.runtime.core_client as core_client

    monkeypatch.setattr(core_client, "check_options", lambda *a, **k: None)

    async def run():
        async for _ in engine.generate_stream("a b", SHORT, session_id=5):
            pass

    with pytest.raises(ValueError, match="session_id"):
        asyncio.run(asyncio.wait_for(run(), timeout=10))
    _still_serves(engine)


@pytest.mark.parametrize("config, match", [
    (dict(max_num_seqs="4"), "max_num_seqs"),
    (dict(cpu_kv_cache_bytes=None), "cpu_kv_cache_bytes"),
    (dict(seed="abc"), "seed"),
    (dict(stream_interval=1.5), "stream_interval"),
    (dict(grammar_timeout_s=float("nan")), "grammar_timeout_s"),
    (dict(kv_cache_tokens=5), "kv_cache_tokens must be >= 16"),
])
def test_engine_config_of_wrong_types_is_a_value_error(config, match):
    from radixflow.runtime.config import EngineConfig

    with pytest.raises(ValueError, match=match):
        EngineConfig.from_kwargs(**config)


def test_engine_config_takes_paths(tmp_path):
    from radixflow.runtime.config import EngineConfig

    assert EngineConfig.from_kwargs(model=tmp_path, lora_dir=tmp_path).model == str(tmp_path)
