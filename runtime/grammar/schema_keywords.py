"""JSON-schema keywords outlines-core compiles as if they were absent: refused, never ignored, so an
output that `stop`s follows its schema. (llguidance refuses them itself, as unimplemented keys.)

Measured on outlines-core 0.2: `{"type": "integer", "not": {"const": 3}}` admits `3`; `if` /
`then` / `else`, `contains`, `propertyNames`, `patternProperties` (`{"x": "s"}` passes an integer
pattern) and `dependentRequired` are dropped the same way. Others are dropped only in some places
(measured on 0.2.14, each beside the text it admitted in tests/runtime/test_schema_keywords.py):
- beside `properties` it writes the listed properties only: `anyOf` / `oneOf` / `allOf` / `enum` /
  `const` / `$ref` there, a `required` name not among them, and `minProperties` / `maxProperties` that
  this does not meet anyway are dropped;
- without `properties`, `minProperties` past 1 and `maxProperties` past 0 are, and so are
  `unevaluatedProperties` / `unevaluatedItems` (with nothing else saying what a value may be);
- `prefixItems` gives exactly that many items: a `minItems` above, a `maxItems` below, dropped;
- `allOf` of two or more members is written as the members one after another (not JSON).
"""
from __future__ import annotations

from typing import Any

IGNORED = ("not", "if", "then", "else", "contains", "minContains", "maxContains", "propertyNames",
           "patternProperties", "dependentRequired", "dependentSchemas", "dependencies")
# values, not schemas (`discriminator`: OpenAPI's, which pydantic writes beside a oneOf: tag values)
_DATA = frozenset({"const", "enum", "default", "examples", "discriminator"})
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
        _check_properties(node, at)
        _check_in_place(node, at)
        for key, value in node.items():
            if key in _DATA:
                continue
            if key in _NAMED and isinstance(value, dict):
                stack += [(sub, f"{at}/{key}/{name}") for name, sub in value.items()]
            elif isinstance(value, (dict, list)):
                stack.append((value, f"{at}/{key}"))


def _refuse(key: str, at: str, why: str) -> None:
    raise ValueError(f"{key!r} at {at} is not supported {why}: the grammar would not enforce it")


def _check_properties(node: dict, at: str) -> None:
    """Beside `properties` outlines-core writes the listed properties, the required ones always:
    anything asking for other objects is dropped, so refused unless every output meets it anyway."""
    properties = node.get("properties")
    if not isinstance(properties, dict):
        return
    for key in ("anyOf", "oneOf", "allOf", "enum", "const", "$ref"):
        if key in node:
            _refuse(key, at, "beside properties")
    required = node.get("required") or []
    missing = [name for name in required if name not in properties]
    if missing:
        _refuse("required", at, f"naming {missing[0]!r}, which is not in properties")
    least, most = node.get("minProperties"), node.get("maxProperties")
    if least is not None and not least <= len(set(required)):
        _refuse("minProperties", at, "beside properties (past the required ones)")
    if most is not None and not len(properties) <= most:  # additionalProperties or not: no other key
        _refuse("maxProperties", at, "beside properties (below their number)")


def _check_in_place(node: dict, at: str) -> None:
    """Keywords outlines-core keeps in some places only (the module doc)."""
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        _refuse("allOf", at, "with more than one member")
    if "properties" not in node:
        least, most = node.get("minProperties"), node.get("maxProperties")
        if least is not None and not least <= 1:
            _refuse("minProperties", at, "past 1 (without properties)")
        if most is not None and not most <= 0:
            _refuse("maxProperties", at, "past 0 (without properties)")
        if node.get("unevaluatedProperties", True) is not True:
            _refuse("unevaluatedProperties", at, "without properties")
    if node.get("unevaluatedItems", True) is not True and "items" not in node and "prefixItems" not in node:
        _refuse("unevaluatedItems", at, "without items or prefixItems")
    prefix = node.get("prefixItems")
    if isinstance(prefix, list):
        least, most = node.get("minItems"), node.get("maxItems")
        if least is not None and not least <= len(prefix):
            _refuse("minItems", at, "past the number of prefixItems")
        if most is not None and not most >= len(prefix):
            _refuse("maxItems", at, "below the number of prefixItems")
