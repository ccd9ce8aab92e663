"""NullCache: the prefix cache for --disable-radix-cache; same interface, holds nothing."""
from __future__ import annotations

from collections.abc import Sequence

from .histogram import Histogram
from .tree import EMPTY_SLOTS, FreeFn, InsertResult, MatchResult, Node, SlotIds


class NullCache:
    """A cache that never hits and never keeps a slot.

    `match_prefix` returns an empty match on a dummy root (with `record`, the query
    tokens still count, hits stay 0). `insert` returns `len(key)`: every slot is a
    "duplicate", so the caller frees all of them itself; `insert_after` keeps nothing
    (`held_len` 0, the root as node). Lock ops, evict and reset do
    nothing; all sizes are 0.
    """

    def __init__(self) -> None:
        self.hit_tokens = 0
        self.query_tokens = 0
        self.evicted_tokens = 0
        self.lifetime = Histogram()
        self.reuse_gap = Histogram()
        self._root = Node((), EMPTY_SLOTS, None)

    def match_prefix(self, key: Sequence[int], namespace: str | None = None, *,
                     record: bool = False) -> MatchResult:
        if record:
            self.query_tokens += len(key)
        return MatchResult(EMPTY_SLOTS.copy(), self._root, 0)

    def record_query(self, query_tokens: int, hit_tokens: int, node: Node | None = None) -> None:
        self.query_tokens += query_tokens

    def explain_miss(self, key: Sequence[int], namespace: str | None,
                     match: MatchResult) -> tuple[list[tuple[str, int]], int | None]:
        return ([("cold", len(key))] if key else []), None

    def insert(self, key: Sequence[int], values: Sequence[int] | SlotIds, namespace: str | None = None) -> int:
        if len(key) != len(values):
            raise ValueError(f"insert: key has {len(key)} tokens but values has {len(values)}")
        return len(key)

    def insert_after(self, node: Node, key: Sequence[int], values: Sequence[int] | SlotIds) -> InsertResult:
        if len(key) != len(values):
            raise ValueError(f"insert: key has {len(key)} tokens but values has {len(values)}")
        return InsertResult(0, self._root, EMPTY_SLOTS.copy(), 0)

    def inc_lock_ref(self, node: Node) -> int:
        return 0

    def dec_lock_ref(self, node: Node) -> int:
        return 0

    def num_unlocked_on_path(self, node: Node) -> int:
        return 0

    def num_sole_locked_on_path(self, node: Node) -> int:
        return 0

    def evict(self, num_tokens: int, free_fn: FreeFn) -> int:
        return 0

    def evict_namespace(self, namespace: str | None, free_fn: FreeFn) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def num_nodes(self) -> int:
        return 0

    def reset(self, free_fn: FreeFn | None = None) -> None:
        return None

    def all_slots(self) -> list[int]:
        return []

    def check(self) -> None:
        assert not self._root.children and self._root.lock_ref == 0, "NullCache root was modified"

    def pretty(self, max_tokens_per_node: int = 8) -> str:
        return "(radix cache disabled)"
