"""Per-step output (issue 15): the engine posts, per step, one batched StepOutput carrying each
streaming request's new tokens only; generate_stream rebuilds the cumulative chunks from them."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from radixflow.runtime import Engine, SamplingParams
from radixflow.runtime.core.messages import StepOutput
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.output_channel import OutputChannel

GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine():
    with Engine(demo_model("tiny"), kv_cache_tokens=4096, check_invariants=True) as e:
        yield e
    assert not e.invariant_violations


def _stream_all(engine: Engine, prompts: list[str], **kwargs) -> list[list[dict]]:
    async def one(prompt: str) -> list[dict]:
        return [c async for c in engine.generate_stream(prompt, GREEDY, **kwargs)]

    async def run() -> list[list[dict]]:
        return list(await asyncio.gather(*(one(p) for p in prompts)))
    return asyncio.run(run())


def test_each_step_posts_one_message_with_only_new_tokens(engine, monkeypatch):
    posted: list[StepOutput] = []
    real_post = OutputChannel.post

    def record(self, step):
        posted.append(step)
        real_post(self, step)
    monkeypatch.setattr(OutputChannel, "post", record)
    prompts = [f"request number {i} says" for i in range(4)]
    streams = _stream_all(engine, prompts)
    per_rid: dict[str, list[int]] = {}
    for step in posted:
        rids = [out.rid for out in step.request_outputs()]
        assert len(rids) == len(set(rids)), "a request appears twice in one step's message"
        for out in step.request_outputs():
            assert len(out.new_token_ids) <= 1, "a message carried more than the step's new token"
            per_rid.setdefault(out.rid, []).extend(out.new_token_ids)
    assert any(len(step.request_outputs()) > 1 for step in posted), "concurrent requests were not batched"
    finals = {chunks[-1]["meta_info"]["id"]: chunks[-1]["output_ids"] for chunks in streams}
    assert per_rid == finals
    assert sum(1 for step in posted for out in step.request_outputs() if out.finish_reason) == len(prompts)


@pytest.mark.parametrize("overlap", [False, True])
def test_stats_are_fresh_when_a_steps_outputs_are_posted(overlap, monkeypatch):
    """A consumer woken by a step's outputs reads stats that include that step: they were
    refreshed after the outputs were posted, so a client that got its first token could read
    num_running 0 (and generated tokens one step behind)."""
    with Engine(demo_model("tiny"), kv_cache_tokens=4096, enable_overlap=overlap) as engine:
        seen: list[tuple[int, int, int, bool]] = []  # at each post: running, generated, posted so far, a finish
        posted = [0]
        real_post = OutputChannel.post

        def record(self, step):
            stats, outputs = engine.stats(), step.request_outputs()
            posted[0] += sum(len(out.new_token_ids) for out in outputs)
            seen.append((stats.num_running, stats.generated_tokens, posted[0],
                         any(out.finish_reason for out in outputs)))
            real_post(self, step)
        monkeypatch.setattr(OutputChannel, "post", record)
        _stream_all(engine, ["fresh stats one", "fresh stats two"])
    assert seen and all(running >= 1 for running, _, _, finish in seen if not finish), seen
    assert all(generated >= sent for _, generated, sent, _ in seen), seen


def test_stream_chunks_keep_the_native_shape(engine):
    full = engine.generate("Shape of a stream", GREEDY, return_logprob=True, top_logprobs_num=2,
                           logprob_start_len=0)
    (chunks,) = _stream_all(engine, ["Shape of a stream"], return_logprob=True, top_logprobs_num=2,
                            logprob_start_len=0)
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    ids = [c["output_ids"] for c in chunks]
    assert all(b[:len(a)] == a for a, b in zip(ids, ids[1:]))
    last, meta = chunks[-1], chunks[-1]["meta_info"]
    assert (last["text"], last["output_ids"]) == (full["text"], full["output_ids"])
    inputs = {"input_token_logprobs", "input_top_logprobs"}  # in the first chunk only
    assert set(meta) | inputs == set(full["meta_info"]) and not inputs & set(meta)
    assert set(chunks[0]["meta_info"]) >= inputs
    assert chunks[0]["meta_info"]["input_token_logprobs"] == full["meta_info"]["input_token_logprobs"]
    streamed = [e for c in chunks for e in c["meta_info"]["output_token_logprobs"]]
    assert [e[1] for e in streamed] == [e[1] for e in full["meta_info"]["output_token_logprobs"]]
    assert meta["output_token_logprobs_length"] == len(full["output_ids"])
    assert all(c["meta_info"]["completion_tokens"] == len(c["output_ids"]) for c in chunks)
    assert [c["meta_info"]["finish_reason"] is None for c in chunks] == [True] * (len(chunks) - 1) + [False]


def test_decode_forward_batch_equals_the_general_one(engine):
    """A decode step's ForwardBatch, built from one host array and the step's new slots, holds
    the numbers the general per-request build gives (the input token, position, slot and table
    row of each request), for requests at different lengths."""
    import dataclasses

    runner = engine.runner
    seen: list[tuple] = []
    real = runner.make_forward_batch

    def compare(batch, offsets, input_ids=None):
        fast = real(batch, offsets, input_ids)
        if batch.is_decode and batch.new_slots is not None and not seen:
            general = real(dataclasses.replace(batch, new_slots=None), offsets, input_ids)
            seen.append((fast, general, len(batch.reqs)))
        return fast
    runner.make_forward_batch = compare
    try:
        engine.generate(["one", "a longer prompt than that", "x"], {**GREEDY, "max_new_tokens": 4})
    finally:
        del runner.make_forward_batch
    fast, general, n = seen[0]
    assert n == 3
    for f in dataclasses.fields(fast):
        a, b = getattr(fast, f.name), getattr(general, f.name)
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), f.name
        else:
            assert a == b, f.name


def _stream_chunks(engine, prompt: str, sp: dict) -> list[dict]:
    async def run() -> list[dict]:
        return [c async for c in engine.generate_stream(prompt, sp)]
    return asyncio.run(run())


@pytest.mark.parametrize("interval", [1, 3, 5, 40])
def test_stream_interval_holds_chunks_to_every_n_tokens(engine, interval):
    """sampling_params.stream_interval: the first token at once, then a chunk per `interval`
    new tokens (or more, when outputs arrived together), the end at once; the final chunk
    equals the one of a stream without it."""
    plain = _stream_chunks(engine, "Once upon a time", {**GREEDY, "max_new_tokens": 23})
    chunks = _stream_chunks(engine, "Once upon a time", {**GREEDY, "max_new_tokens": 23, "stream_interval": interval})
    assert chunks[-1]["output_ids"] == plain[-1]["output_ids"] and chunks[-1]["text"] == plain[-1]["text"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    counts = [len(c["output_ids"]) for c in chunks]
    # (the first chunk is not held, but how many tokens it has depends on how far the consumer fell
    # behind, which a loaded machine decides: test_stream_chunks_hold_outputs_to_the_interval checks it)
    steps = [b - a for a, b in zip(counts, counts[1:])]
    assert all(s >= interval for s in steps[:-1]), counts
    assert len(chunks) <= 2 + 22 // interval


@pytest.mark.parametrize("interval", [1, 3, 5, 40])
def test_stream_chunks_hold_outputs_to_the_interval(interval):
    """The holding rule alone, one output at a time (no timing): the first output and the finish
    go at once, the others in chunks of `interval` new tokens."""
    from radixflow.runtime.core.messages import RequestOutput
    from radixflow.runtime.core.request import OutputOptions
    from radixflow.runtime.stream_chunks import StreamChunks

    chunks = StreamChunks("r", 4, OutputOptions(), None, False, interval)
    sizes = []
    for i in range(23):
        last = i == 22
        out = RequestOutput(rid="r", new_token_ids=[i], cached_tokens=0,
                            finish_reason={"type": "length", "length": 23} if last else None)
        chunk = chunks.add([out])
        if chunk is not None:
            sizes.append(len(chunk["output_ids"]))
    assert chunks.done and sizes[-1] == 23
    assert sizes == [1, *range(1 + interval, 23, interval), 23], sizes


def test_incremental_chunks_do_not_grow_with_the_output():
    """An incremental chunk holds only its own outputs' ids and text, however long the output
    grew: building it reads no earlier token (the cumulative shape copies all of them)."""
    from radixflow.runtime.core.messages import RequestOutput
    from radixflow.runtime.core.request import OutputOptions
    from radixflow.runtime.stream_chunks import StreamChunks

    chunks = StreamChunks("r", 4, OutputOptions(), None, False, incremental=True)
    for i in range(1000):
        out = RequestOutput(rid="r", new_token_ids=[i, i + 1], text_delta="ab", cached_tokens=0,
                            finish_reason={"type": "length", "length": 2000} if i == 999 else None)
        chunk = chunks.add([out])
        assert (chunk["output_ids"], chunk["text"]) == ([i, i + 1], "ab")
        assert chunk["meta_info"]["completion_tokens"] == 2 * (i + 1)
    assert chunks.done and not chunks.output_ids and not chunks.text  # nothing cumulative kept


def test_engine_stream_interval_is_the_default_a_request_overrides():
    with Engine(demo_model("tiny"), kv_cache_tokens=4096, stream_interval=6) as e:
        default = _stream_chunks(e, "Once upon a time", {**GREEDY, "max_new_tokens": 19})
        every = _stream_chunks(e, "Once upon a time", {**GREEDY, "max_new_tokens": 19, "stream_interval": 1})
    assert len(default) <= 2 + 18 // 6 < len(every)
    assert default[-1]["output_ids"] == every[-1]["output_ids"]
    with pytest.raises(ValueError, match="stream_interval"):
        Engine(demo_model("tiny"), stream_interval=0)
    with pytest.raises(ValueError, match="stream_interval"):
        SamplingParams.from_dict({"stream_interval": 0})


def test_plain_decode_tokens_travel_as_columns():
    """A request whose only news in a step is one token (tokens only: no text or logprobs, not
    its first message, not finished) goes in the StepOutput's columns, no RequestOutput of its
    own; its consumer sees the same RequestOutput either way, through msgpack too."""
    import msgspec

    from radixflow.runtime.core.messages import FromCore, RequestOutput
    from radixflow.runtime.core.publish import StreamCursor, publish
    from radixflow.runtime.core.request import OutputOptions, Req

    class Sink:
        def __init__(self):
            self.steps: list[StepOutput] = []

        def post(self, step):
            self.steps.append(step)

    sinks = [Sink(), Sink()]
    sp = SamplingParams.from_dict({"max_new_tokens": 8})
    reqs = [Req(f"r{i}", [1, 2, 3], sp, sink=sinks[i % 2], cursor=StreamCursor(), cached_len=i) for i in range(4)]
    reqs[3].options = OutputOptions(return_logprob=True)
    for req in reqs:
        req.output_ids.append(10)
    publish(reqs)  # every first message is a RequestOutput (it starts the stream)
    assert all(not s.steps[0].token_rids and len(s.steps[0].outputs) == 2 for s in sinks)
    for i, req in enumerate(reqs):
        req.output_ids.append(20 + i)
    reqs[2].output_ids.append(30)  # two new tokens (a jump-forward): a RequestOutput
    reqs[1].finish({"type": "length", "length": 2})
    publish(reqs)
    even, odd = sinks[0].steps[1], sinks[1].steps[1]
    assert (even.token_rids, even.tokens, even.cached_tokens) == (["r0"], [20], [0])
    assert [o.rid for o in even.outputs] == ["r2"] and even.outputs[0].new_token_ids == [22, 30]
    assert not odd.token_rids and [o.rid for o in odd.outputs] == ["r1", "r3"]  # finished; logprobs
    assert even.request_outputs()[-1] == RequestOutput(rid="r0", new_token_ids=[20], cached_tokens=0)
    wire = msgspec.msgpack.Decoder(FromCore).decode(msgspec.msgpack.encode(even))
    assert wire == even and wire.request_outputs() == even.request_outputs()
    assert StepOutput([]).request_outputs() == []


def test_a_plain_decode_step_builds_no_output_struct_per_request(engine, monkeypatch):
    """The regression guard of the O(1)-structs decode step: streaming tokens-only requests,
    the RequestOutputs the engine builds are their first and last messages only."""
    import radixflow.runtime.core.publish as publish_mod
    from radixflow.runtime.core.request import OutputOptions

    built = []
    real = publish_mod.RequestOutput

    def counting(*args, **kwargs):
        built.append(kwargs.get("rid"))
        return real(*args, **kwargs)
    monkeypatch.setattr(publish_mod, "RequestOutput", counting)

    class Sink:
        def __init__(self):
            self.tokens: dict[str, list[int]] = {}
            self.done = 0

        def post(self, step):
            for out in step.request_outputs():
                self.tokens.setdefault(out.rid, []).extend(out.new_token_ids)
                self.done += out.finish_reason is not None

    sink = Sink()
    sp = SamplingParams.from_dict({**GREEDY, "max_new_tokens": 12})
    prompts = [engine.tokenizer.encode(f"columns {i}") for i in range(6)]
    for i, ids in enumerate(prompts):
        engine.start_stream(ids, sp, OutputOptions(), f"col-{i}", None, None, sink)
    deadline = time.monotonic() + 60
    while sink.done < len(prompts) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sink.done == len(prompts)
    assert all(len(t) == 12 for t in sink.tokens.values())
    assert len(built) == 2 * len(prompts), built
    full = engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 12})
    assert [sink.tokens[f"col-{i}"] for i in range(6)] == [f["output_ids"] for f in full]


def test_non_streamed_text_is_made_once_at_the_finish(engine, monkeypatch):
    """A `generate` request with no stop string or regex is detokenized once, when it finishes
    (the engine step appends its tokens only); its text is the incrementally made one: the same
    request with a stop string that never matches (detokenized token by token) gives the same."""
    from radixflow.runtime.text.output_text import OutputText

    adds = []
    real_add = OutputText.add

    def counting_add(self, token):
        adds.append(token)
        return real_add(self, token)
    monkeypatch.setattr(OutputText, "add", counting_add)
    prompts = [f"deferred text {i}:" for i in range(6)] + ["é€😀 ünïcödé"]
    sp = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True, "skip_special_tokens": False}
    once = engine.generate(prompts, sp)
    assert adds == []
    incremental = engine.generate(prompts, {**sp, "stop": ["\x00never"]})
    assert len(adds) == sum(len(r["output_ids"]) for r in incremental)
    assert [r["output_ids"] for r in once] == [r["output_ids"] for r in incremental]
    assert [r["text"] for r in once] == [r["text"] for r in incremental]
    assert any(r["text"] for r in once)
    eos = engine.generate(prompts[:3], {"temperature": 0, "max_new_tokens": 24})  # EOS may end these
    again = engine.generate(prompts[:3], {"temperature": 0, "max_new_tokens": 24, "stop": ["\x00never"]})
    assert [r["text"] for r in eos] == [r["text"] for r in again]


def test_generate_stream_makes_its_text_on_the_consumer_side(engine, monkeypatch):
    """Item 2 of issue 15 for the in-process stream: the engine thread sends a streamed request's
    token ids only (plain decode columns: no RequestOutput per request per step, no detokenizing
    there); the text, stop strings included, is made where the chunks are, on the consumer's
    loop, and equals `generate`'s."""
    import threading

    import radixflow.runtime.core.publish as publish_mod
    from radixflow.runtime.text.output_text import OutputText

    built = []
    real = publish_mod.RequestOutput
    monkeypatch.setattr(publish_mod, "RequestOutput", lambda *a, **k: built.append(k.get("rid")) or real(*a, **k))
    adders = set()
    real_add = OutputText.add

    def add(self, token):
        adders.add(threading.current_thread().name)
        return real_add(self, token)
    monkeypatch.setattr(OutputText, "add", add)
    prompts = [f"consumer text {i}:" for i in range(5)] + ["é€😀 ünïcödé"]
    streams = _stream_all(engine, prompts)
    assert len(built) == 2 * len(prompts), built
    assert adders == {threading.current_thread().name}
    full = engine.generate(prompts, GREEDY)
    assert [s[-1]["text"] for s in streams] == [f["text"] for f in full]
    assert [s[-1]["output_ids"] for s in streams] == [f["output_ids"] for f in full]
    assert [s[-1]["meta_info"]["completion_tokens"] for s in streams] == [16] * len(prompts)

    # a stop string found on the consumer side ends the request in the engine, as `generate` does
    stop_at = full[0]["text"][3:6]
    stop = {**GREEDY, "stop": [stop_at]}
    chunks = asyncio.run(_collect(engine.generate_stream(prompts[0], stop)))
    expect = engine.generate(prompts[0], stop)
    last = chunks[-1]
    assert last["text"] == expect["text"] and last["output_ids"] == expect["output_ids"]
    assert last["meta_info"]["finish_reason"] == expect["meta_info"]["finish_reason"]
    assert last["meta_info"]["finish_reason"]["matched"] == stop_at
    assert last["meta_info"]["completion_tokens"] == expect["meta_info"]["completion_tokens"]
    assert all(a["text"] == b["text"][: len(a["text"])] for a, b in zip(chunks, chunks[1:]))


async def _collect(stream) -> list[dict]:
    return [c async for c in stream]


def test_a_stream_whose_text_cannot_be_set_up_submits_nothing(engine, monkeypatch):
    """The consumer's text state is made before the request reaches the engine: if making it
    fails, the caller gets the error and no request is left running with nobody to read it."""
    import radixflow.runtime.stream_chunks as stream_chunks

    def broken(*args, **kwargs):
        raise RuntimeError("no detokenizer")
    monkeypatch.setattr(stream_chunks, "OutputText", broken)  # both streams build it there
    before = engine.stats().num_finished
    with pytest.raises(RuntimeError, match="no detokenizer"):
        asyncio.run(_collect(engine.generate_stream("never submitted", {**GREEDY, "max_new_tokens": 400})))
    time.sleep(0.2)
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_finished) == (0, 0, before)
    engine.check_accounting()


def test_a_stream_sees_outputs_posted_before_its_submit_returned(engine, monkeypatch):
    """A constrained stream is submitted from a worker thread (its grammar compiles there) while
    the loop runs on: outputs the engine posts before the submit call returns must reach the
    stream, not be dropped for want of an open queue (the caller would wait forever)."""
    real = Engine.start_stream

    def slow_return(self, *args, **kwargs):
        req = real(self, *args, **kwargs)
        time.sleep(0.5)  # the engine runs the request meanwhile, its outputs reach the loop first
        return req
    monkeypatch.setattr(Engine, "start_stream", slow_return)
    sp = {**GREEDY, "max_new_tokens": 4, "regex": "[a-z]{4}"}
    chunks = asyncio.run(asyncio.wait_for(_collect(engine.generate_stream("race", sp)), 20))
    want = engine.generate("race", sp)
    assert chunks[-1]["output_ids"] == want["output_ids"] and chunks[-1]["text"] == want["text"]
    assert chunks[-1]["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]


def test_a_stream_rid_in_use_is_refused_and_the_first_stream_goes_on(engine, monkeypatch):
    """The queue is opened before the submit, so a second stream with a rid in use on the same
    loop is refused there, without taking the first one's queue; the first ends as it would. The
    submit is slowed so that the engine has finished the first request before the loop reads it
    (a loaded machine's case)."""
    real = Engine.start_stream

    def slow_return(self, *args, **kwargs):
        req = real(self, *args, **kwargs)
        time.sleep(0.5)
        return req
    monkeypatch.setattr(Engine, "start_stream", slow_return)
    sp = {**GREEDY, "max_new_tokens": 8}

    async def run() -> list[dict]:
        first = engine.generate_stream("same rid", sp, rid="dup")
        # NOTE: the first stream opens its queue and submits in its first step, and this coroutine resumes
        # right after, before any delivery the engine thread schedules: awaiting its first chunk instead
        # raced, as a loaded machine can deliver all 8 tokens, the finish that frees the rid included, at once
        pending = asyncio.ensure_future(first.__anext__())
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="already in use"):
            await engine.generate_stream("other", sp, rid="dup").__anext__()
        return [await pending] + [c async for c in first]
    chunks = asyncio.run(run())
    want = engine.generate("same rid", sp)
    assert chunks[-1]["output_ids"] == want["output_ids"] and chunks[-1]["text"] == want["text"]
    engine.check_accounting()



def test_a_stream_cancelled_while_its_grammar_compiles_leaves_nothing_running(engine, monkeypatch):
    """A constrained stream's submit runs in a worker thread (the grammar compiles there). If its
    consumer goes away meanwhile (a client disconnect cancels it), the request that the worker
    submits afterwards is aborted, not left running to max_new_tokens with nobody to read it."""
    real = Engine.start_stream
    compiling = threading.Event()

    def slow_compile(self, *args, **kwargs):
        compiling.set()
        time.sleep(0.5)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Engine, "start_stream", slow_compile)
    before = engine.stats()
    sp = {**GREEDY, "max_new_tokens": 2000, "regex": "[a-z ]*"}

    async def run() -> None:
        task = asyncio.ensure_future(_collect(engine.generate_stream("gone", sp, rid="cancelled-compile")))
        await asyncio.get_running_loop().run_in_executor(None, compiling.wait)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(run())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        s = engine.stats()
        if s.num_finished > before.num_finished and s.num_running == 0 and s.num_waiting == 0:
            break
        time.sleep(0.05)
    s = engine.stats()
    assert s.num_running == 0 and s.num_waiting == 0
    assert s.finish_counts.get("abort", 0) == before.finish_counts.get("abort", 0) + 1
    assert s.generated_tokens - before.generated_tokens < 1000
    engine.check_accounting()
