"""HTTP load for the benchmarks: `radixflow serve` in a child process, streaming /generate clients,
and a process's CPU time (used by engine_overhead.py and http_server_ab.py)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def stream_all_httpx(url: str, ps: list[list[int]], params: dict) -> int:
    import httpx

    async def one(client, p) -> int:
        body = {"input_ids": p, "sampling_params": params, "stream": True}
        last = None
        async with client.stream("POST", f"{url}/generate", json=body) as resp:
            resp.raise_for_status()
            async for line in resp.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    last = line
        return len(json.loads(last[6:])["output_ids"])

    limits = httpx.Limits(max_connections=len(ps) + 8, max_keepalive_connections=len(ps) + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        return sum(await asyncio.gather(*(one(client, p) for p in ps)))


async def stream_all_raw(url: str, ps: list[list[int]], params: dict, first_bytes: list[float] | None = None) -> int:
    """As stream_all_httpx with a load generator's client: one raw HTTP/1.1 connection per request,
    the whole SSE response read as bytes, only its last event parsed. The httpx client spends
    about four times the server's CPU parsing 256 streams, on the same two cores. `first_bytes`:
    each response's first bytes' arrival, seconds after the start, are appended to it (the
    server sends a stream's headers with its first chunk)."""
    host, port = url.removeprefix("http://").split(":")
    t0 = time.perf_counter()

    async def one(p) -> int:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request_bytes(host, p, params))
        if first_bytes is None:
            data = await reader.read(-1)
        else:
            data = await reader.read(1)
            first_bytes.append(time.perf_counter() - t0)
            data += await reader.read(-1)
        writer.close()
        return last_event_tokens(data)

    return sum(await asyncio.gather(*(one(p) for p in ps)))


def request_bytes(host: str, p: list[int], params: dict) -> bytes:
    return post_bytes(host, "/generate", {"input_ids": p, "sampling_params": params, "stream": True})


def post_bytes(host: str, path: str, body: dict) -> bytes:
    """An HTTP/1.1 POST of `body` as JSON, on a connection the server closes after answering."""
    data = json.dumps(body).encode()
    return (b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (path.encode(), host.encode(), len(data), data))


def last_event_tokens(data: bytes) -> int:
    start = data.rindex(b"data: {")
    return len(json.loads(data[start + 6: data.index(b"\n", start)])["output_ids"])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


SERVE = "import sys; from radixflow.frontend.cli import main; sys.exit(main())"


@contextlib.contextmanager
def server(model_dir: Path, core: str, num_requests: int, device: str = "cpu", dtype: str = "float32",
           launch: str = SERVE, env: dict | None = None, flags: tuple[str, ...] = ()):
    """`radixflow serve --engine-core core` in a child process (one torch thread, as in-process),
    started by the Python code `launch` with `env` added to the environment and `flags` added to
    its command line; yields its URL once healthy."""
    port = free_port()
    cmd = [sys.executable, "-c", launch,
           "serve", "--model", str(model_dir), "--load-format", "dummy", "--device", device,
           "--dtype", dtype,
           "--port", str(port), "--log-level", "warning", "--max-num-seqs", str(num_requests),
           "--kv-cache-tokens", "65536", "--engine-core", core, *flags]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 180)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    """Return once `url`/health answers 200; RuntimeError if `proc` exits or time runs out first."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"the server at {url} did not come up")
        time.sleep(0.2)
