"""JSON read a character at a time (frontend/json_stream.py) and tool calls read as they are
written (frontend/call_stream.py): checked against Python's json on random values, layouts and
one-character mutations, and through the Hermes parser in random pieces."""
from __future__ import annotations

import json
import random
import string

from radixflow.frontend.json_stream import JsonReader
from radixflow.frontend.tool_calls import CallArgs, CallStart, HermesParser, whole


def _read(text):
    """(whether the value completed, the canonical text given out)."""
    reader, out = JsonReader(), []
    for c in text:
        piece = reader.step(c)
        if piece is None:
            assert reader.failed
            break
        out.append(piece)
    return reader.done, "".join(out)


def _value(rng, depth=0):
    if depth > 3 or rng.random() < 0.3:
        return rng.choice([0, -7, 2.5e-3, 1e21, True, False, None, 'q"\\/', "é\n\t\x01", "\u2028", 2 ** 70])
    if rng.random() < 0.5:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "b\"", "c\n", "ü"]): _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _layout(rng, value, ascii=False):
    return json.dumps(value, indent=rng.choice([None, 1, "\t"]), ensure_ascii=ascii,
                      separators=rng.choice([None, (",", ":"), (" , ", " : ")]))


def test_canonical_text_of_random_values_in_random_layouts():
    """Whatever the layout, the text given out is json.dumps's (strings and numbers as written)."""
    rng = random.Random(0)
    for _ in range(400):
        value, ascii = {"k": _value(rng)}, rng.random() < 0.5
        assert _read(_layout(rng, value, ascii)) == (True, json.dumps(value, ensure_ascii=ascii))


def test_a_text_is_read_to_its_end_exactly_when_python_parses_it():
    rng = random.Random(1)
    for _ in range(600):
        text = json.dumps({"k": _value(rng)})
        at = rng.randrange(len(text))
        mutated = text[:at] + rng.choice(string.printable.strip() + " ") + text[at + 1:]
        try:
            json.loads(mutated)
            valid = True
        except ValueError:
            valid = False
        assert _read(mutated)[0] == valid, mutated


def test_escapes_and_raw_control_characters():
    assert _read('{"s": "a\\u00e9\\n\\"\\\\", "t": "x\ny\x01"}') == (True, '{"s": "a\\u00e9\\n\\"\\\\", "t": "x\\ny\\u0001"}')
    assert _read('{"s": "\\x"}') == (False, '{"s": "')  # the backslash waits for what follows it
    assert _read('{"n": 01}') == (False, '{"n": 0')
    assert _read('[1, 2,]') == (False, "[1, 2, ")


def test_hermes_arguments_stream_while_the_block_is_open():
    parser = HermesParser(frozenset({"write"}))
    assert parser.feed('<tool_call>\n{"name": "write", "arguments": {"path": "a.py", "code": "def f') == [
        CallStart("write"), CallArgs('{"path": "a.py", "code": "def f')]
    assert parser.feed("():\n    return 1 <") == [CallArgs("():\\n    return 1 <")]  # in a string: not a tag
    assert parser.feed('2"}}\n</tool_call>') == [CallArgs('2"}')]  # the second brace closes the call object
    assert parser.finish() == []


def test_calls_in_random_pieces_give_the_same_events_as_whole_text():
    rng = random.Random(2)
    names = frozenset({"f", "g"})
    for _ in range(150):
        calls = [(rng.choice(sorted(names)), {"x": _value(rng)}) for _ in range(rng.randint(1, 3))]
        text = "pre " + "".join(
            f"<tool_call>{_layout(rng, {'name': n, 'arguments': a})}</tool_call>\n" for n, a in calls) + "post"
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        parser = HermesParser(names)
        events = [e for p in pieces for e in parser.feed(p)] + parser.finish()
        got = whole(events)
        assert "".join(e for e in got if isinstance(e, str)) == "pre post"
        called = [(e.name, json.loads(e.arguments)) for e in got if not isinstance(e, str)]
        assert called == calls
