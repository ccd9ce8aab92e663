"""RadixCache: a radix tree from token-id sequences to KV slot ids, with lock refs and LRU eviction."""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .debug import check_tree, common_len, format_tree, preview
from .eviction_log import EvictionLog
from .histogram import Histogram
from .lru import LeafLRU

# Slot ids are int32 numpy arrays: a match concatenates a few node arrays (one copy, no Python
# per token) and a request's slot-table row is written from it in bulk.
SlotIds = np.ndarray  # [n] int32
FreeFn = Callable[[SlotIds], None]
EMPTY_SLOTS: SlotIds = np.zeros(0, dtype=np.int32)
EMPTY_SLOTS.flags.writeable = False

_node_ids = itertools.count()


class Node:
    """One edge of the tree: a run of tokens and the KV slot ids that hold them.

    `key` is a tuple of token ids and `value` an int32 array of slot ids (read-only: a split
    takes views of it) of the same length, empty only for a namespace root.
    `children` is keyed by the first token of each child's key. `lock_ref` counts the
    running requests whose matched path passes through this node; a node with
    `lock_ref > 0` is never evicted. `last_access` is the cache tick of the last
    match/insert that touched the node. Roots have `parent is None` and an empty key;
    evicted nodes have `parent is None` and keep their key. `created_s` / `used_s`: monotonic
    seconds of the insertion of its tokens and of their last counted hit.
    """

    __slots__ = ("key", "value", "parent", "children", "lock_ref", "last_access", "id", "created_s", "used_s")

    def __init__(self, key: tuple[int, ...], value: SlotIds, parent: Node | None,
                 tick: int = 0, created_s: float | None = None) -> None:
        self.key = key
        self.value = value
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.lock_ref = 0
        self.last_access = tick
        self.id = next(_node_ids)
        self.created_s = self.used_s = time.monotonic() if created_s is None else created_s

    @property
    def is_root(self) -> bool:
        return self.parent is None and not self.key

    @property
    def is_evicted(self) -> bool:
        """True once evict removed this node from the tree."""
        return self.parent is None and bool(self.key)

    def __repr__(self) -> str:
        return (f"Node(id={self.id}, len={len(self.key)}, key={preview(self.key, 8)}, "
                f"lock_ref={self.lock_ref}, children={len(self.children)})")


@dataclass(frozen=True, slots=True)
class MatchResult:
    """The longest cached prefix of a key.

    `slots` are the KV slot ids of the matched tokens (int32, len == `length`, a fresh
    array); the slots stay owned by the tree and are only valid while `node` is locked
    (inc_lock_ref) or until the next evict. `node` is the deepest node of the match and
    covers exactly its end (a root when nothing matched).
    """

    slots: SlotIds
    node: Node
    length: int


@dataclass(frozen=True, slots=True)
class InsertResult:
    """What `insert_after` found and left: the first `cached_len` tokens of the key were cached
    already, under the tree's own `slots` (the caller's are duplicates, to free); the tree now
    holds the first `held_len` tokens of the key (all of them; none in a NullCache), and `node`
    is the deepest node of those and covers exactly their end."""

    cached_len: int
    node: Node
    slots: SlotIds
    held_len: int


class RadixCache:
    """Prefix cache over token ids, one subtree per namespace (None = base model).

    Ownership: slot ids handed to `insert` beyond the returned prefix length belong to the
    tree until `evict` (or `reset`) gives them back through `free_fn`. The tree never
    allocates or frees slots by itself.

    Sizes (in tokens) are kept incrementally: `evictable_size` counts non-root nodes with
    `lock_ref == 0`, `protected_size` those with `lock_ref > 0`. Evictable *leaves* live in
    a LeafLRU keyed by the access tick, so evict never scans the tree.

    Counters `hit_tokens`, `query_tokens`, `evicted_tokens` only grow; `reset` keeps them.
    `lifetime`: seconds evicted tokens had been cached (token-weighted); `reuse_gap`: seconds
    between counted hits of the same node. `eviction_log` remembers evicted edges so that
    `explain_miss` can tell an evicted prefix from a cold one.
    Not thread-safe: the engine loop owns it.
    """

    def __init__(self) -> None:
        self.hit_tokens = 0
        self.query_tokens = 0
        self.evicted_tokens = 0
        self._roots: dict[str | None, Node] = {}
        self._leaves: LeafLRU[Node] = LeafLRU()
        self._tick = 0
        self._evictable_size = 0
        self._protected_size = 0
        self._num_nodes = 0
        self._namespace_of: dict[int, str | None] = {}  # id(root) -> namespace
        self.eviction_log = EvictionLog()
        self.lifetime = Histogram()
        self.reuse_gap = Histogram()

    # ---- lookup and insertion -------------------------------------------------------

    def match_prefix(self, key: Sequence[int], namespace: str | None = None, *,
                     record: bool = False) -> MatchResult:
        """Return the longest cached prefix of `key` in `namespace`.

        Splits the last matched node when the match ends inside it, and marks the matched
        path as used now (LRU). With `record`, counts the query and hit tokens.
        """
        key = _as_tuple(key)
        node, parts, length = self._walk(self._root(namespace), key)
        if record:
            self.query_tokens += len(key)
            self.hit_tokens += length
        return MatchResult(_concat(parts), node, length)

    def record_query(self, query_tokens: int, hit_tokens: int, node: Node | None = None) -> None:
        """Count one request's prefix lookup: `query_tokens` asked for, `hit_tokens` found,
        ending at `node` (its reuse gap is recorded). The engine calls it once per admitted
        request, not per admission attempt."""
        self.query_tokens += query_tokens
        self.hit_tokens += hit_tokens
        if hit_tokens and node is not None and node.parent is not None:
            now = time.monotonic()
            self.reuse_gap.observe(now - node.used_s)
            node.used_s = now

    def explain_miss(self, key: Sequence[int], namespace: str | None,
                     match: MatchResult) -> tuple[list[tuple[str, int]], int | None]:
        """Why `key[match.length:]` is not cached, as runs [(reason, tokens)] in key order, and
        the matched length when the prompt diverged from a cached sequence (else None).

        Reasons: `evicted` (the tree held these tokens here and evicted them), `namespace`
        (cached under another namespace), `divergent` (a cached sequence matched and goes on
        with a different token), `cold` (nothing cached goes this way). Does not change the tree.
        """
        key = _as_tuple(key)
        pos, runs = match.length, []
        evicted = self.eviction_log.evicted_len(namespace, key, pos)
        if evicted:
            runs.append(("evicted", evicted))
            pos += evicted
        elsewhere = max((self._peek(root, key) for ns, root in self._roots.items() if ns != namespace),
                        default=0)
        if elsewhere > pos:
            runs.append(("namespace", elsewhere - pos))
            pos = elsewhere
        diverged = pos == match.length > 0 and bool(match.node.children)
        if pos < len(key):
            runs.append(("divergent" if diverged else "cold", len(key) - pos))
        return runs, match.length if diverged and pos < len(key) else None

    def _peek(self, root: Node, key: tuple[int, ...]) -> int:
        """Matched length of `key` below `root`, without splitting or touching anything."""
        node, pos = root, 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            n = common_len(child.key, key, pos)
            pos += n
            if n < len(child.key):
                break
            node = child
        return pos

    def insert(self, key: Sequence[int], values: Sequence[int] | SlotIds, namespace: str | None = None) -> int:
        """Cache `key -> values` and return the length of the prefix that was already cached.

        The tree keeps its own slots for that prefix; the caller still owns `values[:n]`
        (duplicates, to free) and hands `values[n:]` to the tree (copied: the caller's array
        stays its own). Raises ValueError when the lengths differ.
        """
        return self.insert_after(self._root(namespace), key, values).cached_len

    def insert_after(self, node: Node, key: Sequence[int], values: Sequence[int] | SlotIds) -> InsertResult:
        """Cache `key -> values` below `node`, whose path spells the tokens just before `key`
        (a request's locked last node, or a root): costs O(len(key)), not O(depth in tokens).

        Ownership as in `insert`. Raises ValueError when the lengths differ, RuntimeError when
        `node` was evicted.
        """
        key = _as_tuple(key)
        if len(key) != len(values):
            raise ValueError(f"insert: key has {len(key)} tokens but values has {len(values)}")
        if node.is_evicted:
            raise RuntimeError(f"insert_after an evicted node: {node!r}")
        end, parts, cached_len = self._walk(node, key)
        if cached_len < len(key):
            tail = np.array(values[cached_len:], dtype=np.int32)
            end = self._add_leaf(end, key[cached_len:], tail)
        return InsertResult(cached_len, end, _concat(parts), len(key))

    def _walk(self, start: Node, key: tuple[int, ...]) -> tuple[Node, list[SlotIds], int]:
        """Follow `key` from `start` as far as it matches, splitting where the match stops
        inside a node; stamp the path (and start's ancestors) with a new tick.
        Returns (deepest node, the matched nodes' slot arrays in order, matched length)."""
        self._tick += 1
        tick = self._tick
        up = start
        while up.parent is not None:  # O(nodes above start): a child is never newer than its parent
            up.last_access = tick
            up = up.parent
        node = start
        slots: list[SlotIds] = []
        pos, end = 0, len(key)
        while pos < end:
            child = node.children.get(key[pos])
            if child is None:
                break
            child_key = child.key
            child_len = len(child_key)
            if key[pos:pos + child_len] != child_key:
                child_len = common_len(child_key, key, pos)
                child = self._split(child, child_len)
            child.last_access = tick
            slots.append(child.value)
            node = child
            pos += child_len
            if child_len < len(child_key):
                break
        if not node.children and node.lock_ref == 0 and node.parent is not None:
            self._leaves.add(node, tick)
        return node, slots, pos

    def _split(self, node: Node, at: int) -> Node:
        """Cut `node` after `at` tokens; return the new parent holding the first part.

        The original object keeps the tail, so lock handles held on it stay valid.
        """
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key), "split outside a node"
        head = Node(node.key[:at], node.value[:at], parent, node.last_access, node.created_s)
        head.used_s = node.used_s
        head.lock_ref = node.lock_ref
        head.children[node.key[at]] = node
        parent.children[node.key[0]] = head
        node.key, node.value, node.parent = node.key[at:], node.value[at:], head
        self._num_nodes += 1
        return head

    def _add_leaf(self, parent: Node, key: tuple[int, ...], value: SlotIds) -> Node:
        value.flags.writeable = False
        leaf = Node(key, value, parent, self._tick)
        parent.children[key[0]] = leaf
        self._leaves.discard(parent)
        self._leaves.add(leaf, self._tick)
        self._evictable_size += len(key)
        self._num_nodes += 1
        return leaf

    # ---- locking ----------------------------------------------------------------------

    def inc_lock_ref(self, node: Node) -> int:
        """Lock the path from `node` up to its root against eviction.

        Returns the number of tokens that moved from evictable to protected. Raises
        RuntimeError for an evicted node: its slots are gone (lock before evicting).
        """
        if node.parent is None and node.key:
            raise RuntimeError(f"inc_lock_ref on an evicted node: {node!r}")
        moved = 0
        while node.parent is not None:
            if node.lock_ref == 0:
                moved += len(node.key)
                self._leaves.discard(node)
            node.lock_ref += 1
            node = node.parent
        self._evictable_size -= moved
        self._protected_size += moved
        return moved

    def dec_lock_ref(self, node: Node) -> int:
        """Undo one inc_lock_ref on the same node (or a node it was split from).

        Returns the number of tokens that moved from protected to evictable. Raises
        RuntimeError when the node is not locked (an engine bookkeeping bug).
        """
        if node.parent is not None and node.lock_ref <= 0:
            raise RuntimeError(f"dec_lock_ref on an unlocked node: {node!r}")
        moved = 0
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                moved += len(node.key)
                if not node.children:
                    self._leaves.add(node, node.last_access)
            node = node.parent
        self._evictable_size += moved
        self._protected_size -= moved
        return moved

    def num_unlocked_on_path(self, node: Node) -> int:
        """Tokens that inc_lock_ref(node) would move from evictable to protected (no change)."""
        total = 0
        while node.parent is not None and node.lock_ref == 0:
            total += len(node.key)
            node = node.parent
        return total

    def num_sole_locked_on_path(self, node: Node) -> int:
        """Tokens that one dec_lock_ref(node) would make evictable: the path's nodes locked
        exactly once (a parent is locked at least as often as its child; no change)."""
        total = 0
        while node.parent is not None and node.lock_ref == 1:
            total += len(node.key)
            node = node.parent
        return total

    # ---- eviction ---------------------------------------------------------------------

    def evict(self, num_tokens: int, free_fn: FreeFn) -> int:
        """Remove unlocked leaves, least recently used first, until `num_tokens` tokens are
        freed or none is left; a parent left as an unlocked leaf becomes a candidate.

        Calls `free_fn` once with every removed slot id (not at all when nothing was
        removed). Returns the number of tokens evicted (may exceed `num_tokens` by part
        of a node: nodes go whole).
        """
        freed: list[SlotIds] = []
        num_freed = 0
        while num_freed < num_tokens:
            leaf = self._leaves.pop_oldest()
            if leaf is None:
                break
            self._remove_leaf(leaf)
            freed.append(leaf.value)
            num_freed += len(leaf.value)
        if num_freed:
            self.evicted_tokens += num_freed
            free_fn(_concat(freed))
        return num_freed

    def evict_namespace(self, namespace: str | None, free_fn: FreeFn) -> int:
        """Remove every unlocked node of `namespace` (an unloaded adapter's KV), deepest first;
        calls `free_fn` once with their slots. Returns the tokens removed."""
        root = self._roots.get(namespace)
        if root is None:
            return 0
        order, stack = [], [root]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(node.children.values())
        freed: list[SlotIds] = []
        for node in reversed(order):  # preorder reversed: children before their parent
            if node is root or node.children or node.lock_ref:
                continue
            self._leaves.discard(node)
            self._remove_leaf(node)
            freed.append(node.value)
        slots = _concat(freed)
        if len(slots):
            self.evicted_tokens += len(slots)
            free_fn(slots)
        return len(slots)

    def _remove_leaf(self, leaf: Node) -> None:
        parent = leaf.parent
        assert parent is not None and not leaf.children and leaf.lock_ref == 0
        depth, up = 0, parent
        while up.parent is not None:
            depth += len(up.key)
            up = up.parent
        self.eviction_log.record(self._namespace_of[id(up)], depth, leaf.key)
        self.lifetime.observe(time.monotonic() - leaf.created_s, len(leaf.key))
        del parent.children[leaf.key[0]]
        leaf.parent = None
        self._evictable_size -= len(leaf.key)
        self._num_nodes -= 1
        if parent.parent is not None and not parent.children and parent.lock_ref == 0:
            self._leaves.add(parent, parent.last_access)

    def reset(self, free_fn: FreeFn | None = None) -> None:
        """Drop every node, passing all held slot ids to `free_fn` if given.

        Raises RuntimeError while any node is locked. Counters are kept.
        """
        if self._protected_size:
            raise RuntimeError(f"reset: {self._protected_size} tokens are locked by running requests")
        slots = _concat([node.value for node in self._nodes()])
        self._roots.clear()
        self._namespace_of.clear()
        self._leaves.clear()
        self._evictable_size = 0
        self._num_nodes = 0
        if free_fn is not None and len(slots):
            free_fn(slots)

    # ---- sizes and inspection ---------------------------------------------------------

    def evictable_size(self) -> int:
        return self._evictable_size

    def protected_size(self) -> int:
        return self._protected_size

    def total_size(self) -> int:
        return self._evictable_size + self._protected_size

    def num_nodes(self) -> int:
        """Non-root nodes."""
        return self._num_nodes

    def all_slots(self) -> list[int]:
        """Every slot id the tree holds, in no particular order."""
        return _concat([node.value for node in self._nodes()]).tolist()

    def check(self) -> None:
        """Raise AssertionError unless every structural and accounting invariant holds."""
        check_tree(self)

    def pretty(self, max_tokens_per_node: int = 8) -> str:
        """Indented dump: a line per namespace, then one per node (key preview, lock, tick)."""
        return format_tree(self._roots, max_tokens_per_node)

    def _root(self, namespace: str | None) -> Node:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = Node((), EMPTY_SLOTS, None)
            self._namespace_of[id(root)] = namespace
        return root

    def _nodes(self) -> Iterator[Node]:
        """Every non-root node, depth first (iterative: paths can be deep)."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def _as_tuple(key: Sequence[int]) -> tuple[int, ...]:
    return key if isinstance(key, tuple) else tuple(key)


def _concat(parts: list[SlotIds]) -> SlotIds:
    """One fresh int32 array of `parts` in order (a single copy, whatever their number)."""
    if not parts:
        return EMPTY_SLOTS.copy()
    return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
