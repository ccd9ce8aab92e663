"""Orders the waiting queue: longest prefix match, DFS weight over the prefix tree, or arrival."""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from radixflow.radix import MatchResult
from radixflow.runtime.core.request import Req

if TYPE_CHECKING:
    from radixflow.runtime.core.priority import PriorityRules


def match_key(req: Req) -> tuple[int, ...]:
    """The tokens whose KV may come from the cache: all but the last (its logits are needed),
    none past the first prompt position whose logprob was asked for, and, for a request that
    asks for hidden states, none whose hidden state it does not have yet (the cache keeps KV
    only). A tuple: the tree compares and slices it without converting it again."""
    limit = req.seq_len - 1
    start = req.options.prompt_start(len(req.prompt_ids))
    if start is not None:
        limit = min(limit, max(start - 1, 0))
    if req.options.return_hidden_states:
        limit = min(limit, req.num_hidden)
    return tuple(req.ids_range(0, limit))


def order_waiting(waiting: list[Req], policy: str, cache: Any, fcfs_threshold: int,
                  priority: PriorityRules | None = None) -> list[tuple[Req, tuple[int, ...] | None, MatchResult | None]]:
    """Return `waiting` in the order admission should try them (stable; does not mutate), each
    with the match key and prefix match the ordering took (None for fcfs: neither was needed),
    so that admission builds neither again. With `priority` enabled, by priority first and the
    policy's order within each priority."""
    if policy == "fcfs" or len(waiting) > fcfs_threshold:
        out = [(r, None, None) for r in waiting]
    else:
        keys = {id(r): match_key(r) for r in waiting}
        matches = {id(r): cache.match_prefix(keys[id(r)], r.namespace) for r in waiting}
        if policy == "lpm":
            ordered = sorted(waiting, key=lambda r: -matches[id(r)].length)
        else:
            ordered = _dfs_weight_order(waiting, {id(r): matches[id(r)].node for r in waiting})
        out = [(r, keys[id(r)], matches[id(r)]) for r in ordered]
    if priority is not None and priority.enabled:
        out.sort(key=lambda entry: priority.rank(entry[0]))
    return out


def _dfs_weight_order(waiting: list[Req], nodes: dict[int, Any]) -> list[Req]:
    """Visit the tree depth-first, heavier subtrees (more waiting requests) first, emitting the
    requests whose match ends at each node: requests sharing a prefix run back to back."""
    at_node: dict[int, list[Req]] = defaultdict(list)
    weight: dict[int, int] = defaultdict(int)
    children: dict[int, set[int]] = defaultdict(set)
    by_id: dict[int, Any] = {}
    roots: list[Any] = []
    for r in waiting:
        node = nodes[id(r)]
        at_node[id(node)].append(r)
        while node is not None:
            by_id[id(node)] = node
            weight[id(node)] += 1
            parent = node.parent
            if parent is None:
                if node not in roots:
                    roots.append(node)
            else:
                children[id(parent)].add(id(node))
            node = parent
    out: list[Req] = []
    stack = sorted((id(n) for n in roots), key=lambda i: weight[i])
    while stack:
        nid = stack.pop()
        out.extend(at_node.get(nid, []))
        stack.extend(sorted(children.get(nid, ()), key=lambda i: weight[i]))
    return out
