"""503 while the engine starts and while stopping; an engine built by a factory is shut down with the app;
a failed request or a dead engine loop is an HTTP error, never a 200."""
from __future__ import annotations

import threading

import httpx

from radixflow.frontend.server import create_app


class Borrowed:
    """The shared engine, with shutdown() recorded instead of done."""

    def __init__(self, engine) -> None:
        self._engine, self.was_shut_down = engine, False

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def shutdown(self) -> None:
        self.was_shut_down = True


def test_503_while_starting_then_ready_then_stopping(engine, live_server):
    release = threading.Event()
    borrowed = Borrowed(engine)

    def factory():
        release.wait(30)
        return borrowed

    app = create_app(factory, "tiny-2")
    live = live_server(app).start(wait_ready=False)
    try:
        with httpx.Client(base_url=live.url, timeout=30) as c:
            for path in ("/health", "/v1/models"):
                r = c.get(path)
                assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
            release.set()
            live.start_wait_ready()
            assert c.get("/v1/models").json()["data"][0]["id"] == "tiny-2"
            out = c.post("/v1/completions", json={"model": "tiny-2", "prompt": "x", "max_tokens": 2})
            assert out.status_code == 200
            app.state.server.phase = "stopping"
            assert c.get("/health").status_code == 503
            app.state.server.phase = "ready"
    finally:
        release.set()
        live.stop()
    assert borrowed.was_shut_down


def test_engine_that_fails_to_start(live_server):
    failed = []

    def factory():
        raise ValueError("no such model")

    app = create_app(factory, on_failure=lambda: failed.append(True))
    live = live_server(app).start(wait_ready=False)
    try:
        with httpx.Client(base_url=live.url, timeout=30) as c:
            while not failed:
                threading.Event().wait(0.01)
            r = c.get("/v1/models")
            assert r.status_code == 503 and "failed to start" in r.json()["error"]["message"]
    finally:
        live.stop()


def test_dead_engine_loop_answers_503_and_fails_streams(live_server):
    """The loop thread dies: the stream in flight ends with an error, /health and new requests 503."""
    from radixflow.runtime import Engine
    from radixflow.runtime.model.demo import demo_model

    engine = Engine(demo_model("tiny"), kv_cache_tokens=512)
    app = create_app(engine, "tiny-dead")
    live = live_server(app).start()
    try:
        with httpx.Client(base_url=live.url, timeout=30) as c:
            assert c.get("/health").status_code == 200
            real = engine.loop.step.run_one
            calls = []

            def run_one():
                calls.append(1)
                if len(calls) > 3:
                    raise SystemExit("the loop thread dies")
                return real()

            engine.loop.step.run_one = run_one
            body = {"text": "hello", "stream": True,
                    "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}
            with c.stream("POST", "/generate", json=body) as r:
                lines = [line for line in r.iter_lines() if line.startswith("data:")]
            assert lines[-1] == "data: [DONE]"
            assert '"error"' in lines[-2]
            assert c.get("/health").status_code == 503
            r = c.post("/generate", json={"text": "again", "sampling_params": {"max_new_tokens": 1}})
            assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
    finally:
        live.stop()
        engine.shutdown()


def test_a_failed_request_is_an_http_error_never_a_200(client, engine):
    """A request that finishes with reason `error` answers 500 with its message (native and
    OpenAI routes); the requests around it are served."""
    from radixflow.runtime.core.faults import Fault, FaultInjector

    body = {"text": "hello", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    engine.set_fault_injector(FaultInjector([Fault("detokenizer", rids={"doomed"})]))
    try:
        r = client.post("/generate", json={**body, "rid": "doomed"})
        assert r.status_code == 500, r.text
        assert r.json()["error"]["code"] == "internal_error" and "InjectedFault" in r.json()["error"]["message"]
        ok = client.post("/generate", json={**body, "rid": "fine"})
        assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 4
        engine.set_fault_injector(FaultInjector([Fault("sampler", times=1)]))  # the next request
        completion = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        r = client.post("/v1/completions", json=completion)
        assert r.status_code == 500 and "InjectedFault" in r.json()["error"]["message"]
        assert client.post("/v1/completions", json=completion).status_code == 200
    finally:
        engine.set_fault_injector(None)
    engine.check_accounting()
    assert engine.invariant_violations == []
