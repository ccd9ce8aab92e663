"""`radixflow serve` end to end in a subprocess: starts on the demo model, serves, stops on SIGINT."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_demo_model_with_api_key():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "radixflow.frontend.cli", "serve", "--demo-size", "tiny", "--port", str(port),
                             "--kv-cache-tokens", "2048", "--api-key", "sekrit", "--max-num-seqs", "8",
                             "--tool-call-parser", "pythonic", "--enable-weight-updates"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # start-up only: generous, the suite runs on busy cores
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
            assert info["tool_call_parser"] == "pythonic" and info["weight_updates"] is True
            out = c.post("/v1/completions", json={"model": "radixflow-demo-tiny", "prompt": "Hi", "max_tokens": 2,
                                                      "ignore_eos": True})
            assert out.status_code == 200 and out.json()["usage"]["completion_tokens"] == 2
            chat = c.post("/v1/chat/completions", json={"model": "radixflow-demo-tiny", "max_tokens": 2, "stream": True,
                                                        "logprobs": True, "messages": [{"role": "user", "content": "Hi"}]})
            assert chat.status_code == 200 and chat.text.rstrip().endswith("data: [DONE]")
            embed = c.post("/v1/embeddings", json={"model": "radixflow-demo-tiny", "input": "Hi"})
            assert embed.status_code == 200
            # the API server process (the engine core is another) serves without torch: 2 s less
            # to start and its memory, per API server process
            assert info["api_server_pid"] == proc.pid != info["engine_core_pid"]
            if os.path.exists(f"/proc/{proc.pid}/maps"):
                with open(f"/proc/{proc.pid}/maps") as maps:
                    assert "libtorch" not in maps.read()
    finally:
        proc.send_signal(signal.SIGINT)
        log, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, log
    assert "KV pool" in log and f"http://127.0.0.1:{port}" in log


def test_limit_flags_reach_the_server_limits():
    from radixflow.frontend.cli import build_parser
    from radixflow.frontend.limits import RequestLimits, limit_table, limits_from_flags
    from radixflow.lang import Limits

    ns = build_parser().parse_args(["serve", "--max-stop", "3", "--max-body-bytes", "1000",
                                    "--program-deadline-s", "5", "--program-max-concurrent", "2"])
    request, program = limits_from_flags(ns)
    assert request == RequestLimits(max_stop=3, max_body_bytes=1000)
    assert program == Limits(deadline_s=5.0, max_concurrent=2)
    default_request, default_program = limits_from_flags(build_parser().parse_args(["serve"]))
    assert default_request == RequestLimits() and default_program == Limits()
    readme = open(__file__.rsplit("/tests/", 1)[0] + "/README.md").read()
    for flag, _, _ in limit_table():  # the README's limits table lists every flag
        assert f"`{flag}`" in readme, flag


def test_an_unknown_tool_call_parser_is_refused_at_startup(capsys, caplog):
    import argparse

    import pytest

    from radixflow.frontend.cli import build_parser
    from radixflow.frontend.server import create_app, serve

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["serve", "--tool-call-parser", "qwen"])
    assert exc.value.code == 2 and "--tool-call-parser: invalid choice: 'qwen'" in capsys.readouterr().err
    assert build_parser().parse_args(["serve"]).tool_call_parser == "hermes"
    message = ("--tool-call-parser must be one of hermes, llama3_json, mistral, pythonic, qwen3_coder, glm45, glm47, "
               "granite, phi4_mini_json, gpt_oss, minimax_m2, deepseek_v3, deepseek_v31, kimi_k2; got 'qwen'")
    with pytest.raises(ValueError, match=message):
        create_app(lambda: None, tool_call_parser="qwen")
    ns = argparse.Namespace(host="127.0.0.1", port=0, demo_size="tiny", tool_call_parser="qwen")
    assert serve(ns, {}) == 2 and message in caplog.text
    from radixflow.frontend.tool_call_formats import PARSERS

    readme = open(__file__.rsplit("/tests/", 1)[0] + "/README.md").read()
    assert "`radixflow serve --tool-call-parser NAME`" in readme
    for name in PARSERS:  # the README describes every format
        assert f"  - `{name}`" in readme, name


def test_two_api_servers_share_one_engine_core():
    """`--api-server-count 2`: two HTTP server processes on one port, one engine core process; both
    serve, both read the same core (its counters), and SIGINT stops all three."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "radixflow.frontend.cli", "serve", "--demo-size", "tiny", "--port",
                             str(port), "--kv-cache-tokens", "2048", "--api-server-count", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # start-up only: generous, the suite runs on busy cores
        seen: dict[int, int] = {}

        def ask(_: int) -> None:
            try:
                with httpx.Client(base_url=url, timeout=30) as c:  # a new connection each time
                    info = c.get("/get_server_info")
                    if info.status_code == 200:
                        seen[info.json()["api_server_pid"]] = info.json()["engine_core_pid"]
            except httpx.TransportError:
                time.sleep(0.1)

        with ThreadPoolExecutor(8) as pool:
            while len(seen) < 2:  # concurrent new connections land on either server
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, f"two servers did not answer: {seen}"
                list(pool.map(ask, range(8)))
        assert len(set(seen.values())) == 1 and set(seen.values()).isdisjoint(seen)  # one core, not a server
        generated = []
        for _ in range(4):
            with httpx.Client(base_url=url, timeout=30) as c:
                out = c.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 3,
                                                                                  "ignore_eos": True}})
                assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 3
                generated.append(c.get("/get_server_info").json()["stats"]["generated_tokens"])
        assert generated == sorted(generated) and generated[-1] - generated[0] == 9  # one shared counter
    finally:
        proc.send_signal(signal.SIGINT)
        log, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, log
    assert "2 API server processes" in log


def test_a_port_out_of_range_is_refused_before_anything_starts(caplog):
    from radixflow.frontend.cli import main

    for port in ("-1", "70000"):
        assert main(["serve", "--demo-size", "tiny", "--port", port]) == 2
        assert f"--port must be 0 to 65535, got {port}" in caplog.text


def test_stored_responses_with_several_api_servers_are_refused(caplog):
    """Each API server process keeps its own responses: a previous_response_id could reach another."""
    from radixflow.frontend.cli import main

    argv = ["serve", "--demo-size", "tiny", "--port", str(_free_port()), "--api-server-count", "2"]
    assert main([*argv, "--max-stored-responses", "5"]) == 2
    assert "--max-stored-responses must be >= 0, and 0 with --api-server-count above 1" in caplog.text


def test_a_model_path_that_does_not_exist_is_refused_before_listening(caplog):
    from radixflow.frontend.cli import main

    assert main(["serve", "--model", "/nonexistent/model", "--port", str(_free_port())]) == 2
    assert "'/nonexistent/model' does not exist" in caplog.text


def _broken_model(tmp_path) -> str:
    import json
    import shutil

    from radixflow.runtime.model.demo import demo_model

    out = tmp_path / "broken"
    shutil.copytree(demo_model("tiny"), out)
    cfg = json.loads((out / "config.json").read_text())
    del cfg["hidden_size"]
    (out / "config.json").write_text(json.dumps(cfg))
    return str(out)


def test_an_engine_that_fails_to_load_exits_nonzero_with_the_reason(tmp_path):
    """The model loads after the port is bound: its ValueError is one log line naming the file and
    the cause (no traceback), and the server exits with status 1."""
    model = _broken_model(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "radixflow.frontend.cli", "serve", "--model", model, "--port",
                           str(_free_port()), "--engine-core", "thread"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout
    assert f"{model}/config.json: the required field hidden_size is missing" in proc.stdout
    assert "Traceback" not in proc.stdout, proc.stdout


def test_a_port_in_use_is_one_line_and_exit_1_with_several_api_servers():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "radixflow.frontend.cli", "serve", "--demo-size", "tiny",
                               "--port", str(port), "--api-server-count", "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stdout and "Traceback" not in proc.stdout, proc.stdout


def test_a_core_that_fails_to_start_leaves_no_socket_folder(monkeypatch, tmp_path):
    """--api-server-count N: the engine core's socket folder goes when the core cannot start."""
    import argparse
    import tempfile

    import radixflow.runtime.core_process as core_process
    from radixflow.frontend import server

    made = []
    real_mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: made.append(real_mkdtemp(dir=tmp_path, **kw)) or made[-1])

    def fail(*_args, **_kwargs):
        raise ValueError("no such model")

    monkeypatch.setattr(core_process, "start_core", fail)
    ns = argparse.Namespace(host="127.0.0.1", port=0)
    assert server._serve_many(ns, "nowhere", {}, "name", 2) == 1
    assert made and not any(os.path.exists(folder) for folder in made)
