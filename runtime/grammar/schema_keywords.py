"""JSON-schema keywords outlines-core compiles as if they were absent: refused, never ignored, so an
output that `stop`s follows its schema. (llguidance refuses them itself, as unimplemented keys.)

Measured on outlines-core 0.2: `{"type": "integer", "not": {"const": 3}}` admits `3`; `if` /
`then` / `else`, `contains`, `propertyNames`, `patternProperties` (`{"x": "s"}` passes an integer
pattern) and `dependentRequired` are dropped the same way, and
so are `minProperties` / `maxProperties` on an object that lists `properties` (without them the
bounds hold).
"""
from __future__ import annotations

from typing import Any

IGNORED = ("not", "if", "then", "else", "contains", "minContains", "maxContains", "propertyNames",
           "patternProperties", "dependentRequired", "dependentSchemas", "dependencies")
_DATA = frozenset({"const", "enum", "default", "examples"})  # values, not schemas
_NAMED = frozenset({"properties", "$defs", "definitions"})  # maps of names to schemas


def check_enforceable(schema: Any) -> None:
    """ValueError naming the first keyword of `schema` (with its JSON pointer) outlines-core would
    ignore. Iterative: a schema may nest past Python's recursion limit before the depth limit."""
    stack: list[tuple[Any, str]] = [(schema, "#")]
    while stack:
        node, at = stack.pop()
        if isinstance(node, list):
            stack += [(item, f"{at}/{i}") for i, item in enumerate(node)]
            continue
        if not isinstance(node, dict):
            continue
        for key in IGNORED:
            if key in node:
                raise ValueError(f"{key!r} at {at} is not supported: the grammar would not enforce it")
        _check_property_counts(node, at)
        for key, value in node.items():
            if key in _DATA:
                continue
            if key in _NAMED and isinstance(value, dict):
                stack += [(sub, f"{at}/{key}/{name}") for name, sub in value.items()]
            elif isinstance(value, (dict, list)):
                stack.append((value, f"{at}/{key}"))


def _check_property_counts(node: dict, at: str) -> None:
    """min/maxProperties beside `properties` are dropped: refused unless every output meets them
    anyway (no more than the required properties asked for, no fewer than all that can appear)."""
    properties = node.get("properties")
    if not isinstance(properties, dict):
        return
    least, most = node.get("minProperties"), node.get("maxProperties")
    if least is not None and not least <= len(node.get("required") or []):
        raise ValueError(f"'minProperties' at {at} is not supported beside properties (past the required ones): "
                         "the grammar would not enforce it")
    closed = node.get("additionalProperties") is False or "additionalProperties" not in node
    if most is not None and not (closed and len(properties) <= most):
        raise ValueError(f"'maxProperties' at {at} is not supported beside properties (below their number): "
                         "the grammar would not enforce it")
