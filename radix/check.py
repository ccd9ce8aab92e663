"""Full invariant check of a RadixCache by recount (tests and debugging only: O(tree))."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tree import Node, RadixCache


def check_tree(cache: RadixCache) -> None:
    """Raise AssertionError naming the first broken invariant of `cache`.

    Checked: roots are empty and unlocked; parent/child links agree; children are keyed
    by their first token; non-root keys are non-empty tuples with values of equal length;
    lock_refs are >= 0 and never exceed the parent's; a child was accessed no later than
    its parent; slot ids are unique; size totals and node count match a recount; the LRU
    holds exactly the unlocked leaves, each with its current tick.
    """
    evictable = protected = num_nodes = 0
    seen_slots: set[int] = set()
    unlocked_leaves: dict[Node, int] = {}
    for namespace, root in cache._roots.items():
        assert root.parent is None and root.key == () and root.value == (), (
            f"root of namespace {namespace!r} is not an empty root")
        assert root.lock_ref == 0, f"root of namespace {namespace!r} has lock_ref {root.lock_ref}"
        stack = [root]
        while stack:
            parent = stack.pop()
            for first, node in parent.children.items():
                _check_node(node, parent, first, seen_slots)
                num_nodes += 1
                if node.lock_ref:
                    protected += len(node.key)
                else:
                    evictable += len(node.key)
                    if not node.children:
                        unlocked_leaves[node] = node.last_access
                stack.append(node)
    assert num_nodes == cache._num_nodes, f"num_nodes {cache._num_nodes} != recount {num_nodes}"
    assert evictable == cache._evictable_size, (
        f"evictable_size {cache._evictable_size} != recount {evictable}")
    assert protected == cache._protected_size, (
        f"protected_size {cache._protected_size} != recount {protected}")
    lru = cache._leaves
    lru_ticks = lru.ticks()
    assert lru_ticks == unlocked_leaves, (
        f"LRU holds {len(lru_ticks)} leaves, tree has {len(unlocked_leaves)} unlocked leaves "
        f"(extra: {[n for n in lru_ticks if n not in unlocked_leaves]!r}, "
        f"missing: {[n for n in unlocked_leaves if n not in lru_ticks]!r}, or stale ticks)")
    lru.check()


def _check_node(node: Node, parent: Node, first: int, seen_slots: set[int]) -> None:
    assert node.parent is parent, f"{node!r} has a wrong parent link"
    assert isinstance(node.key, tuple) and isinstance(node.value, tuple), (
        f"{node!r}: key and value must be tuples")
    assert node.key, f"{node!r}: empty key below a root"
    assert node.key[0] == first, f"{node!r} is filed under first token {first}"
    assert len(node.key) == len(node.value), (
        f"{node!r}: {len(node.key)} tokens but {len(node.value)} slots")
    assert node.lock_ref >= 0, f"{node!r}: negative lock_ref"
    if parent.parent is not None:
        assert node.lock_ref <= parent.lock_ref, f"{node!r} is locked more than its parent"
        assert node.last_access <= parent.last_access, f"{node!r} is newer than its parent"
    duplicates = seen_slots.intersection(node.value)
    assert not duplicates and len(set(node.value)) == len(node.value), (
        f"{node!r}: slot ids held twice: {sorted(duplicates) or node.value}")
    seen_slots.update(node.value)
