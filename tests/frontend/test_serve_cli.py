"""`radixflow serve` end to end in a subprocess: starts on the demo model, serves, stops on SIGINT."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_demo_model_with_api_key():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "radixflow.frontend.cli", "serve", "--demo-size", "tiny", "--port", str(port),
                             "--kv-cache-tokens", "2048", "--api-key", "sekrit", "--max-num-seqs", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 40
        with httpx.Client(base_url=url, headers={"Authorization": "Bearer sekrit"}, timeout=30) as c:
            while True:
                assert proc.poll() is None, proc.stdout.read()
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "server did not become ready"
                time.sleep(0.1)
            info = c.get("/get_server_info").json()
            assert info["config"]["max_num_seqs"] == 8 and info["kv_cache_tokens"] == 2048
            out = c.post("/v1/completions", json={"model": "radixflow-demo-tiny", "prompt": "Hi", "max_tokens": 2})
            assert out.status_code == 200 and out.json()["usage"]["completion_tokens"] == 2
    finally:
        proc.send_signal(signal.SIGINT)
        log, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, log
    assert "KV pool" in log and f"http://127.0.0.1:{port}" in log
