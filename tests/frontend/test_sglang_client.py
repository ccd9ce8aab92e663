"""SGLang 0.5.23's own frontend (`RuntimeEndpoint`) runs its programs against radixflow unchanged.

Needs the client, installed without its server dependencies (a separate CI step):
    pip install --no-deps sglang==0.5.23 psutil pybase64 pillow pyzmq aiohttp multidict yarl \
        propcache aiohappyeyeballs aiosignal frozenlist orjson && pip install ipython
Skipped when sglang is not importable.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

sgl = pytest.importorskip("sglang")
runtime_endpoint = pytest.importorskip("sglang.lang.backend.runtime_endpoint")


@pytest.fixture(scope="module")
def backend(server) -> Iterator[Any]:
    endpoint = runtime_endpoint.RuntimeEndpoint(server.url, api_key="test-key")
    yield endpoint


@sgl.function
def mixed(s):
    s += "Q: pick a number. A: " + sgl.gen("num", max_tokens=8, regex=r"\d{3}")
    s += " Color: " + sgl.select("color", choices=["red", "green", "blue"])
    s += " Word: " + sgl.gen("word", max_tokens=4, choices=["yes", "no"])
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f" branch {i}: " + sgl.gen("b", max_tokens=3, temperature=0)
    forks.join()
    s += " int: " + sgl.gen_int("n", max_tokens=5)
    return [f.text() for f in forks]


@sgl.function
def scored(s, text):
    s += text + sgl.gen("x", max_tokens=3, return_logprob=True)


@sgl.function
def streamed(s):
    s += "Stream: " + sgl.gen("s", max_tokens=6, temperature=0)


def test_gen_regex_select_choices_fork_and_int(backend):
    state = mixed.run(backend=backend)
    assert re.fullmatch(r"[0-9]{3}", state["num"])  # ASCII digits, not Unicode ones
    assert state["color"] in ("red", "green", "blue") and state["word"] in ("yes", "no")
    assert re.fullmatch(r"[-+]?[0-9]+", state["n"].strip())
    branches = state.ret_value
    assert [b.count(f"branch {i}: ") for i, b in enumerate(branches)] == [1, 1]
    assert all(b.startswith("Q: pick a number. A: " + state["num"]) for b in branches)


def test_return_logprob_hits_the_prompt_cache(backend):
    text = "A long warm prompt for the prefix cache. " * 30
    scored.run(text=text, backend=backend).sync()  # run() returns before its gen ends; wait for it
    meta = scored.run(text=text, backend=backend).get_meta_info("x")
    assert meta["cached_tokens"] >= meta["prompt_tokens"] - 1
    assert len(meta["output_token_logprobs"]) == 3


def test_streaming_text_iter(backend):
    whole = streamed.run(backend=backend)["s"]
    pieces = list(streamed.run(stream=True, backend=backend).text_iter("s"))
    assert "".join(pieces) == whole and len(pieces) >= 2
