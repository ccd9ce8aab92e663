"""logit_bias over HTTP (OpenAI's shape on /v1/chat/completions and /v1/completions,
`sampling_params.logit_bias` on /generate), on both engines (core thread, core process)."""
from __future__ import annotations

import openai
import pytest

from .conftest import API_KEY, MODEL_NAME

MAX_TOKENS = 4


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


def _forced(engine) -> tuple[int, str]:
    """A token and the text of MAX_TOKENS of it."""
    token = engine.tokenizer.encode(" the")[-1]
    return token, engine.tokenizer.decode([token] * MAX_TOKENS)


def test_plus_100_forces_its_token_on_both_openai_routes(oai, engine):
    token, text = _forced(engine)
    common = {"model": MODEL_NAME, "max_tokens": MAX_TOKENS, "logit_bias": {str(token): 100},
              "extra_body": {"ignore_eos": True}}
    out = oai.completions.create(prompt="Once upon a", temperature=0, **common)
    assert out.choices[0].text == text and out.usage.completion_tokens == MAX_TOKENS
    out = oai.completions.create(prompt="Once upon a", temperature=1.0, n=2, seed=3, **common)
    assert [c.text for c in out.choices] == [text, text]
    chat = oai.chat.completions.create(messages=[{"role": "user", "content": "hi"}], temperature=0.8, **common)
    assert chat.choices[0].message.content == text


def test_minus_100_bans_the_greedy_token_on_generate(client):
    body = {"text": "Once upon a", "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
    plain = client.post("/generate", json=body).json()["output_ids"]
    body["sampling_params"]["logit_bias"] = {str(plain[0]): -100}
    biased = client.post("/generate", json=body).json()["output_ids"]
    assert biased[0] != plain[0] and plain[0] not in biased


def _requests(bias) -> list[tuple[str, dict]]:
    return [("/v1/completions", {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, "logit_bias": bias}),
            ("/v1/chat/completions", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 2, "logit_bias": bias}),
            ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "logit_bias": bias}})]


@pytest.mark.parametrize("bias", [
    {"abc": 1}, {"-1": 1}, {"1.0": 1}, {"99999999": 1}, "vocab_size", {"5": 101}, {"5": -100.5}, {"5": "x"},
    {str(i): 1 for i in range(301)}, [5],
], ids=["word", "negative", "float-key", "huge-id", "vocab-size", "101", "-100.5", "string-value", "301-entries",
        "list"])
def test_bad_logit_bias_is_a_400_naming_it(client, engine, bias):
    if bias == "vocab_size":  # the first id past the vocabulary
        bias = {str(engine.vocab_size): 1}
    for path, body in _requests(bias):
        r = client.post(path, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", (path, r.text)
