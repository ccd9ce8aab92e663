"""Inspection of a RadixCache: full invariant check by recount, and a readable dump (O(tree))."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

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
        assert root.parent is None and root.key == () and len(root.value) == 0, (
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
    assert isinstance(node.key, tuple), f"{node!r}: key must be a tuple"
    assert isinstance(node.value, np.ndarray) and node.value.dtype == np.int32 and node.value.ndim == 1, (
        f"{node!r}: value must be a 1-d int32 array")
    assert node.key, f"{node!r}: empty key below a root"
    assert node.key[0] == first, f"{node!r} is filed under first token {first}"
    assert len(node.key) == len(node.value), (
        f"{node!r}: {len(node.key)} tokens but {len(node.value)} slots")
    assert node.lock_ref >= 0, f"{node!r}: negative lock_ref"
    if parent.parent is not None:
        assert node.lock_ref <= parent.lock_ref, f"{node!r} is locked more than its parent"
        assert node.last_access <= parent.last_access, f"{node!r} is newer than its parent"
    values = node.value.tolist()
    duplicates = seen_slots.intersection(values)
    assert not duplicates and len(set(values)) == len(values), (
        f"{node!r}: slot ids held twice: {sorted(duplicates) or values}")
    seen_slots.update(values)


def format_tree(roots: dict[str | None, Node], max_tokens_per_node: int) -> str:
    """One line per namespace root, then its nodes depth first, children by first token."""
    lines: list[str] = []
    for namespace, root in roots.items():
        lines.append(f"namespace={namespace!r}")
        stack = [(child, 1) for child in _sorted_children(root)]
        while stack:  # iterative: conversation chains can be deeper than the recursion limit
            node, depth = stack.pop()
            lines.append(f"{'  ' * depth}{preview(node.key, max_tokens_per_node)} "
                         f"len={len(node.key)} lock={node.lock_ref} t={node.last_access}")
            stack.extend((child, depth + 1) for child in _sorted_children(node))
    return "\n".join(lines) if lines else "(empty)"


def preview(key: tuple[int, ...], max_tokens: int) -> str:
    """`[t0 t1 … ]`: at most `max_tokens` tokens of a key."""
    shown = " ".join(map(str, key[:max_tokens]))
    return f"[{shown}{' …' if len(key) > max_tokens else ''}]"


def _sorted_children(node: Node) -> list[Node]:
    # Reversed so that a stack pops them in ascending first-token order.
    return [node.children[t] for t in sorted(node.children, reverse=True)]


def common_len(node_key: tuple[int, ...], key: tuple[int, ...], pos: int) -> int:
    """Length of the common prefix of `node_key` and `key[pos:]`: a binary search over slice
    comparisons, O(log n) Python steps (a long cached node is split without a per-token loop)."""
    lo, hi = 0, min(len(node_key), len(key) - pos)  # node_key[:lo] matches; nothing past hi does
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if node_key[lo:mid] == key[pos + lo: pos + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
