"""Send one benchmark request and time it: native `/generate`, OpenAI `/v1/completions` (any
compatible server), or an in-process `Engine`. Every backend streams, so TTFT and inter-token
gaps are measured on the client clock.

Sampling is greedy with EOS ignored (every system produces exactly max_new_tokens tokens, so the
token counts match across systems), except for schema-constrained requests, which stop when the
JSON value is complete.
"""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from radixflow.frontend.bench.metrics import RequestResult


class Client(Protocol):
    async def send(self, prompt_ids: list[int], max_new_tokens: int, json_schema: dict | None) -> RequestResult: ...

    async def close(self) -> None: ...


def sampling(max_new_tokens: int, json_schema: dict | None) -> dict[str, Any]:
    params: dict[str, Any] = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": json_schema is None}
    if json_schema is not None:
        params["json_schema"] = json.dumps(json_schema)
    return params


class _Timer:
    """Chunk arrival times → TTFT, inter-chunk gaps, E2E."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.chunk_times: list[float] = []

    def chunk(self) -> None:
        self.chunk_times.append(time.perf_counter())

    def result(self, prompt_len: int, output_ids: list[int], cached: int | None, error: str | None = None) -> RequestResult:
        end = time.perf_counter()
        t = self.chunk_times
        ttft = (t[0] - self.start) if t else end - self.start
        gaps = [b - a for a, b in zip(t, t[1:])]
        return RequestResult(prompt_len, output_ids, ttft, end - self.start, gaps, cached, error)


async def _sse(response: Any) -> AsyncIterator[dict]:
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield json.loads(data)


class NativeClient:
    """radixflow's (SGLang-shaped) `/generate` with `input_ids`; chunks carry cumulative output_ids."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s)

    async def send(self, prompt_ids: list[int], max_new_tokens: int, json_schema: dict | None) -> RequestResult:
        body = {"input_ids": prompt_ids, "sampling_params": sampling(max_new_tokens, json_schema), "stream": True}
        timer, last = _Timer(), None
        async with self._http.stream("POST", "/generate", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return timer.result(len(prompt_ids), [], None, f"HTTP {response.status_code}: {response.text[:200]}")
            async for chunk in _sse(response):
                if "error" in chunk:
                    return timer.result(len(prompt_ids), [], None, str(chunk["error"]))
                if last is None or len(chunk["output_ids"]) > len(last["output_ids"]):
                    timer.chunk()
                last = chunk
        if last is None:
            return timer.result(len(prompt_ids), [], None, "empty stream")
        return timer.result(len(prompt_ids), list(last["output_ids"]), last["meta_info"].get("cached_tokens"))

    async def close(self) -> None:
        await self._http.aclose()


class OpenAIClient:
    """`/v1/completions` with a token-id prompt. Completions return text, not ids: the output ids
    (needed for the next turn of a session) are the text re-encoded with `tokenizer`, the same
    one the server uses, so both engines see the same follow-up prompts."""

    def __init__(self, base_url: str, model: str, tokenizer: Any, api_key: str | None = None,
                 timeout_s: float = 600.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s)
        self.model, self.tokenizer = model, tokenizer

    def _body(self, prompt_ids: list[int], max_new_tokens: int, json_schema: dict | None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "prompt": prompt_ids, "max_tokens": max_new_tokens,
                                "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
                                "ignore_eos": json_schema is None}
        if json_schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "extract", "schema": json_schema}}
        return body

    async def send(self, prompt_ids: list[int], max_new_tokens: int, json_schema: dict | None) -> RequestResult:
        timer, text, usage = _Timer(), [], None
        body = self._body(prompt_ids, max_new_tokens, json_schema)
        async with self._http.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return timer.result(len(prompt_ids), [], None, f"HTTP {response.status_code}: {response.text[:200]}")
            async for chunk in _sse(response):
                if chunk.get("error"):
                    return timer.result(len(prompt_ids), [], None, str(chunk["error"]))
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    timer.chunk()
                    text.append(chunk["choices"][0]["text"])
                usage = chunk.get("usage") or usage
        output_ids = self.tokenizer.encode("".join(text), add_special_tokens=False)
        details = (usage or {}).get("prompt_tokens_details") or {}
        return timer.result(len(prompt_ids), output_ids, details.get("cached_tokens"))

    async def close(self) -> None:
        await self._http.aclose()


class OfflineClient:
    """An `Engine` in this process, through its async stream."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def send(self, prompt_ids: list[int], max_new_tokens: int, json_schema: dict | None) -> RequestResult:
        timer, last = _Timer(), None
        try:
            async for chunk in self.engine.generate_stream(input_ids=prompt_ids,
                                                           sampling_params=sampling(max_new_tokens, json_schema)):
                if last is None or len(chunk["output_ids"]) > len(last["output_ids"]):
                    timer.chunk()
                last = chunk
        except ValueError as exc:
            return timer.result(len(prompt_ids), [], None, str(exc))
        assert last is not None, "a stream ends with its finished chunk"
        return timer.result(len(prompt_ids), list(last["output_ids"]), last["meta_info"]["cached_tokens"])

    async def close(self) -> None:
        return None
