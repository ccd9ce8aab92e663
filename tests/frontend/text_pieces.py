"""A text cut every way a stream may deliver it, and a parser's events as a client reassembles
them, for the parsers' tests (imported by name: this folder is on sys.path, see conftest.py)."""
from __future__ import annotations

import random
from collections.abc import Iterator

from radixflow.frontend.call_stream import whole
from radixflow.runtime.text.reasoning import Thought


def every_split(text: str) -> Iterator[list[str]]:
    """The text whole, one character at a time, cut at every position, and in random pieces."""
    yield [text]
    yield list(text)
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(2, 6))))
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def run(parser, pieces):
    """The parser's events for a text fed in `pieces`, and what finish() flushes."""
    out = []
    for piece in pieces:
        out += parser.feed(piece)
    return out + parser.finish()


def merged(events):
    """Each call's start and argument pieces folded into a Call, adjacent text events joined and
    adjacent reasoning pieces too: what a client reassembles."""
    out = []
    for e in whole(events):
        if isinstance(e, str) and out and isinstance(out[-1], str):
            out[-1] += e
        elif isinstance(e, Thought) and out and isinstance(out[-1], Thought):
            out[-1] = Thought(out[-1].text + e.text)
        else:
            out.append(e)
    return out
