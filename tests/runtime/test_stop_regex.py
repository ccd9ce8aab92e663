"""Stop regexes: linear-time incremental matching, `re`-compatible results, held-back streaming, the engine stays responsive."""
from __future__ import annotations

import asyncio
import random
import re
import threading
import time

import pytest

from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.text.stop_regex import MAX_STATES, StopMatcher, compile_stop_regexes


def feed_all(patterns: list[str], text: str, chunk: int) -> tuple[int, int] | None:
    m = StopMatcher(compile_stop_regexes(tuple(patterns)))
    for i in range(0, len(text), chunk):
        hit = m.feed(text[i:i + chunk])
        if hit is not None:
            return hit
    return None


@pytest.mark.parametrize("pattern", [r"ab+c", r"\d{2,3}\.", r"(foo|ba[rz])!", r"x*y", r"[^a-c\s]q", r"(?i)end",
                                     r"a.b", r"(?s)a.b", r"^h", r"(?m)^z", r"colou?r", r"(ab){2}", r"[\w-]+@",
                                     r"(a|ab)(c|bcd)", r"a.{0,3}b", r"(x|y)+z"])
def test_first_match_start_agrees_with_re(pattern):
    rng = random.Random(pattern)
    for _ in range(200):
        text = "".join(rng.choice("abcxyz0129.!-@ qhEND\n") for _ in range(rng.randrange(0, 30)))
        chunk = rng.randrange(1, 5)
        hit = feed_all([pattern], text, chunk)
        # `re` over each growing prefix: the first prefix with a match decides where we stop
        expected = None
        for end in range(len(text) + 1):
            m = re.search(pattern, text[:end])
            if m is not None:
                expected = m
                break
        if expected is None:
            assert hit is None, (pattern, text)
        else:
            assert hit is not None and hit[1] == expected.end(), (pattern, text, hit)
            assert hit[0] == expected.start(), (pattern, text, hit)  # the leftmost start
            assert re.fullmatch(pattern, text[hit[0]:hit[1]]) or pattern.startswith(("^", "(?m)^")), (pattern, text)


def test_catastrophic_pattern_is_linear():
    nfa = compile_stop_regexes((r"(x+x+)+y",))
    times = []
    for n in (2_000, 8_000):
        m = StopMatcher(nfa)
        start = time.perf_counter()
        for i in range(0, n, 4):
            assert m.feed("xxxx") is None
        times.append(time.perf_counter() - start)
    assert times[1] < 8 * times[0] + 0.05  # 4x the text, ~4x the time (Python re: exponential)
    assert StopMatcher(nfa).feed("x" * 24 + "y") == (0, 25)


def test_hold_from_marks_a_match_still_forming():
    m = StopMatcher(compile_stop_regexes((r"answer: \d+\.",)))
    assert m.feed("The answer: 1") is None
    assert m.hold_from == 4  # "answer: 1" might still become a match
    assert m.feed("2 and") is None
    assert m.hold_from == m.pos  # it cannot any more


@pytest.mark.parametrize("bad, why", [(r"(a)\1", "not supported"), (r"(?=a)b", "not supported"),
                                      (r"a$", "not supported"), ("a{3000}", "too large"), ("(", "not a valid")])
def test_unsupported_or_huge_patterns_are_value_errors(bad, why):
    with pytest.raises(ValueError, match=why):
        compile_stop_regexes((bad,))
    assert MAX_STATES >= 1000


@pytest.fixture(scope="module")
def engine():
    with Engine(demo_model("tiny"), kv_cache_tokens=4096) as e:
        yield e


def _free_text(engine, prompt: str, n: int = 24) -> str:
    return engine.generate(prompt, {"max_new_tokens": n, "temperature": 0, "ignore_eos": True})["text"]


def test_engine_stops_at_a_regex_and_streams_only_growing_text(engine):
    prompt = "Once upon a time"
    text = _free_text(engine, prompt)
    cut = len(text) // 2
    pattern = re.escape(text[cut:cut + 3])
    expected = text[: re.search(pattern, text).start()]

    async def stream() -> list[dict]:
        return [c async for c in engine.generate_stream(prompt, {"max_new_tokens": 24, "temperature": 0,
                                                                 "ignore_eos": True, "stop_regex": pattern})]

    chunks = asyncio.run(stream())
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), texts
    assert texts[-1] == expected
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "stop"


def test_redos_regex_does_not_stall_a_concurrent_request(engine):
    def one_token_latency() -> float:
        start = time.perf_counter()
        engine.generate("ping", {"max_new_tokens": 1})
        return time.perf_counter() - start

    baseline = min(one_token_latency() for _ in range(3))
    evil = {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True, "stop_regex": r"(.+.+)+\x00"}
    worker = threading.Thread(target=engine.generate, args=("x" * 50, evil))
    worker.start()
    time.sleep(0.05)
    during = min(one_token_latency() for _ in range(3))
    worker.join()
    assert during < max(20 * baseline, 0.5), (baseline, during)
