"""The `structural_tag` constraint without the engine: its checks, and the texts its llguidance
grammar takes (free text; at a trigger, a structure's begin, JSON of its schema, its end)."""
from __future__ import annotations

import json

import pytest

from radixflow.runtime.grammar.backend import GrammarError
from radixflow.runtime.grammar.spec import GrammarKey, grammar_key
from radixflow.runtime.grammar.structural_tag import MAX_STRUCTURES, MAX_TRIGGERS, normalize
from radixflow.runtime.grammar.vocab import TokenVocab
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.text.tokenizer import Tokenizer

pytest.importorskip("llguidance", reason="structural_tag needs llguidance: pip install 'radixflow[llguidance]'")

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
CLOCK = {"type": "object", "properties": {"tz": {"type": "integer"}}, "required": ["tz"],
         "additionalProperties": False}
TOOLS = {"structures": [{"begin": "<function=get_weather>", "schema": WEATHER, "end": "</function>"},
                        {"begin": "<function=get_time>", "schema": CLOCK, "end": "</function>"}],
         "triggers": ["<function="]}


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_dir(demo_model("tiny"))


@pytest.fixture(scope="module")
def backend(tokenizer):
    from radixflow.runtime.grammar.llguidance_backend import LLGuidanceBackend

    vocab = TokenVocab.from_tokenizer(tokenizer, tokenizer.vocab_size, tokenizer.eos_token_ids)
    b = LLGuidanceBackend(tokenizer, vocab)
    yield b
    b.close()


def _compile(backend, tag: dict | str):
    return backend.compile(GrammarKey("structural_tag", normalize(tag)), 5.0)


def _takes(grammar, tokenizer, text: str) -> bool:
    """Whether `text` is a complete match of `grammar`."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    matcher = grammar.new_matcher()
    return matcher.count_valid(ids) == len(ids) and matcher.accepting_after(ids)


@pytest.mark.parametrize("text, ok", [
    ("", True),
    ("no call at all, just text", True),
    ('<function=get_weather>{"city":"Paris"}</function>', True),
    ('I will look. <function=get_weather>{"city":"Paris"}</function> Done.', True),
    ('a<function=get_time>{"tz":3}</function>b<function=get_weather>{"city":"x"}</function>c', True),
    ("text ending in half a trigger <function", True),
    ('<function=get_weather>{"city":1}</function>', False),        # JSON against the schema
    ('<function=get_weather>{"city":"Paris"}', False),             # no end
    ('<function=get_weather>{"city": "Paris"}</function>', False),  # JSON is compact
    ("a trigger in free text <function=other> is a call", False),
    ("a bare trigger <function=", False),
])
def test_texts_the_grammar_takes(backend, tokenizer, text, ok):
    assert _takes(_compile(backend, TOOLS), tokenizer, text) is ok


def test_after_a_trigger_the_begin_and_the_json_punctuation_are_forced(backend, tokenizer):
    matcher = _compile(backend, {**TOOLS, "structures": TOOLS["structures"][:1]}).new_matcher()
    assert matcher.forced_bytes() == b""  # free text
    ids = tokenizer.encode("Sure. <function=", add_special_tokens=False)
    assert matcher.count_valid(ids) == len(ids) and all(matcher.accept(t) for t in ids)
    assert matcher.forced_bytes() == b'get_weather>{"city":"'


def test_overlapping_triggers_and_special_characters(backend, tokenizer):
    tag = {"structures": [{"begin": "<function=a>", "schema": {"type": "integer"}, "end": "</f>"},
                          {"begin": '<f"\\/[.*]\n\u00e9\U0001F600', "schema": {"type": "boolean"}, "end": ""}],
           "triggers": ["<f", "<function=", "<f"]}
    grammar = _compile(backend, tag)
    assert _takes(grammar, tokenizer, "x<function=a>12</f>y")
    assert _takes(grammar, tokenizer, 'x<f"\\/[.*]\n\u00e9\U0001F600true tail')
    assert not _takes(grammar, tokenizer, "x<fz")
    assert not _takes(grammar, tokenizer, "x<function=a>true</f>")


def test_a_type_key_and_json_text_are_the_same_grammar():
    text = json.dumps({"type": "structural_tag", **TOOLS})
    assert normalize(text) == normalize(TOOLS)
    key = grammar_key(SamplingParams(structural_tag=text))
    assert key == GrammarKey("structural_tag", normalize(TOOLS))


def test_the_key_keeps_the_kind():
    """A structural tag and an EBNF grammar of the same text are different cache entries."""
    assert grammar_key(SamplingParams(structural_tag=TOOLS)).kind == "structural_tag"


def _tag(**change) -> dict:
    structure = {**TOOLS["structures"][0], **change.pop("structure", {})}
    return {"structures": [structure], "triggers": ["<function="], **change}


@pytest.mark.parametrize("tag, why", [
    ("[]", "JSON object"),
    ({"triggers": ["<f"]}, "structures"),
    (_tag(structures=[]), "structures"),
    (_tag(triggers=[]), "triggers"),
    (_tag(triggers=[""]), "triggers"),
    (_tag(triggers="<function="), "triggers"),
    (_tag(structure={"begin": "<tool>"}), "structures[0].begin"),
    (_tag(structure={"schema": ["not", "an", "object"]}), "structures[0].schema"),
    (_tag(structure={"schema": None}), "structures[0].schema"),
    (_tag(structure={"end": 5}), "structures[0].end"),
    (_tag(structure={"name": "x"}), "structures[0]"),
    (_tag(extra=1), "extra"),
    ({"type": "structural_tag", "format": {"type": "triggered_tags"}}, "format"),
    (_tag(structures=[TOOLS["structures"][0]] * (MAX_STRUCTURES + 1)), str(MAX_STRUCTURES)),
    (_tag(triggers=[f"<{i}" for i in range(MAX_TRIGGERS)] + ["<function="]), str(MAX_TRIGGERS)),
])
def test_bad_tags_are_value_errors_naming_the_field(tag, why):
    with pytest.raises(ValueError, match=r"^sampling_params\.structural_tag") as info:
        grammar_key(SamplingParams(structural_tag=tag))
    assert why in str(info.value), str(info.value)


def test_not_json_text_is_a_value_error():
    with pytest.raises(ValueError, match=r"^structural_tag is not valid JSON"):
        SamplingParams.from_dict({"structural_tag": "{structures"})


def test_one_constraint_at_a_time():
    with pytest.raises(ValueError, match="structural_tag"):
        SamplingParams.from_dict({"structural_tag": TOOLS, "regex": "a"})
    assert SamplingParams(structural_tag=TOOLS).is_constrained


def test_a_schema_that_matches_nothing_is_refused_naming_its_structure(backend):
    tag = {**TOOLS, "structures": [TOOLS["structures"][0],
                                   {"begin": "<function=x>", "schema": {"enum": []}, "end": "</function>"}]}
    with pytest.raises(GrammarError, match=r"^structural_tag: structures\[1\]\.schema"):
        _compile(backend, tag)


def test_a_trigger_spelled_like_a_special_token_is_matched_as_text(backend, tokenizer):
    """Grammars match text: "<|im_start|>" is written with ordinary tokens (special tokens are
    never allowed under a grammar), and compiling does not read it as the special token."""
    tag = {"structures": [{"begin": "<|im_start|>{", "schema": {"type": "integer"}, "end": "}"}],
           "triggers": ["<|im_start|>"]}
    matcher = _compile(backend, tag).new_matcher()
    ids = [t for c in "hi <|im_start|>" for t in tokenizer.encode(c, add_special_tokens=False)]
    assert all(matcher.accept(t) for t in ids) and matcher.forced_bytes() == b"{"
