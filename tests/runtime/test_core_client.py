"""The engine core in its own process gives what the in-process engine gives: the core sends token
ids only, the client detokenizes and finds stop strings and regexes (runtime/core_client.py)."""
from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from radixflow.runtime import Engine, EngineClient
from radixflow.runtime.model.demo import demo_model

GREEDY = {"temperature": 0, "ignore_eos": True}
PROMPTS = ["Once upon a time", "The list: 1, 2,", "Numbers and words"]


@pytest.fixture(scope="module")
def engines():
    model = demo_model("tiny")
    with Engine(model, dtype="float32", kv_cache_tokens=4096) as local, \
            EngineClient(model, dtype="float32", kv_cache_tokens=4096) as remote:
        yield local, remote


def _stream(engine, prompt: str, sp: dict, **kw) -> list[dict]:
    async def run() -> list[dict]:
        return [c async for c in engine.generate_stream(prompt, sp, **kw)]
    return asyncio.run(run())


def _cases(local) -> list[dict]:
    """Sampling params that end at stop strings and regexes found in the greedy text."""
    cases = []
    for prompt in PROMPTS:
        whole = local.generate(prompt, {**GREEDY, "max_new_tokens": 24})
        text, stop_id, special = whole["text"], whole["output_ids"][5], min(local.tokenizer.special_token_ids)
        middle = text[len(text) // 3: len(text) // 3 + 3]
        assert middle.strip(), text
        cases += [
            (prompt, {**GREEDY, "max_new_tokens": 24}),
            (prompt, {**GREEDY, "max_new_tokens": 24, "stop": [middle]}),
            (prompt, {**GREEDY, "max_new_tokens": 24, "stop": [middle, "zzz"], "no_stop_trim": True}),
            (prompt, {**GREEDY, "max_new_tokens": 24, "stop_regex": "[0-9]{2}|" + "".join(
                f"[{c}]" if c not in "\\^]" else f"\\{c}" for c in middle)}),
            (prompt, {**GREEDY, "max_new_tokens": 24, "stop": [text[-2:]]}),  # at the last token
            (prompt, {"temperature": 0, "max_new_tokens": 24}),  # may end at EOS
            (prompt, {**GREEDY, "max_new_tokens": 12, "regex": "[a-z ]{3,30}"}),
            (prompt, {**GREEDY, "max_new_tokens": 6, "stop": ["e"], "min_new_tokens": 2}),
            (prompt, {**GREEDY, "max_new_tokens": 6, "logit_bias": {"1234": 100, "7": -100}}),
            (prompt, {**GREEDY, "max_new_tokens": 24, "stop_token_ids": [stop_id], "stop": ["zzz"]}),
            (prompt, {**GREEDY, "max_new_tokens": 24, "stop_token_ids": [special], "logit_bias": {str(special): 100},
                      "min_new_tokens": 3, "skip_special_tokens": False}),  # its text left out
            (prompt, {**GREEDY, "max_new_tokens": 24, "stop_token_ids": [special], "logit_bias": {str(special): 100},
                      "min_new_tokens": 3, "skip_special_tokens": False, "no_stop_trim": True}),
        ]
    return cases


def test_streams_match_the_in_process_engine(engines):
    """Streams, in-process and through the core process (both make their text on the consumer's
    side), against the in-process `generate`, whose text and stops the engine thread makes."""
    local, remote = engines
    reasons = []
    for prompt, sp in _cases(local):
        kw = {"return_logprob": True, "top_logprobs_num": 2}
        w = local.generate(prompt, sp, **kw)
        for engine in (local, remote):
            got = _stream(engine, prompt, sp, **kw)
            g = got[-1]
            assert (g["text"], g["output_ids"], g["meta_info"]["finish_reason"]) == \
                (w["text"], w["output_ids"], w["meta_info"]["finish_reason"]), (engine, prompt, sp)
            assert g["meta_info"]["completion_tokens"] == len(w["output_ids"])
            assert sum(len(c["meta_info"]["output_token_logprobs"]) for c in got) == len(w["output_ids"])
            texts = [c["text"] for c in got]
            assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), texts  # streamed text only grows
        reasons.append((sorted(sp), g["meta_info"]["finish_reason"]))
    stopped = [keys for keys, r in reasons if r["type"] == "stop" and isinstance(r["matched"], str)]
    assert sum("stop" in k for k in stopped) >= 6 and sum("stop_regex" in k for k in stopped) >= 2, reasons


def test_incremental_streams_carry_only_what_is_new(engines):
    """`incremental=True` (what the OpenAI routes stream, SGLang's --incremental-streaming-output
    shape): each chunk's `text` and `output_ids` are only what is new since the previous chunk,
    so a chunk costs O(its new tokens), not O(the output so far); joined, they are the cumulative
    stream's whole output, stops, regexes, logprobs and stream_interval included."""
    local, remote = engines
    cases = _cases(local) + [(PROMPTS[0], {**GREEDY, "max_new_tokens": 20, "stream_interval": 3})]
    for prompt, sp in cases:
        kw = {"return_logprob": True, "top_logprobs_num": 2}
        w = local.generate(prompt, sp, **kw)
        for engine in (local, remote):
            parts = _stream(engine, prompt, sp, incremental=True, **kw)
            assert "".join(c["text"] for c in parts) == w["text"], (engine, prompt, sp)
            assert [t for c in parts for t in c["output_ids"]] == w["output_ids"], (engine, prompt, sp)
            counts = [c["meta_info"]["completion_tokens"] for c in parts]
            assert counts == list(itertools.accumulate(len(c["output_ids"]) for c in parts))
            assert parts[-1]["meta_info"]["finish_reason"] == w["meta_info"]["finish_reason"]
            assert all(c["meta_info"]["finish_reason"] is None for c in parts[:-1])
            streamed = [e for c in parts for e in c["meta_info"]["output_token_logprobs"]]
            assert [(e[1], e[0]) for e in streamed] == \
                [(e[1], pytest.approx(e[0], abs=1e-4)) for e in w["meta_info"]["output_token_logprobs"]]


@pytest.mark.parametrize("side", ["in-process", "core process"])
def test_a_stop_found_by_the_client_ends_the_request_in_the_core(engines, side):
    """The core is told the stop its stream's consumer found: it finishes the request with it
    (counted as stop, not abort) and frees its slot; nothing keeps running behind the stopped
    stream. The same for the in-process engine, whose streams find their stops on the loop too."""
    local, remote = engines
    if side == "in-process":
        remote = local
    text = local.generate(PROMPTS[0], {**GREEDY, "max_new_tokens": 24})["text"]
    stop = text[len(text) // 3: len(text) // 3 + 3]
    before = remote.stats()
    sp = {**GREEDY, "max_new_tokens": 1500, "stop": [stop]}
    last = _stream(remote, PROMPTS[0], sp)[-1]
    assert last["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert "timings" in last["meta_info"]  # the core's own final message came through
    remote.check_accounting()
    s = remote.stats()
    assert s.finish_counts.get("stop", 0) == before.finish_counts.get("stop", 0) + 1 and s.num_running == 0
    assert s.generated_tokens - before.generated_tokens < 100  # it did not run on to max_new_tokens


def test_a_message_the_client_cannot_read_is_dropped_not_fatal(tmp_path):
    """Against a fake core: an unreadable message and an unreadable reply leave the client's IO
    thread serving; the stream still ends with what the core sent next."""
    import os
    import threading

    import msgspec
    import zmq

    from radixflow.runtime.core.messages import (
        ControlReply, CoreInfo, RequestOutput, StepOutput, SubmitRequest, ToCore)

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    address = f"ipc://{tmp_path}/fake-core.sock"
    router.bind(address)
    encode, decode = msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder(ToCore).decode

    def fake_core() -> None:
        who, _ = router.recv_multipart()  # Hello
        router.send_multipart([who, encode(CoreInfo(vocab_size=3072, max_context_len=2048, kv_capacity=4096,
                                                    healthy=True, pid=os.getpid()))])
        while True:
            who, payload = router.recv_multipart()
            message = decode(payload)
            if isinstance(message, SubmitRequest):
                break
            router.send_multipart([who, encode(ControlReply(message.call_id, True, b"not a pickle"))])
        router.send_multipart([who, b"\xc1 not msgpack"])
        router.send_multipart([who, encode(StepOutput([RequestOutput(
            rid=message.rid, new_token_ids=[5, 6], finish_reason={"type": "length", "length": 2})]))])

    core = threading.Thread(target=fake_core, daemon=True)
    core.start()
    client = EngineClient(demo_model("tiny"), address=address)
    try:
        with pytest.raises(RuntimeError, match="could not be read"):
            client.lora_adapters()

        async def run() -> list[dict]:
            return [c async for c in client.generate_stream(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})]
        last = asyncio.run(asyncio.wait_for(run(), 30))[-1]  # a dead IO thread: TimeoutError, not a hang
        assert last["output_ids"] == [5, 6] and last["meta_info"]["finish_reason"]["type"] == "length"
        assert client.is_healthy
    finally:
        client.shutdown()
        core.join(timeout=10)
        router.close(linger=0)
        ctx.term()


def test_a_step_output_the_core_cannot_encode_ends_those_requests_with_an_error(tmp_path):
    """The core's IO thread: an output that msgpack cannot carry ends its requests with an error
    (sent to the client and applied in the engine) instead of leaving the client waiting."""
    import msgspec
    import zmq

    from radixflow.runtime.core.messages import AbortRequest, FromCore, RequestOutput, StepOutput
    from radixflow.runtime.core_process import CoreServer

    class FakeEngine:
        def __init__(self) -> None:
            self.aborted: list = []

        def add_finish_listener(self, fn) -> None:
            pass

        def abort(self, rid, reason=None) -> None:
            self.aborted.append((rid, reason))

    engine = FakeEngine()
    address = f"ipc://{tmp_path}/core.sock"
    server = CoreServer(engine, address)
    client = server.ctx.socket(zmq.DEALER)
    client.setsockopt(zmq.IDENTITY, b"c1")
    client.connect(address)
    try:
        client.send(msgspec.msgpack.encode(AbortRequest("warm-up")))  # the router learns "c1"
        assert server.sock.poll(5000)
        server._receive()
        bad = StepOutput([RequestOutput(rid="r", new_token_ids=[1],
                                        finish_reason={"type": "stop", "matched": object()})])
        server._send_to(b"c1", bad)
        assert client.poll(5000)
        got = msgspec.msgpack.Decoder(FromCore).decode(client.recv())
        (out,) = got.outputs
        assert out.rid == "r" and out.finish_reason["type"] == "error"
        assert "could not be sent" in out.finish_reason["message"]
        assert engine.aborted[0] == ("warm-up", None) and engine.aborted[1][0] == "r"
        assert engine.aborted[1][1]["type"] == "error"
    finally:
        client.close(linger=0)
        server.close()


def test_a_stopped_core_times_out_quick_calls_instead_of_freezing_the_caller(engines, monkeypatch):
    """stats() runs on the server's event loop (metrics, server info): a core that is stopped, not
    dead, answers TimeoutError after QUICK_CALL_TIMEOUT_S; once it runs again, calls work."""
    import os
    import signal
    import time

    from radixflow.runtime import core_client

    _, remote = engines
    monkeypatch.setattr(core_client, "QUICK_CALL_TIMEOUT_S", 0.5)
    os.kill(remote.core_pid, signal.SIGSTOP)
    try:
        t = time.monotonic()
        with pytest.raises(TimeoutError, match="did not answer stats"):
            remote.stats()
        assert time.monotonic() - t < 5
    finally:
        os.kill(remote.core_pid, signal.SIGCONT)
    assert remote.stats().kv_slots_total == 4096 and remote.is_healthy


VICTIM = """
import asyncio, sys
from radixflow.runtime import EngineClient
client = EngineClient(sys.argv[1], address=sys.argv[2], dtype="float32")

async def main():
    # as long as the tiny model's 2,048-token context allows: no stream may end by length before
    # the kill is noticed, even on a loaded machine
    streams = [client.generate_stream("a long one", {"max_new_tokens": 2000, "ignore_eos": True}, rid=f"victim{i}")
               for i in range(12)]
    first = [asyncio.ensure_future(s.__anext__()) for s in streams]
    await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
    print("streaming", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_requests_of_a_client_whose_process_dies_are_aborted(tmp_path):
    """A client attached by address that is killed cannot abort its requests: the core notices its
    process is gone and aborts them all, running and waiting, freeing everything they held."""
    import signal
    import subprocess
    import sys
    import threading
    import time

    model = demo_model("tiny")
    with EngineClient(model, dtype="float32", kv_cache_tokens=4096, max_num_seqs=2) as owner:
        finished: dict[str, tuple[str, int]] = {}
        done = threading.Event()

        def on_finish(t) -> None:
            finished[t.rid] = (t.finish_type, t.completion_tokens)
            if len(finished) == 12:
                done.set()
        owner.add_finish_listener(on_finish)
        victim = subprocess.Popen([sys.executable, "-c", VICTIM, model, owner.address], stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert victim.stdout.readline().strip() == "streaming"
            deadline = time.monotonic() + 10  # the stats are refreshed after a step posts its outputs
            while not ((stats := owner.stats()).num_running >= 1 and stats.num_running + stats.num_waiting == 12):
                assert time.monotonic() < deadline, stats
                time.sleep(0.01)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            killed = time.monotonic()
            assert done.wait(10), finished
            assert time.monotonic() - killed < 3
        finally:
            victim.kill()
            victim.wait()
        assert {rid for rid in finished} == {f"victim{i}" for i in range(12)}
        assert all(kind == "abort" and n < 2000 for kind, n in finished.values()), finished
        stats = owner.stats()
        assert stats.num_running == 0 and stats.num_waiting == 0
        owner.check_accounting()
        # the core goes on serving its other client
        out = owner.generate("still here", {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0})
        assert len(out["output_ids"]) == 4


def test_process_alive_tells_running_gone_and_zombie_processes():
    import subprocess
    import sys
    import time

    from radixflow.runtime.process_liveness import process_alive, process_start

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = process_start(child.pid)
        assert start is not None and process_alive(child.pid) and process_alive(child.pid, start)
        assert not process_alive(child.pid, b"0")  # the pid now names a process started at another time
        child.kill()
        deadline = time.monotonic() + 5
        while process_alive(child.pid) and time.monotonic() < deadline:  # dead: a zombie until reaped
            time.sleep(0.05)
        assert not process_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not process_alive(child.pid)


def test_a_stream_whose_text_cannot_be_set_up_sends_nothing_to_the_core(engines, monkeypatch):
    """As in-process (tests/runtime/test_step_output.py): the client's text state is made before
    the request is sent, so its failure leaves nothing running in the core and no route behind."""
    import radixflow.runtime.stream_chunks as stream_chunks

    _, remote = engines

    def broken(*args, **kwargs):
        raise RuntimeError("no detokenizer")
    monkeypatch.setattr(stream_chunks, "OutputText", broken)  # both streams build it there
    before = remote.stats().num_finished
    with pytest.raises(RuntimeError, match="no detokenizer"):
        _stream(remote, PROMPTS[0], {**GREEDY, "max_new_tokens": 400})
    time.sleep(0.3)
    stats = remote.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_finished) == (0, 0, before)
    assert not remote._routes


@pytest.mark.parametrize("side", ["in-process", "core process"])
def test_a_finished_stream_frees_its_rid_before_it_is_closed(engines, side):
    """A consumer may stop reading at the finish chunk and close the stream later: the rid is free
    for a new stream meanwhile, and the old stream's late close leaves the new one's queue alone."""
    engine = engines[0] if side == "in-process" else engines[1]
    sp = {**GREEDY, "max_new_tokens": 6}

    async def run() -> tuple[list[dict], list[dict]]:
        old = engine.generate_stream("rid reuse", sp, rid="reused")
        first = []
        async for chunk in old:
            first.append(chunk)
            if chunk["meta_info"]["finish_reason"] is not None:
                break  # `old` stays suspended at its last yield
        new = engine.generate_stream("rid reuse", sp, rid="reused")
        second = [await new.__anext__()]
        await old.aclose()  # the old stream's cleanup runs now, with the new one open
        second += [c async for c in new]
        return first, second
    first, second = asyncio.run(asyncio.wait_for(run(), 30))
    assert first[-1]["output_ids"] == second[-1]["output_ids"] == engine.generate("rid reuse", sp)["output_ids"]
    engine.check_accounting()


@pytest.mark.parametrize("abort", ["rid", "group", "client gone"])
def test_an_abort_reaches_a_request_still_compiling_its_grammar(tmp_path, monkeypatch, abort):
    """A constrained request's grammar compiles on a worker before the engine loop knows the
    request: an abort arriving meanwhile is kept and applied once it starts. One from another
    client (an /abort_request on the other API server), by the rid of its n > 1 request
    (`group`), or for a client that is gone, must be kept too: found nothing in the loop, it was
    lost and the request ran to its limit."""
    import threading

    import msgspec
    import zmq

    from radixflow.runtime.core.messages import AbortRequest, FromCore, StepOutput, SubmitRequest
    from radixflow.runtime.core_process import CoreServer
    from radixflow.runtime.sampling_params import SamplingParams

    compiling, release = threading.Event(), threading.Event()
    with Engine(demo_model("tiny"), dtype="float32", kv_cache_tokens=4096) as engine:
        new_state = engine.grammar.new_state

        def slow_compile(sp, *args):
            compiling.set()
            assert release.wait(10)
            return new_state(sp, *args)
        monkeypatch.setattr(engine.grammar, "new_state", slow_compile)
        finished, completion_tokens, ended = [], [], threading.Event()

        def on_finish(timing) -> None:
            finished.append((timing.rid, timing.finish_type))
            completion_tokens.append(timing.completion_tokens)
            ended.set()
        engine.add_finish_listener(on_finish)
        address = f"ipc://{tmp_path}/core.sock"
        server = CoreServer(engine, address)
        owner, other = (server.ctx.socket(zmq.DEALER) for _ in range(2))
        for sock, name in ((owner, b"owner"), (other, b"other")):
            sock.setsockopt(zmq.IDENTITY, name)
            sock.connect(address)
        try:
            sampling = SamplingParams.from_dict({"regex": "[ab]{200}", "max_new_tokens": 200})
            owner.send(msgspec.msgpack.encode(SubmitRequest(rid="g-0", input_ids=[1, 2], sampling=sampling,
                                                            group="g")))
            assert server.sock.poll(5000)
            server._receive()
            assert compiling.wait(5)
            if abort == "client gone":
                server.forget(b"owner", "its client is gone")
            else:
                other.send(msgspec.msgpack.encode(AbortRequest("g-0" if abort == "rid" else "g")))
                assert server.sock.poll(5000)
                server._receive()
            release.set()
            assert ended.wait(10), "the aborted request was not ended"
            assert finished == [("g-0", "abort")] and completion_tokens[0] < 200
            stats = engine.stats()
            assert (stats.num_running, stats.num_waiting) == (0, 0)
            if abort != "client gone":  # its owner hears of the abort (a gone client hears nothing)
                outputs: list = []
                deadline = time.monotonic() + 10
                while not outputs or outputs[-1].finish_reason is None:
                    assert time.monotonic() < deadline, outputs
                    server._send(server.outbox.take())  # the engine thread may post it after the finish listener ran
                    if owner.poll(50):
                        message = msgspec.msgpack.Decoder(FromCore).decode(owner.recv())
                        if isinstance(message, StepOutput):
                            outputs += message.request_outputs()
                assert outputs[-1].finish_reason["type"] == "abort"
            engine.check_accounting()
        finally:
            release.set()
            owner.close(linger=0)
            other.close(linger=0)
            server.close()
