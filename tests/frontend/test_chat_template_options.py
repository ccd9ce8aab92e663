"""vLLM's chat-template options on /v1/chat/completions and /tokenize: `add_generation_prompt`,
`continue_final_message` (the model goes on writing the last message) and `chat_template_kwargs`
(extra variables for the template)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from radixflow.frontend.server import create_app

from .conftest import MODEL_NAME, LiveServer

PARTIAL = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "The color is"}]


def test_continue_final_message_prompts_with_the_open_message(client, engine):
    body = {"model": MODEL_NAME, "messages": PARTIAL, "add_generation_prompt": False,
            "continue_final_message": True, "max_tokens": 4, "temperature": 0}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    expected = engine.tokenizer.apply_chat_template(PARTIAL, continue_final_message=True, tokenize=True)
    assert r.json()["usage"]["prompt_tokens"] == len(expected)
    # the same ids through /tokenize, and the same text as a completion of the rendered prompt
    tokenized = client.post("/tokenize", json={"messages": PARTIAL, "add_generation_prompt": False,
                                               "continue_final_message": True}).json()
    assert tokenized["tokens"] == expected
    completion = client.post("/v1/completions", json={"model": MODEL_NAME, "prompt": expected, "max_tokens": 4,
                                                      "temperature": 0}).json()
    assert r.json()["choices"][0]["message"]["content"] == completion["choices"][0]["text"]


def test_add_generation_prompt_false_leaves_the_turn_closed(client, engine):
    messages = PARTIAL[:1]
    r = client.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": messages, "max_tokens": 1,
                                                  "add_generation_prompt": False})
    assert r.status_code == 200, r.text
    closed = engine.tokenizer.apply_chat_template(messages, tokenize=True)
    assert r.json()["usage"]["prompt_tokens"] == len(closed)


@pytest.mark.parametrize("extra, param", [
    ({"continue_final_message": True}, "continue_final_message"),  # add_generation_prompt defaults to true
    ({"continue_final_message": True, "add_generation_prompt": False,
      "messages": [PARTIAL[0], {"role": "assistant", "content": ""}]}, "messages"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": ["x"]}, "chat_template_kwargs"),
])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_conflicting_options_are_a_400(client, path, extra, param):
    body = {"model": MODEL_NAME, "messages": PARTIAL, "max_tokens": 1, **extra}
    if path == "/tokenize":
        body.pop("max_tokens")
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.fixture(scope="module")
def templated_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    from radixflow.runtime import Engine
    from radixflow.runtime.model.demo import demo_model

    template = Path(tmp_path_factory.mktemp("template")) / "chat_template.jinja"
    template.write_text("{% if mood is defined %}{{ '[' + mood + ']' }}{% endif %}"
                        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                        "{% if add_generation_prompt %}<assistant>{% endif %}")
    with Engine(demo_model("tiny"), kv_cache_tokens=1024, chat_template=str(template)) as engine:
        live = LiveServer(create_app(engine, MODEL_NAME)).start()
        yield live
        live.stop()


def test_chat_template_kwargs_reach_the_template(templated_server):
    url = templated_server.url
    messages = [{"role": "user", "content": "hi"}]
    plain = httpx.post(url + "/tokenize", json={"messages": messages}).json()
    moody = httpx.post(url + "/tokenize", json={"messages": messages,
                                                "chat_template_kwargs": {"mood": "cheerful"}}).json()
    engine_tokenizer = templated_server.app.state.server.engine.tokenizer
    assert moody["tokens"] == engine_tokenizer.encode("[cheerful]<user>hi<assistant>", add_special_tokens=False)
    assert plain["tokens"] == engine_tokenizer.encode("<user>hi<assistant>", add_special_tokens=False)
    r = httpx.post(url + "/v1/chat/completions", json={"model": MODEL_NAME, "messages": messages, "max_tokens": 1,
                                                       "chat_template_kwargs": {"mood": "cheerful"}})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == moody["count"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_a_kwarg_the_template_cannot_use_is_a_400(templated_server, path):
    """`'[' + mood + ']'` with a number raises TypeError inside the template: the caller's data,
    not a server fault."""
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"mood": 3}}
    r = httpx.post(templated_server.url + path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages" and "TypeError" in r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_kwargs_named_like_the_renderers_own_parameters_are_variables(client, path):
    """`self` and `kwargs` are no parameter of apply_chat_template: just variables the template ignores."""
    body = {"model": MODEL_NAME, "messages": PARTIAL[:1], "chat_template_kwargs": {"self": 1, "kwargs": {}}}
    plain = client.post("/tokenize", json={"messages": PARTIAL[:1]}).json()
    r = client.post(path, json=body if path == "/tokenize" else {**body, "max_tokens": 1})
    assert r.status_code == 200, r.text
    count = r.json()["count"] if path == "/tokenize" else r.json()["usage"]["prompt_tokens"]
    assert count == plain["count"]


@pytest.mark.parametrize("final", ["<", "d", "end", "  x "])
def test_continue_final_message_cuts_after_the_content_not_in_the_markup(client, engine, final):
    """A final message whose text also occurs in the markup after it ("<" and "d" in "<|im_end|>")
    is continued from the message, not from inside the end tag."""
    messages = [PARTIAL[0], {"role": "assistant", "content": final}]
    r = client.post("/tokenize", json={"messages": messages, "add_generation_prompt": False,
                                       "continue_final_message": True})
    assert r.status_code == 200, r.text
    text = engine.tokenizer.decode(r.json()["tokens"], skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n" + final), text
