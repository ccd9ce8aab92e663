"""JSON-schema keywords outlines-core would compile as if absent (`not`, `if`, `contains`, ...) are
refused with the keyword and where it is, never ignored; names and values that merely spell them
are not keywords."""
from __future__ import annotations

import json
import re

import jsonschema
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
    # pydantic's discriminated union whose tags spell keywords: the mapping's keys are tag values
    {"oneOf": [{"$ref": "#/$defs/If"}], "discriminator": {"propertyName": "k", "mapping": {"if": "#/$defs/If"}},
     "$defs": {"If": {"type": "object", "properties": {"k": {"const": "if"}}, "required": ["k"]}}},
    {**OBJ, "minProperties": 1, "maxProperties": 2, "additionalProperties": False},
])
def test_names_values_and_kept_bounds_pass(schema):
    check_enforceable(schema)
    to_regex(GrammarKey("json_schema", json.dumps(schema)))


@pytest.mark.parametrize("schema, keyword", [
    ({**OBJ, "minProperties": 2}, "minProperties"),
    ({**OBJ, "maxProperties": 1}, "maxProperties"),
])
def test_property_counts_beside_properties_are_refused_unless_always_met(schema, keyword):
    with pytest.raises(ValueError, match=keyword):
        check_enforceable(schema)


def test_the_outlines_compile_refuses_them():
    with pytest.raises(GrammarError, match="'not' at # is not supported"):
        to_regex(GrammarKey("json_schema", '{"type": "integer", "not": {"const": 3}}'))


# Each schema, with the text outlines-core's regex admits (measured, 0.2.14) though it breaks the schema.
DROPPED = [
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
     '{"a":1}{"b":2}', "allOf"),  # the members one after another: not JSON
    ({**OBJ, "required": ["a", "z"]}, '{"a":1}', "required"),
    ({**OBJ, "anyOf": [{"required": ["b"]}]}, '{"a":1}', "anyOf"),
    ({**OBJ, "enum": [{"a": 2}]}, '{"a":1}', "enum"),
    ({**OBJ, "$ref": "#/$defs/B", "$defs": {"B": {"required": ["b"]}}}, '{"a":1}', "$ref"),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 2}, "[1]", "minItems"),
    ({"type": "array", "prefixItems": [{"type": "integer"}] * 2, "maxItems": 1}, "[1,2]", "maxItems"),
    ({"type": "object", "minProperties": 2}, '{"a":1}', "minProperties"),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1}, '{"a":1,"b":2}',
     "maxProperties"),
    ({"type": "object", "unevaluatedProperties": {"type": "integer"}}, '{"a":"x"}', "unevaluatedProperties"),
    ({"type": "array", "unevaluatedItems": {"type": "integer"}}, '["x"]', "unevaluatedItems"),
]


@pytest.mark.parametrize("schema, witness, keyword", DROPPED)
def test_keywords_outlines_core_drops_in_place_are_refused(monkeypatch, schema, witness, keyword):
    from radixflow.runtime.grammar import outlines_backend

    with pytest.raises(GrammarError, match=re.escape(f"'{keyword}' at # ")):
        to_regex(GrammarKey("json_schema", json.dumps(schema)))
    monkeypatch.setattr(outlines_backend, "check_enforceable", lambda _schema: None)
    assert re.fullmatch(to_regex(GrammarKey("json_schema", json.dumps(schema))), witness)  # what it would admit
    with pytest.raises((jsonschema.ValidationError, ValueError)):
        jsonschema.validate(json.loads(witness), schema)


@pytest.mark.parametrize("schema", [
    {"allOf": [{"$ref": "#/$defs/A"}], "$defs": {"A": {"type": "integer"}}},  # pydantic v1's field form
    {**OBJ, "additionalProperties": {"type": "string"}, "unevaluatedProperties": False},  # no extra keys anyway
    {"type": "array", "prefixItems": [{"type": "integer"}] * 2, "minItems": 2, "maxItems": 3, "items": False},
    {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1},
    {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 0},
    {"type": "array", "items": {"type": "integer"}, "unevaluatedItems": False},
])
def test_kept_or_harmless_beside_what_outlines_core_renders(schema):
    check_enforceable(schema)
    to_regex(GrammarKey("json_schema", json.dumps(schema)))


@pytest.mark.parametrize("extra", [True, {"type": "integer"}])
def test_max_properties_beside_properties_hold_whatever_additional_properties_says(extra):
    """Beside properties outlines-core writes no other key, so a bound no lower than their number holds."""
    regex = to_regex(GrammarKey("json_schema", json.dumps({**OBJ, "maxProperties": 2, "additionalProperties": extra})))
    assert re.fullmatch(regex, '{"a":1,"b":2}') and not re.fullmatch(regex, '{"a":1,"b":2,"c":3}')


def test_with_llguidance_a_schema_outlines_core_would_not_enforce_compiles_there():
    """allOf of two members and anyOf beside properties: exact on llguidance; `not`, which
    llguidance does not implement either, is still refused naming it."""
    pytest.importorskip("llguidance")
    from radixflow.runtime import Engine
    from radixflow.runtime.model.demo import demo_model

    both = {"allOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 5}]}
    beside = {"type": "object", "properties": {"a": {"enum": [1]}}, "anyOf": [{"required": ["a"]}],
              "additionalProperties": False}
    with Engine(demo_model("tiny"), kv_cache_tokens=2048) as engine:
        for schema in (both, beside):
            with pytest.raises(ValueError):
                check_enforceable(schema)  # outlines-core would not enforce it
            assert engine.grammar.backend_for(GrammarKey("json_schema", json.dumps(schema))) == "llguidance"
            for out in engine.generate(["x"] * 3, {"json_schema": schema, "max_new_tokens": 40, "seed": 1}):
                assert out["meta_info"]["finish_reason"]["type"] == "stop", out
                jsonschema.validate(json.loads(out["text"]), schema)
        with pytest.raises(ValueError, match="'not' at # is not supported"):
            engine.generate("x", {"json_schema": {"type": "integer", "not": {"const": 3}}, "max_new_tokens": 4})
