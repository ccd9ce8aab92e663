"""LoRA over HTTP: load/unload routes gated by --lora-dir, adapters as OpenAI models, native lora_path, metrics."""
from __future__ import annotations

import os
import sys

import httpx
import pytest

from .conftest import LiveServer
from radixflow.frontend.server import create_app
from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime"))
from lora_adapters import write_adapter  # noqa: E402

GREEDY = {"max_new_tokens": 6, "temperature": 0.0}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model = demo_model("tiny")
    root = tmp_path_factory.mktemp("lora_dir")
    a = write_adapter(str(root / "a"), model, rank=8, seed=1)
    b = write_adapter(str(root / "b"), model, rank=4, seed=2)
    outside = write_adapter(str(tmp_path_factory.mktemp("outside") / "c"), model, rank=4, seed=3)
    with Engine(model, lora_dir=str(root), lora_modules=[f"alpha={a}"], dtype="float32") as eng:
        live = LiveServer(create_app(eng, "tiny")).start()
        with httpx.Client(base_url=live.url, timeout=60) as client:
            yield client, eng, {"a": a, "b": b, "outside": outside, "url": live.url}
        live.stop()


def _native(client, **fields):
    return client.post("/generate", json={"text": "the river ran", "sampling_params": GREEDY, **fields})


def test_models_list_adapters_with_their_parent(setup):
    client, _, paths = setup
    data = client.get("/v1/models").json()["data"]
    assert [(m["id"], m.get("parent")) for m in data] == [("tiny", None), ("alpha", "tiny")]
    card = client.get("/v1/models/alpha").json()
    assert card["parent"] == "tiny" and card["root"] == os.path.realpath(paths["a"])


def test_openai_model_is_the_adapter(setup):
    client, eng, _ = setup
    body = {"prompt": "the river ran", "max_tokens": 6, "temperature": 0}
    lora = client.post("/v1/completions", json={**body, "model": "alpha"}).json()
    base = client.post("/v1/completions", json={**body, "model": "tiny"}).json()
    want = eng.generate("the river ran", GREEDY, lora="alpha")["text"]
    assert lora["choices"][0]["text"] == want
    assert lora["model"] == "alpha"
    assert base["choices"][0]["text"] == eng.generate("the river ran", GREEDY)["text"]
    chat = client.post("/v1/chat/completions", json={"model": "alpha", "max_tokens": 4, "temperature": 0,
                                                     "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200
    missing = client.post("/v1/completions", json={**body, "model": "nope"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_load_generate_unload_over_http(setup):
    client, eng, paths = setup
    r = client.post("/v1/load_lora_adapter", json={"lora_name": "beta", "lora_path": paths["b"]})
    assert r.status_code == 200, r.text
    out = _native(client, lora_path="beta").json()
    assert out["output_ids"] == eng.generate("the river ran", GREEDY, lora="beta")["output_ids"]
    assert out["output_ids"] != _native(client).json()["output_ids"]  # the adapter changes the output
    by_path = _native(client, lora_path=paths["b"]).json()  # a path under --lora-dir, as SGLang
    assert by_path["output_ids"] == out["output_ids"]
    assert client.post("/v1/unload_lora_adapter", json={"lora_name": "beta"}).status_code == 200
    assert "beta" not in [m["id"] for m in client.get("/v1/models").json()["data"]]
    gone = _native(client, lora_path="beta")
    assert gone.status_code == 400 and "unknown LoRA adapter" in gone.json()["error"]["message"]
    again = client.post("/v1/unload_lora_adapter", json={"lora_name": "beta"})
    assert again.status_code == 404


def test_load_rejections_are_400(setup):
    client, _, paths = setup
    outside = client.post("/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": paths["outside"]})
    assert outside.status_code == 400 and "outside --lora-dir" in outside.json()["error"]["message"]
    base_name = client.post("/v1/load_lora_adapter", json={"lora_name": "tiny", "lora_path": paths["b"]})
    assert base_name.status_code == 400
    extra = client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": paths["b"], "z": 1})
    assert extra.status_code == 400
    bad = _native(client, lora_path=paths["outside"])
    assert bad.status_code == 400 and "outside --lora-dir" in bad.json()["error"]["message"]


def test_corrupt_or_non_finite_adapters_are_400(setup):
    client, _, paths = setup
    root = os.path.dirname(paths["a"])
    model = demo_model("tiny")
    corrupt = write_adapter(os.path.join(root, "corrupt"), model, rank=4, seed=4)
    with open(os.path.join(corrupt, "adapter_model.safetensors"), "wb") as f:
        f.write(b"\x00" * 16)
    nan_alpha = write_adapter(os.path.join(root, "nan_alpha"), model, rank=4, seed=5, alpha=float("nan"))
    for path, match in [(corrupt, "adapter_model.safetensors"), (nan_alpha, "lora_alpha")]:
        r = client.post("/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": path})
        assert r.status_code == 400 and match in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"] == "lora_path"
        r = _native(client, lora_path=path)
        assert r.status_code == 400 and match in r.json()["error"]["message"], r.text
    assert _native(client, lora_path="alpha").status_code == 200


def test_metrics_count_requests_per_adapter(setup):
    client, _, _ = setup
    _native(client, lora_path="alpha")
    text = client.get("/metrics").text
    assert 'radixflow_lora_requests_total{lora_name="alpha",model_name="tiny"}' in text
    assert "radixflow_lora_adapters_loaded{" in text and "radixflow_lora_load_time_seconds_count{" in text
    resident = [line for line in text.splitlines() if line.startswith("radixflow_lora_adapters_resident{")]
    assert resident and float(resident[0].split()[-1]) >= 1


def _per_adapter(text: str, name: str) -> dict[str, float]:
    """Samples of `name` by lora_name (summed over other labels but model_name)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                assert s.labels["model_name"] == "tiny"
                out[s.labels["lora_name"]] = out.get(s.labels["lora_name"], 0.0) + s.value
    return out


def test_per_request_series_are_labelled_by_adapter(setup):
    from radixflow.frontend.top import Scrape

    client, _, paths = setup
    assert client.post("/v1/load_lora_adapter", json={"lora_name": "gamma", "lora_path": paths["b"]}).status_code == 200
    names = ("radixflow_time_to_first_token_seconds_count", "radixflow_e2e_request_latency_seconds_count",
             "radixflow_requests_finished_total", "radixflow_goodput_requests_total",
             "radixflow_prefix_cache_miss_tokens_total")
    before = {n: _per_adapter(client.get("/metrics").text, n) for n in names}
    sent = {"alpha": 2, "gamma": 3, "": 1}  # "": base-model requests
    for name, n in sent.items():
        for i in range(n):
            fields = {"lora_path": name} if name else {}
            assert client.post("/generate", json={"text": f"adapter {name} request {i}", "sampling_params": GREEDY,
                                                  **fields}).status_code == 200
    text = client.get("/metrics").text
    for n in names[:4]:
        after = _per_adapter(text, n)
        assert {k: after.get(k, 0) - before[n].get(k, 0) for k in sent} == sent, n
    misses = _per_adapter(text, names[4])
    assert all(misses[k] > before[names[4]].get(k, 0) for k in sent)
    # `radixflow top` sums the adapters back together
    scrape = Scrape.parse(text, 0.0)
    assert scrape.get(names[0]) == sum(_per_adapter(text, names[0]).values())
    finished = scrape.by_label["radixflow_requests_finished_total"]
    assert sum(finished.values()) == sum(_per_adapter(text, names[2]).values())
    assert client.post("/v1/unload_lora_adapter", json={"lora_name": "gamma"}).status_code == 200


def test_routes_are_off_without_lora_dir(client):
    r = client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/tmp"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "lora_loading_disabled"
    assert client.post("/v1/unload_lora_adapter", json={"lora_name": "a"}).status_code == 400
    r = client.post("/generate", json={"text": "hi", "lora_path": "a", "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400 and "not enabled" in r.json()["error"]["message"]
    assert "lora_name" not in client.get("/metrics").text  # no adapters, no adapter label


def test_language_gen_with_lora_over_endpoint_and_engine(setup):
    import radixflow.lang as rf

    client, eng, paths = setup

    @rf.function
    def program(s, lora):
        s += "the river ran"
        s += rf.gen("out", max_tokens=6, temperature=0, lora=lora)

    want = eng.generate("the river ran", GREEDY, lora="alpha")["text"]
    base = eng.generate("the river ran", GREEDY)["text"]
    assert want != base
    assert program.run(lora="alpha", backend=rf.Endpoint(paths["url"]))["out"] == want
    with rf.Engine(engine=eng) as backend:
        assert program.run(lora="alpha", backend=backend)["out"] == want
        assert program.run(lora=None, backend=backend)["out"] == base


def test_serve_flags_for_adapters():
    from radixflow.frontend.cli import build_parser, engine_kwargs
    from radixflow.runtime import EngineConfig

    ns = build_parser().parse_args(["serve", "--lora-modules", "a=/x", "b=/y", "--max-loras", "3",
                                    "--max-lora-rank", "64", "--lora-dir", "/adapters"])
    cfg = EngineConfig.from_kwargs(**engine_kwargs(ns))
    assert cfg.lora_modules == ("a=/x", "b=/y") and cfg.max_loras == 3 and cfg.max_lora_rank == 64
    assert cfg.lora_enabled and cfg.lora_dir == "/adapters"
    assert not EngineConfig.from_kwargs(**engine_kwargs(build_parser().parse_args(["serve"]))).lora_enabled


@pytest.mark.parametrize("kind", ["core-thread", "core-process"])
def test_n_samples_over_http_never_split_across_a_replace(tmp_path, monkeypatch, kind):
    """Over HTTP an n > 1 request's samples are submitted one by one; a load replacing their
    adapter's name between two submits must not give some samples the old weights and others the
    new ones (the in-process Engine resolves once per request, tests/runtime/test_lora_concurrency.py).
    The request pins the weights its name means when it starts: it runs on them, or is refused."""
    from radixflow.runtime import EngineClient
    from radixflow.runtime.core.messages import SubmitRequest

    model = demo_model("tiny")
    old_path = write_adapter(str(tmp_path / "old"), model, rank=8, seed=11)
    new_path = write_adapter(str(tmp_path / "new"), model, rank=8, seed=12)
    make = EngineClient if kind == "core-process" else Engine
    with make(model, dtype="float32", lora_modules=[f"x={old_path}", f"new={new_path}"]) as eng:
        live = LiveServer(create_app(eng, "tiny")).start()
        try:
            with httpx.Client(base_url=live.url, timeout=60) as client:
                old = _native(client, lora_path="x").json()["output_ids"]
                assert old != _native(client, lora_path="new").json()["output_ids"]
                samples = []

                def replace_after_the_first_sample(max_new_tokens: int) -> None:
                    if max_new_tokens > 0:  # a sample, not the shared prefill
                        samples.append(max_new_tokens)
                        if len(samples) == 1:  # x gets new weights now, before the next sample's submit
                            eng.load_lora_adapter("x", new_path)
                if kind == "core-process":
                    send = eng._send

                    def hooked_send(message) -> None:
                        send(message)
                        if isinstance(message, SubmitRequest) and message.lora == "x":
                            replace_after_the_first_sample(message.sampling.max_new_tokens)
                    monkeypatch.setattr(eng, "_send", hooked_send)
                else:
                    submit = eng.loop.submit

                    def hooked_submit(req) -> None:
                        submit(req)
                        replace_after_the_first_sample(req.sampling.max_new_tokens)
                    monkeypatch.setattr(eng.loop, "submit", hooked_submit)
                r = _native(client, lora_path="x", sampling_params={**GREEDY, "n": 3})
                monkeypatch.undo()
                assert samples  # the replace happened after the first sample was submitted
                assert r.status_code == 400 and "was replaced" in r.json()["error"]["message"], r.text
                eng.load_lora_adapter("x", old_path)
                again = _native(client, text="the sea rose and", lora_path="x", sampling_params={**GREEDY, "n": 3})
                assert [s["output_ids"] for s in again.json()] == [again.json()[0]["output_ids"]] * 3
                # the shared prefill ran on the adapter: every sample hits its KV
                assert {s["meta_info"]["cached_tokens"] for s in again.json()} == {
                    again.json()[0]["meta_info"]["prompt_tokens"] - 1}
                eng.check_accounting()
        finally:
            live.stop()
