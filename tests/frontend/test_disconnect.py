"""A client that goes away mid-request aborts it; KV slots and locks are released."""
from __future__ import annotations

import time

import httpx

MODEL_NAME = "tiny"  # the conftest server's
LONG = {"max_tokens": 1500, "ignore_eos": True}


def _settled(engine, aborts_before: int, timeout_s: float = 10.0) -> None:
    """The aborted request is gone and the KV slot accounting is back where idle leaves it."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = engine.stats()
        if s.num_running == 0 and s.num_waiting == 0 and s.finish_counts.get("abort", 0) > aborts_before:
            break
        assert time.monotonic() < deadline, f"request not aborted: {s}"
        time.sleep(0.02)
    engine.check_accounting()
    assert engine.invariant_violations == []
    assert engine.stats().kv_slots_used == 0  # nothing held or locked: only free and evictable slots


def test_streaming_client_disconnects_after_3_chunks(client, engine):
    engine.check_accounting()
    aborts = engine.stats().finish_counts.get("abort", 0)
    body = {"model": MODEL_NAME, "prompt": "Tell me a very long story", "stream": True, **LONG}
    with client.stream("POST", "/v1/completions", json=body) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == 3:
                break
    assert seen == 3
    _settled(engine, aborts)
    assert engine.stats().num_running == 0


def test_non_streaming_client_disconnects(server, engine):
    aborts = engine.stats().finish_counts.get("abort", 0)
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "go"}], "n": 2, **LONG}
    with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer test-key"}, timeout=0.5) as c:
        try:
            c.post("/v1/chat/completions", json=body)
            raise AssertionError("1500 tokens x2 should not finish in 0.5 s")
        except httpx.ReadTimeout:
            pass
    _settled(engine, aborts)


def test_native_stream_disconnect(client, engine):
    aborts = engine.stats().finish_counts.get("abort", 0)
    body = {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}, "stream": True}
    with client.stream("POST", "/generate", json=body) as r:
        next(r.iter_lines())
    _settled(engine, aborts)


def test_program_client_disconnects(server, engine):
    import msgspec

    import radixflow.lang as rf

    @rf.function
    def ramble(s, topic):
        s += "About " + topic + ":" + rf.gen("story", max_tokens=1500, ignore_eos=True)

    aborts = engine.stats().finish_counts.get("abort", 0)
    body = {"program": msgspec.to_builtins(rf.trace(ramble)), "arguments": {"topic": "cats"}}
    with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer test-key"}, timeout=0.5) as c:
        try:
            c.post("/v1/programs", json=body)
            raise AssertionError("1500 tokens should not finish in 0.5 s")
        except httpx.ReadTimeout:
            pass
    _settled(engine, aborts)


def test_streamed_program_client_disconnects_without_error_logs(server, engine, caplog):
    """The program's failure after its client left ("the client went away") is expected: no
    'Future exception was never retrieved' traceback in the log."""
    import gc
    import logging

    import msgspec

    import radixflow.lang as rf

    @rf.function
    def ramble(s, topic):
        s += "About " + topic + ":" + rf.gen("head", max_tokens=2) + rf.gen("story", max_tokens=1500, ignore_eos=True)

    aborts = engine.stats().finish_counts.get("abort", 0)
    body = {"program": msgspec.to_builtins(rf.trace(ramble)), "arguments": {"topic": "cats"}, "stream": True}
    caplog.set_level(logging.ERROR, logger="asyncio")
    with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer test-key"}, timeout=30) as c:
        with c.stream("POST", "/v1/programs", json=body) as r:
            next(line for line in r.iter_lines() if line.startswith("data: "))  # the "head" variable
    _settled(engine, aborts)
    time.sleep(0.2)  # the program's thread ends once its generation is aborted
    gc.collect()
    assert "never retrieved" not in caplog.text, caplog.text[-2000:]
