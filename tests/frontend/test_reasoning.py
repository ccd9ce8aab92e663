"""The reasoning parsers on their own (`--reasoning-parser`): reasoning and content of an output fed
whole, a character at a time, cut at every position and in random pieces, alone and ahead of a
tool-call parser."""
from __future__ import annotations

import pytest
from text_pieces import every_split  # noqa: E402  (tests/frontend is on sys.path via conftest)

from radixflow.frontend.reasoning import ChoiceParser
from radixflow.runtime.text.reasoning import FORMATS, ReasoningParser, Thought, check_reasoning_parser, split_reasoning
from radixflow.frontend.tool_calls import Call, HermesParser, call_events, whole


def split(parser, parts):
    """(reasoning, content, calls, whether a block was seen) of the parts fed in order."""
    events = []
    for part in parts:
        events += parser.feed(part)
    events += parser.finish()
    assert all(e != "" and e != Thought("") for e in events), events  # nothing empty is given out
    thought = "".join(e.text for e in events if isinstance(e, Thought))
    content = "".join(e for e in events if isinstance(e, str))
    calls = [e for e in whole(events) if isinstance(e, Call)]
    block = parser.saw_block if isinstance(parser, ReasoningParser) else parser.reasoning.saw_block
    return thought, content, calls, block


CASES = [
    # (output, opened: reasoning, content, saw a block ; not opened: the same)
    ("<think>\nLet me add.\n</think>\n\nIt is 4.", ("Let me add.", "It is 4.", True), ("Let me add.", "It is 4.", True)),
    ("Let me add.\n</think>\n\nIt is 4.", ("Let me add.", "It is 4.", True),
     (None, "Let me add.\n</think>\n\nIt is 4.", False)),
    ("It is 4.", ("It is 4.", "", True), (None, "It is 4.", False)),
    ("<think>still going", ("still going", "", True), ("still going", "", True)),
    ("<think></think>answer", ("", "answer", True), ("", "answer", True)),
    ("<think>a\n\n b </think>", ("a\n\n b", "", True), ("a\n\n b", "", True)),
    ("<think>x</think> <think>y</think>", ("x", "<think>y</think>", True), ("x", "<think>y</think>", True)),
    ("a < b </thinking> </think>c", ("a < b </thinking>", "c", True), (None, "a < b </thinking> </think>c", False)),
    ("<thi", ("<thi", "", True), (None, "<thi", False)),
    (" <think>x</think>y", ("<think>x", "y", True), (None, " <think>x</think>y", False)),
    ("<think>x</thi", ("x</thi", "", True), ("x</thi", "", True)),
    ("", ("", "", False), (None, "", False)),
]


@pytest.mark.parametrize("text, opened_case, plain_case", CASES)
def test_reasoning_and_content_fed_in_any_pieces(text, opened_case, plain_case):
    for opened, (thought, content, block) in ((True, opened_case), (False, plain_case)):
        for parts in every_split(text):
            got = split(ReasoningParser(opened), parts)
            assert got == (thought or "", content, [], block), (opened, parts)


@pytest.mark.parametrize("text, opened_case, plain_case", CASES)
def test_seed_oss_tags_split_as_think_tags_do(text, opened_case, plain_case):
    """Seed-OSS's <seed:think> ... </seed:think>: every case above with its tags in place of <think>'s
    (the text between is unchanged), and <think> tags are plain text there."""
    fmt = FORMATS["seed_oss"]
    seed = text.replace("<think>", fmt.open_tag).replace("</think>", fmt.close_tag).replace(
        "<thi", "<seed:thi").replace("</thi", "</seed:thi")
    for opened, (thought, content, block) in ((True, opened_case), (False, plain_case)):
        swap = (lambda t: t.replace("<think>", fmt.open_tag).replace("</think>", fmt.close_tag)
                .replace("<thi", "<seed:thi").replace("</thi", "</seed:thi"))
        for parts in every_split(seed):
            got = split(ReasoningParser(opened, fmt), parts)
            assert got == (swap(thought or ""), swap(content), [], block), (opened, parts)
    assert split_reasoning("<think>a</think> b", "seed_oss") == (None, "<think>a</think> b")
    assert split_reasoning("<seed:think>a</seed:think> b", "seed_oss") == ("a", "b")


def test_content_after_the_block_goes_to_the_tool_parser():
    text = ('<think>I should call <tool_call>{"name": "add"}</tool_call> maybe</think>\n'
            'Sure.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    for parts in every_split(text):
        parser = ChoiceParser(ReasoningParser(False), HermesParser(frozenset({"add"})), include=True)
        assert split(parser, parts) == ('I should call <tool_call>{"name": "add"}</tool_call> maybe', "Sure.",
                                        [Call("add", '{"a": 1}')], True)


def test_include_false_drops_the_reasoning():
    parser = ChoiceParser(ReasoningParser(True), None, include=False)
    assert split(parser, ["thinking</think>", "answer"]) == ("", "answer", [], True)


def test_format_names():
    assert check_reasoning_parser(None) is None
    assert check_reasoning_parser("deepseek-r1") == "deepseek_r1"
    assert check_reasoning_parser("glm45") == "qwen3" and check_reasoning_parser("openai_gptoss") == "gpt_oss"
    assert {check_reasoning_parser(name) for name in FORMATS} == set(FORMATS)
    with pytest.raises(ValueError, match="--reasoning-parser must be one of"):
        check_reasoning_parser("o1")


def test_response_items_in_the_order_of_the_events():
    from radixflow.frontend.responses_output import OutputItems, conversation_items
    from radixflow.frontend.responses_schemas import CallItem, MessageItem, ThoughtItem

    items = OutputItems()
    events = (Thought("a"), Thought("b"), "Sure.", *call_events(Call("add", "{}")), "Done.")
    frames = [f for e in events for f in items.add(e)]
    frames += items.finish("completed")
    assert [i.__struct_config__.tag for i in items.items] == ["reasoning", "message", "function_call", "message"]
    assert items.items[0].content[0].text == "ab" and items.items[0].status == "completed"
    assert [f["type"] for f in frames if "reasoning" in f["type"]] == ["response.reasoning_text.delta"] * 2 + [
        "response.reasoning_text.done"]
    assert conversation_items(items.items) == [ThoughtItem("ab"), MessageItem("assistant", "Sure."),
                                               CallItem(items.items[2].call_id, "add", "{}"),
                                               MessageItem("assistant", "Done.")]


def test_a_reasoning_item_is_the_next_assistant_turns_reasoning():
    from radixflow.frontend.responses_input import chat_messages, read_items

    items = read_items([{"role": "user", "content": "Hi"},
                        {"type": "reasoning", "id": "rs_1", "summary": [],
                         "content": [{"type": "reasoning_text", "text": "hmm"}]},
                        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
                        {"type": "function_call_output", "call_id": "c1", "output": "2"},
                        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "ok"}]},
                        {"type": "message", "role": "assistant", "content": "It is 2."}])
    turns = [(m.role, m.content, m.reasoning_content, bool(m.tool_calls)) for m in chat_messages(items)]
    assert turns == [("user", "Hi", None, False), ("assistant", None, "hmm", True), ("tool", "2", None, False),
                     ("assistant", "It is 2.", "ok", False)]


def test_a_reasoning_item_before_a_user_turn_is_an_assistant_turn_of_its_own():
    from radixflow.frontend.responses_input import chat_messages, read_items

    items = read_items([{"type": "reasoning", "summary": [{"type": "summary_text", "text": "a"}]},
                        {"role": "user", "content": "Hi"}, {"type": "reasoning", "content": [], "summary": []}])
    assert [(m.role, m.content, m.reasoning_content) for m in chat_messages(items)] == [
        ("assistant", None, "a"), ("user", "Hi", None), ("assistant", None, "")]


def test_split_reasoning_of_a_whole_output():
    assert split_reasoning("<think>a</think> b", "qwen3") == ("a", "b")
    assert split_reasoning("b", "qwen3") == (None, "b")
    assert split_reasoning("a</think>b", "deepseek_r1") == ("a", "b")
    assert split_reasoning("", "deepseek_r1") == (None, "")


def test_kimis_older_tags_split_as_think_tags_do():
    fmt = FORMATS["kimi"]
    text = "◁think▷\nLet me add.\n◁/think▷\n\nIt is 4."
    for parts in every_split(text):
        assert split(ReasoningParser(False, fmt), parts) == ("Let me add.", "It is 4.", [], True), parts
    assert split_reasoning("<think>a</think> b", "kimi") == (None, "<think>a</think> b")
    assert check_reasoning_parser("kimi-k2") == "kimi_k2"  # SGLang's spelling


@pytest.mark.parametrize("kwargs, opened", [({}, False), ({"thinking": True}, True), ({"thinking": False}, False),
                                            ({"enable_thinking": True}, True)])
def test_deepseek_v31_thinks_only_when_its_template_is_told_to(kwargs, opened):
    """DeepSeek-V3.1's template opens the block only with `thinking` true (its default is not to
    think): deepseek_v3 starts the output inside the block then, and reads a <think> the output
    opens with otherwise; deepseek_r1's output is in the block unless told not to think."""
    import msgspec

    from radixflow.frontend.chat import reasoning_plan
    from radixflow.frontend.openai_schemas import ChatRequest
    from radixflow.frontend.tools import NO_TOOLS

    req = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "x"}],
                           "chat_template_kwargs": kwargs}, ChatRequest)
    assert reasoning_plan(req, NO_TOOLS, "deepseek_v3").opened is opened
    assert reasoning_plan(req, NO_TOOLS, "deepseek_r1").opened is (kwargs.get("thinking", True) is not False)
    assert check_reasoning_parser("deepseek_v31") == check_reasoning_parser("deepseek-v3") == "deepseek_v3"
    assert split_reasoning("a</think>b", "deepseek_v3") == (None, "a</think>b")  # not told to think
    assert split_reasoning("<think>a</think>b", "deepseek_v3") == ("a", "b")


def test_kimi_k2_reasoning_ends_where_its_tool_calls_begin():
    """Kimi K2 may call tools from inside its <think> block, without closing it: the block ends
    where a tool-call section opens, and the section is content (for the tool-call parser)."""
    fmt = FORMATS[check_reasoning_parser("kimi_k2")]
    section = '<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>{"a": 1}'
    for opening in ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>"):
        text = "<think>I should call the tool.\n" + section.replace("<|tool_calls_section_begin|>", opening)
        for parts in every_split(text):
            got = split(ReasoningParser(False, fmt), parts)
            assert got[:2] == ("I should call the tool.", text[len("<think>I should call the tool.\n"):]), parts
    assert split(ReasoningParser(False, fmt), ["<think>a</think>b <|tool_calls_section_begin|>"])[:2] == (
        "a", "b <|tool_calls_section_begin|>")  # after the block the marker is content as any text
