"""radixflow.radix: the prefix cache (radix tree over token ids → KV slot ids), no devices."""
from __future__ import annotations

from .null import NullCache
from .protocol import PrefixCache
from .tree import InsertResult, MatchResult, Node, RadixCache

__all__ = ["InsertResult", "MatchResult", "Node", "NullCache", "PrefixCache", "RadixCache"]
