"""/update_weights_from_disk and /get_weight_version over HTTP, the core in its own process."""
from __future__ import annotations

import dataclasses

import httpx
import pytest

from .conftest import LiveServer
from radixflow.frontend.server import create_app
from radixflow.runtime import Engine, EngineClient
from radixflow.runtime.model.demo import SIZES, demo_model, write_demo_model

GREEDY = {"max_new_tokens": 8, "temperature": 0}
PROMPT = "the river ran"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    first = demo_model("tiny")
    second = write_demo_model("tiny", tmp_path_factory.mktemp("tiny-b"), dataclasses.replace(SIZES["tiny"], seed=999))
    with Engine(first) as a, Engine(second) as b:
        want = {first: a.generate(PROMPT, GREEDY)["output_ids"], second: b.generate(PROMPT, GREEDY)["output_ids"]}
    assert want[first] != want[second]
    with EngineClient(first) as eng:
        live = LiveServer(create_app(eng, "tiny", weight_updates=True)).start()
        with httpx.Client(base_url=live.url, timeout=60) as client:
            yield client, first, second, want, eng
        live.stop()


def _generate(client, version: str | None = None) -> list[int]:
    """The greedy output ids, the weights named `version` in meta_info (when given)."""
    r = client.post("/generate", json={"text": PROMPT, "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    if version is not None:
        assert r.json()["meta_info"]["weight_version"] == version
    return r.json()["output_ids"]


def test_update_and_version(setup):
    client, first, second, want, _ = setup
    assert _generate(client, "default") == want[first]
    assert client.get("/get_weight_version").json() == {"weight_version": "default"}
    r = client.post("/update_weights_from_disk", json={"model_path": second, "weight_version": "step-7"})
    assert r.status_code == 200, r.text
    assert r.json() == {"success": True, "message": f"weights updated from {second}", "num_paused_requests": 0}
    assert _generate(client, "step-7") == want[second]
    with client.stream("POST", "/generate", json={"text": PROMPT, "sampling_params": GREEDY, "stream": True}) as r:
        last = [line for line in r.iter_lines() if line.startswith("data: {")][-1]
    assert '"weight_version":"step-7"' in last.replace(" ", "")
    assert client.get("/get_weight_version").json() == {"weight_version": "step-7"}
    assert client.get("/get_model_info").json()["weight_version"] == "step-7"
    r = client.post("/update_weights_from_disk", json={"model_path": first, "load_format": "auto",
                                                       "abort_all_requests": True, "flush_cache": True})
    assert r.status_code == 200, r.text
    assert _generate(client) == want[first]
    assert 'radixflow_weight_updates_total{model_name="tiny"} 2.0' in client.get("/metrics").text


@pytest.mark.parametrize("body, param, text", [
    ({"model_path": "/nonexistent/checkpoint"}, "model_path", "does not exist"),
    ({"model_path": "x", "load_format": "pt"}, "load_format", "load_format 'pt' is not supported"),
    ({"model_path": "x", "flush_cache": False}, "flush_cache", "flush_cache must be true"),
    ({"model_path": "x", "token_step": 3}, "token_step", "token_step"),
    ({"load_format": "auto"}, "model_path", "model_path"),
    ({"model_path": 3}, "model_path", "model_path"),
])
def test_refusals(setup, body, param, text):
    client, first, _, want, _ = setup
    version = client.get("/get_weight_version").json()
    r = client.post("/update_weights_from_disk", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and text in error["message"]
    if param == "model_path" and "does not exist" in text:  # SGLang's failure reply beside the error
        assert r.json()["success"] is False and text in r.json()["message"]
    assert client.get("/get_weight_version").json() == version


def test_off_by_default(server):
    """The package's servers (both cores) were started without --enable-weight-updates."""
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": "Bearer test-key"}) as client:
        r = client.post("/update_weights_from_disk", json={"model_path": demo_model("tiny")})
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "weight_updates_disabled"
        assert client.get("/get_weight_version").json() == {"weight_version": "default"}


def test_pause_and_continue(setup):
    """A /generate sent while paused answers once /continue_generation is called."""
    import threading
    import time

    client, *_ = setup
    r = client.post("/pause_generation", content=b"")  # SGLang's clients may send no body: mode abort
    assert r.status_code == 200 and r.json() == {"success": True, "message": "generation paused (mode abort)"}
    got: dict = {}
    waiting = threading.Thread(target=lambda: got.update(r=client.post(
        "/generate", json={"text": PROMPT, "sampling_params": GREEDY})))
    waiting.start()
    time.sleep(0.5)
    assert "r" not in got and client.get("/get_load").json()[0]["num_waiting_reqs"] == 1
    assert 'radixflow_admission_paused{model_name="tiny"} 1.0' in client.get("/metrics").text
    health = client.get("/health_generate")
    assert health.status_code == 503 and "paused" in health.json()["error"]["message"]
    r = client.post("/continue_generation", json={})
    assert r.status_code == 200 and r.json()["success"] is True
    waiting.join(timeout=30)
    assert got["r"].status_code == 200 and got["r"].json()["meta_info"]["finish_reason"]["type"] == "length"
    assert client.post("/pause_generation", json={"mode": "retract"}).status_code == 200
    assert client.post("/continue_generation").status_code == 200
    assert 'radixflow_admission_paused{model_name="tiny"} 0.0' in client.get("/metrics").text
    assert client.get("/health_generate").status_code == 200


def test_update_weight_version(setup):
    client, *_ = setup
    r = client.post("/update_weight_version", json={"new_version": "named", "abort_all_requests": False})
    assert r.status_code == 200 and r.json()["success"] is True
    assert client.get("/get_weight_version").json() == {"weight_version": "named"}
    assert client.post("/update_weight_version", json={"new_version": "default"}).status_code == 200


@pytest.mark.parametrize("path, body, param", [
    ("/update_weight_version", {}, "new_version"),
    ("/update_weight_version", {"new_version": 3}, "new_version"),
    ("/pause_generation", {"mode": "sleep"}, "mode"),
    ("/pause_generation", {"mode": 1}, "mode"),
    ("/pause_generation", {"abort_all": True}, "abort_all"),
    ("/continue_generation", {"torch_empty_cache": True}, "torch_empty_cache"),
])
def test_pause_refusals(setup, path, body, param):
    client, *_ = setup
    r = client.post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert _generate(client)  # not paused


def test_update_from_tensors_through_the_core_process(setup):
    """update_weights_from_tensor (Python API only: no route takes pickled tensors) reaches the
    core process: the tensors are pickled over its socket."""
    import os

    from safetensors.torch import load_file

    client, first, second, want, eng = setup
    tensors = load_file(os.path.join(second, "model.safetensors"))
    reply = eng.update_weights_from_tensor(tensors, weight_version="from-tensors")
    assert reply["message"] == "weights updated from tensors"
    assert _generate(client, "from-tensors") == want[second]
    eng.update_weights_from_disk(first)
    assert _generate(client) == want[first]


def test_health_generate_answers_within_its_timeout(live_server):
    """A probe that cannot even start (one sequence slot, held by a long request) gets its 503
    after health_timeout_s, not when the slot frees."""
    import threading
    import time

    from radixflow.runtime.core.faults import FaultInjector

    class SlowSteps(FaultInjector):  # 20 ms a step: the long request holds its slot for ~10 s
        def check(self, point, reqs, step, step_level=False):
            if point == "forward":
                time.sleep(0.02)

    with Engine(demo_model("tiny"), max_num_seqs=1) as eng:
        eng.set_fault_injector(SlowSteps([]))
        live = live_server(create_app(eng, "tiny", health_timeout_s=1.0)).start()
        try:
            long = threading.Thread(target=lambda: eng.generate(
                "once", {"max_new_tokens": 500, "temperature": 0, "ignore_eos": True}))
            long.start()
            while eng.stats().num_running == 0:
                time.sleep(0.005)
            t0 = time.monotonic()
            r = httpx.get(live.url + "/health_generate", timeout=30)
            elapsed = time.monotonic() - t0
            assert r.status_code == 503 and elapsed < 2.5, (r.status_code, elapsed)
            eng.abort_all()
            long.join()
        finally:
            live.stop()
        eng.check_accounting()
