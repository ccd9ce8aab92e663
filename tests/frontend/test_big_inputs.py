"""Big inputs under the default limits: refused before any work, and the event loop never blocks on tokenization."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from radixflow.frontend.limits import RequestLimits
from radixflow.frontend.server import create_app

from .conftest import LiveServer


@pytest.fixture(scope="module")
def default_server(engine) -> Iterator[LiveServer]:
    live = LiveServer(create_app(engine, "tiny")).start()  # the default limits
    yield live
    live.stop()


def test_30_mb_prompt_is_refused_at_once(default_server):
    body = b'{"model": "tiny", "prompt": "' + b"x" * (30 * 1024 * 1024) + b'"}'
    start = time.monotonic()
    r = httpx.post(default_server.url + "/v1/completions", content=body,
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413 and str(RequestLimits().max_body_bytes) in r.json()["error"]["message"]
    assert time.monotonic() - start < 5


def test_prompt_over_max_prompt_chars_is_refused_before_tokenizing(default_server):
    chars = RequestLimits().max_prompt_chars + 1
    start = time.monotonic()
    r = httpx.post(default_server.url + "/generate", json={"text": "y" * chars}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "limit_exceeded"
    assert f"the limit max_prompt_chars is {chars - 1}" in r.json()["error"]["message"]
    assert time.monotonic() - start < 3


def test_many_empty_messages_are_refused_before_rendering(default_server):
    body = b'{"model": "tiny", "messages": [' + b",".join([b'{"role": "user"}'] * 450_000) + b"]}"  # 7 MB
    start = time.monotonic()
    r = httpx.post(default_server.url + "/v1/chat/completions", content=body,
                   headers={"content-type": "application/json"}, timeout=60)
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "limit_exceeded" and err["param"] == "messages", err
    assert "max_messages" in err["message"]
    assert time.monotonic() - start < 3


def test_message_chars_count_roles_names_and_tool_call_ids():
    from radixflow.frontend.chat_prompt import message_chars
    from radixflow.frontend.openai_schemas import ChatMessage

    messages = [ChatMessage(role="user", content="hi", name="bob"), ChatMessage(role="tool", tool_call_id="c1")]
    assert message_chars(messages) == len("user" + "hi" + "bob") + len("tool" + "c1")


def test_health_answers_while_a_big_prompt_is_tokenized(default_server):
    text = "word " * (RequestLimits().max_prompt_chars // 5 - 1)  # just inside the limit
    done = threading.Event()
    took: list[float] = []
    statuses: list[int] = []

    def big() -> None:
        start = time.monotonic()
        try:
            r = httpx.post(default_server.url + "/generate",
                           json={"text": text, "sampling_params": {"max_new_tokens": 0}}, timeout=120)
            statuses.append(r.status_code)
        finally:  # the loop below must end even if the request fails
            took.append(time.monotonic() - start)
            done.set()

    worker = threading.Thread(target=big)
    worker.start()
    worst = 0.0
    while not done.is_set():
        start = time.monotonic()
        assert httpx.get(default_server.url + "/health", timeout=30).status_code == 200
        worst = max(worst, time.monotonic() - start)
        time.sleep(0.02)
    worker.join()
    assert statuses and statuses[0] in (200, 400)  # 400: more tokens than the context holds
    # Tokenizing on the event loop would hold /health for the whole request.
    assert worst < max(1.0, 0.5 * took[0]), (worst, took)


@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize", "/v1/programs"])
def test_a_body_that_stops_arriving_is_a_408(engine, path):
    """A client that sends the headers and part of the body, then nothing: the server answers 408
    once no byte has come for `body_timeout_s`, on the direct lane and the routed paths alike,
    and serves others meanwhile."""
    import json
    import socket

    live = LiveServer(create_app(engine, "tiny", limits=RequestLimits(body_timeout_s=0.5))).start()
    try:
        port = int(live.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         f"Content-Length: 100\r\n\r\n".encode() + b'{"model": "tiny", ')
            assert httpx.get(live.url + "/health").status_code == 200  # others are served meanwhile
            start = time.monotonic()
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                data = sock.recv(65536)
                if not data:
                    break
                reply += data
            head, _, body = reply.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), reply
            assert json.loads(body)["error"]["code"] == "request_timeout"
            assert time.monotonic() - start < 5
    finally:
        live.stop()


@pytest.mark.parametrize("flag", ["--body-timeout-s=0", "--body-timeout-s=-1", "--body-timeout-s=nan",
                                  "--max-body-bytes=0", "--program-deadline-s=-5"])
def test_limit_flags_must_be_above_zero(flag):
    """--body-timeout-s 0 (or nan) used to start a server that answered every body with 408."""
    import argparse

    from radixflow.frontend.limits import add_limit_flags

    parser = argparse.ArgumentParser()
    add_limit_flags(parser)
    assert parser.parse_args(["--body-timeout-s=0.25"]).body_timeout_s == 0.25
    with pytest.raises(SystemExit):
        parser.parse_args([flag])
