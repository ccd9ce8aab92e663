"""The language's Backend protocol over the server's own engine, for programs run by /v1/programs.

The interpreter runs on a worker thread and calls `generate(body)` (native /generate bodies);
each call runs on the server's event loop exactly like a /generate request, so `close()` (the
client went away) aborts every generation in flight and refuses further ones.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any

import msgspec

from radixflow.frontend.errors import APIError
from radixflow.frontend.in_flight import InFlight
from radixflow.frontend.limits import RequestLimits
from radixflow.frontend.native import GenerateRequest, check_generate, generate_result, parse_generate


class ServerBackend:
    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop, role_markers: dict[str, Any],
                 limits: RequestLimits | None = None, in_flight: InFlight | None = None) -> None:
        self.engine, self._loop, self._markers, self._in_flight = engine, loop, role_markers, in_flight
        self._limits = limits or RequestLimits()
        self._pending: set[concurrent.futures.Future] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.session_id = f"program-{uuid.uuid4().hex}"  # a program run is one session (goodput)

    def generate(self, body: dict) -> dict | list[dict]:
        """Blocking (worker threads only). Bad bodies raise ValueError, as the in-process engine's
        (the program's answer is 400); an engine failure raises BackendError (500); a full engine
        raises the 429 APIError itself (the program's answer is then 429)."""
        try:
            fields = {"session_id": self.session_id, **{k: v for k, v in body.items() if k != "stream"}}
            req = msgspec.convert(fields, GenerateRequest)
            check_generate(req, self._limits)
            job = parse_generate(req, self.engine.tokenizer)
        except (msgspec.ValidationError, APIError) as exc:
            raise ValueError(str(exc)) from exc
        return self._run(generate_result(None, self.engine, job, self._in_flight))

    def generate_stream(self, body: dict) -> Iterator[dict]:
        """The whole result as one (final, cumulative) chunk."""
        yield self.generate(body)

    def role_markers(self) -> dict[str, Any]:
        return self._markers

    def close(self) -> None:
        """Abort what is running and refuse new requests (thread-safe)."""
        with self._lock:
            self._closed = True
            pending = list(self._pending)
        for future in pending:
            future.cancel()  # cancels the task on the loop → its engine streams close → abort

    def _run(self, work: Coroutine[Any, Any, Any]) -> Any:
        from radixflow.lang import BackendError

        with self._lock:
            if self._closed:
                work.close()
                raise BackendError("the client went away; the program was stopped")
            future = asyncio.run_coroutine_threadsafe(work, self._loop)
            self._pending.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError as exc:
            raise BackendError("the client went away; the program was stopped") from exc
        except APIError as exc:  # the answer /generate would give: a client error stays one, a failure a 5xx
            if exc.status == 429:
                raise
            if exc.status >= 500:  # the engine failed the generation (finish reason error): not the program's fault
                raise BackendError(exc.message) from exc
            raise ValueError(exc.message) from exc
        finally:
            with self._lock:
                self._pending.discard(future)
