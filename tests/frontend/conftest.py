"""A live radixflow server (uvicorn in a thread, 127.0.0.1, ephemeral port) on the tiny demo model."""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from radixflow.frontend.server import create_app
from radixflow.runtime.model.demo import demo_model

# test helpers beside this file (text_pieces.py) import by name
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MODEL_NAME = "tiny"
API_KEY = "test-key"


class LiveServer:
    """Runs `app` until stop(); `url` is http://127.0.0.1:<ephemeral port>."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def start(self, wait_ready: bool = True) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        if wait_ready:
            self.start_wait_ready()
        return self

    def start_wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.app.state.server.phase != "ready":
            assert time.monotonic() < deadline, "engine did not become ready"
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()


@pytest.fixture(scope="session")
def live_server() -> type[LiveServer]:
    """The LiveServer class, for tests that serve an engine of their own."""
    return LiveServer


@pytest.fixture(scope="package", params=["core-thread", "core-process"])
def engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Every server test runs twice: on the in-process Engine (its core on a thread) and on an
    EngineClient (its core in its own process, over ZMQ), as `radixflow serve` runs it."""
    from radixflow.runtime import Engine, EngineClient

    kind = EngineClient if request.param == "core-process" else Engine
    with kind(demo_model("tiny"), kv_cache_tokens=4096, check_invariants=True) as eng:
        yield eng


@pytest.fixture(scope="package")
def server(engine: Any) -> Iterator[LiveServer]:
    live = LiveServer(create_app(engine, MODEL_NAME, API_KEY, max_body_bytes=256 * 1024)).start()
    yield live
    live.stop()


@pytest.fixture()
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as c:
        yield c


@pytest.fixture()
def wait_idle() -> Any:
    """wait_idle(engine, kv=False): wait (at most 5 s) until nothing runs or waits in the engine,
    and with `kv` until no KV slot is held either: requests of earlier tests (aborted streams,
    deadlines) may still be finishing."""
    def wait(engine: Any, kv: bool = False) -> None:
        deadline = time.monotonic() + 5
        while True:
            s = engine.stats()
            if not (s.num_running or s.num_waiting or (kv and s.kv_slots_used)):
                return
            assert time.monotonic() < deadline, s
            time.sleep(0.01)
    return wait
