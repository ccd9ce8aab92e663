"""The tool-call parsers on their own: the formats of tool_choice "auto" (Hermes `<tool_call>`
blocks, Llama 3 JSON, Mistral `[TOOL_CALLS]`, pythonic lists), at most one call with
parallel_tool_calls false, and the JSON that tool_choice "required" / a named function constrains
the output to; fed whole, piecewise and in random pieces."""
from __future__ import annotations

import json

import pytest
from text_pieces import every_split, merged, run  # noqa: E402  (tests/frontend is on sys.path via conftest)

from radixflow.frontend.tool_call_formats import (
    PARSERS, GraniteParser, Llama3JsonParser, MistralParser, Phi4MiniParser, PythonicParser, auto_parser,
)
from radixflow.frontend.marked_calls import DeepSeekV3Parser, DeepSeekV31Parser, KimiK2Parser
from radixflow.frontend.xml_calls import Glm45Parser, MiniMaxM2Parser, Qwen3CoderParser
from radixflow.frontend.tool_calls import (
    Call, CallArgs, CallStart, FirstCallOnly, HermesParser, JsonCallsParser, whole,
)

NAMES = frozenset({"get_weather", "add"})


WEATHER = Call("get_weather", '{"city": "Paris"}')
ADD1 = Call("add", '{"a": 1}')
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
    ("JSON that breaks before the call starts stays content",
     '<tool_call>{"name": "add" "arguments": {}}</tool_call>',
     ['<tool_call>{"name": "add" "arguments": {}}</tool_call>']),
    ("JSON that breaks after the call started ends its arguments there (the rest of the block is dropped)",
     '<tool_call>{"name": "add", "arguments": {"a": NaN}}</tool_call> ok', [Call("add", '{"a": '), "ok"]),
    ("a block closed early leaves the arguments unfinished",
     '<tool_call>{"name": "add", "arguments": {</tool_call>', [Call("add", "{")]),
    ("arguments before the name come out when the name is read",
     '<tool_call>{"arguments": {"a": 1}, "name": "add"}</tool_call>', [Call("add", '{"a": 1}')]),
    ("whitespace outside strings takes canonical spacing; a raw newline in a string is escaped",
     '<tool_call>{"name":"add","arguments":{\n  "a" :1,"s":"x\ny" ,"l":[ 1 ,{ } ]}}</tool_call>',
     [Call("add", '{"a": 1, "s": "x\\ny", "l": [1, {}]}')]),
    ("text after the object ends the block: it is content",
     '<tool_call>{"name": "add", "arguments": {"a": 1}}}</tool_call>', [Call("add", '{"a": 1}'), "}</tool_call>"]),
    ("an unknown tool stays content", '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
     ['<tool_call>{"name": "rm", "arguments": {}}</tool_call>']),
    ("arguments that are not an object stay content",
     '<tool_call>{"name": "add", "arguments": [1]}</tool_call>', ['<tool_call>{"name": "add", "arguments": [1]}</tool_call>']),
    ("a name that is not a string stays content", '<tool_call>{"name": ["add"]}</tool_call>',
     ['<tool_call>{"name": ["add"]}</tool_call>']),
    ("missing arguments are {}", '<tool_call>{"name": "add"}</tool_call>', [Call("add", "{}")]),
    ("an unclosed last call that parses is a call", '<tool_call>{"name": "add", "arguments": {"a": 1}}',
     [Call("add", '{"a": 1}')]),
    ("an unclosed call that did not start is content", 'x <tool_call>{"name": "add", "argu',
     ['x <tool_call>{"name": "add", "argu']),
    ("an unclosed call that started keeps its unfinished arguments", 'x <tool_call>{"name": "add", "arguments": {"a',
     ["x", Call("add", '{"a')]),
    ("whitespace-only text is kept when there is no call", "  \n", ["  \n"]),
    ("a call without its closing tag ends with its object: text and calls after it are read",
     '<tool_call>{"name": "add", "arguments": {"a": 1}}\nok <tool_call>{"name": "get_weather", "arguments": '
     '{"city": "Paris"}}</tool_call> bye', [ADD1, "ok", WEATHER, " bye"]),
    ("the closing tag inside a JSON string is the string's",
     '<tool_call>{"name": "add", "arguments": {"s": "</tool_call>"}}</tool_call> ok',
     [Call("add", '{"s": "</tool_call>"}'), "ok"]),
    ("broken JSON with no closing tag after it: the text after the break is content",
     '<tool_call>{"name": "add", "arguments": {"a": NaN and more', [Call("add", '{"a": '), "NaN and more"]),
    ("a block broken before a new block: the text between is content",
     '<tool_call>{"name": "add", "arguments": {"a": x <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
     [Call("add", '{"a": '), "x", ADD1]),
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
    assert whole(parser.feed('"name": "add"}</tool_call>')) == [Call("add", "{}")]
    assert parser.finish() == []


def test_hermes_arguments_are_compact_json_text_with_unicode_kept():
    [call] = whole(run(HermesParser(NAMES), ['<tool_call>{"name":"get_weather","arguments":{"city":"Zürich"}}</tool_call>']))
    assert json.loads(call.arguments) == {"city": "Zürich"} and "Zürich" in call.arguments


REQUIRED = '[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"add","arguments":{"a":1,"b":"}]"}}]'


def test_required_array_streams_each_call_from_its_arguments_opening():
    parser = JsonCallsParser(NAMES)
    opening = REQUIRED.index('{"city"')
    assert parser.feed(REQUIRED[:opening]) == []
    assert parser.feed(REQUIRED[opening:opening + 8]) == [CallStart("get_weather"), CallArgs('{"city": ')]
    assert parser.feed(REQUIRED[opening + 8:opening + 12]) == [CallArgs('"Par')]
    close = REQUIRED.index("},{")
    assert parser.feed(REQUIRED[opening + 12:close + 1]) == [CallArgs('is"}')]
    assert whole(parser.feed(REQUIRED[close + 1:]) + parser.finish()) == [Call("add", '{"a": 1, "b": "}]"}')]
    for pieces in every_split(REQUIRED):
        assert whole(run(JsonCallsParser(NAMES), pieces)) == [WEATHER, Call("add", '{"a": 1, "b": "}]"}')], pieces


def test_required_cut_short_leaves_the_rest_as_content():
    close = REQUIRED.index("},{")
    text = REQUIRED[:close + 12]
    for pieces in every_split(text):
        assert whole(run(JsonCallsParser(NAMES), pieces)) == [WEATHER, text[close + 1:]], pieces
    assert run(JsonCallsParser(NAMES), ['[{"na']) == ['[{"na']
    cut = REQUIRED[:REQUIRED.index("Paris") + 3]  # inside a started call: its arguments stay unfinished
    assert whole(run(JsonCallsParser(NAMES), [cut])) == [Call("get_weather", '{"city": "Par')]


def test_named_function_output_is_its_arguments():
    for pieces in every_split('{"a":1,"b":{"c":"\\"}"}}'):
        assert whole(run(JsonCallsParser(NAMES, name="add"), pieces)) == [Call("add", '{"a": 1, "b": {"c": "\\"}"}}')]
    assert whole(run(JsonCallsParser(NAMES, name="add"), ['{"a":'])) == [Call("add", '{"a": ')]
    assert run(JsonCallsParser(NAMES, name="add"), [' x']) == [' x']


LLAMA = [
    ("plain text, no call", "Sure, it is {sunny} today; ok", ["Sure, it is {sunny} today; ok"]),
    ("one call with parameters", '{"name": "get_weather", "parameters": {"city": "Paris"}}', [WEATHER]),
    ("arguments are accepted too", '{"name": "add", "arguments": {"a": 1}}', [ADD1]),
    ("after <|python_tag|>", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', [WEATHER]),
    ("calls separated by ;", '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "add", '
     '"parameters": {"a": 1}}', [WEATHER, ADD1]),
    ("braces and ; in strings", '{"name": "add", "parameters": {"s": "}{;\\"}"}}', [Call("add", '{"s": "}{;\\"}"}')]),
    ("whitespace around, text after", ' \n{"name": "add", "parameters": {"a": 1}}\nDone. ', [ADD1, "Done."]),
    ("missing parameters are {}", '{"name": "add"}', [Call("add", "{}")]),
    ("an unknown tool stays content", '{"name": "rm", "parameters": {}}', ['{"name": "rm", "parameters": {}}']),
    ("malformed JSON before the call starts stays content", '{"name": "add", "parameters" {]}',
     ['{"name": "add", "parameters" {]}']),
    ("malformed JSON after the call started ends its arguments", '{"name": "add", "parameters": {]} ok',
     [Call("add", "{"), "ok"]),
    ("parameters that are not an object stay content", '{"name": "add", "parameters": [1]}',
     ['{"name": "add", "parameters": [1]}']),
    ("an unfinished object stays content", '<|python_tag|>{"name": "add", "param',
     ['<|python_tag|>{"name": "add", "param']),
    ("JSON after text is content", 'Calling: {"name": "add", "parameters": {}}',
     ['Calling: {"name": "add", "parameters": {}}']),
    ("a bad call after a good one: it and what follows stay content",
     '{"name": "add", "parameters": {"a": 1}}; {"name": "rm", "parameters": {}} x',
     [ADD1, '{"name": "rm", "parameters": {}} x']),
    ("a trailing ; is dropped", '{"name": "add", "parameters": {"a": 1}};\n', [ADD1]),
    ("a ; before text stays content", '{"name": "add", "parameters": {"a": 1}}; bye', [ADD1, "; bye"]),
    ("broken JSON that never closes: the text after the break is content",
     '{"name": "add", "parameters": {"a": [}} Then prose', [Call("add", '{"a": ['), "}} Then prose"]),
    ("the tag before something else stays content", "<|python_tag|>print(1)", ["<|python_tag|>print(1)"]),
    ("a partial tag stays content", "<|python", ["<|python"]),
    ("whitespace-only text is kept", "  \n", ["  \n"]),
]

MISTRAL = [
    ("plain text, no call", "Hello [world] [TOOL", ["Hello [world] [TOOL"]),
    ("a list of calls", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "add", "arguments": {"a": 1}}]', [WEATHER, ADD1]),
    ("text before the marker is content", 'Let me check.\n[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}]',
     ["Let me check.", ADD1]),
    ("a bare list at the start (the marker skipped as a special token)",
     ' [{"name": "add", "arguments": {"a": 1}}]', [ADD1]),
    ("brackets in strings", '[TOOL_CALLS][{"name": "add", "arguments": {"s": "]\\"["}}]',
     [Call("add", '{"s": "]\\"["}')]),
    ("text after the calls", '[TOOL_CALLS][{"name": "add"}]\n done', [Call("add", "{}"), "done"]),
    ("an unknown tool first leaves the whole list content",
     '[TOOL_CALLS][{"name": "rm", "arguments": {}}, {"name": "add", "arguments": {"a": 1}}]',
     ['[TOOL_CALLS][{"name": "rm", "arguments": {}}, {"name": "add", "arguments": {"a": 1}}]']),
    ("an unknown tool after calls is content, with the rest of the list",
     '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "rm", "arguments": {}}] x',
     [ADD1, '{"name": "rm", "arguments": {}}] x']),
    ("an unfinished item after calls is content", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"na',
     [ADD1, '{"na']),
    ("an empty list stays content", "[TOOL_CALLS][]", ["[TOOL_CALLS][]"]),
    ("a list of other values stays content", "[1, 2] and [3]", ["[1, 2] and [3]"]),
    ("a bare list after text is content", 'x [{"name": "add", "arguments": {"a": 1}}]',
     ['x [{"name": "add", "arguments": {"a": 1}}]']),
    ("the marker before something else stays content", "[TOOL_CALLS] hello", ["[TOOL_CALLS] hello"]),
    ("an unfinished list stays content", 'ok [TOOL_CALLS][{"name": "add", "argu',
     ['ok [TOOL_CALLS][{"name": "add", "argu']),
    ("v11: a name and its arguments", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', [WEATHER]),
    ("v11: calls one after another, text before and after",
     'Sure.[TOOL_CALLS]get_weather[ARGS]{"city":"Paris"}[TOOL_CALLS]add[CALL_ID]a1B2c3[ARGS] {"a": 1} done',
     ["Sure.", WEATHER, ADD1, "done"]),
    ("v11 with [ARGS] dropped as a special token", '[TOOL_CALLS]add{"a": 1}', [ADD1]),
    ("v11: an unknown tool stays content", '[TOOL_CALLS]rm[ARGS]{"path": "/"}', ['[TOOL_CALLS]rm[ARGS]{"path": "/"}']),
    ("v11: a name then text stays content", "[TOOL_CALLS]add and more", ["[TOOL_CALLS]add and more"]),
    ("v11: arguments cut short stay unfinished", '[TOOL_CALLS]add[ARGS]{"a": 1', [Call("add", '{"a": 1')]),
    ("v11: arguments that break drop the rest of the object", '[TOOL_CALLS]add[ARGS]{"a": x} ok',
     [Call("add", '{"a": '), "ok"]),
    ("malformed JSON before a call starts stays content", '[TOOL_CALLS][{"name": "add", "arguments" {]}]',
     ['[TOOL_CALLS][{"name": "add", "arguments" {]}]']),
    ("malformed JSON after a call started ends its arguments and the list",
     '[TOOL_CALLS][{"name": "add", "arguments": {]}, {"name": "add"}] ok', [Call("add", "{"), "ok"]),
]

GRANITE = [
    ("plain text, no call", "Hello [world] <tool", ["Hello [world] <tool"]),
    ("Granite 3.1+: <tool_call> then a list", '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "add", "arguments": {"a": 1}}]', [WEATHER, ADD1]),
    ("Granite 3.0: <|tool_call|> (kept when special tokens are)", ' <|tool_call|> [{"arguments": {"a": 1}, '
     '"name": "add"}]', [ADD1]),
    ("a bare list at the start (the special token skipped)", '\n[{"name": "add", "arguments": {"a": 1}}]', [ADD1]),
    ("text after the calls is content", '<tool_call>[{"name": "add"}]\n done', [Call("add", "{}"), "done"]),
    ("a marker after text is content", 'Sure. <tool_call>[{"name": "add"}]', ['Sure. <tool_call>[{"name": "add"}]']),
    ("the marker before something else stays content", "<tool_call> hello", ["<tool_call> hello"]),
    ("an unknown tool first leaves the whole list content", '<tool_call>[{"name": "rm", "arguments": {}}]',
     ['<tool_call>[{"name": "rm", "arguments": {}}]']),
    ("an unfinished list that started a call keeps it", '<tool_call>[{"name": "add", "arguments": {"a": 1',
     [Call("add", '{"a": 1')]),
]

PHI4_MINI = [
    ("plain text, no call", "Hello [world] functool", ["Hello [world] functool"]),
    ("functools then a list", 'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
     '{"name": "add", "arguments": {"a": 1}}]', [WEATHER, ADD1]),
    ("text after the calls is content", 'functools[{"name": "add"}]\n done', [Call("add", "{}"), "done"]),
    ("the marker after text is content", 'Sure. functools[{"name": "add"}]', ['Sure. functools[{"name": "add"}]']),
    ("the marker before something else stays content", "functools are handy", ["functools are handy"]),
    ("an unknown tool first leaves the whole list content", 'functools[{"name": "rm", "arguments": {}}]',
     ['functools[{"name": "rm", "arguments": {}}]']),
]

PYTHONIC = [
    ("plain text, no call", "Sure (or not) [ok]", ["Sure (or not) [ok]"]),
    ("a list of calls", '[get_weather(city="Paris"), add(a=1)]', [WEATHER, ADD1]),
    ("every kind of literal", "[add(a=-1, b=[1, 2.5, (3,)], c={'k': None}, d=True, e='x')]",
     [Call("add", json.dumps({"a": -1, "b": [1, 2.5, [3]], "c": {"k": None}, "d": True, "e": "x"}))]),
    ("no arguments", "[add()]", [Call("add", "{}")]),
    ("brackets and quotes in strings", '[get_weather(city="Par]i\'s)\\"")]',
     [Call("get_weather", json.dumps({"city": "Par]i's)\""}))]),
    ("whitespace around, text after", '\n[add(a=1)]\nDone.', [ADD1, "Done."]),
    ("an unknown tool leaves the list content", '[add(a=1), rm(path="/")]', ['[add(a=1), rm(path="/")]']),
    ("an expression is not a literal", "[add(a=1+1)]", ["[add(a=1+1)]"]),
    ("a call inside is not a literal", '[add(a=os.system("x"))]', ['[add(a=os.system("x"))]']),
    ("positional arguments are not a call", "[add(1)]", ["[add(1)]"]),
    ("**kwargs are not a call", "[add(**{'a': 1})]", ["[add(**{'a': 1})]"]),
    ("a method is not a call", "[x.add(a=1)]", ["[x.add(a=1)]"]),
    ("a value JSON cannot hold is not a call", "[add(a={1, 2})]", ["[add(a={1, 2})]"]),
    ("a list of other values stays content", "[1, 2]", ["[1, 2]"]),
    ("a list after text is content", "Calling [add(a=1)]", ["Calling [add(a=1)]"]),
    ("an unfinished list stays content", "[add(a=1), get_weather(city='Pa", ["[add(a=1), get_weather(city='Pa"]),
    ("invalid syntax stays content", "[add(a=1]", ["[add(a=1]"]),
]


def _xml(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


STRINGS = {"get_weather": frozenset({"city"}), "add": frozenset()}
QWEN3_CODER = [
    ("plain text, no call", "Hello <function=add> <tool", ["Hello <function=add> <tool"]),
    ("one call: a string parameter, a number", _xml("get_weather", city="Paris"), [WEATHER]),
    ("text around calls", "Let me check.\n" + _xml("get_weather", city="Paris") + "\n" + _xml("add", a=1) + "\nDone.",
     ["Let me check.", WEATHER, ADD1, "\nDone."]),
    ("a multi-line string keeps its inner newlines and quotes",
     _xml("get_weather", city='line 1\n  "line" 2\n'), [Call("get_weather", '{"city": "line 1\\n  \\"line\\" 2\\n"}')]),
    ("values that are not typed strings are JSON when they are JSON, else strings",
     _xml("add", a="[1, {\"b\" :null}]", b="true", c="2.50", d="Rome", e="NaN"),
     [Call("add", '{"a": [1, {"b": null}], "b": true, "c": 2.50, "d": "Rome", "e": "NaN"}')]),
    ("no parameters", "<tool_call><function=add></function></tool_call>", [Call("add", "{}")]),
    ("a missing </function> is forgiven", "<tool_call><function=add><parameter=a>1</parameter></tool_call> ok",
     [ADD1, "ok"]),
    ("an unknown tool stays content", _xml("rm", path="/"), [_xml("rm", path="/")]),
    ("a block that is not a function stays content", "<tool_call>{\"name\": \"add\"}</tool_call>",
     ["<tool_call>{\"name\": \"add\"}</tool_call>"]),
    ("text in a call breaks it: its rest is dropped up to the closing tag",
     "<tool_call><function=add><parameter=a>1</parameter>oops</function></tool_call> ok", [Call("add", '{"a": 1'), "ok"]),
    ("an unclosed call that started keeps its unfinished arguments",
     "x <tool_call><function=get_weather><parameter=city>\nPar", ["x", Call("get_weather", '{"city": "Par')]),
    ("an unfinished function tag is content", "x <tool_call><function=ad", ["x <tool_call><function=ad"]),
    ("only one newline after the tag is layout", _xml("get_weather", city="\nX"), [Call("get_weather", '{"city": "\\nX"}')]),
    ("a parameter name past 256 characters breaks the call",
     _xml("add", **{"k" * 300: 1}) + " ok", [Call("add", "{"), "ok"]),
    ("a value cut short keeps what was written", "<tool_call><function=add><parameter=a>12",
     [Call("add", '{"a": 12')]),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in QWEN3_CODER], ids=[c[0] for c in QWEN3_CODER])
def test_qwen3_coder(text, expected):
    for pieces in every_split(text):
        assert merged(run(Qwen3CoderParser(NAMES, STRINGS), pieces)) == expected, pieces


def test_qwen3_coder_streams_string_values_while_they_are_written():
    parser = Qwen3CoderParser(NAMES, STRINGS)
    assert parser.feed("<tool_call>\n<function=get_weather>\n<parameter=city>\nPa") == [
        CallStart("get_weather"), CallArgs("{"), CallArgs('"city": "'), CallArgs("Pa")]
    assert parser.feed("ris\n") == [CallArgs("ris")]  # the newline may be the layout before </parameter>
    assert parser.feed("\n</param") == [CallArgs("\\n")]
    assert parser.feed('eter>\n<parameter=days>\n2') == [CallArgs('"'), CallArgs(', "days": ')]
    assert parser.feed("\n</parameter>\n</function>\n</tool_call>") == [CallArgs("2"), CallArgs("}")]


def _glm(name, sep="\n", **params):
    body = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in params.items())
    return f"<tool_call>{name}{sep}{body}</tool_call>"


GLM = [
    ("plain text, no call", "Hello <arg_key> <tool", ["Hello <arg_key> <tool"]),
    ("one call", _glm("get_weather", city="Paris"), [WEATHER]),
    ("GLM-4.7: no newlines", _glm("add", sep="", a=1), [ADD1]),
    ("text around calls", "Let me check.\n" + _glm("get_weather", city="Paris") + "\n" + _glm("add", a=1) + "\nDone.",
     ["Let me check.", WEATHER, ADD1, "\nDone."]),
    ("keys and values are stripped; inner whitespace stays",
     "<tool_call>get_weather\n<arg_key> city </arg_key>\n<arg_value>\n  Par is \n</arg_value></tool_call>",
     [Call("get_weather", '{"city": "Par is"}')]),
    ("other values: JSON, a Python literal, else a string",
     _glm("add", a="[1, 2]", b="True", c="{'k': None}", d="Rome"),
     [Call("add", '{"a": [1, 2], "b": true, "c": {"k": null}, "d": "Rome"}')]),
    ("no arguments", "<tool_call>add</tool_call>", [Call("add", "{}")]),
    ("an unknown tool stays content", _glm("rm", path="/"), [_glm("rm", path="/")]),
    ("JSON in the block is not a call", '<tool_call>{"name": "add"}\n</tool_call>', ['<tool_call>{"name": "add"}\n</tool_call>']),
    ("a key without a value breaks the call", "<tool_call>add<arg_key>a</arg_key>oops</tool_call> ok",
     [Call("add", "{"), "ok"]),
    ("an unclosed call that started keeps its unfinished arguments",
     "x <tool_call>get_weather<arg_key>city</arg_key><arg_value>Par", ["x", Call("get_weather", '{"city": "Par')]),
    ("a key past 256 characters breaks the call", _glm("add", **{"k" * 300: 1}) + " ok", [Call("add", "{"), "ok"]),
    ("a name past 256 characters is not a call", "<tool_call>add" + " " * 300 + "\n</tool_call>",
     ["<tool_call>add" + " " * 300 + "\n</tool_call>"]),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in GLM], ids=[c[0] for c in GLM])
def test_glm45(text, expected):
    for pieces in every_split(text):
        assert merged(run(Glm45Parser(NAMES, STRINGS), pieces)) == expected, pieces


def test_glm45_streams_string_values_holding_back_trailing_whitespace():
    parser = Glm45Parser(NAMES, STRINGS)
    assert parser.feed("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value> Pa") == [
        CallStart("get_weather"), CallArgs("{"), CallArgs('"city": "'), CallArgs("Pa")]
    assert parser.feed("ris \n") == [CallArgs("ris")]
    assert parser.feed("x</arg_value></tool_call>") == [CallArgs(' \\nx"'), CallArgs("}")]


def _minimax(*calls):
    """A MiniMax-M2 block: (name, {key: value}) invokes, one block holding them all."""
    body = "".join(f'<invoke name="{name}">\n' + "".join(f'<parameter name="{k}">{v}</parameter>\n'
                                                          for k, v in params.items()) + "</invoke>\n"
                   for name, params in calls)
    return f"<minimax:tool_call>\n{body}</minimax:tool_call>"


MINIMAX = [
    ("plain text, no call", 'Hello <invoke name="add"> <minimax', ['Hello <invoke name="add"> <minimax']),
    ("one call", _minimax(("get_weather", {"city": "Paris"})), [WEATHER]),
    ("two calls in one block, text around", "Let me check.\n" + _minimax(("get_weather", {"city": "Paris"}),
                                                                       ("add", {"a": 1})) + "\nDone.",
     ["Let me check.", WEATHER, ADD1, "\nDone."]),
    ("two blocks", _minimax(("get_weather", {"city": "Paris"})) + _minimax(("add", {"a": 1})), [WEATHER, ADD1]),
    ("single quotes, and values typed by the schemas",
     "<minimax:tool_call><invoke name='add'><parameter name='a'>[1, 2]</parameter>"
     "<parameter name='b'>True</parameter></invoke></minimax:tool_call>", [Call("add", '{"a": [1, 2], "b": true}')]),
    ("a string keeps its inner newlines", _minimax(("get_weather", {"city": "\nline 1\n  line 2\n"})),
     [Call("get_weather", '{"city": "line 1\\n  line 2"}')]),
    ("no parameters", '<minimax:tool_call><invoke name="add"></invoke></minimax:tool_call>', [Call("add", "{}")]),
    ("an unknown tool stays content", _minimax(("rm", {"path": "/"})), [_minimax(("rm", {"path": "/"}))]),
    ("a missing </invoke> is forgiven", '<minimax:tool_call><invoke name="add"><parameter name="a">1</parameter>'
                                        "</minimax:tool_call> ok", [ADD1, "ok"]),
    ("... before the next invoke too", '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
                                       '</parameter>\n<invoke name="add">\n<parameter name="a">1</parameter>\n</invoke>\n'
                                       "</minimax:tool_call>", [WEATHER, ADD1]),
    ("text in a call breaks it: its rest is dropped up to the closing tag",
     '<minimax:tool_call><invoke name="add"><parameter name="a">1</parameter>oops</invoke></minimax:tool_call> ok',
     [Call("add", '{"a": 1'), "ok"]),
    ("an unclosed call that started keeps its unfinished arguments",
     'x <minimax:tool_call><invoke name="get_weather"><parameter name="city">Par', ["x", Call("get_weather", '{"city": "Par')]),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in MINIMAX], ids=[c[0] for c in MINIMAX])
def test_minimax_m2(text, expected):
    for pieces in every_split(text):
        assert merged(run(MiniMaxM2Parser(NAMES, STRINGS), pieces)) == expected, pieces


B, E, CB, CE, SEP = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def _deepseek(*calls, v31=False):
    """A DeepSeek section: (name, arguments text) calls, V3's fenced form or V3.1's."""
    if v31:
        return B + "".join(f"{CB}{name}{SEP}{args}{CE}" for name, args in calls) + E
    return B + "".join(f"{CB}function{SEP}{name}\n```json\n{args}\n```{CE}" for name, args in calls) + E


def _kimi(*calls):
    return "<|tool_calls_section_begin|>" + "".join(
        f"<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
        for i, (name, args) in enumerate(calls)) + "<|tool_calls_section_end|>"


def _marked_cases(section):
    """The cases every marked-section format shares: `section(*(name, arguments))` writes one section."""
    one, two = section(("get_weather", '{"city": "Paris"}')), section(("get_weather", '{"city": "Paris"}'),
                                                                      ("add", '{"a": 1}'))
    unknown, cut = section(("rm", '{"path": "/"}')), section(("get_weather", '{"city": "Par'))
    return [
        ("one call", one, [WEATHER]),
        ("two calls in one section, text around", "Let me check.\n" + two + "\nDone.",
         ["Let me check.", WEATHER, ADD1, "\nDone."]),
        ("two sections", one + section(("add", '{"a": 1}')), [WEATHER, ADD1]),
        ("nested JSON and markers inside strings",
         section(("add", '{"a": {"b": [1, "' + E + '"]}}')), [Call("add", '{"a": {"b": [1, "' + E + '"]}}')]),
        ("an unknown tool stays content", unknown, [unknown]),
        ("an unknown tool after a call ends the section there",
         section(("add", '{"a": 1}'), ("rm", "{}")) + " ok", [ADD1, "ok"]),
        ("broken JSON: the call ends where it broke, the section's rest is dropped",
         section(("add", '{"a": NaN}')) + " ok", [Call("add", '{"a": '), "ok"]),
        ("an unclosed call that started keeps its unfinished arguments",
         "x " + cut[:cut.index('"Par') + 4], ["x", Call("get_weather", '{"city": "Par')]),
    ]


DEEPSEEK = _marked_cases(_deepseek) + [
    ("plain text, no call", "Hello <｜tool▁calls <tool_call>", ["Hello <｜tool▁calls <tool_call>"]),
    ("an empty section is content", B + E + " hi", [B + E + " hi"]),
    ("no fence: not V3's form, content", B + CB + "function" + SEP + 'add\n{"a": 1}' + CE + E,
     [B + CB + "function" + SEP + 'add\n{"a": 1}' + CE + E]),
]
DEEPSEEK_V31 = _marked_cases(lambda *calls: _deepseek(*calls, v31=True)) + [
    ("a section opening after a broken call, however the text is split",
     B + CB + "add" + SEP + '{"a": NaN}' + CE + " " + _deepseek(("add", '{"a": 1}'), v31=True),
     [Call("add", '{"a": '), "NaN}" + CE, ADD1]),  # no closing marker before the new section: content
    ("V3's fenced form is not V3.1's", _deepseek(("add", '{"a": 1}')), [_deepseek(("add", '{"a": 1}'))]),
]
KIMI = _marked_cases(_kimi) + [
    ("the singular closing marker too", "<|tool_call_section_begin|><|tool_call_begin|>functions.add:0"
                                        '<|tool_call_argument_begin|>{"a": 1}<|tool_call_end|><|tool_call_section_end|> ok',
     [ADD1, "ok"]),
    ("a section opening after a broken call, however the text is split",
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>{\"a\": NaN}"
     "<|tool_call_end|> " + _kimi(("add", '{"a": 1}')), [Call("add", '{"a": '), "NaN}<|tool_call_end|>", ADD1]),
    ("the older section marker", "<|tool_call_section_begin|><|tool_call_begin|>functions.add:0"
                                 '<|tool_call_argument_begin|>{"a": 1}<|tool_call_end|><|tool_calls_section_end|>', [ADD1]),
    ("a name without its functions. prefix or index", "<|tool_calls_section_begin|><|tool_call_begin|>add"
                                                      '<|tool_call_argument_begin|>{"a": 1}<|tool_call_end|>'
                                                      "<|tool_calls_section_end|>", [ADD1]),
]


@pytest.mark.parametrize("kind,text,expected", [(k, *c[1:]) for k, cases in (
    (DeepSeekV3Parser, DEEPSEEK), (DeepSeekV31Parser, DEEPSEEK_V31), (KimiK2Parser, KIMI)) for c in cases],
    ids=[f"{k}-{c[0]}" for k, cases in (("v3", DEEPSEEK), ("v31", DEEPSEEK_V31), ("kimi", KIMI)) for c in cases])
def test_marked_sections(kind, text, expected):
    for pieces in every_split(text):
        assert merged(run(kind(NAMES), pieces)) == expected, pieces


def test_marked_arguments_stream_as_they_are_written():
    parser = DeepSeekV31Parser(NAMES)
    assert parser.feed("Sure." + B + CB + "get_wea") == ["Sure."]
    assert parser.feed("ther" + SEP + '{"city": "Pa') == [CallStart("get_weather"), CallArgs('{"city": "Pa')]
    assert parser.feed('ris"}' + CE) == [CallArgs('ris"}')]
    assert parser.feed(E + " done") == ["done"]  # trimmed after the call, as every format trims
    assert parser.finish() == []


def test_qwen3_coder_types_come_from_the_tools_schemas():
    """A request's string-typed parameters stay strings even when they read as JSON; others are JSON."""
    import msgspec

    from radixflow.frontend.openai_schemas import ChatRequest
    from radixflow.frontend.tools import tool_plan

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string"}, "n": {"type": ["string", "null"]}, "i": {"type": "integer"}, "e": {"enum": [1]},
        "o": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}}  # o: pydantic's Optional[str]
    req = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [tool]}, ChatRequest)
    plan = tool_plan(req, None, True, "qwen3_coder")
    assert plan.strings == {"f": frozenset({"s", "n", "o"})}
    text = "<tool_call><function=f>" + "".join(f"<parameter={k}>\n123\n</parameter>" for k in "snieo") + "</function></tool_call>"
    assert merged(run(plan.parser(), [text])) == [Call("f", '{"s": "123", "n": "123", "i": 123, "e": 123, "o": "123"}')]


def _cases(cases):
    return pytest.mark.parametrize("text,expected", [c[1:] for c in cases], ids=[c[0] for c in cases])


@_cases(LLAMA)
def test_llama3_json(text, expected):
    for pieces in every_split(text):
        assert merged(run(Llama3JsonParser(NAMES), pieces)) == expected, pieces


@_cases(MISTRAL)
def test_mistral(text, expected):
    for pieces in every_split(text):
        assert merged(run(MistralParser(NAMES), pieces)) == expected, pieces


@_cases(GRANITE)
def test_granite(text, expected):
    for pieces in every_split(text):
        assert merged(run(GraniteParser(NAMES), pieces)) == expected, pieces


@_cases(PHI4_MINI)
def test_phi4_mini(text, expected):
    for pieces in every_split(text):
        assert merged(run(Phi4MiniParser(NAMES), pieces)) == expected, pieces


@_cases(PYTHONIC)
def test_pythonic(text, expected):
    for pieces in every_split(text):
        assert merged(run(PythonicParser(NAMES), pieces)) == expected, pieces


def test_mistral_v11_arguments_stream():
    parser = MistralParser(NAMES)
    assert parser.feed("[TOOL_CALLS]get_wea") == []
    assert parser.feed('ther[ARGS]{"city": "Pa') == [CallStart("get_weather"), CallArgs('{"city": "Pa')]
    assert parser.feed('ris"}') == [CallArgs('ris"}')]
    assert parser.finish() == []


@pytest.mark.parametrize("parser,tools,asked,kept", [
    ("mistral", True, None, False), ("mistral", True, True, True), ("mistral", False, None, None),
    ("hermes", True, None, None), ("deepseek_v3", True, None, False), ("kimi_k2", True, None, False)])
def test_the_mistral_parser_keeps_special_tokens_unless_the_request_drops_them(parser, tools, asked, kept):
    """[TOOL_CALLS] and [ARGS] are special tokens: under --tool-call-parser mistral, tool_choice
    "auto" keeps them in the text (skip_special_tokens false) unless the request says otherwise."""
    from types import SimpleNamespace

    import msgspec

    from radixflow.frontend.chat import ChatShape
    from radixflow.frontend.limits import RequestLimits
    from radixflow.frontend.openai_schemas import ChatRequest

    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "skip_special_tokens": asked}
    if tools:
        body["tools"] = [{"type": "function", "function": {"name": "add"}}]
    req = msgspec.convert(body, ChatRequest)
    server = SimpleNamespace(limits=RequestLimits(), engine=SimpleNamespace(supports_grammar=True),
                             tool_call_parser=parser, reasoning_parser=None)
    ChatShape().check(req, SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(server=server))))
    assert req.skip_special_tokens is kept


def test_plain_text_streams_once_it_cannot_be_a_call():
    """Each format holds back only what may still become a call: a refused object or list is
    content as soon as it is refused, not when it closes."""
    hermes = HermesParser(NAMES)
    assert merged(hermes.feed('<tool_call>{"name": "rm",')) == ['<tool_call>{"name": "rm",']
    assert hermes.feed(' "arguments": {}} and prose') == [' "arguments": {}} and prose']
    llama = Llama3JsonParser(NAMES)
    assert merged(llama.feed("{Note:")) == ["{Note:"] and llama.feed(" more") == [" more"]
    mistral = MistralParser(NAMES)
    assert merged(mistral.feed("[Note:")) == ["[Note:"] and mistral.feed(" more") == [" more"]
    llama = Llama3JsonParser(NAMES)
    assert llama.feed(" <|py") == [] and llama.feed("thon") == [] and llama.feed("n") == [" <|pythonn"]
    assert llama.feed(" more") == [" more"]
    mistral = MistralParser(NAMES)
    assert mistral.feed("[TOOL") == [] and merged(mistral.feed("S] x [TO")) == ["[TOOLS] x"]
    assert mistral.feed("OL_CALLS][") == [] and whole(mistral.feed('{"name": "add"}]')) == [Call("add", "{}")]
    pythonic = PythonicParser(NAMES)
    assert pythonic.feed("[add(a=1)") == [] and whole(pythonic.feed("] ok")) == [ADD1, "ok"]
    assert pythonic.feed(" go") == [" go"]


def test_parsers_by_flag_name():
    from radixflow.frontend.harmony import HarmonyChoiceParser
    from radixflow.frontend.tool_call_formats import check_parser_name

    assert set(PARSERS) == {"hermes", "llama3_json", "mistral", "pythonic", "qwen3_coder", "glm45", "glm47",
                            "granite", "phi4_mini_json", "gpt_oss", "minimax_m2", "deepseek_v3", "deepseek_v31",
                            "kimi_k2"}
    assert isinstance(auto_parser("mistral", NAMES, parallel=True), MistralParser)
    assert isinstance(auto_parser("openai", NAMES, parallel=True), HarmonyChoiceParser)  # vLLM's name for it
    assert check_parser_name("gpt-oss") == check_parser_name("openai") == "gpt_oss"
    assert check_parser_name("deepseekv3") == "deepseek_v3" and check_parser_name("deepseekv31") == "deepseek_v31"
    with pytest.raises(ValueError, match="--tool-call-parser must be one of hermes, llama3_json, mistral, "
                                         "pythonic, qwen3_coder, glm45, glm47, granite, phi4_mini_json, gpt_oss, "
                                         "minimax_m2, deepseek_v3, deepseek_v31, kimi_k2; "
                                         "got 'qwen'"):
        auto_parser("qwen", NAMES, parallel=True)


ONE_CALL = [
    (HermesParser, 'A <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call> B '
     '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> C', ["A", WEATHER, " B C"]),
    (Llama3JsonParser, '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
     '{"name": "add", "parameters": {"a": 1}}', [WEATHER]),
    (MistralParser, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add"}] ok',
     [WEATHER, "ok"]),
    (PythonicParser, '[get_weather(city="Paris"), add(a=1)]', [WEATHER]),
    (GraniteParser, '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add"}] ok',
     [WEATHER, "ok"]),
    (Phi4MiniParser, 'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add"}] ok',
     [WEATHER, "ok"]),
    (Qwen3CoderParser, _xml("get_weather", city="Paris") + " B " + _xml("add", a=1), [WEATHER, "B"]),
    (DeepSeekV3Parser, _deepseek(("get_weather", '{"city": "Paris"}'), ("add", '{"a": 1}')), [WEATHER]),
    (KimiK2Parser, _kimi(("get_weather", '{"city": "Paris"}'), ("add", '{"a": 1}')) + " ok", [WEATHER, "ok"]),
]


@pytest.mark.parametrize("kind,text,expected", ONE_CALL, ids=[c[0].__name__ for c in ONE_CALL])
def test_parallel_tool_calls_false_keeps_the_first_call_only(kind, text, expected):
    """Later calls are dropped, not shown as content; text around them stays."""
    for pieces in every_split(text):
        assert merged(run(FirstCallOnly(kind(NAMES)), pieces)) == expected, pieces
    name = next(n for n, k in PARSERS.items() if k is kind)
    assert merged(run(auto_parser(name, NAMES, parallel=False), [text])) == expected
    assert len([e for e in whole(run(auto_parser(name, NAMES, parallel=True), [text])) if isinstance(e, Call)]) == 2


BREAKS = [  # after the call started: its arguments end where the JSON broke (NaN and Infinity are not JSON)
    (HermesParser, '<tool_call>{"name": "add", "arguments": {"a": NaN}}</tool_call>', '{"a": '),
    (Llama3JsonParser, '{"name": "add", "parameters": {"a": -Infinity}}', '{"a": -'),
    (MistralParser, '[TOOL_CALLS][{"name": "add", "arguments": {"a": Infinity}}, {"name": "add"}]', '{"a": '),
    (JsonCallsParser, '[{"name": "add", "arguments": {"a": NaN}}]', '{"a": '),
    (lambda names: JsonCallsParser(names, name="add"), '{"a": NaN}', '{"a": '),
]


@pytest.mark.parametrize("kind,text,arguments", BREAKS)
def test_arguments_that_break_end_there(kind, text, arguments):
    """A started call is never taken back: what was given of its arguments is the call's, a valid
    start of JSON, and the rest of the call (and of its list) is dropped."""
    for pieces in every_split(text):
        assert merged(run(kind(NAMES), pieces)) == [Call("add", arguments)], pieces
    assert merged(run(HermesParser(NAMES), ['<tool_call>{"name": "add", "arguments": {"a": 1e999}}</tool_call>'])) \
        == [Call("add", '{"a": 1e999}')]  # a number JSON can write, however large
