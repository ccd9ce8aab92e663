"""A text cut every way a stream may deliver it, for the parsers' tests (imported by name: this
folder is on sys.path, see conftest.py)."""
from __future__ import annotations

import random
from collections.abc import Iterator


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
