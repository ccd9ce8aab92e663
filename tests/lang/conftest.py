"""A recording fake backend for the language tests: deterministic replies and logprobs, every request kept."""
from __future__ import annotations

import copy
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

MARKERS = {
    "bos": "<s>",
    "system": ["[SYS]", "[/SYS]\n"],
    "user": ["[USER]", "[/USER]\n"],
    "assistant": ["[ASST]", "### END\n"],
}


def tokenize(text: str) -> list[str]:
    """One token per character, except that a space merges with the character after it."""
    return re.findall(r" [^ ]|.", text, re.S)


def default_logprob(prefix: str, token: str) -> float:
    return -(1 + (sum(map(ord, token)) + len(prefix)) % 5) / 2


def default_reply(prompt: str, sampling: dict) -> str:
    return f"r{len(prompt)}"


class FakeBackend:
    """Implements the Backend protocol. `reply(prompt, sampling_params)` gives a completion,
    `logprob(prefix_text, token)` the logprob of `token` after `prefix_text`."""

    def __init__(self, reply: Callable[[str, dict], str] = default_reply,
                 logprob: Callable[[str, str], float] = default_logprob,
                 markers: dict | None = None, chunk_chars: int = 2) -> None:
        self.reply, self.logprob = reply, logprob
        self.markers = MARKERS if markers is None else markers
        self.chunk_chars = chunk_chars
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.vocab: dict[str, int] = {}

    # -- helpers -------------------------------------------------------------------------------

    def token_id(self, token: str) -> int:
        with self.lock:
            return self.vocab.setdefault(token, len(self.vocab) + 1)

    def token_text(self, token_id: int) -> str:
        with self.lock:
            return {v: k for k, v in self.vocab.items()}[token_id]

    def _record(self, body: dict) -> None:
        with self.lock:
            self.requests.append(copy.deepcopy(body))

    def _completion(self, prompt: str, sampling: dict) -> tuple[str, dict]:
        if sampling.get("max_new_tokens") == 0:
            return "", {"type": "length", "length": 0}
        text = self.reply(prompt, sampling)
        stops = sampling.get("stop") or []
        for stop in [stops] if isinstance(stops, str) else stops:
            if stop in text:
                return text[: text.index(stop)], {"type": "stop", "matched": stop}
        return text, {"type": "stop", "matched": 0}

    def _one(self, tokens: list[str], body: dict) -> dict:
        prompt = "".join(tokens)
        sampling = body.get("sampling_params") or {}
        text, finish = self._completion(prompt, sampling)
        meta: dict[str, Any] = {"id": "fake", "prompt_tokens": len(tokens), "completion_tokens": len(tokenize(text)),
                                "cached_tokens": 0, "finish_reason": finish}
        if body.get("return_logprob"):
            start = body.get("logprob_start_len") or 0
            with_text = body.get("return_text_in_logprobs", False)
            meta["input_token_logprobs"] = [
                [None if p == 0 else self.logprob("".join(tokens[:p]), tokens[p]), self.token_id(tokens[p]),
                 tokens[p] if with_text else None]
                for p in range(start, len(tokens))]
            meta["output_token_logprobs"] = []
        return {"text": text, "output_ids": [self.token_id(t) for t in tokenize(text)], "meta_info": meta}

    # -- the protocol --------------------------------------------------------------------------

    def generate(self, body: dict) -> dict | list[dict]:
        self._record(body)
        if "input_ids" in body:
            batch = [[self.token_text(i) for i in ids] for ids in body["input_ids"]]
            return [self._one(tokens, body) for tokens in batch]
        if isinstance(body["text"], list):
            return [self._one(tokenize(t), body) for t in body["text"]]
        return self._one(tokenize(body["text"]), body)

    def generate_stream(self, body: dict) -> Iterator[dict]:
        self._record(body)
        full = self._one(tokenize(body["text"]), body)
        text = full["text"]
        for end in range(self.chunk_chars, len(text) + self.chunk_chars, self.chunk_chars):
            yield {"text": text[:end], "meta_info": {**full["meta_info"], "completion_tokens": end}}

    def role_markers(self) -> dict:
        return self.markers

    # -- views for assertions ------------------------------------------------------------------

    def prompts(self) -> list[Any]:
        return [r.get("text", r.get("input_ids")) for r in self.requests]

    def prefills(self) -> list[dict]:
        return [r for r in self.requests if (r.get("sampling_params") or {}).get("max_new_tokens") == 0
                and not r.get("return_logprob")]


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def make_fake() -> Callable[..., FakeBackend]:
    return FakeBackend


@pytest.fixture(name="tokenize")
def tokenize_fixture() -> Callable[[str], list[str]]:
    return tokenize
