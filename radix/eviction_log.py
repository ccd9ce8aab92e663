"""A bounded record of evicted edges, so a later miss on them can be told apart from a cold one."""
from __future__ import annotations

from collections import OrderedDict

from .debug import common_len

EdgeKey = tuple[str | None, int, int]  # (namespace, depth of the edge's first token, that token)


class EvictionLog:
    """Edges (token runs) the tree evicted, by where they stood: namespace, depth, first token.

    Holds at most `max_tokens` tokens of keys (the evicted key tuples themselves, no copies),
    dropping the oldest records first. A record stays after its tokens are cached again:
    a cached token is matched, never explained as a miss, so the record is then unused.
    """

    def __init__(self, max_tokens: int = 1 << 18) -> None:
        self.max_tokens = max_tokens
        self._edges: OrderedDict[EdgeKey, tuple[int, ...]] = OrderedDict()
        self._num_tokens = 0

    def record(self, namespace: str | None, depth: int, key: tuple[int, ...]) -> None:
        where = (namespace, depth, key[0])
        old = self._edges.pop(where, None)
        if old is not None:
            self._num_tokens -= len(old)
        self._edges[where] = key
        self._num_tokens += len(key)
        while self._num_tokens > self.max_tokens and self._edges:
            _, dropped = self._edges.popitem(last=False)
            self._num_tokens -= len(dropped)

    def evicted_len(self, namespace: str | None, key: tuple[int, ...], start: int) -> int:
        """How many tokens of `key` from position `start` on were evicted (following records
        edge by edge)."""
        pos = start
        while pos < len(key):
            edge = self._edges.get((namespace, pos, key[pos]))
            if edge is None:
                break
            n = common_len(edge, key, pos)
            pos += n
            if n < len(edge):
                break
        return pos - start

    @property
    def num_tokens(self) -> int:
        return self._num_tokens
