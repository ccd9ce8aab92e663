"""The tool-call parsers on their own: Hermes `<tool_call>` blocks (tool_choice "auto") and the JSON
that tool_choice "required" / a named function constrains the output to, fed whole and piecewise."""
from __future__ import annotations

import json

import pytest

from radixflow.frontend.tool_calls import Call, HermesParser, JsonCallsParser

NAMES = frozenset({"get_weather", "add"})


def run(parser, pieces):
    out = []
    for piece in pieces:
        out += parser.feed(piece)
    return out + parser.finish()


def merged(events):
    """Adjacent text events joined: the content a client reassembles."""
    out = []
    for e in events:
        if isinstance(e, str) and out and isinstance(out[-1], str):
            out[-1] += e
        else:
            out.append(e)
    return out


def every_split(text):
    """The text whole, one character at a time, and cut at every position."""
    yield [text]
    yield list(text)
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]


WEATHER = Call("get_weather", '{"city": "Paris"}')
CASES = [
    ("plain text, no call", "Hello <b>world</b> <tool", ["Hello <b>world</b> <tool"]),
    ("one call", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', [WEATHER]),
    ("text around calls is content, trimmed at the calls",
     'Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
     '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\nDone.',
     ["Let me check.", WEATHER, Call("add", '{"a": 1, "b": 2}'), "\nDone."]),
    ("text on both sides of a call keeps the whitespace before the call between them",
     'Hi <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call> x',
     ["Hi", WEATHER, " x"]),
    ("text written against a call stays against it",
     'Hi<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>x', ["Hi", WEATHER, "x"]),
    ("no separator before text when nothing came before the calls",
     ' <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n x ', [WEATHER, "x"]),
    ("malformed JSON stays content",
     '<tool_call>{"name": "add", "arguments": {</tool_call>',
     ['<tool_call>{"name": "add", "arguments": {</tool_call>']),
    ("an unknown tool stays content", '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
     ['<tool_call>{"name": "rm", "arguments": {}}</tool_call>']),
    ("arguments that are not an object stay content",
     '<tool_call>{"name": "add", "arguments": [1]}</tool_call>', ['<tool_call>{"name": "add", "arguments": [1]}</tool_call>']),
    ("a name that is not a string stays content", '<tool_call>{"name": ["add"]}</tool_call>',
     ['<tool_call>{"name": ["add"]}</tool_call>']),
    ("missing arguments are {}", '<tool_call>{"name": "add"}</tool_call>', [Call("add", "{}")]),
    ("an unclosed last call that parses is a call", '<tool_call>{"name": "add", "arguments": {"a": 1}}',
     [Call("add", '{"a": 1}')]),
    ("an unclosed call that does not parse is content", 'x <tool_call>{"name": "add", "argu',
     ['x <tool_call>{"name": "add", "argu']),
    ("whitespace-only text is kept when there is no call", "  \n", ["  \n"]),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hermes(text, expected):
    for pieces in every_split(text):
        assert merged(run(HermesParser(NAMES), pieces)) == expected, pieces


def test_hermes_streams_plain_text_and_holds_back_only_a_possible_tag():
    parser = HermesParser(NAMES)
    assert parser.feed("Hi there <tool") == ["Hi there"]  # " <tool" could start a call
    assert parser.feed("box> ok") == [" <toolbox> ok"]
    assert parser.feed("<tool_call>{") == []
    assert parser.feed('"name": "add"}</tool_call>') == [Call("add", "{}")]
    assert parser.finish() == []


def test_hermes_arguments_are_compact_json_text_with_unicode_kept():
    [call] = run(HermesParser(NAMES), ['<tool_call>{"name":"get_weather","arguments":{"city":"Zürich"}}</tool_call>'])
    assert json.loads(call.arguments) == {"city": "Zürich"} and "Zürich" in call.arguments


REQUIRED = '[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"add","arguments":{"a":1,"b":"}]"}}]'


def test_required_array_gives_each_call_when_its_object_closes():
    parser = JsonCallsParser(NAMES)
    close = REQUIRED.index("},{")  # the first call's closing brace
    assert parser.feed(REQUIRED[:close]) == []
    assert parser.feed(REQUIRED[close:close + 1]) == [WEATHER]
    assert parser.feed(REQUIRED[close + 1:-2]) == []  # "}]" inside a string closes nothing
    assert parser.feed(REQUIRED[-2:]) == [Call("add", '{"a": 1, "b": "}]"}')]
    assert parser.finish() == []
    for pieces in every_split(REQUIRED):
        assert run(JsonCallsParser(NAMES), pieces) == [WEATHER, Call("add", '{"a": 1, "b": "}]"}')], pieces


def test_required_cut_short_leaves_the_rest_as_content():
    close = REQUIRED.index("},{")
    text = REQUIRED[:close + 12]
    for pieces in every_split(text):
        assert run(JsonCallsParser(NAMES), pieces) == [WEATHER, text[close + 1:]], pieces
    assert run(JsonCallsParser(NAMES), ['[{"na']) == ['[{"na']


def test_named_function_output_is_its_arguments():
    for pieces in every_split('{"a":1,"b":{"c":"\\"}"}}'):
        assert run(JsonCallsParser(NAMES, name="add"), pieces) == [Call("add", '{"a": 1, "b": {"c": "\\"}"}}')]
    assert run(JsonCallsParser(NAMES, name="add"), ['{"a":']) == ['{"a":']
