"""JSON-schema keywords outlines-core would compile as if absent (`not`, `if`, `contains`, ...) are
refused with the keyword and where it is, never ignored; names and values that merely spell them
are not keywords."""
from __future__ import annotations

import pytest

from radixflow.runtime.grammar.outlines_backend import to_regex
from radixflow.runtime.grammar.schema_keywords import IGNORED, check_enforceable
from radixflow.runtime.grammar.spec import GrammarKey
from radixflow.runtime.grammar.backend import GrammarError

OBJ = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize("keyword", IGNORED)
def test_each_ignored_keyword_is_refused_where_it_is(keyword):
    schema = {"type": "object", "properties": {"x": {"type": "array", "items": {keyword: {}}}}}
    with pytest.raises(ValueError, match=f"'{keyword}' at #/properties/x/items is not supported"):
        check_enforceable(schema)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"not": {"type": "integer"}, "if": {"type": "string"}}, "required": ["not"]},
    {"enum": [{"not": 1}], "default": {"contains": 2}},
    {"$defs": {"contains": {"type": "string"}}, "anyOf": [{"$ref": "#/$defs/contains"}]},
    {**OBJ, "minProperties": 1, "maxProperties": 2, "additionalProperties": False},
    {"type": "object", "minProperties": 2},  # without properties outlines-core keeps the bound
])
def test_names_values_and_kept_bounds_pass(schema):
    check_enforceable(schema)
    to_regex(GrammarKey("json_schema", __import__("json").dumps(schema)))


@pytest.mark.parametrize("schema, keyword", [
    ({**OBJ, "minProperties": 2}, "minProperties"),
    ({**OBJ, "maxProperties": 1}, "maxProperties"),
    ({**OBJ, "maxProperties": 2, "additionalProperties": True}, "maxProperties"),
])
def test_property_counts_beside_properties_are_refused_unless_always_met(schema, keyword):
    with pytest.raises(ValueError, match=keyword):
        check_enforceable(schema)


def test_the_outlines_compile_refuses_them():
    with pytest.raises(GrammarError, match="'not' at # is not supported"):
        to_regex(GrammarKey("json_schema", '{"type": "integer", "not": {"const": 3}}'))
