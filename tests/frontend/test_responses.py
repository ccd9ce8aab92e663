"""POST /v1/responses (OpenAI's Responses API) through the live server (both engine cores), with the
real openai client: prompts equal to the equivalent chat request's, the length limit as an
incomplete response, streamed events, text.format, function calls out and back, stored responses
continued by previous_response_id (served from the radix cache), and 400 / 404 errors naming the field."""
from __future__ import annotations

import json
import time
import types

import httpx
import jsonschema
import openai
import pytest

from radixflow.frontend.response_store import ResponseStore, StoredResponse

MODEL_NAME, API_KEY = "tiny", "test-key"  # the conftest server's

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 5}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city", "parameters": WEATHER}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                "parameters": WEATHER}}]
YES_NO = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


def _chat(client, messages, max_tokens=1, **extra):
    r = client.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": messages, "max_tokens": max_tokens,
                                                  "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_text_response_is_the_chat_requests_output(oai, client):
    out = oai.responses.create(model=MODEL_NAME, input="Say hi", max_output_tokens=4, temperature=0)
    assert out.id.startswith("resp_") and out.object == "response" and out.model == MODEL_NAME
    [message] = out.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    [part] = message.content
    assert part.type == "output_text" and part.annotations == [] and out.output_text == part.text
    chat = _chat(client, [{"role": "user", "content": "Say hi"}], max_tokens=4)
    assert part.text == chat["choices"][0]["message"]["content"]
    usage = out.usage
    assert usage.input_tokens == chat["usage"]["prompt_tokens"] and usage.output_tokens == 4
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0 and usage.input_tokens_details.cached_tokens >= 0
    assert out.tools == [] and out.tool_choice == "auto" and out.parallel_tool_calls is True


def test_length_limit_is_an_incomplete_response(oai):
    out = oai.responses.create(model=MODEL_NAME, input="Count", max_output_tokens=2, temperature=0)
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.output[0].status == "incomplete" and out.usage.output_tokens == 2 and out.max_output_tokens == 2


def test_instructions_and_message_items_render_as_chat_messages(oai, client):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello",
                                                                  "annotations": []}]},
             {"role": "developer", "content": "Be terse"}, {"role": "user", "content": "Bye"}]
    out = oai.responses.create(model=MODEL_NAME, input=items, instructions="You are kind.", max_output_tokens=3,
                               temperature=0)
    chat = _chat(client, [{"role": "system", "content": "You are kind."}, {"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": "Hello"}, {"role": "system", "content": "Be terse"},
                          {"role": "user", "content": "Bye"}], max_tokens=3)
    assert out.usage.input_tokens == chat["usage"]["prompt_tokens"] and out.instructions == "You are kind."
    assert out.output_text == chat["choices"][0]["message"]["content"]


def test_stream_events_in_order_and_equal_to_the_whole_response(oai):
    kwargs = {"model": MODEL_NAME, "input": "Tell a story", "max_output_tokens": 6, "temperature": 0}
    whole = oai.responses.create(**kwargs)
    events = list(oai.responses.create(**kwargs, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *[d.type for d in deltas], "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.incomplete"]
    item_id = events[2].item.id
    assert all(d.item_id == item_id and d.output_index == 0 and d.content_index == 0 for d in deltas)
    text = "".join(d.delta for d in deltas)
    assert text == events[-4].text == whole.output_text and events[-2].item.content[0].text == text
    final = events[-1].response
    assert final.id == events[0].response.id and final.output_text == text and events[0].response.status == "in_progress"
    assert final.usage.output_tokens == 6 and final.incomplete_details.reason == "max_output_tokens"


def test_json_schema_format_and_the_stream_helper(oai):
    fmt = {"format": {"type": "json_schema", "name": "yn", "schema": YES_NO, "strict": True}}
    with oai.responses.stream(model=MODEL_NAME, input="yes or no?", text=fmt, max_output_tokens=40,
                              temperature=0) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[-1] == "response.completed" and final.status == "completed"
    jsonschema.validate(json.loads(final.output_text), YES_NO)
    assert final.text.format.type == "json_schema"
    whole = oai.responses.create(model=MODEL_NAME, input="yes or no?", text=fmt, max_output_tokens=40, temperature=0)
    assert whole.output_text == final.output_text


def test_forced_function_call_and_its_output_sent_back(oai, client):
    first = oai.responses.create(model=MODEL_NAME, input="Weather in Rome?", tools=TOOLS, temperature=0,
                                 tool_choice={"type": "function", "name": "get_weather"})
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, WEATHER)
    assert first.status == "completed" and first.output_text == ""
    # the call and the tool's answer go back as input items, rendered as chat's tool_calls and tool turn
    items = [{"role": "user", "content": "Weather in Rome?"}, call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    second = oai.responses.create(model=MODEL_NAME, input=items, tools=TOOLS, max_output_tokens=2)
    chat = _chat(client, [{"role": "user", "content": "Weather in Rome?"},
                          {"role": "assistant", "content": None, "tool_calls": [
                              {"id": call.call_id, "type": "function",
                               "function": {"name": "get_weather", "arguments": call.arguments}}]},
                          {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}], tools=CHAT_TOOLS)
    assert second.usage.input_tokens == chat["usage"]["prompt_tokens"]


def test_required_call_streams_as_a_function_call_item(oai):
    events = list(oai.responses.create(model=MODEL_NAME, input="Weather?", tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, temperature=0, stream=True))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.function_call_arguments.delta")  # one a chunk of the output: timing
    assert deltas >= 1 and kinds == ["response.created", "response.in_progress", "response.output_item.added",
                                     *["response.function_call_arguments.delta"] * deltas,
                                     "response.function_call_arguments.done", "response.output_item.done",
                                     "response.completed"]
    added, *pieces, done, item_done, completed = events[2:]
    assert added.item.type == "function_call" and added.item.status == "in_progress"
    assert "".join(p.delta for p in pieces) == done.arguments == item_done.item.arguments
    assert {p.item_id for p in pieces} == {added.item.id}
    jsonschema.validate(json.loads(done.arguments), WEATHER)
    assert completed.response.output[0].call_id == added.item.call_id


def test_previous_response_id_continues_from_the_cache(oai, client):
    first = oai.responses.create(model=MODEL_NAME, input="Hi there", instructions="Be brief", max_output_tokens=4,
                                 temperature=0)
    second = oai.responses.create(model=MODEL_NAME, input="And then?", instructions="Be brief",
                                  previous_response_id=first.id, max_output_tokens=2, temperature=0)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    # the input tokens the cache did not hold are written to it (OpenAI's cache_write_tokens)
    for out in (first, second):
        details = out.usage.input_tokens_details
        assert details.cache_write_tokens == out.usage.input_tokens - details.cached_tokens
    chat = _chat(client, [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi there"},
                          {"role": "assistant", "content": first.output_text},
                          {"role": "user", "content": "And then?"}])
    assert second.usage.input_tokens == chat["usage"]["prompt_tokens"]
    got = oai.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text and got.usage == first.usage
    unstored = oai.responses.create(model=MODEL_NAME, input="x", max_output_tokens=1, store=False)
    for gone in (unstored.id, "resp_nope"):
        with pytest.raises(openai.NotFoundError) as info:
            oai.responses.create(model=MODEL_NAME, input="x", previous_response_id=gone, max_output_tokens=1)
        assert info.value.body["param"] == "previous_response_id"
        assert info.value.body["code"] == "previous_response_not_found"
    oai.responses.delete(first.id)
    assert client.get(f"/v1/responses/{first.id}").status_code == 404


def test_input_items_of_a_stored_response(oai, client):
    """GET /v1/responses/{id}/input_items: the items of that request's input (not the previous
    response's, not instructions), newest first by default, paged with after / limit."""
    items = [{"role": "user", "content": "Weather?"},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Rome"}'},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
             {"role": "user", "content": [{"type": "input_text", "text": "So?"}]}]
    out = oai.responses.create(model=MODEL_NAME, input=items, instructions="Be brief", tools=TOOLS,
                               max_output_tokens=1)
    listed = list(oai.responses.input_items.list(out.id, order="asc"))
    assert [i.type for i in listed] == ["message", "function_call", "function_call_output", "message"]
    assert listed[0].role == "user" and listed[0].content[0].text == "Weather?" and listed[3].content[0].text == "So?"
    assert listed[1].call_id == "c1" and listed[1].arguments == '{"city": "Rome"}' and listed[2].output == "sunny"
    assert len({i.id for i in listed}) == 4
    newest = oai.responses.input_items.list(out.id, limit=3)
    assert [i.id for i in newest.data] == [i.id for i in reversed(listed)][:3] and newest.has_more
    rest = oai.responses.input_items.list(out.id, limit=3, after=newest.data[-1].id)
    assert [i.id for i in rest.data] == [listed[0].id] and not rest.has_more
    later = oai.responses.create(model=MODEL_NAME, input="More", previous_response_id=out.id, max_output_tokens=1)
    assert [i.content[0].text for i in oai.responses.input_items.list(later.id)] == ["More"]
    # an assistant message's text is output_text, with its (empty) annotations as OpenAI's type has them
    said = oai.responses.create(model=MODEL_NAME, input=[{"role": "assistant", "content": "Hi"}, {"role": "user",
                                                                                                 "content": "Go"}],
                                max_output_tokens=1)
    from openai.types.responses import ResponseItemList

    raw = client.get(f"/v1/responses/{said.id}/input_items?order=asc").json()
    assert raw["data"][0]["content"] == [{"type": "output_text", "text": "Hi", "annotations": []}]
    ResponseItemList.model_validate(raw, strict=True)  # the openai client's own schema, strictly
    # items are listed as they were sent: parts apart, a refusal as one, a reasoning item's summary, ids given
    sent = [{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "message", "role": "assistant", "id": "msg_given", "status": "completed",
             "content": [{"type": "refusal", "refusal": "No."}]},
            {"type": "reasoning", "id": "rs_given", "summary": [{"type": "summary_text", "text": "thought"}]},
            {"role": "user", "content": "Go"}]
    echoed = oai.responses.create(model=MODEL_NAME, input=sent, max_output_tokens=1)
    raw = client.get(f"/v1/responses/{echoed.id}/input_items?order=asc").json()
    ResponseItemList.model_validate(raw, strict=True)
    listed = raw["data"]
    assert listed[0]["content"] == sent[0]["content"] and listed[1]["content"] == sent[1]["content"]
    assert [i["id"] for i in listed[1:3]] == ["msg_given", "rs_given"] and listed[2]["summary"] == sent[2]["summary"]
    assert listed[3]["content"] == [{"type": "input_text", "text": "Go"}] and listed[0]["id"].startswith("msg_")
    for query, param in (("limit=0", "limit"), ("order=up", "order"), ("after=msg_nope", "after"),
                         ("include=message.input_image.image_url", "include")):
        r = client.get(f"/v1/responses/{out.id}/input_items?{query}")
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert client.get("/v1/responses/resp_nope/input_items").status_code == 404


def test_output_text_logprobs_when_included(oai):
    """include message.output_text.logprobs (with top_logprobs): every output token's logprob on the
    output_text part, the same streamed (each delta with its tokens' entries) as whole."""
    ask = {"model": MODEL_NAME, "input": "Count", "max_output_tokens": 6, "temperature": 0,
           "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    out = oai.responses.create(**ask)
    entries = out.output[0].content[0].logprobs
    assert len(entries) == out.usage.output_tokens == 6
    assert all(len(e.top_logprobs) == 2 and e.logprob <= e.top_logprobs[0].logprob + 1e-6 for e in entries)
    assert "".join(e.token for e in entries) == out.output_text
    events = list(oai.responses.create(**ask, stream=True))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    done = next(e for e in events if e.type == "response.output_text.done")
    streamed = [x for d in deltas for x in d.logprobs]
    assert [(x.token, x.logprob) for x in streamed] == [(x.token, x.logprob) for x in done.logprobs] \
        == [(x.token, x.logprob) for x in entries]
    plain = oai.responses.create(model=MODEL_NAME, input="Count", max_output_tokens=2)
    assert plain.output[0].content[0].logprobs in (None, [])


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tools": [{"type": "function", "name": "f", "paramters": {}}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input"),
    ({"input": []}, "input"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"reasoning": {"summary": "auto"}}, "reasoning"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning"),
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "tool_choice"),
    ({"temperature": 3}, "temperature"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"include": ["message.output_text.logprobs"], "tools": TOOLS}, "include"),
    ({"text": {"format": {"type": "text", "schema": {"type": "object"}}}}, "text"),  # the schema meant nothing
    ({"text": {"format": {"type": "json_object", "name": "x"}}}, "text"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),  # OpenAI's limits: 16 pairs,
    ({"metadata": {"k" * 65: "v"}}, "metadata"),                    # keys of 64 characters,
    ({"metadata": {"k": "v" * 513}}, "metadata"),                   # values of 512
])
def test_bad_fields_are_400_naming_the_field(client, extra, param):
    r = client.post("/v1/responses", json={"model": MODEL_NAME, "input": "hi", "max_output_tokens": 1, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_a_client_that_leaves_a_stream_aborts_its_request(server, engine, wait_idle):
    aborts = engine.stats().finish_counts.get("abort", 0)
    body = {"model": MODEL_NAME, "input": "Tell me a very long story", "max_output_tokens": 1500, "temperature": 0,
            "stream": True}
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30) as c:
        with c.stream("POST", "/v1/responses", json=body) as r:
            deltas = 0
            for line in r.iter_lines():
                deltas += line == "event: response.output_text.delta"
                if deltas == 3:
                    break
    deadline = time.monotonic() + 10
    while engine.stats().finish_counts.get("abort", 0) == aborts:
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.02)
    wait_idle(engine, kv=True)


def test_the_store_keeps_the_most_recently_used():
    store = ResponseStore(2)
    entries = {name: StoredResponse(types.SimpleNamespace(id=name), []) for name in "abc"}  # the store reads ids
    store.put(entries["a"])
    store.put(entries["b"])
    assert store.get("a") is entries["a"]  # a is now the most recently used: c drops b
    store.put(entries["c"])
    assert store.get("b") is None and store.get("a") and store.get("c") and len(store) == 2
    assert store.delete("a") and not store.delete("a")
    empty = ResponseStore(0)
    empty.put(entries["a"])
    assert len(empty) == 0
    with pytest.raises(ValueError):
        ResponseStore(-1)



def test_text_after_a_call_opens_a_new_message_item():
    from radixflow.frontend.responses_output import OutputItems
    from radixflow.frontend.tool_calls import CallArgs, CallStart

    output = OutputItems()
    steps = ("Let me check.", CallStart("get_weather"), CallArgs('{"city": '), CallArgs('"Rome"}'), "Done", " now")
    events = [e for step in steps for e in output.add(step)] + output.finish("completed")
    first, call, last = output.items
    assert [first.content[0].text, call.name, last.content[0].text] == ["Let me check.", "get_weather", "Done now"]
    assert call.arguments == '{"city": "Rome"}' and [e["delta"] for e in events if e["type"].endswith("arguments.delta")] \
        == ['{"city": ', '"Rome"}']
    assert first.status == call.status == last.status == "completed"
    assert [(e["type"], e["output_index"]) for e in events if e["type"].startswith("response.output_item")] == [
        ("response.output_item.added", 0), ("response.output_item.done", 0), ("response.output_item.added", 1),
        ("response.output_item.done", 1), ("response.output_item.added", 2), ("response.output_item.done", 2)]
    assert events[0]["item"]["status"] == "in_progress" and events[0]["item"]["content"] == []
