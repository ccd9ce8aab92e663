"""/openapi.json describes the routes from the msgspec structs; bodies generated from it (valid and mutated), and programs from the IR, never get a 5xx."""
from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from radixflow.frontend.limits import RequestLimits
from radixflow.frontend.server import create_app
from radixflow.lang import ir
from radixflow.runtime.sampling_params import RequestOptions, SamplingParams

from .conftest import LiveServer

FUZZED = ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/generate", "/v1/programs", "/abort_request", "/tokenize",
          "/detokenize", "/separate_reasoning", "/v1/score"]


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[tuple[LiveServer, dict]]:
    from radixflow.runtime import Engine
    from radixflow.runtime.model.demo import demo_model

    # Small bounds keep every generated request cheap; a request past them is a 400, as it should be.
    limits = RequestLimits(max_n=2, max_prompts=2, max_prompt_tokens=256, max_top_logprobs=2)
    with Engine(demo_model("tiny"), kv_cache_tokens=2048, max_model_len=64, grammar_timeout_s=2.0) as engine:
        # a reasoning parser: chat and responses bodies reach its paths (the block, a grammar after it)
        live = LiveServer(create_app(engine, "tiny", limits=limits, reasoning_parser="deepseek_r1")).start()
        doc = httpx.get(live.url + "/openapi.json").json()
        yield live, doc
        live.stop()
        engine.check_accounting()


def test_openapi_document_lists_routes_and_schemas(fuzz_server):
    _, doc = fuzz_server
    assert doc["openapi"].startswith("3.")
    for path in FUZZED + ["/v1/models", "/get_load", "/model_info", "/health_generate"]:
        assert path in doc["paths"], path
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ChatRequest"}
    chat = doc["components"]["schemas"]["ChatRequest"]
    assert {"messages", "model", "temperature", "max_tokens"} <= set(chat["properties"])
    assert set(chat["required"]) == {"messages", "model"}


def _schema(doc: dict, path: str) -> dict:
    ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**ref, "components": doc["components"]}


_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(max_size=8))
_JSONISH = st.recursive(_SCALARS,
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                        max_size=3), max_leaves=6)


def _mutate(body: dict, data: st.DataObject) -> dict:
    """Replace one field with a value of an arbitrary type."""
    if not body:
        return body
    key = data.draw(st.sampled_from(sorted(body)))
    return {**body, key: data.draw(_JSONISH)}


@pytest.mark.parametrize("path", FUZZED)
def test_generated_bodies_never_5xx(fuzz_server, path):
    live, doc = fuzz_server
    schema = _schema(doc, path)
    client = httpx.Client(base_url=live.url, timeout=30)
    deadline = time.monotonic() + 12  # bound the whole route's fuzzing

    @settings(max_examples=20, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(body=from_schema(schema), data=st.data())
    def check(body: dict, data: st.DataObject) -> None:
        if path in ("/v1/completions", "/v1/chat/completions", "/v1/responses") and isinstance(body, dict):
            body["model"] = data.draw(st.sampled_from(["tiny", body.get("model", "x")]))
        if path == "/generate" and isinstance(body, dict) and body.get("text") is None:
            body["text"] = data.draw(st.text(max_size=20) | st.lists(st.text(max_size=5), max_size=2))
            body.pop("input_ids", None)
        bodies = [body, _mutate(body, data) if isinstance(body, dict) else body]
        if time.monotonic() > deadline:  # after every draw: generation must not depend on the clock
            return
        for sent in bodies:
            r = client.post(path, json=sent)
            assert r.status_code < 500, (sent, r.status_code, r.text)
            if r.status_code >= 400:
                assert set(r.json()["error"]) == {"message", "type", "param", "code"}

    try:
        check()
    finally:
        client.close()


# -- programs: /openapi.json shows `program` as an object (the IR is recursive, which
# hypothesis-jsonschema cannot generate), so programs are drawn from the IR's own structs ------


def _of(struct: type) -> st.SearchStrategy:
    return from_schema(msgspec.json.schema(struct))


# Small values of every type: most draws reach the engine, edge values (0, -1, None, "") included.
_SMALL = (st.none() | st.booleans() | st.integers(-2, 3) | st.floats(-1, 2) | st.text(max_size=4)
          | st.lists(st.text(max_size=3), max_size=2))


def _fields(struct: type) -> st.SearchStrategy:
    """A few of `struct`'s fields (few, so that many draws are valid) with small values."""
    return st.dictionaries(st.sampled_from(struct.__struct_fields__), _SMALL, max_size=3)


def _programs() -> st.SearchStrategy:
    flat = st.one_of(*(_of(op) for op in (ir.RoleBegin, ir.RoleEnd, ir.Select, ir.VarRef, ir.ScopeBegin,
                                          ir.ScopeEnd, ir.Join)))
    gen = st.builds(lambda name, params, extras: {"op": "gen", "name": name, "params": params, "extras": extras},
                    st.sampled_from(["a", "b", None]), _fields(SamplingParams), _fields(RequestOptions))
    op = st.one_of(gen, gen, gen, _of(ir.Text), flat)  # mostly gens: they reach the engine
    fork = st.builds(lambda fork_id, n, body: {"op": "fork", "id": fork_id, "n": n, "body": body},
                     st.uuids().map(str), st.integers(-1, 3), st.lists(op, max_size=3))
    return st.lists(op | fork, max_size=5).map(lambda ops: {"program": {"ops": ops}})


def test_generated_programs_never_5xx(fuzz_server):
    live, _ = fuzz_server
    client = httpx.Client(base_url=live.url, timeout=30)
    deadline = time.monotonic() + 15

    @settings(max_examples=40, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(body=_programs())
    def check(body: dict) -> None:
        if time.monotonic() > deadline:
            return
        r = client.post("/v1/programs", json=body)
        assert r.status_code < 500, (body, r.status_code, r.text)

    try:
        check()
    finally:
        client.close()
