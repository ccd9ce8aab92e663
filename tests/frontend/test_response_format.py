"""response_format: mapped onto the engine's json_schema when it has constrained decoding, else 400."""
from __future__ import annotations

import json
import types
from decimal import Decimal

import pytest

from radixflow.frontend.errors import APIError
from radixflow.frontend.openai_sampling import response_format_params
from radixflow.frontend.openai_schemas import JsonSchemaFormat, ResponseFormat

SCHEMA = {"enum": ["yes", "no"]}


def test_mapping_and_switch():
    with_grammar, without = types.SimpleNamespace(supports_grammar=True), types.SimpleNamespace()
    assert response_format_params(None, without) == {}
    assert response_format_params(ResponseFormat("text"), without) == {}
    assert response_format_params(ResponseFormat("json_object"), with_grammar) == {"json_schema": {"type": "object"}}
    fmt = ResponseFormat("json_schema", JsonSchemaFormat(name="yn", schema=SCHEMA))
    assert response_format_params(fmt, with_grammar) == {"json_schema": SCHEMA}
    for f in (fmt, ResponseFormat("json_object")):
        with pytest.raises(APIError, match="not supported yet") as info:
            response_format_params(f, without)
        assert info.value.status == 400 and info.value.param == "response_format"


def test_json_schema_over_http(client, engine):
    assert engine.supports_grammar
    body = {"model": "tiny", "messages": [{"role": "user", "content": "yes or no?"}], "max_tokens": 8,
            "temperature": 1.0, "response_format": {"type": "json_schema",
                                                    "json_schema": {"name": "yn", "schema": SCHEMA}}}
    for _ in range(3):
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert json.loads(r.json()["choices"][0]["message"]["content"]) in ("yes", "no")


def test_json_object_over_http(client):
    body = {"model": "tiny", "prompt": "Some JSON:", "max_tokens": 64, "temperature": 1.0,
            "response_format": {"type": "json_object"}}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"].startswith("{")
    if choice["finish_reason"] == "stop":  # complete output must parse as an object
        assert isinstance(json.loads(choice["text"]), dict)


def test_number_bounds_over_http(client):
    """A bounded number schema through response_format: every finished value is in range (exactly)."""
    schema = {"type": "number", "minimum": 0.5, "exclusiveMaximum": 2.25}
    body = {"model": "tiny", "prompt": "A number:", "max_tokens": 32, "temperature": 1.0, "n": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    done = [c for c in r.json()["choices"] if c["finish_reason"] == "stop"]
    assert done
    for c in done:
        x = json.loads(c["text"], parse_float=Decimal, parse_int=Decimal)
        assert Decimal("0.5") <= x < Decimal("2.25"), c["text"]
    too_precise = {"type": "number", "minimum": 1e-300}
    bad = client.post("/v1/completions", json={**body, "n": 1, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": too_precise}}})
    assert bad.status_code == 400 and "too long" in bad.json()["error"]["message"]


def test_invalid_schema_is_400(client):
    body = {"model": "tiny", "prompt": "x", "max_tokens": 4,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "bad", "schema": {"type": "no-such-type"}}}}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["message"]
    ok = client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
    assert ok.status_code == 200


@pytest.mark.parametrize("message", ["json_schema: grammar compilation exceeded the 5 s limit",
                                     "json_schema is not supported: Unsupported type: frob"])
@pytest.mark.parametrize("constraint", ["response_format", "tools"])
def test_grammar_errors_name_the_constraint(message, constraint):
    """A schema whose compilation times out is as much the constraint's fault as one that does not
    compile: both name the field that carried it (the timeout's "json_schema:" used to name none)."""
    from radixflow.frontend.errors import bad_request

    assert bad_request(ValueError(message), {"json_schema": constraint}).param == constraint
