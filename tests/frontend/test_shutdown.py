"""SIGTERM to `radixflow serve` with streams in flight: the streams end (reason abort, then
[DONE]), non-streamed requests get their answer, and every process exits within seconds."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx

from tests.frontend.test_serve_cli import _free_port

MODEL = "radixflow-demo-tiny"
LONG = {"max_tokens": 1900, "ignore_eos": True}


def _wait_ready(proc: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + 180  # start-up only: generous, the suite runs on busy cores
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not become ready"
        time.sleep(0.1)


def _read(url: str, path: str, body: dict, out: dict, key: str) -> None:
    try:
        with httpx.stream("POST", url + path, json=body, timeout=30) as r:
            out[key] = (r.status_code, [line for line in r.iter_lines() if line])
    except httpx.HTTPError as exc:
        out[key] = (None, [repr(exc)])


def _program() -> dict:
    import msgspec

    import radixflow.lang as rf

    @rf.function
    def ramble(s):
        s += "Once:" + rf.gen("head", max_tokens=2)
        for branch in s.fork(16):
            branch += rf.gen("more", max_tokens=1900, ignore_eos=True)

    return msgspec.to_builtins(rf.trace(ramble))


def test_sigterm_ends_streams_in_flight_and_exits():
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "radixflow.frontend.cli", "serve", "--demo-size", "tiny",
                             "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_ready(proc, url)
        core_pid = httpx.get(url + "/get_server_info").json()["engine_core_pid"]
        calls = {"chat": ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                   "stream": True, **LONG}),
                 "n8": ("/v1/completions", {"model": MODEL, "prompt": "hi", "n": 8, "stream": True, **LONG}),
                 "native": ("/generate", {"text": "hi", "stream": True,
                                          "sampling_params": {"max_new_tokens": 1900, "ignore_eos": True}}),
                 "whole": ("/v1/completions", {"model": MODEL, "prompt": "hi", **LONG}),
                 "program": ("/v1/programs", {"program": _program(), "stream": True})}
        out: dict = {}
        threads = [threading.Thread(target=_read, args=(url, path, body, out, key))
                   for key, (path, body) in calls.items()]
        for t in threads:
            t.start()
        time.sleep(1.0)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=15)
        proc.communicate(timeout=15)
        assert time.monotonic() - started < 5, "shutdown took too long"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    for key in ("chat", "n8", "native"):
        status, lines = out[key]
        assert status == 200 and lines[-1] == "data: [DONE]", (key, lines[-2:])
        events = [json.loads(line[6:]) for line in lines[:-1]]
        reasons = [c["finish_reason"] for e in events for c in e.get("choices", [])] or \
                  [(e["meta_info"]["finish_reason"] or {}).get("type") for e in events]
        assert [r for r in reasons if r is not None] == ["abort"] * (8 if key == "n8" else 1), (key, lines[-3:])
    status, lines = out["program"]
    assert status == 200 and lines[-1] == "data: [DONE]", lines[-2:]
    status, lines = out["whole"]
    assert status == 200, lines
    assert json.loads(lines[0])["choices"][0]["finish_reason"] == "abort"
    try:
        os.kill(core_pid, 0)
        raise AssertionError("the engine core process is still running")
    except ProcessLookupError:
        pass
