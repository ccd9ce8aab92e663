"""`--reasoning-parser` through the live server (both engine cores): a thinking model's block as
message.reasoning_content / reasoning, whole and streamed alike, the answer as content and alone
parsed for tool calls, the request switches (separate_reasoning, include_reasoning,
enable_thinking), reasoning sent back in assistant turns, and the Responses API's reasoning item.
The tiny random model writes what a regex forces, or its own text for the forced-open formats."""
from __future__ import annotations

import json
import re

import httpx
import pytest

from radixflow.frontend.server import create_app

MODEL_NAME = "tiny"
THOUGHT = "<think>\nThe capital of France.\n</think>\n\nParis."
CALL = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}}}}]
BASE = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Capital of France?"}], "max_tokens": 60,
        "temperature": 0}


@pytest.fixture(scope="module")
def r1(engine, live_server):
    live = live_server(create_app(engine, MODEL_NAME, reasoning_parser="deepseek-r1")).start()
    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield c
    live.stop()


def _chat(client, **extra):
    r = client.post("/v1/chat/completions", json={**BASE, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _streamed(client, **extra):
    """The first choice as a client rebuilds it from the deltas."""
    with client.stream("POST", "/v1/chat/completions", json={**BASE, **extra, "stream": True}) as r:
        assert r.status_code == 200
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    out = {"content": "", "reasoning_content": "", "reasoning": "", "tool_calls": [], "finish_reason": None}
    for chunk in map(json.loads, events[:-1]):
        for c in chunk["choices"]:
            for key in ("content", "reasoning_content", "reasoning"):
                out[key] += c["delta"].get(key) or ""
            out["tool_calls"] += [call["function"] for call in c["delta"].get("tool_calls", [])]
            out["finish_reason"] = c["finish_reason"] or out["finish_reason"]
    return out


def _as_streamed(choice):
    message = choice["message"]
    return {"content": message["content"] or "", "reasoning_content": message.get("reasoning_content") or "",
            "reasoning": message.get("reasoning") or "", "finish_reason": choice["finish_reason"],
            "tool_calls": [c["function"] for c in message.get("tool_calls") or []]}


# a grammar holds after </think> while the model thinks; told not to think, from the first token
UNTHINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def test_the_block_is_reasoning_and_the_rest_content(r1, client):
    forced = {"regex": re.escape(THOUGHT), **UNTHINKING}
    whole = _chat(r1, **forced)
    assert whole["message"] == {"role": "assistant", "content": "Paris.",
                                "reasoning_content": "The capital of France.", "reasoning": "The capital of France."}
    assert _streamed(r1, **forced) == _as_streamed(whole)
    # vLLM's include_reasoning false: the answer alone; SGLang's separate_reasoning false: the text as written
    assert _chat(r1, include_reasoning=False, **forced)["message"] == {"role": "assistant", "content": "Paris."}
    assert _chat(r1, separate_reasoning=False, **forced)["message"] == {"role": "assistant", "content": THOUGHT}
    # a server without --reasoning-parser leaves the text alone
    assert _chat(client, **forced)["message"] == {"role": "assistant", "content": THOUGHT}


def test_a_grammar_holds_after_the_block(r1, client):
    """Thinking on, a constraint starts after </think>: the random model never writes it, so its
    output is the unconstrained one, all reasoning; told not to think, the grammar holds at once."""
    for extra in ({"regex": "yes|no"}, {"response_format": {"type": "json_object"}}, {"tool_choice": "required",
                                                                                         "tools": TOOLS}):
        plain = _chat(client, max_tokens=8, tools=extra.get("tools"))["message"]["content"]  # same prompt
        thinking = _chat(r1, max_tokens=8, **extra)
        assert thinking["message"] == {"role": "assistant", "content": None, "reasoning_content": plain.strip(),
                                       "reasoning": plain.strip()}, extra
    assert _chat(r1, regex="yes|no", **UNTHINKING)["message"]["content"] in ("yes", "no")


def test_an_output_that_never_closes_the_block_is_all_reasoning(r1, client):
    """deepseek_r1: the template opened the block, so the output thinks from its first token; told
    not to think (enable_thinking false) it is content."""
    plain = _chat(client)["message"]["content"]
    whole = _chat(r1)
    assert whole["message"]["content"] is None and whole["message"]["reasoning_content"] == plain.strip()
    assert _streamed(r1) == _as_streamed(whole)
    assert _chat(r1, chat_template_kwargs={"enable_thinking": False})["message"] == {"role": "assistant",
                                                                                     "content": plain}


def test_a_continued_final_message_is_read_from_where_it_stops(r1, client):
    """continue_final_message: the output goes on from the final message's text, not from a new
    turn the template opened, so it is in the block only when that text leaves one open, and a
    grammar waits for </think> only then."""
    def continued(c, text, **extra):
        messages = [BASE["messages"][0], {"role": "assistant", "content": text}]
        return _chat(c, messages=messages, add_generation_prompt=False, continue_final_message=True, max_tokens=8,
                     **extra)["message"]

    assert continued(r1, "<think>x</think>", regex="yes|no")["content"] in ("yes", "no")
    assert continued(r1, "It is", regex="yes|no")["content"] in ("yes", "no")
    plain = continued(client, "It is")["content"]  # the random model never writes </think>
    assert continued(r1, "It is") == {"role": "assistant", "content": plain}
    assert continued(r1, "<think>Hmm", regex="yes|no")["reasoning_content"] == continued(client, "<think>Hmm")[
        "content"].strip()
    r = r1.post("/v1/chat/completions", json={**BASE, "messages": [], "add_generation_prompt": False,
                                              "continue_final_message": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_tool_calls_are_read_from_the_answer_only(r1):
    text = f"<think>Maybe {CALL}?</think>{CALL}"
    extra = {"regex": re.escape(text), "tools": TOOLS, "max_tokens": 200, **UNTHINKING}
    whole = _chat(r1, **extra)
    message = whole["message"]
    assert message["reasoning_content"] == f"Maybe {CALL}?" and message["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [("add", '{"a": 1}')]
    assert whole["finish_reason"] == "tool_calls"
    assert _streamed(r1, **extra) == _as_streamed(whole)


def test_reasoning_sent_back_in_an_assistant_turn_is_accepted(r1):
    messages = [BASE["messages"][0], {"role": "assistant", "content": "Paris.", "reasoning_content": "France."},
                {"role": "user", "content": "And Italy?"}, {"role": "assistant", "content": "Rome.",
                                                            "reasoning": "Italy."}, {"role": "user", "content": "ok"}]
    assert _chat(r1, messages=messages, max_tokens=1)["finish_reason"] == "length"


def test_the_parser_name_is_checked_and_shown(r1, capsys):
    with pytest.raises(ValueError, match="--reasoning-parser must be one of"):
        create_app(object(), MODEL_NAME, reasoning_parser="o1")
    assert r1.get("/get_server_info").json()["reasoning_parser"] == "deepseek_r1"
    from radixflow.frontend.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    assert ("--reasoning-parser {deepseek_r1,qwen3,qwen3_thinking,seed_oss,gpt_oss,deepseek_v3,kimi,kimi_k2,"
            "deepseek-r1,qwen3-thinking,seed-oss,gpt-oss,deepseek-v3,kimi-k2,openai_gptoss,glm45,deepseek_v31}"
            in capsys.readouterr().out)


def test_responses_give_the_block_as_a_reasoning_item(r1, engine, live_server):
    import openai

    chat = _chat(r1, max_tokens=6)["message"]
    with openai.OpenAI(base_url=str(r1.base_url).rstrip("/") + "/v1", api_key="x", max_retries=0) as oai:
        kwargs = {"model": MODEL_NAME, "input": BASE["messages"][0]["content"], "max_output_tokens": 6,
                  "temperature": 0}
        whole = oai.responses.create(**kwargs)
        [item] = whole.output
        assert item.type == "reasoning" and item.id.startswith("rs_") and item.status == "incomplete"
        assert [part.text for part in item.content] == [chat["reasoning_content"]] and whole.output_text == ""
        events = list(oai.responses.create(**kwargs, stream=True))
        deltas = [e for e in events if e.type == "response.reasoning_text.delta"]
        assert [e.type for e in events] == ["response.created", "response.in_progress", "response.output_item.added",
                                            *[d.type for d in deltas], "response.reasoning_text.done",
                                            "response.output_item.done", "response.incomplete"]
        assert "".join(d.delta for d in deltas) == events[-3].text == chat["reasoning_content"]
        # the output sent back as input: the reasoning is the assistant turn's reasoning_content
        again = oai.responses.create(**{**kwargs, "input": [{"role": "user", "content": "Hi"}, *whole.output,
                                                            {"role": "user", "content": "More"}]})
    turns = [{"role": "user", "content": "Hi"},
             {"role": "assistant", "content": None, "reasoning_content": chat["reasoning_content"]},
             {"role": "user", "content": "More"}]
    prompt = r1.post("/v1/chat/completions", json={**BASE, "messages": turns, "max_tokens": 1}).json()
    assert again.usage.input_tokens == prompt["usage"]["prompt_tokens"]


def test_separate_reasoning_route(r1, client):
    assert r1.post("/separate_reasoning", json={"text": THOUGHT}).json() == {
        "text": "Paris.", "reasoning_text": "The capital of France."}
    out = client.post("/separate_reasoning", json={"text": "Paris.", "reasoning_parser": "qwen3"})
    assert out.json() == {"text": "Paris.", "reasoning_text": ""}
    for c, body, message in ((client, {"text": "x"}, "this server has no --reasoning-parser"),
                             (client, {"text": "x", "reasoning_parser": "o1"}, "reasoning_parser must be one of"),
                             (r1, {"text": "x", "reasoning_parser": ""}, "reasoning_parser must be one of")):
        r = c.post("/separate_reasoning", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_parser"
        assert message in r.json()["error"]["message"]


def test_reasoning_effort_reaches_the_template_and_none_turns_thinking_off(r1):
    from radixflow.frontend.chat_prompt import template_kwargs
    from radixflow.frontend.openai_schemas import ChatRequest

    def kwargs(**fields):
        return template_kwargs(ChatRequest(model=MODEL_NAME, messages=[], **fields))

    assert kwargs(reasoning_effort="high") == {"reasoning_effort": "high"}
    assert kwargs(reasoning_effort="none") == {"reasoning_effort": "none", "enable_thinking": False}
    assert kwargs(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True}) == {
        "reasoning_effort": "none", "enable_thinking": True}
    assert kwargs() == {}
    plain = _chat(r1, **UNTHINKING)["message"]
    assert _chat(r1, reasoning_effort="none")["message"] == plain and "reasoning_content" not in plain
    assert "reasoning_content" in _chat(r1, reasoning_effort="high")["message"]
    r = r1.post("/v1/chat/completions", json={**BASE, "reasoning_effort": "extreme"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort"
    # the Responses API's reasoning.effort is the chat request's reasoning_effort, echoed back
    out = r1.post("/v1/responses", json={"model": MODEL_NAME, "input": BASE["messages"][0]["content"],
                                         "max_output_tokens": 6, "temperature": 0, "reasoning": {"effort": "none"}})
    assert out.status_code == 200, out.text
    assert [item["type"] for item in out.json()["output"]] == ["message"]
    assert out.json()["reasoning"]["effort"] == "none"
    # output_text logprobs would mix the block's tokens with the answer's: refused under a reasoning parser
    r = r1.post("/v1/responses", json={"model": MODEL_NAME, "input": "Hi", "include": ["message.output_text.logprobs"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "include", r.text
    # /tokenize takes it with messages, as the chat request would run them; not with a prompt
    ids = r1.post("/tokenize", json={"messages": BASE["messages"], "reasoning_effort": "low"})
    assert ids.status_code == 200 and ids.json()["count"] == out.json()["usage"]["input_tokens"]
    r = r1.post("/tokenize", json={"prompt": "x", "reasoning_effort": "low"})
    assert r.status_code == 400 and "reasoning_effort" in r.json()["error"]["message"]
