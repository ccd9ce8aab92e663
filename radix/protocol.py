"""PrefixCache: the interface the engine uses, met by RadixCache and NullCache."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .histogram import Histogram
from .tree import FreeFn, InsertResult, MatchResult, Node, SlotIds


@runtime_checkable
class PrefixCache(Protocol):
    """What the scheduler needs from a prefix cache (see RadixCache for the contract).

    Engine usage per request:
      admit:  m = match_prefix(tokens, ns); inc_lock_ref(m.node); reuse m.slots;
              record_query(len(tokens), m.length) once the request is admitted
      progress: r = insert_after(m.node, new tokens, their slots); free the duplicates
              (the first r.cached_len, replaced by r.slots); lock r.node, unlock m.node
      finish: the same, then dec_lock_ref(r.node) and free what the tree did not keep
      short of slots: evict(num_tokens, free_fn)
    """

    hit_tokens: int
    query_tokens: int
    evicted_tokens: int
    lifetime: Histogram      # seconds evicted tokens were cached, token-weighted
    reuse_gap: Histogram     # seconds between counted hits of one node

    def match_prefix(self, key: Sequence[int], namespace: str | None = None, *,
                     record: bool = False) -> MatchResult: ...

    def record_query(self, query_tokens: int, hit_tokens: int, node: Node | None = None) -> None: ...

    def explain_miss(self, key: Sequence[int], namespace: str | None,
                     match: MatchResult) -> tuple[list[tuple[str, int]], int | None]: ...

    def insert(self, key: Sequence[int], values: Sequence[int] | SlotIds,
               namespace: str | None = None) -> int: ...

    def insert_after(self, node: Node, key: Sequence[int], values: Sequence[int] | SlotIds) -> InsertResult: ...

    def inc_lock_ref(self, node: Node) -> int: ...

    def dec_lock_ref(self, node: Node) -> int: ...

    def num_unlocked_on_path(self, node: Node) -> int: ...

    def num_sole_locked_on_path(self, node: Node) -> int: ...

    def evict(self, num_tokens: int, free_fn: FreeFn) -> int: ...

    def evict_namespace(self, namespace: str | None, free_fn: FreeFn) -> int: ...

    def evictable_size(self) -> int: ...

    def protected_size(self) -> int: ...

    def total_size(self) -> int: ...

    def num_nodes(self) -> int: ...

    def reset(self, free_fn: FreeFn | None = None) -> None: ...

    def all_slots(self) -> list[int]: ...

    def check(self) -> None: ...

    def pretty(self, max_tokens_per_node: int = 8) -> str: ...
