"""gpt-oss's harmony output: the reader (messages fed in any pieces), the reasoning split
(`--reasoning-parser gpt_oss`), the chat parser's calls to functions.NAME, the request's special
tokens kept, the final channel as where a grammar starts (its markers being special tokens), and
the whole route through the live server with the tiny model writing what a regex forces."""
from __future__ import annotations

import json
import re

import httpx
import pytest
from text_pieces import every_split, merged, run

from radixflow.frontend.call_stream import CallArgs, CallStart, whole
from radixflow.frontend.harmony import HarmonyChoiceParser
from radixflow.frontend.tool_calls import Call, FirstCallOnly
from radixflow.runtime.text.harmony import Body, Header, HarmonyReader, parse_header
from radixflow.runtime.text.reasoning import Thought, split_reasoning

ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
CALL = ('<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
        '{"city": "Rome", "days": 2}<|call|>')
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny in Rome.<|return|>"
NAMES = frozenset({"get_weather", "add"})


def test_headers_name_channel_and_recipient_either_side():
    assert parse_header("<|channel|>analysis") == Header("analysis")
    assert parse_header("<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json") == Header(
        "commentary", "functions.add")
    assert parse_header("<|start|>assistant to=functions.add<|channel|>commentary json") == Header(
        "commentary", "functions.add")
    assert parse_header("<|start|>assistant") == Header("")


def test_the_reader_gives_the_same_messages_in_any_pieces():
    text = ANALYSIS + CALL + FINAL
    want = [Header("analysis"), Body("The user wants the weather."), Header("commentary", "functions.get_weather"),
            Body('{"city": "Rome", "days": 2}'), Header("final"), Body("It is sunny in Rome.")]
    for pieces in every_split(text):
        events = run(HarmonyReader(), pieces)
        merged = []
        for e in events:  # a body may come in pieces
            if isinstance(e, Body) and merged and isinstance(merged[-1], Body):
                merged[-1] = Body(merged[-1].text + e.text)
            else:
                merged.append(e)
        assert merged == want, pieces


@pytest.mark.parametrize("text, want", [
    ("Just text, no markers.", [Header(""), Body("Just text, no markers.")]),  # not harmony: content
    ("<|channel|>analysis<|message|>cut sho", [Header("analysis"), Body("cut sho")]),  # cut mid-body
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|chan", [Header("analysis"), Body("x")]),  # mid-header
    ("<|channel|>final<|message|>a<|start|>assistant<|channel|>final<|message|>b",  # no <|end|>: the next start
     [Header("final"), Body("a"), Header("final"), Body("b")]),
    ("<|channel|>final<|message|>a < b <| c", [Header("final"), Body("a < b <| c")]),  # marker-like text kept
])
def test_the_reader_on_cut_and_odd_outputs(text, want):
    for pieces in ([text], list(text)):
        events = run(HarmonyReader(), pieces)
        bodies = "".join(e.text for e in events if isinstance(e, Body))
        assert [e for e in events if isinstance(e, Header)] == [w for w in want if isinstance(w, Header)]
        assert bodies == "".join(w.text for w in want if isinstance(w, Body))


def test_a_header_that_never_closes_is_content():
    text = "<|channel|>" + "x" * 600
    events = run(HarmonyReader(), [text])
    assert events[0] == Header("") and "".join(e.text for e in events[1:]) == text


def test_reasoning_is_the_analysis_channel():
    assert split_reasoning(ANALYSIS + FINAL, "gpt_oss") == ("The user wants the weather.", "It is sunny in Rome.")
    assert split_reasoning(FINAL.removeprefix("<|start|>assistant"), "gpt_oss") == (None, "It is sunny in Rome.")
    assert split_reasoning("plain", "gpt_oss") == (None, "plain")


def test_calls_reasoning_and_content_in_any_pieces():
    want = [Thought("The user wants the weather."), Call("get_weather", '{"city": "Rome", "days": 2}'),
            "It is sunny in Rome."]
    for pieces in every_split(ANALYSIS + CALL + FINAL):
        assert merged(run(HarmonyChoiceParser(NAMES), pieces)) == want, pieces


def test_call_arguments_stream_as_written():
    parser = HarmonyChoiceParser(NAMES)
    assert parser.feed(CALL[:-len('"days": 2}<|call|>')]) == [CallStart("get_weather"), CallArgs('{"city": "Rome", ')]
    assert parser.feed('"days": 2}<|call|>') == [CallArgs('"days": 2}')]


@pytest.mark.parametrize("options, want", [
    ({"reasoning": False}, ["The user wants the weather.", Call("get_weather", '{"city": "Rome", "days": 2}'),
                            "It is sunny in Rome."]),  # --tool-call-parser gpt_oss alone
    ({"include": False}, [Call("get_weather", '{"city": "Rome", "days": 2}'), "It is sunny in Rome."]),
])
def test_reasoning_off_or_not_included(options, want):
    assert merged(run(HarmonyChoiceParser(NAMES, **options), [ANALYSIS + CALL + FINAL])) == want


@pytest.mark.parametrize("call, names", [
    (CALL.replace("get_weather", "rm"), NAMES),                     # not one of the tools
    (CALL.replace("functions.get_weather", "browser.search"), NAMES),  # a built-in tool: not served
    (CALL, None),                                                   # the request has no tools
    (CALL.replace('{"city": "Rome", "days": 2}', "[1, 2]"), NAMES),  # not an arguments object
])
def test_messages_that_are_not_calls_of_the_tools_are_content(call, names):
    body = re.search(r"<\|message\|>(.*)<\|call\|>", call).group(1)
    for pieces in ([call], list(call)):
        assert merged(run(HarmonyChoiceParser(names), pieces)) == [body]


def test_parallel_tool_calls_false_keeps_the_first_call():
    second = CALL.replace("get_weather", "add").replace('{"city": "Rome", "days": 2}', '{"a": 1}')
    events = run(FirstCallOnly(HarmonyChoiceParser(NAMES)), [ANALYSIS + CALL + second + FINAL])
    assert [e for e in whole(events) if isinstance(e, Call)] == [Call("get_weather", '{"city": "Rome", "days": 2}')]


def _check(body: dict, tool_call_parser: str = "hermes", reasoning_parser: str | None = "gpt_oss"):
    from types import SimpleNamespace

    import msgspec

    from radixflow.frontend.chat import ChatShape
    from radixflow.frontend.limits import RequestLimits
    from radixflow.frontend.openai_schemas import ChatRequest

    req = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "x"}], **body}, ChatRequest)
    server = SimpleNamespace(limits=RequestLimits(), engine=SimpleNamespace(supports_grammar=True),
                             tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser)
    plan = ChatShape().check(req, SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(server=server))))
    return req, plan


TOOLS = [{"type": "function", "function": {"name": "add"}}]


@pytest.mark.parametrize("body, tool_parser, reasoning, kept", [
    ({}, "hermes", "gpt_oss", False),                                 # the reasoning format keeps them
    ({"skip_special_tokens": True}, "hermes", "gpt_oss", True),      # unless the request says otherwise
    ({"tools": TOOLS}, "gpt_oss", None, False),                       # the call format keeps them
    ({}, "gpt_oss", None, None),                                      # no tools: plain text
    ({"separate_reasoning": False}, "hermes", "gpt_oss", None),       # not split
])
def test_harmony_keeps_special_tokens_unless_the_request_drops_them(body, tool_parser, reasoning, kept):
    req, _ = _check(body, tool_parser, reasoning)
    assert req.skip_special_tokens is kept


def test_a_grammar_holds_from_the_final_channel_and_required_calls_are_read_there():
    _, plan = _check({"tools": TOOLS, "tool_choice": "required"})
    assert plan.constraint(None).params["constrain_after"] == "<|channel|>final<|message|>"
    text = ANALYSIS + '<|start|>assistant<|channel|>final<|message|>[{"name": "add", "arguments": {"a": 1}}]'
    events = run(plan.parser(), [text])
    assert [e for e in whole(events) if isinstance(e, Call)] == [Call("add", '{"a": 1}')]


def test_special_tokens_complete_the_text_a_grammar_starts_after():
    """AfterText reads a special token (empty in the grammar's table) as its text."""
    from radixflow.runtime.grammar.after_text import AfterText
    from radixflow.runtime.grammar.vocab import TokenVocab

    class Inner:
        error = None

    vocab = TokenVocab([b"final", b"", b""], [], 8, lambda text: [], special_bytes={1: b"<|channel|>",
                                                                                    2: b"<|message|>"})
    m = AfterText(Inner(), b"<|channel|>final<|message|>", vocab)
    assert m.accept(0) and m.accept(2) and not m.started  # "final<|message|>" alone is not it
    assert m.accept(1) and m.accept(0) and m.accept(2) and m.started


FORCED = ANALYSIS + CALL.removesuffix("<|call|>") + "<|end|>" + FINAL.removesuffix("<|return|>")


@pytest.fixture(scope="module")
def harmony_server(engine, live_server):
    from radixflow.frontend.server import create_app

    live = live_server(create_app(engine, "tiny", reasoning_parser="gpt-oss")).start()
    with httpx.Client(base_url=live.url, timeout=60) as c:
        yield c
    live.stop()


def test_the_chat_route_reads_reasoning_calls_and_content_whole_and_streamed(harmony_server):
    """The tiny model spells the markers out in ordinary tokens (its vocabulary has no harmony
    special tokens), as a regex forces them from the first token (told not to think, the grammar
    does not wait for the final channel): what the route makes of the text is what is tested."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Rome?"}], "max_tokens": 200,
            "temperature": 0, "regex": re.escape(FORCED), "chat_template_kwargs": {"enable_thinking": False},
            "tools": [
                {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]}
    r = harmony_server.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    message = choice["message"]
    assert message["reasoning_content"] == "The user wants the weather."
    assert message["content"] == "It is sunny in Rome."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_weather", {"city": "Rome", "days": 2})]
    assert choice["finish_reason"] == "tool_calls"
    out = {"reasoning_content": "", "content": "", "calls": []}
    with harmony_server.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
        for line in s.iter_lines():
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            out["reasoning_content"] += delta.get("reasoning_content") or ""
            out["content"] += delta.get("content") or ""
            out["calls"] += [c["function"] for c in delta.get("tool_calls") or []]
    assert out["reasoning_content"] == message["reasoning_content"] and out["content"] == message["content"]
    assert "".join(c.get("arguments") or "" for c in out["calls"]) == message["tool_calls"][0]["function"]["arguments"]


def test_separate_reasoning_route_reads_harmony(harmony_server):
    r = harmony_server.post("/separate_reasoning", json={"text": ANALYSIS + FINAL})
    assert r.json() == {"text": "It is sunny in Rome.", "reasoning_text": "The user wants the weather."}
    r = harmony_server.post("/separate_reasoning", json={"text": ANALYSIS + FINAL, "reasoning_parser": "openai_gptoss"})
    assert r.json()["reasoning_text"] == "The user wants the weather."


RECIPIENT_FIRST = (' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Rome", "days": 2}<|call|>'
                   + FINAL)


def test_a_first_message_naming_its_recipient_before_its_channel_is_a_call():
    """The prompt ends with `<|start|>assistant`, so an output may open with ` to=functions.x`."""
    want = [Call("get_weather", '{"city": "Rome", "days": 2}'), "It is sunny in Rome."]
    for pieces in every_split(RECIPIENT_FIRST):
        assert merged(run(HarmonyChoiceParser(NAMES), pieces)) == want, pieces


PREAMBLE = "<|start|>assistant<|channel|>commentary<|message|>Let me add these.<|end|>"
OWN_CALL = '<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1}<|end|>'


@pytest.mark.parametrize("choice, final", [
    ("required", '[{"name": "add", "arguments": {"a": 2}}]'),
    ({"type": "function", "function": {"name": "add"}}, '{"a": 2}')])
@pytest.mark.parametrize("before", ["", PREAMBLE, OWN_CALL])
def test_required_and_named_calls_are_read_from_the_final_channel_only(choice, final, before):
    """The grammar holds in the final channel; a preamble or a call message the model wrote before
    it is content as written, and does not spoil the final channel's calls."""
    _, plan = _check({"tools": TOOLS, "tool_choice": choice})
    text = ANALYSIS + before + "<|start|>assistant<|channel|>final<|message|>" + final
    events = run(plan.parser(), [text])
    assert [e for e in whole(events) if isinstance(e, Call)] == [Call("add", '{"a": 2}')]
    body = re.search(r"<\|message\|>(.*)<\|end\|>", before).group(1) if before else ""
    assert "".join(e for e in events if isinstance(e, str)) == body


def test_a_header_past_the_limit_is_content_whole_and_streamed():
    text = "<|channel|>analysis" + " " * 600 + "<|message|>secret<|end|>" + FINAL
    for limit_case in (text, "<|channel|>analysis" + " " * 490 + "<|message|>ok<|end|>" + FINAL):
        results = {tuple(merged(run(HarmonyChoiceParser(NAMES), pieces))) for pieces in every_split(limit_case)}
        assert len(results) == 1, results  # one reading however it is cut
    assert merged(run(HarmonyChoiceParser(NAMES), [text])) == [text]  # as written


@pytest.mark.parametrize("text", ["<|hello world", "<|im_start|>assistant\nHi there", "<| not a marker |> but text"])
def test_text_opening_with_a_bar_but_no_marker_is_content(text):
    for pieces in ([text], list(text)):
        assert merged(run(HarmonyChoiceParser(NAMES), pieces)) == [text]
    assert split_reasoning(text, "gpt_oss") == (None, text)


def test_separate_reasoning_false_still_reads_calls_on_a_harmony_server():
    req, plan = _check({"tools": TOOLS, "separate_reasoning": False})
    assert req.skip_special_tokens is False
    add = CALL.replace("get_weather", "add").replace('{"city": "Rome", "days": 2}', '{"a": 1}')
    assert merged(run(plan.parser(), [ANALYSIS + add + FINAL])) == [
        "The user wants the weather.", Call("add", '{"a": 1}'), "It is sunny in Rome."]


def test_reasoning_sent_back_reaches_the_template_as_thinking_too():
    """gpt-oss's template reads an assistant turn's analysis as `thinking` (the name transformers'
    gpt-oss template uses); other thinking models' templates read `reasoning_content`: both are set."""
    import msgspec

    from radixflow.frontend.chat_prompt import template_messages
    from radixflow.frontend.openai_schemas import ChatMessage

    turns = [{"role": "user", "content": "Weather?"},
             {"role": "assistant", "content": None, "reasoning": "Need the tool.",
              "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]}]
    out = template_messages([msgspec.convert(m, ChatMessage) for m in turns])
    assert out[1]["thinking"] == out[1]["reasoning_content"] == "Need the tool."
    assert "thinking" not in out[0]
