"""Engine streams over HTTP: n-way fan-out, SSE responses, and abort when the client goes away.

Every generation, streaming or not, runs through `engine.generate_stream`: closing that
iterator aborts the request, so a cancelled task (client gone) frees its KV slots and locks.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from radixflow.frontend.in_flight import InFlight
from radixflow.runtime.core.request import new_rid
from radixflow.runtime.sampling_params import SamplingParams

log = logging.getLogger(__name__)

T = TypeVar("T")
Receive = Callable[[], Awaitable[dict]]


class ClientGone(Exception):
    """The HTTP client disconnected; its requests were aborted."""


@dataclass
class Job:
    """One engine stream: `index` is its position in the response (prompt * n + sample)."""

    index: int
    input_ids: list[int]
    sampling: SamplingParams
    options: dict[str, Any] = field(default_factory=dict)  # logprob keys, rid
    group: str | None = None  # the rid the client gave (sample j of n runs as `group-j`)
    prompt: int = 0  # which prompt of the request
    ended: dict | None = None  # its whole stream: the request ended before its samples started


def expand(prompts: list[list[int]], sampling: list[SamplingParams], options: list[dict[str, Any]]) -> list[Job]:
    """One job per (prompt, sample); sample j of n gets `for_sample(j)` (seed + j) and rid `rid-j`, as the
    engine does; a job without a client rid gets a fresh one (so the server knows what it runs)."""
    jobs = []
    for p, (ids, sp, opts) in enumerate(zip(prompts, sampling, options)):
        group = opts.get("rid")
        for j in range(sp.n):
            child = sp if sp.n == 1 else sp.for_sample(j)
            rid = new_rid() if group is None else group if sp.n == 1 else f"{group}-{j}"
            # a sample carries its client rid: the core ends it on an abort of that rid from any server
            sample = {"group": group} if sp.n > 1 and group is not None else {}
            jobs.append(Job(p * sp.n + j, ids, child, {**opts, "rid": rid, **sample}, group, p))
    return jobs


_ADAPTER_KEYS = ("lora_path", "lora_version")


async def prefill(engine: Any, prompts: list[tuple[list[int], dict[str, Any]]]) -> list[dict]:
    """Prefill-only requests (max_new_tokens 0), so n samples of a prompt share one prefill: on
    the samples' adapter (its KV is the adapter's own) and in their group (an abort of the
    client's rid ends the prefill too), given each prompt's (ids, options). Returns each
    prefill's last chunk: its cached_tokens are the prompt's before this request."""
    warm = SamplingParams.from_dict({"max_new_tokens": 0})

    async def one(ids: list[int], options: dict[str, Any]) -> dict:
        last: dict = {}
        keys = {key: options[key] for key in _ADAPTER_KEYS if options.get(key) is not None}
        if options.get("rid") is not None:
            keys["group"] = options["rid"]
        async for last in engine.generate_stream(input_ids=ids, sampling_params=warm, **keys):
            pass
        return last

    return list(await asyncio.gather(*(one(ids, options) for ids, options in prompts)))


async def pin_adapter(engine: Any, options: dict[str, Any]) -> dict[str, Any]:
    """`options` with the weights its adapter means now (`lora_version`), for the samples of an
    n > 1 request: each is a submit of its own, and a load replacing the name between two of
    them must not run them on different weights (the engine refuses a sample whose adapter
    changed). Blocking in the engine (a call to the core, perhaps a read from disk): off the loop."""
    lora = options.get("lora_path")
    if lora is None:
        return options
    return {**options, "lora_version": await asyncio.to_thread(engine.adapter_version, lora)}


_END = object()
_ENDING = ("abort", "error")  # a shared prefill that ended so ends its request


def _ending(last: dict, group: str | None, in_flight: InFlight | None) -> dict | None:
    """The ending of an n > 1 request whose shared prefill gave `last`: that chunk when the
    prefill was aborted (by the client's rid) or failed; an abort when the client's rid was
    aborted on this server after it, or the server began shutting down; None when its samples
    are to start."""
    if (last["meta_info"]["finish_reason"] or {}).get("type") in _ENDING:
        return last
    if in_flight is not None and in_flight.aborted(group):
        meta = {**last["meta_info"], "finish_reason": {"type": "abort", "message": "aborted"}, "completion_tokens": 0}
        return {**last, "meta_info": meta}
    return None


async def _ended_stream(job: Job) -> AsyncIterator[dict]:
    """The stream of a sample that never started: its request's ending (the prefill's last chunk)."""
    assert job.ended is not None
    yield {"text": "", "output_ids": [], "meta_info": {**job.ended["meta_info"], "id": job.options["rid"]}}


class Fanout:
    """Runs jobs concurrently; iterate for (index, chunk) in arrival order. `start()` returns once
    every job produced its first chunk, so input errors (ValueError) surface before a response
    begins. `close()` cancels what is still running (the engine aborts those requests).

    One job (most requests) is read directly from its engine stream by whoever iterates; several
    are pumped by a task each into one queue.
    """

    def __init__(self, engine: Any, jobs: list[Job], in_flight: InFlight | None = None) -> None:
        self.engine, self.jobs, self.in_flight = engine, jobs, in_flight
        self._queue: asyncio.Queue[tuple[int, Any]] | None = None  # several jobs: their chunks
        self._tasks: list[asyncio.Task] = []
        self._errors: list[Exception] = []
        self._stream: Any = None  # one job: its engine stream
        self._first: Any = _END   # one job: its first chunk, until iterated

    def _open(self, job: Job) -> Any:
        if job.ended is not None:
            return _ended_stream(job)
        # incremental chunks unless a job asks otherwise (the native stream's cumulative shape)
        return self.engine.generate_stream(input_ids=job.input_ids, sampling_params=job.sampling,
                                           **{"incremental": True, **job.options})

    def register(self) -> None:
        """Enter the jobs in the server's registry: ValueError (a client rid in use) before anything runs."""
        if self.in_flight is not None:
            self.in_flight.add(id(self), [(job.options["rid"], job.group) for job in self.jobs])

    async def start(self) -> None:
        """Start every job (register() first)."""
        if len(self.jobs) == 1:
            self._stream = self._open(self.jobs[0])
            try:
                self._first = await self._stream.__anext__()
            except StopAsyncIteration:
                pass
            except BaseException:
                await self.close()
                raise
            return
        self._queue = asyncio.Queue()
        started = [asyncio.Event() for _ in self.jobs]
        self._tasks = [asyncio.create_task(self._pump(job, ev)) for job, ev in zip(self.jobs, started)]
        try:
            await asyncio.gather(*(ev.wait() for ev in started))
        except BaseException:
            await self.close()
            raise
        if self._errors:
            await self.close()
            raise self._errors[0]

    async def _pump(self, job: Job, started: asyncio.Event) -> None:
        assert self._queue is not None
        stream = self._open(job)
        try:
            async for chunk in stream:
                self._queue.put_nowait((job.index, chunk))
                started.set()
            self._queue.put_nowait((job.index, _END))
        except Exception as exc:  # handed to start() or the iterating side, which raise it
            self._errors.append(exc)
            self._queue.put_nowait((job.index, exc))
        finally:
            started.set()
            await stream.aclose()

    async def __aiter__(self) -> AsyncIterator[tuple[int, dict]]:
        if self._stream is not None:
            index = self.jobs[0].index
            first, self._first = self._first, _END
            if first is not _END:
                yield index, first
            async for chunk in self._stream:
                yield index, chunk
            return
        remaining = len(self.jobs)
        while remaining:
            assert self._queue is not None, "start() first"
            index, item = await self._queue.get()
            if item is _END:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item

    async def collect(self) -> list[dict]:
        """Every job's final result (native shape, logprob lists complete), in index order. The
        jobs' streams must be incremental (the default)."""
        results: dict[int, ResultFold] = {}
        async for index, chunk in self:
            results.setdefault(index, ResultFold()).add(chunk)
        return [results[job.index].result() for job in sorted(self.jobs, key=lambda j: j.index)]

    async def finish(self, receive: Receive | None) -> list[dict]:
        """collect(), aborted (ClientGone) if the client disconnects first; always closes."""
        try:
            return await until_disconnect(receive, self.collect())
        finally:
            await self.close()

    async def close(self) -> None:
        try:
            if self._stream is not None:
                await self._stream.aclose()  # the engine aborts it if it still runs
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            if self.in_flight is not None:
                self.in_flight.remove(id(self))


_PER_CHUNK = ("output_token_logprobs", "output_top_logprobs")  # each chunk's own entries
_FIRST_CHUNK = ("input_token_logprobs", "input_top_logprobs")  # in the first chunk only


class ResultFold:
    """One stream's whole result (the native non-streamed shape) from its incremental chunks, each
    in O(its new tokens): text pieces joined once at the end, ids and output logprob entries
    appended, input logprobs from the first chunk, the other fields from the last."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._ids: list[int] = []
        self._lists: dict[str, list] = {}
        self._first: dict[str, Any] = {}
        self._meta: dict[str, Any] = {}
        self._embedding: list[float] | None = None
        self._embed = False

    def add(self, chunk: dict) -> None:
        if "embedding" in chunk:  # an embedding request's (None: it ended without one)
            self._embed, self._embedding = True, chunk["embedding"]
        self._text.append(chunk["text"])
        self._ids.extend(chunk["output_ids"])
        meta = self._meta = chunk["meta_info"]
        for key in _PER_CHUNK:
            if key in meta:
                self._lists.setdefault(key, []).extend(meta[key])
        for key in _FIRST_CHUNK:
            if key in meta:
                self._first[key] = meta[key]

    def result(self) -> dict:
        meta = {**self._meta, **self._first, **self._lists}
        if self._embed:
            return {"embedding": self._embedding, "meta_info": meta}
        return {"text": "".join(self._text), "output_ids": self._ids, "meta_info": meta}


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive | None, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and raising ClientGone) if the client disconnects first.
    Call only after the request body has been read. `receive=None`: no client to watch."""
    if receive is None:
        return await work
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise ClientGone()
    finally:
        for t in (task, watcher):
            t.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)


def sse(data: Any) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else msgspec.json.encode(data)) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class EventStream:
    """An SSE response over `events` (already-framed bytes). If the client disconnects, the
    iterator is closed, which closes the engine streams behind it (abort)."""

    def __init__(self, events: AsyncIterator[bytes]) -> None:
        self.events = events

    async def __call__(self, scope: dict, receive: Receive, send: Callable[[dict], Awaitable[None]]) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no")]})

        async def pump() -> None:
            async for data in self.events:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await until_disconnect(receive, pump())
        except ClientGone:
            pass
        finally:
            await self.events.aclose()  # type: ignore[attr-defined]


async def launch(receive: Receive | None, engine: Any, prompts: list[list[int]], sampling: list[SamplingParams],
                 options: list[dict[str, Any]], in_flight: InFlight | None = None) -> tuple[Fanout, list[int]]:
    """Validate every prompt, prefill prompts with n > 1 once, then start all streams.

    Returns the running fan-out and, per prompt with n > 1 (in order), its cached_tokens before
    this request. ValueError (bad input, a client rid in use) and ClientGone propagate; nothing is
    left running then. `in_flight`: the server's registry (frontend/in_flight.py).
    """
    for ids, sp in zip(prompts, sampling):
        engine.validate_prompt(ids, sp)
    options = [await pin_adapter(engine, opts) if sp.n > 1 else opts for sp, opts in zip(sampling, options)]
    fanout = Fanout(engine, expand(prompts, sampling, options), in_flight)
    fanout.register()  # before the prefill: an abort of the client's rid is remembered from now on
    try:
        shared = [(ids, opts) for ids, sp, opts in zip(prompts, sampling, options) if sp.n > 1]
        warmed = iter(await until_disconnect(receive, prefill(engine, shared)) if shared else [])
        lasts = [next(warmed) if sp.n > 1 else None for sp in sampling]
        endings = [None if last is None else _ending(last, opts.get("rid"), in_flight)
                   for last, opts in zip(lasts, options)]
        for job in fanout.jobs:
            job.ended = endings[job.prompt]
        await until_disconnect(receive, fanout.start())
        if in_flight is not None:
            in_flight.end_if_aborted(engine, {job.group for job in fanout.jobs if job.group is not None})
    except BaseException:
        await fanout.close()
        raise
    return fanout, [int(last["meta_info"]["cached_tokens"]) for last in lasts if last is not None]


async def guarded(events: AsyncIterator[bytes], fanout: Fanout, what: str) -> AsyncIterator[bytes]:
    """Pass an OpenAI event stream through: an error after the response began is reported
    in-band (as OpenAI does), the fan-out always closes (aborting what still runs), and
    `[DONE]` ends the stream."""
    from radixflow.frontend.errors import APIError

    try:
        async for event in events:
            yield event
    except APIError as exc:  # the 200 is already sent: report in-band
        log.warning("%s stream failed: %s", what, exc.message)
        yield sse(exc.body())
    except Exception as exc:  # the 200 is already sent: report in-band
        log.exception("%s stream failed", what)
        yield sse(APIError(500, f"generation failed: {exc}").body())
    finally:
        await fanout.close()
    yield SSE_DONE
