"""frontend/streams.py: the fan-out that every route runs its engine streams through."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from radixflow.frontend.streams import Fanout, ResultFold, expand
from radixflow.runtime import SamplingParams

PROMPTS = ["A fan-out folds", "each stream's chunks into"]


def test_collect_is_the_whole_result_of_each_stream(engine):
    """Non-streamed answers: the fan-out reads incremental chunks (O(new tokens) each) and folds
    them into what `generate` returns, logprobs (input, output, top) and `n` samples included."""
    ids = [engine.tokenizer.encode(p) for p in PROMPTS]
    sampling = [SamplingParams.from_dict({"max_new_tokens": 12, "temperature": 0, "ignore_eos": True,
                                          "stream_interval": k}) for k in (1, 5)]
    kw = {"return_logprob": True, "top_logprobs_num": 2, "logprob_start_len": 0}

    async def run() -> tuple[list[dict], list[list[dict]]]:
        fanout = Fanout(engine, expand(ids, sampling, [dict(kw), dict(kw)]))
        await fanout.start()
        try:
            folded = await fanout.collect()
        finally:
            await fanout.close()
        chunks = [[c async for c in engine.generate_stream(input_ids=p, sampling_params=sp, incremental=True, **kw)]
                  for p, sp in zip(ids, sampling)]
        return folded, chunks

    folded, chunks = asyncio.run(run())
    for got, p, per_chunk in zip(folded, ids, chunks):
        want = engine.generate(input_ids=p, sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                              "ignore_eos": True}, **kw)
        assert (got["text"], got["output_ids"]) == (want["text"], want["output_ids"])
        meta, wmeta = got["meta_info"], want["meta_info"]
        assert meta["finish_reason"] == wmeta["finish_reason"] and meta["completion_tokens"] == 12
        for key in ("input_token_logprobs", "output_token_logprobs"):
            assert [e[1] for e in meta[key]] == [e[1] for e in wmeta[key]], key
            assert [e[0] for e in meta[key]] == pytest.approx([e[0] for e in wmeta[key]], abs=1e-4, nan_ok=True)
        assert len(meta["output_top_logprobs"]) == 12 and len(meta["input_top_logprobs"]) == len(p)
        assert len(per_chunk) > 1  # the fold had several chunks to fold


def test_result_fold_concatenates_what_each_chunk_adds():
    """The fold alone: text pieces and ids in order, per-chunk output logprob lists joined,
    input logprobs from the first chunk, every other field from the last."""
    def chunk(text: str, ids: list[int], count: int, reason: dict | None, **extra) -> dict:
        return {"text": text, "output_ids": ids,
                "meta_info": {"id": "r", "completion_tokens": count, "finish_reason": reason,
                              "output_token_logprobs": [[-0.5, t, None] for t in ids], **extra}}

    fold = ResultFold()
    fold.add(chunk("He", [1], 1, None, input_token_logprobs=[[None, 7, None]]))
    fold.add(chunk("llo", [2, 3], 3, None))
    fold.add(chunk("!", [4], 4, {"type": "length", "length": 4}, e2e_latency=0.5))
    whole = fold.result()
    assert whole["text"] == "Hello!" and whole["output_ids"] == [1, 2, 3, 4]
    meta = whole["meta_info"]
    assert meta["completion_tokens"] == 4 and meta["finish_reason"] == {"type": "length", "length": 4}
    assert [e[1] for e in meta["output_token_logprobs"]] == [1, 2, 3, 4]
    assert meta["input_token_logprobs"] == [[None, 7, None]] and meta["e2e_latency"] == 0.5


def _stream_events(client, body: dict) -> list[dict]:
    """The JSON events of a native /generate stream, [DONE] checked last."""
    import json

    with client.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200, r.read()
        lines = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def _running_n_stream(client, engine, rid: str, n: int) -> tuple[threading.Thread, dict]:
    """A native stream of n long samples under `rid`, on a thread, once all n run; its events
    land in the dict's "events" when it ends."""
    body = {"text": "go", "rid": rid, "stream": True,
            "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True, "n": n}}
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(events=_stream_events(client, body)))
    thread.start()
    deadline = time.monotonic() + 10
    while engine.stats().num_running < n:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return thread, out


def test_abort_request_by_rid_ends_every_sample_of_an_n_stream(client, engine, wait_idle):
    thread, out = _running_n_stream(client, engine, "fan-abort", 3)
    assert client.post("/abort_request", json={"rid": "fan-abort"}).status_code == 200
    thread.join(timeout=10)
    finals = {e["index"]: e["meta_info"]["finish_reason"] for e in out["events"] if e["meta_info"]["finish_reason"]}
    assert sorted(finals) == [0, 1, 2]
    assert all(reason["type"] == "abort" for reason in finals.values()), finals
    wait_idle(engine)


def test_a_client_rid_in_use_by_an_n_request_is_refused(client, engine, wait_idle):
    thread, _ = _running_n_stream(client, engine, "fan-dup", 2)
    again = client.post("/generate", json={"text": "x", "rid": "fan-dup", "sampling_params": {"max_new_tokens": 1}})
    assert again.status_code == 400 and "already in use" in again.text, again.text
    client.post("/abort_request", json={"rid": "fan-dup"})
    thread.join(timeout=10)
    wait_idle(engine)
    # free again once the first request ended
    assert client.post("/generate", json={"text": "x", "rid": "fan-dup",
                                          "sampling_params": {"max_new_tokens": 1}}).status_code == 200


def test_sample_seeds_wrap_within_the_seed_range_as_the_engine_wraps_them():
    """Sample j of an n > 1 request gets seed + j, wrapped into [0, 2^64) at the top (as
    Engine.generate's samples), never a seed the engine would refuse."""
    jobs = expand([[1, 2]], [SamplingParams(n=3, seed=2**64 - 2)], [{}])
    assert [job.sampling.seed for job in jobs] == [2**64 - 2, 2**64 - 1, 0]
    assert all(job.sampling.n == 1 for job in jobs)
