"""Which JSON schemas leave outlines-core for llguidance: those outlines-core cuts, or would compile
with a keyword it does not enforce (schema_keywords.py: `allOf` of several members,
`patternProperties`, ... llguidance enforces some of them; where it refuses one, the schema goes
back to outlines-core, which refuses it naming the keyword), when llguidance keeps their bounds
exact.

outlines-core (0.2.x) renders a schema as one regex, which cannot nest without limit, so it cuts
two kinds of schema (its parser's rules, mirrored by `outlines_cut`, dispatch order included):
- any value (`{}`, an object without `properties` whose `additionalProperties` is absent or
  `true`, an array without `items`): nested at most three levels (`depth` 2), then scalars only;
- `$ref`s nested more than four deep along one path (every cycle gets there): the fifth is
  dropped, together with the property holding it even when required, or the compile fails.
llguidance has neither limit. Its number bounds are exact (integer_range.py / number_range.py do
this for outlines-core) except where `llguidance_bounds_exact` says not (llguidance 1.9.1,
checked against decimal comparisons): an integer bound no double holds exactly is rounded, and a
number with an exclusive bound at 0 and its other bound inside (-1, 1) lets "-0" / "0" through.
"""
from __future__ import annotations

import functools
import json

from radixflow.runtime.grammar.schema_keywords import check_enforceable

# outlines-core refuses a `$ref` met while this many are already being resolved.
OUTLINES_MAX_NESTED_REFS = 4
ANY_VALUE = "a value of any type nested past three levels"
DEEP_REFS = f"$refs nested more than {OUTLINES_MAX_NESTED_REFS} deep (a cycle)"
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


@functools.lru_cache(maxsize=1024)  # asked on every request, cache hits included
def prefers_llguidance(schema_text: str) -> bool:
    """The schema (GrammarKey text) is one outlines-core cuts or does not enforce, and llguidance
    compiles exactly."""
    schema = json.loads(schema_text)
    return (outlines_cut(schema) is not None or not _outlines_enforces(schema)) and llguidance_bounds_exact(schema)


def _outlines_enforces(schema: object) -> bool:
    try:
        check_enforceable(schema)
    except ValueError:
        return False
    return True


def outlines_cut(schema: object) -> str | None:
    """What outlines-core would cut in `schema` (ANY_VALUE or DEEP_REFS), or None when it renders
    the schema whole (or refuses it: its error then stands)."""
    return _OutlinesWalk(schema).visit(schema, 0)


class _OutlinesWalk:
    def __init__(self, root: object) -> None:
        self.root = root
        self.seen: set[tuple[int, int]] = set()  # (id(node), nested refs): each visited once

    def visit(self, node: object, num_refs: int) -> str | None:
        if not isinstance(node, dict) or (id(node), num_refs) in self.seen:
            return None
        self.seen.add((id(node), num_refs))
        if not node:
            return ANY_VALUE
        if "properties" in node:  # outlines-core then ignores every other keyword but `required`
            props = node["properties"]
            return self.first(props.values() if isinstance(props, dict) else [], num_refs)
        for key in ("allOf", "anyOf", "oneOf", "prefixItems"):
            if key in node:
                return self.first(node[key] if isinstance(node[key], list) else [], num_refs)
        if "enum" in node or "const" in node:
            return None
        if "$ref" in node:
            if num_refs >= OUTLINES_MAX_NESTED_REFS:
                return DEEP_REFS
            target = self.resolve(node["$ref"])
            return None if target is None else self.visit(target, num_refs + 1)
        types = node.get("type")
        cuts = (self.typed(node, t, num_refs) for t in (types if isinstance(types, list) else [types]))
        return next((cut for cut in cuts if cut is not None), None)

    def typed(self, node: dict, type_name: object, num_refs: int) -> str | None:
        if type_name == "object" and _may_hold_any(node.get("maxProperties")):
            extra = node.get("additionalProperties")
            return ANY_VALUE if extra is None or extra is True else self.visit(extra, num_refs)
        if type_name == "array" and _may_hold_any(node.get("maxItems")):
            return self.visit(node["items"], num_refs) if "items" in node else ANY_VALUE
        return None

    def first(self, schemas, num_refs: int) -> str | None:
        cuts = (self.visit(s, num_refs) for s in schemas)
        return next((cut for cut in cuts if cut is not None), None)

    def resolve(self, ref: object) -> object | None:
        """A local `$ref` ("#/a/b", "a/b", or "<root $id>#/a/b") as outlines-core resolves it:
        object keys only, no JSON-pointer escapes. None where it would fail."""
        parts = ref.split("#") if isinstance(ref, str) else []
        if len(parts) == 2 and parts[0] and not (isinstance(self.root, dict) and parts[0] == self.root.get("$id")):
            return None
        if not 1 <= len(parts) <= 2:
            return None
        node = self.root
        for part in (p for p in parts[-1].split("/") if p):
            node = node.get(part) if isinstance(node, dict) else None
        return node


def _may_hold_any(max_count: object) -> bool:
    """outlines-core renders an object / array whose maxProperties / maxItems is 0 as {} / []."""
    return not (isinstance(max_count, int) and not isinstance(max_count, bool) and max_count < 1)


def llguidance_bounds_exact(schema: object) -> bool:
    """Every numeric bound in `schema` is one llguidance enforces exactly (see the module doc)."""
    if isinstance(schema, list):
        return all(llguidance_bounds_exact(s) for s in schema)
    if not isinstance(schema, dict):
        return True
    for key in _BOUNDS:
        value = schema.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and not _double_exact(value):
            return False
    types = schema.get("type")
    if (types == "number" or isinstance(types, list) and "number" in types) and _zero_exclusive_near_zero(schema):
        return False
    return all(llguidance_bounds_exact(v) for k, v in schema.items() if k not in ("enum", "const"))


def _double_exact(value: int) -> bool:
    try:
        return float(value) == value
    except OverflowError:
        return False


def _zero_exclusive_near_zero(schema: dict) -> bool:
    """An exclusive bound at 0 (draft 6+ number or draft 4 boolean form) beside another bound
    inside (-1, 1)."""
    def num(key: str) -> float | None:
        v = schema.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    lo_zero = num("exclusiveMinimum") == 0 or (num("minimum") == 0 and schema.get("exclusiveMinimum") is True)
    hi_zero = num("exclusiveMaximum") == 0 or (num("maximum") == 0 and schema.get("exclusiveMaximum") is True)
    others = [num(k) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")]
    return (lo_zero or hi_zero) and any(v is not None and 0 < abs(v) < 1 for v in others)
