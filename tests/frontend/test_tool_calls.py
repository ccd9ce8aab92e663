"""OpenAI tool calling on /v1/chat/completions, through the live server (both engine cores):
field errors, required / named calls constrained by the tools' schemas, auto parsing of Hermes
`<tool_call>` blocks and of each --tool-call-parser format, with parallel_tool_calls false too
(the output forced by a regex), streams against whole responses, n = 2, the official openai
client and a multi-turn round trip."""
from __future__ import annotations

import json
import re

import httpx
import jsonschema
import msgspec
import openai
import pytest

from radixflow.frontend.chat_prompt import template_messages
from radixflow.frontend.openai_schemas import ChatMessage

MODEL_NAME, API_KEY = "tiny", "test-key"  # the conftest server's

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 5}},
           "required": ["city", "days"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"],
       "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
BASE = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Weather in Rome?"}], "tools": TOOLS,
        "max_tokens": 60, "temperature": 0}
NAMED = {"type": "function", "function": {"name": "add"}}
# the tiny random model writes what the regex forces: text, one good call, one of an unknown tool
FORCED = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n'
          '</tool_call>\n<tool_call>{"name": "rm", "arguments": {}}</tool_call>')


def _chat(client, **extra):
    r = client.post("/v1/chat/completions", json={**BASE, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def _valid_calls(message):
    for call in message["tool_calls"]:
        assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"]) and call["type"] == "function"
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]


def _deep(depth):
    schema = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def _fn(name, **rest):
    return {"type": "function", "function": {"name": name, **rest}}


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools"),
    ({"tools": [_fn("bad name")]}, "tools"),
    ({"tools": [_fn("f"), _fn("f")]}, "tools"),
    ({"tools": [_fn("f", parameters={"type": "array"})]}, "tools"),
    ({"tools": [_fn("f", parameters=_deep(70))], "tool_choice": "required"}, "tools"),  # max_json_depth
    ({"tools": [_fn("f", parameters={"type": "object", "properties": {"x": {"type": "no-such-type"}}})],
      "tool_choice": "required"}, "tools"),  # the grammar does not compile
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tool_choice": NAMED, "regex": "a"}, "tool_choice"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"tools": None, "parallel_tool_calls": False}, "parallel_tool_calls"),
])
def test_bad_tool_fields_are_400_naming_the_field(client, extra, param):
    r = client.post("/v1/chat/completions", json={**BASE, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_tool_text_counts_toward_max_prompt_chars(live_server, engine):
    from radixflow.frontend.limits import RequestLimits
    from radixflow.frontend.server import create_app

    live = live_server(create_app(engine, MODEL_NAME, limits=RequestLimits(max_prompt_chars=500))).start()
    try:
        body = {**BASE, "max_tokens": 1}
        assert httpx.post(live.url + "/v1/chat/completions", json=body).status_code == 200
        big = [_fn("f", description="x" * 500)]
        r = httpx.post(live.url + "/v1/chat/completions", json={**body, "tools": big})
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "limit_exceeded" and "max_prompt_chars" in err["message"]
    finally:
        live.stop()


def test_required_with_refs_between_tools(client):
    """Each tool's $defs move to the top of the required schema, where "#/$defs/..." points."""
    unit = {"type": "object", "properties": {"unit": {"$ref": "#/$defs/unit"}}, "required": ["unit"],
            "additionalProperties": False, "$defs": {"unit": {"enum": ["C", "F"]}}}
    tools = [_fn("temp", parameters=unit), _fn("wind", parameters=unit)]
    for choice in ("required", {"type": "function", "function": {"name": "wind"}}):
        out = _chat(client, tools=tools, tool_choice=choice, parallel_tool_calls=False)["choices"][0]
        [call] = out["message"]["tool_calls"]
        assert json.loads(call["function"]["arguments"])["unit"] in ("C", "F"), out
    clash = [_fn("temp", parameters=unit), _fn("wind", parameters={**unit, "$defs": {"unit": {"enum": ["K"]}}})]
    r = client.post("/v1/chat/completions", json={**BASE, "tools": clash, "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_required_keeps_refs_to_the_tools_own_root(client):
    """"#" and "#/properties/..." in a tool's parameters mean that tool's object, also inside the
    required schema's call array (they used to resolve against the array, or not at all)."""
    pair = {"type": "object", "properties": {"v": {"enum": [7]}, "w": {"$ref": "#/properties/v"}},
            "required": ["v", "w"], "additionalProperties": False}
    # kids optional, so a tree can end early; it nests to any depth (llguidance), an output cut by max_tokens has no call
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 1}},
            "additionalProperties": False}
    via_defs = {**pair, "properties": {**pair["properties"], "w": {"$ref": "#/$defs/w"}},
                "$defs": {"w": {"$ref": "#/properties/v"}}}
    for parameters in (pair, via_defs):
        out = _chat(client, tools=[_fn("pair", parameters=parameters)], tool_choice="required",
                    parallel_tool_calls=False)
        assert json.loads(out["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {"v": 7, "w": 7}
    outs = _chat(client, tools=[_fn("tree", parameters=tree)], tool_choice="required", max_tokens=60, n=4,
                 temperature=1.0)["choices"]
    for choice in outs:  # cut by max_tokens, the last call's arguments may be unfinished
        calls = choice["message"].get("tool_calls") or []
        for call in calls[:-1] if choice["finish_reason"] == "length" else calls:
            jsonschema.validate(json.loads(call["function"]["arguments"]), tree)
    r = client.post("/v1/chat/completions", json={**BASE, "tools": [_fn("f", parameters={"type": "object", "$defs": 5})],
                                                   "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text


def test_required_gives_calls_whose_arguments_follow_the_parameters(client):
    out = _chat(client, tool_choice="required", parallel_tool_calls=False)["choices"][0]
    assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None
    assert len(_valid_calls(out["message"])) == 1
    many = _chat(client, tool_choice="required", max_tokens=40)["choices"][0]  # the random model calls on
    assert many["message"]["tool_calls"] and _valid_calls(many["message"])
    assert many["finish_reason"] in ("tool_calls", "length")


def test_named_function_gives_one_call_of_it(client):
    out = _chat(client, tool_choice=NAMED, temperature=1.0)["choices"][0]
    assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None
    [(name, _)] = _valid_calls(out["message"])
    assert name == "add"
    bare = _chat(client, tools=[_fn("ping")], tool_choice={"type": "function", "function": {"name": "ping"}})
    assert bare["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "ping", "arguments": "{}"}


def test_auto_parses_tool_call_blocks_and_keeps_the_rest_as_content(client):
    out = _chat(client, regex=re.escape(FORCED), max_tokens=200)["choices"][0]
    assert out["finish_reason"] == "tool_calls"
    assert _valid_calls(out["message"]) == [("get_weather", {"city": "Rome", "days": 2})]
    assert out["message"]["content"] == 'Let me check.\n<tool_call>{"name": "rm", "arguments": {}}</tool_call>'
    plain = _chat(client, regex="No tools needed\\.")["choices"][0]
    assert plain == {**plain, "message": {"role": "assistant", "content": "No tools needed."}, "finish_reason": "stop"}
    none = _chat(client, regex=re.escape(FORCED), max_tokens=200, tool_choice="none")["choices"][0]
    assert none["message"] == {"role": "assistant", "content": FORCED} and none["finish_reason"] == "stop"


# per --tool-call-parser: two calls as the model would write them (forced by a regex), and the content
TWO_CALLS = {
    "hermes": ('Checking.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}</tool_call>\n'
               '<tool_call>{"name": "add", "arguments": {"a": 3}}</tool_call>', "Checking."),
    "llama3_json": ('{"name": "get_weather", "parameters": {"city": "Rome", "days": 2}}; '
                    '{"name": "add", "parameters": {"a": 3}}', None),
    "mistral": ('Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}, '
                '{"name": "add", "arguments": {"a": 3}}]', "Checking."),
    "mistral-v11": ('Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Rome", "days": 2}[TOOL_CALLS]add[ARGS]{"a": 3}',
                    "Checking."),
    "pythonic": ('[get_weather(city="Rome", days=2), add(a=3)]', None),
    "granite": ('<tool_call>[{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}, '
                '{"name": "add", "arguments": {"a": 3}}]', None),
    "qwen3_coder": ("Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
                    "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n"
                    "<parameter=a>\n3\n</parameter>\n</function>\n</tool_call>", "Checking."),
    "glm45": ("Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n"
              "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>\n<tool_call>add\n<arg_key>a</arg_key>\n"
              "<arg_value>3</arg_value>\n</tool_call>", "Checking."),
    "minimax_m2": ('Checking.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Rome</parameter>\n'
                   '<parameter name="days">2</parameter>\n</invoke>\n<invoke name="add">\n<parameter name="a">3</parameter>\n'
                   "</invoke>\n</minimax:tool_call>", "Checking."),
    "deepseek_v3": ("Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                    '{"city": "Rome", "days": 2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n'
                    '```json\n{"a": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "Checking."),
    "deepseek_v31": ('Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Rome", "days": 2}'
                     '<｜tool▁call▁end｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
                     "Checking."),
    "kimi_k2": ("Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                '<|tool_call_argument_begin|>{"city": "Rome", "days": 2}<|tool_call_end|><|tool_call_begin|>functions.add:1'
                '<|tool_call_argument_begin|>{"a": 3}<|tool_call_end|><|tool_calls_section_end|>', "Checking."),
}


@pytest.mark.parametrize("call_format", list(TWO_CALLS))
def test_tool_call_parser_formats_and_parallel_tool_calls_false(client, live_server, engine, call_format):
    """A server's --tool-call-parser reads "auto" output in its format, whole and streamed alike;
    parallel_tool_calls false keeps the first call only; a named function's output is still its
    constrained JSON. The default (Hermes) server leaves another format's calls as content."""
    from radixflow.frontend.server import create_app

    text, content = TWO_CALLS[call_format]
    both = [("get_weather", {"city": "Rome", "days": 2}), ("add", {"a": 3})]
    live = live_server(create_app(engine, MODEL_NAME, tool_call_parser=call_format.split("-")[0])).start()
    try:
        with httpx.Client(base_url=live.url, timeout=60) as c:
            for extra, calls in (({}, both), ({"parallel_tool_calls": False}, both[:1])):
                extra = {**extra, "regex": re.escape(text), "max_tokens": 200}
                whole = _chat(c, **extra)["choices"][0]
                assert _valid_calls(whole["message"]) == calls and whole["finish_reason"] == "tool_calls"
                assert whole["message"]["content"] == content
                streamed = _reassemble(_stream(c, {**BASE, **extra}))[0]
                assert streamed == {"content": content or "", "finish_reason": "tool_calls",
                                    "tool_calls": [call["function"] for call in whole["message"]["tool_calls"]]}
            named = _chat(c, tool_choice=NAMED)["choices"][0]  # the constrained JSON, whatever the format
            assert [name for name, _ in _valid_calls(named["message"])] == ["add"]
    finally:
        live.stop()
    if call_format != "hermes":
        plain = _chat(client, regex=re.escape(text), max_tokens=200)["choices"][0]
        assert plain["message"] == {"role": "assistant", "content": text} and plain["finish_reason"] == "stop"


def test_tools_reach_the_template_unless_tool_choice_is_none(client):
    usage = {c: _chat(client, max_tokens=1, **({} if c is None else {"tool_choice": c}))["usage"]["prompt_tokens"]
             for c in (None, "none")}
    bare = _chat(client, max_tokens=1, tools=None)["usage"]["prompt_tokens"]
    assert usage["none"] == bare < usage[None]


def _stream(client, body):
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _reassemble(chunks):
    """Per choice: content, tool calls and finish_reason as a client rebuilds them from deltas
    (a call's first delta has its id, type and name; each later one the next arguments piece)."""
    out = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            choice = out.setdefault(c["index"], {"content": "", "tool_calls": [], "finish_reason": None})
            choice["content"] += c["delta"].get("content") or ""
            for call in c["delta"].get("tool_calls", []):
                if "id" in call:  # a call's first delta: its id, type and name
                    assert call["index"] == len(choice["tool_calls"]) and call["id"].startswith("call_")
                    assert call["type"] == "function" and set(call["function"]) == {"name", "arguments"}
                    choice["tool_calls"].append(dict(call["function"]))
                else:  # the next piece of the last call's arguments
                    assert call["index"] == len(choice["tool_calls"]) - 1 and set(call) == {"index", "function"}
                    assert set(call["function"]) == {"arguments"} and call["function"]["arguments"]
                    choice["tool_calls"][-1]["arguments"] += call["function"]["arguments"]
            choice["finish_reason"] = c["finish_reason"] or choice["finish_reason"]
    return out


@pytest.mark.parametrize("extra", [
    {"tool_choice": "required", "parallel_tool_calls": False}, {"tool_choice": NAMED},
    {"regex": re.escape(FORCED), "max_tokens": 200}, {"regex": re.escape(FORCED), "max_tokens": 200, "n": 2},
    {"tool_choice": "required", "max_tokens": 40}, {"tool_choice": "required", "max_tokens": 24},
], ids=["required", "named", "auto", "auto-n2", "required-cut-short", "required-cut-in-arguments"])
def test_streamed_calls_equal_the_whole_response(client, extra):
    body = {**BASE, **extra}
    whole = _chat(client, **extra)["choices"]
    streamed = _reassemble(_stream(client, body))
    for choice in whole:
        message = choice["message"]
        expected = {"content": message["content"] or "", "finish_reason": choice["finish_reason"],
                    "tool_calls": [c["function"] for c in message.get("tool_calls") or []]}
        assert streamed[choice["index"]] == expected
        assert expected["tool_calls"]
        # how many deltas a call's arguments come in is timing (outputs that reach the consumer together
        # make one chunk); the parsers' pieces are checked token by token in test_tool_call_parsers.py
    if extra.get("max_tokens") == 40:  # cut before the second call's arguments opened: its start is content
        assert whole[0]["finish_reason"] == "length" and whole[0]["message"]["content"].startswith(',{"name":"')
    if extra.get("max_tokens") == 24:  # cut inside arguments that had started: they stay unfinished
        message = whole[0]["message"]
        assert whole[0]["finish_reason"] == "length" and message["content"] is None, message
        with pytest.raises(json.JSONDecodeError):
            json.loads(message["tool_calls"][-1]["function"]["arguments"])


def test_n2_parses_each_choice(client):
    out = _chat(client, tool_choice="required", parallel_tool_calls=False, n=2, temperature=1.0, seed=5)
    assert [c["index"] for c in out["choices"]] == [0, 1]
    for choice in out["choices"]:
        assert choice["finish_reason"] == "tool_calls" and len(_valid_calls(choice["message"])) == 1
    ids = [c["message"]["tool_calls"][0]["id"] for c in out["choices"]]
    assert ids[0] != ids[1]


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


def test_openai_client_parses_calls_and_sends_them_back(oai, engine):
    messages = [{"role": "user", "content": "Weather in Rome?"}]
    first = oai.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, temperature=0,
                                        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER)
    # the turn as the client keeps it, plus the tool's answer, rendered by the template
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    second = oai.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=2)
    rendered = engine.tokenizer.apply_chat_template(
        template_messages([msgspec.convert(m, ChatMessage) for m in messages]), add_generation_prompt=True,
        tools=TOOLS)
    expected_call = f'<tool_call>\n{{"name": "get_weather", "arguments": {json.dumps(arguments)}}}\n</tool_call>'
    assert expected_call in rendered and "<tool_response>\nsunny\n</tool_response>" in rendered
    assert second.usage.prompt_tokens == len(engine.tokenizer.encode(rendered, add_special_tokens=False))
    streamed = list(oai.chat.completions.create(model=MODEL_NAME, messages=messages[:1], tools=TOOLS,
                                                tool_choice="required", parallel_tool_calls=False,
                                                temperature=0, stream=True))
    deltas = [d for chunk in streamed for d in chunk.choices[0].delta.tool_calls or []]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name in ("get_weather", "add")
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in deltas[1:])  # as many as chunks
    assert json.loads("".join(d.function.arguments for d in deltas))
    assert streamed[-1].choices[0].finish_reason == "tool_calls"

