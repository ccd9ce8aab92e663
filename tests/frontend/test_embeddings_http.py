"""POST /v1/embeddings (through the openai client too) and SGLang's /encode, on both engine kinds:
the vectors are Engine.encode's, bad input a 400 naming the field, nothing left running."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from .conftest import API_KEY, MODEL_NAME


def test_embeddings_are_the_engines_and_usage_counts_the_prompt_tokens(client, engine, wait_idle):
    r = client.post("/v1/embeddings", json={"model": MODEL_NAME, "input": ["the river ran", "a small cat"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == MODEL_NAME and body["id"].startswith("embd-")
    want = engine.encode(["the river ran", "a small cat"])
    assert [d["index"] for d in body["data"]] == [0, 1] and all(d["object"] == "embedding" for d in body["data"])
    for got, exp in zip(body["data"], want):
        np.testing.assert_allclose(got["embedding"], exp["embedding"], rtol=1e-4, atol=2e-3)  # bf16 or fp32 engine
        assert len(got["embedding"]) == engine.hidden_size
    tokens = sum(len(engine.tokenizer.encode(t)) for t in ("the river ran", "a small cat"))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    wait_idle(engine)


def test_token_id_inputs_and_base64(client, engine):
    ids = engine.tokenizer.encode("once upon a time")
    floats = client.post("/v1/embeddings", json={"model": MODEL_NAME, "input": ids}).json()["data"][0]["embedding"]
    packed = client.post("/v1/embeddings", json={"model": MODEL_NAME, "input": [ids, ids[:2]],
                                                 "encoding_format": "base64"}).json()["data"]
    decoded = np.frombuffer(base64.b64decode(packed[0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, np.asarray(floats, dtype=np.float32), rtol=1e-4, atol=2e-3)
    assert decoded.shape == (engine.hidden_size,)
    assert abs(float(np.linalg.norm(decoded)) - 1.0) < 1e-3
    same = client.post("/v1/embeddings", json={"model": MODEL_NAME, "input": "once upon a time",
                                               "dimensions": engine.hidden_size}).json()["data"][0]["embedding"]
    np.testing.assert_allclose(same, floats, rtol=1e-4, atol=2e-3)


def test_the_openai_client(server, engine):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY)
    out = client.embeddings.create(model=MODEL_NAME, input=["red green blue", "numbers one two"])
    assert len(out.data) == 2 and len(out.data[0].embedding) == engine.hidden_size
    np.testing.assert_allclose(out.data[1].embedding, engine.encode("numbers one two")["embedding"], rtol=1e-4,
                               atol=2e-3)
    assert out.usage.prompt_tokens > 0


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": [1, "a"]}, "input"),
    ({"input": [[1, 2], []]}, "input"),
    ({"input": [10 ** 9]}, "input"),
    ({"input": "hi", "dimensions": 3}, "dimensions"),
    ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "hi", "temperature": 0.5}, "temperature"),
    ({"model": "other", "input": "hi"}, "model"),
])
def test_bad_embedding_requests_are_400s_naming_the_field(client, engine, wait_idle, body, param):
    r = client.post("/v1/embeddings", json={"model": MODEL_NAME, **body})
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param
    wait_idle(engine, kv=False)


def test_native_encode(client, engine):
    one = client.post("/encode", json={"text": "the river ran"}).json()
    assert set(one) == {"embedding", "meta_info"} and one["meta_info"]["prompt_tokens"] > 0
    np.testing.assert_allclose(one["embedding"], engine.encode("the river ran")["embedding"], rtol=1e-4, atol=2e-3)
    ids = engine.tokenizer.encode("a small cat")
    many = client.post("/encode", json={"input_ids": [ids, ids], "rid": ["e1", "e2"]}).json()
    assert [m["meta_info"]["id"] for m in many] == ["e1", "e2"]
    np.testing.assert_allclose(many[0]["embedding"], many[1]["embedding"], rtol=1e-5, atol=1e-5)
    for body, param in (({"text": "a", "input_ids": [1]}, "text"), ({"input_ids": [1, [2]]}, "input_ids"),
                        ({"input_ids": []}, "input_ids"), ({"text": []}, "text"), ({"text": "a", "rid": ["x", "y"]}, "rid"), ({"text": ["a", "b"], "rid": "x"}, "rid")):
        r = client.post("/encode", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)


def test_the_embedding_routes_are_in_the_openapi_document(client):
    doc = client.get("/openapi.json").json()
    assert {"/v1/embeddings", "/encode"} <= set(doc["paths"])
    assert "EmbeddingRequest" in doc["components"]["schemas"]


def test_the_embedding_routes_need_the_api_key(server):
    import httpx

    for path, body in (("/v1/embeddings", {"model": MODEL_NAME, "input": "hi"}), ("/encode", {"text": "hi"})):
        r = httpx.post(server.url + path, json=body, timeout=30)
        assert r.status_code == 401, (path, r.text)


def test_an_input_longer_than_the_context_names_the_field(client, engine):
    ids = list(range(5, 5 + engine.max_context_len + 1))
    r = client.post("/v1/embeddings", json={"model": MODEL_NAME, "input": [ids[:3], ids]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "input" and error["code"] == "context_length_exceeded", error
    r = client.post("/encode", json={"input_ids": ids})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_ids"


def test_an_aborted_embedding_is_no_server_error(live_server):
    """/abort_request of a running /encode or /v1/embeddings: /encode answers as /generate does
    (200, embedding null, finish_reason abort), /v1/embeddings a 400 saying it was aborted;
    neither is a 500. Prefill goes 2 tokens a step here, so the abort lands mid-prefill."""
    import threading
    import time

    import httpx

    from radixflow.frontend.server import create_app
    from radixflow.runtime import Engine
    from radixflow.runtime.model.demo import demo_model

    headers = {"Authorization": f"Bearer {API_KEY}"}
    long = list(range(5, 1500))
    with Engine(demo_model("tiny"), kv_cache_tokens=4096, chunked_prefill_size=2, max_prefill_tokens=2) as engine:
        server = live_server(create_app(engine, MODEL_NAME, API_KEY)).start()
        try:
            for path, body, abort in (("/encode", {"input_ids": long, "rid": "emb-abort"}, {"rid": "emb-abort"}),
                                      ("/v1/embeddings", {"model": MODEL_NAME, "input": [long, long[:9]]},
                                       {"abort_all": True})):
                done = {}
                thread = threading.Thread(target=lambda: done.setdefault(
                    "r", httpx.post(server.url + path, json=body, headers=headers, timeout=120)))
                thread.start()
                deadline = time.monotonic() + 30
                while engine.stats().num_running == 0:
                    assert time.monotonic() < deadline
                    time.sleep(0.001)
                httpx.post(server.url + "/abort_request", json=abort, headers=headers, timeout=30)
                thread.join()
                r = done["r"]
                if path == "/encode":
                    assert r.status_code == 200, r.text
                    assert r.json()["embedding"] is None and r.json()["meta_info"]["finish_reason"]["type"] == "abort"
                else:
                    assert r.status_code == 400, r.text
                    assert r.json()["error"]["code"] == "request_aborted"
            engine.check_accounting()
        finally:
            server.stop()
