"""POST /tokenize and /detokenize (and their /v1/ aliases): the server's own tokenizer and chat
template, vLLM's response shapes, SGLang's list prompts, bad input a 400 naming the field."""
from __future__ import annotations

import pytest

from .conftest import MODEL_NAME


def test_tokenize_a_prompt_gives_the_ids_generate_would_use(client, engine):
    r = client.post("/tokenize", json={"model": MODEL_NAME, "prompt": "Hello world, hello"})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = engine.tokenizer.encode("Hello world, hello")
    assert body["tokens"] == ids
    assert body["count"] == len(ids)
    assert body["max_model_len"] == engine.max_context_len
    assert body["token_strs"] is None
    # the count is what a completion with the same prompt reports as its prompt tokens
    usage = client.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "Hello world, hello",
                                                 "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == body["count"]


def test_tokenize_special_tokens_and_token_strings(client, engine):
    bare = client.post("/v1/tokenize", json={"prompt": "abc", "add_special_tokens": False,
                                             "return_token_strs": True}).json()
    assert bare["tokens"] == engine.tokenizer.encode("abc", add_special_tokens=False)
    assert bare["token_strs"] == [engine.tokenizer.id_to_token(i) for i in bare["tokens"]]


def test_tokenize_messages_renders_the_chat_template(client, engine):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    body = client.post("/tokenize", json={"model": MODEL_NAME, "messages": messages}).json()
    expected = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert body["tokens"] == expected
    usage = client.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": messages,
                                                      "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == body["count"]
    no_prompt = client.post("/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
    assert no_prompt["tokens"] == engine.tokenizer.apply_chat_template(messages, tokenize=True)
    assert no_prompt["count"] < body["count"]


def test_tokenize_a_list_of_prompts(client, engine):
    body = client.post("/tokenize", json={"prompt": ["one", "two three"]}).json()
    assert body["tokens"] == [engine.tokenizer.encode("one"), engine.tokenizer.encode("two three")]
    assert body["count"] == [len(t) for t in body["tokens"]]


def test_detokenize_round_trips(client, engine):
    ids = engine.tokenizer.encode("Paris is the capital", add_special_tokens=False)
    for path in ("/detokenize", "/v1/detokenize"):
        r = client.post(path, json={"model": MODEL_NAME, "tokens": ids})
        assert r.status_code == 200, r.text
        assert r.json() == {"prompt": "Paris is the capital", "text": "Paris is the capital"}
    many = client.post("/detokenize", json={"tokens": [ids, ids[:1]]}).json()
    assert many["text"] == ["Paris is the capital", engine.tokenizer.decode(ids[:1])]


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {}, None),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, None),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": "a", "model": "other-model"}, "model"),
    ("/tokenize", {"prompt": "a", "bogus": 1}, "bogus"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": [{"role": "user"}], "add_generation_prompt": "yes"}, "add_generation_prompt"),
    ("/detokenize", {"tokens": [1, -1]}, "tokens"),
    ("/detokenize", {"tokens": [10 ** 9]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
    ("/detokenize", {}, "tokens"),
])
def test_bad_input_is_a_400_naming_the_field(client, path, body, param):
    r = client.post(path, json=body)
    assert r.status_code in (400, 404), r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert error["message"]


def test_the_prompt_character_limit_holds(live_server, engine):
    from radixflow.frontend.limits import RequestLimits
    from radixflow.frontend.server import create_app
    import httpx

    live = live_server(create_app(engine, MODEL_NAME, limits=RequestLimits(max_prompt_chars=10,
                                                                          max_prompts=2))).start()
    try:
        long = httpx.post(live.url + "/tokenize", json={"prompt": "x" * 11})
        assert long.status_code == 400 and long.json()["error"]["code"] == "limit_exceeded"
        many = httpx.post(live.url + "/tokenize", json={"prompt": ["a", "b", "c"]})
        assert many.status_code == 400 and many.json()["error"]["param"] == "prompt"
        ids = httpx.post(live.url + "/detokenize", json={"tokens": [[1]] * 3})
        assert ids.status_code == 400 and ids.json()["error"]["param"] == "tokens"
    finally:
        live.stop()
