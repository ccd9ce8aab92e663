"""The same kind of program, traced to an IR and submitted over HTTP to run next to the engine.

Starts `radixflow serve` on a free local port (the default model), submits a tool-choice
program with a server-side branch (`rf.if_` on a select result), compares it with running the
same program locally through the HTTP backend, then stops the server.

    python examples/submit_over_http.py
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx

import radixflow.lang as rf


@rf.function
def route(s, ticket):
    s += rf.system("You route support tickets to a team.")
    s += rf.user(ticket)
    s += rf.assistant("Team: " + rf.select("team", ["billing", "bugs", "sales"]))
    s += rf.if_(s["team"] == "bugs",
                then=rf.user("Summarize the bug.") + rf.assistant(rf.gen("summary", max_tokens=12, temperature=0)),
                else_=rf.user("Write a one-line reply.") + rf.assistant(rf.gen("reply", max_tokens=12, temperature=0)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health_generate", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError("server did not become ready")


def cache_counters(url: str) -> tuple[int, int]:
    stats = httpx.get(url + "/get_server_info", timeout=10).json()["stats"]
    return stats["prefix_hit_tokens"], stats["prefix_query_tokens"]


def main() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "radixflow.frontend.cli", "serve", "--port", str(port),
                             "--kv-cache-tokens", "8192", "--log-level", "warning"])
    try:
        wait_ready(url, proc)
        hit0, query0 = cache_counters(url)
        ticket = "The app crashes when I open settings."
        remote = route.submit(url, ticket=ticket)
        print("server-side run:", remote["variables"])
        local = route.run(ticket=ticket, backend=rf.Endpoint(url))
        print("client-side run:", local.variables())
        assert remote["variables"]["team"] in ("billing", "bugs", "sales")
        assert ("summary" in remote["variables"]) == (remote["variables"]["team"] == "bugs")
        assert remote["variables"] == local.variables(), "greedy: the same program gives the same values"
        hit1, query1 = cache_counters(url)
        print(f"prefix cache: {hit1 - hit0} of {query1 - query0} prompt tokens hit")
        assert hit1 > hit0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
