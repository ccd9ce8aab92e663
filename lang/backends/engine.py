"""Engine backend: a radixflow.runtime.Engine in this process, spoken to with native /generate bodies.

The runtime (torch and all) is imported when an Engine is constructed, never at import time.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

# native body key → Engine.generate keyword, besides the request options (same names)
_KEYS = {"text": "prompt", "input_ids": "input_ids", "sampling_params": "sampling_params", "rid": "rid",
         "lora_path": "lora_path"}


def engine_kwargs(body: dict) -> dict[str, Any]:
    """A native /generate body as Engine.generate keywords (`stream` is decided by the caller);
    the request options resolve as over HTTP (RequestOptions.engine_kwargs)."""
    from radixflow.runtime.sampling_params import RequestOptions, request_option_names

    names = request_option_names()
    unknown = set(body) - set(_KEYS) - set(names) - {"stream"}
    if unknown:
        raise ValueError(f"unsupported /generate keys for the in-process engine: {sorted(unknown)}")
    given = {k: v for k, v in body.items() if k in names and v is not None}
    options = RequestOptions(**given)
    options.validate()
    kwargs = {_KEYS[k]: v for k, v in body.items() if k in _KEYS and v is not None}
    return {**kwargs, **options.engine_kwargs()}


class Engine:
    """`rf.Engine(model, **config)` starts a runtime Engine (config names as in EngineConfig);
    `rf.Engine(engine=existing)` wraps one you already have (and leaves shutting it down to you)."""

    def __init__(self, model: str | None = None, *, engine: Any = None, **config: Any) -> None:
        if engine is None:
            from radixflow.runtime import Engine as RuntimeEngine

            engine = RuntimeEngine(model, **config)
            self._owned = True
        else:
            if model is not None or config:
                raise ValueError("give either engine=... or model/config, not both")
            self._owned = False
        self.engine = engine
        self._markers: dict | None = None

    def generate(self, body: dict) -> dict | list[dict]:
        return self.engine.generate(**engine_kwargs(body))

    def generate_stream(self, body: dict) -> Iterator[dict]:
        """Drive the engine's async stream from this (worker) thread with a private event loop."""
        loop = asyncio.new_event_loop()
        chunks = self.engine.generate_stream(**engine_kwargs(body))
        try:
            while True:
                try:
                    chunk = loop.run_until_complete(chunks.__anext__())
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            loop.run_until_complete(chunks.aclose())  # aborts the request if we stopped early
            loop.close()

    def abort(self, rid: str) -> None:
        """End the request `rid` (a program's gen whose body failed)."""
        self.engine.abort(rid)

    def role_markers(self) -> dict:
        if self._markers is None:
            self._markers = self.engine.tokenizer.role_markers()
        return self._markers

    def shutdown(self) -> None:
        if self._owned:
            self.engine.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
