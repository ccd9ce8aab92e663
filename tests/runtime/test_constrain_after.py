"""`constrain_after`: a constraint that holds once the output contains a text (a thinking model's
`</think>`), through the engine and on its own: free tokens before, the grammar after, EOS only
once the constrained part can end."""
from __future__ import annotations

import pytest

from radixflow.runtime import Engine
from radixflow.runtime.grammar.after_text import AfterText
from radixflow.runtime.grammar.outlines_backend import OutlinesBackend
from radixflow.runtime.grammar.spec import GrammarKey
from radixflow.runtime.grammar.vocab import TokenVocab
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine():
    with Engine(demo_model("tiny"), kv_cache_tokens=4096, check_invariants=True) as e:
        yield e
    assert not e.invariant_violations


def test_the_grammar_starts_after_the_text(engine):
    """The marker is the text of the greedy output's first three tokens: the constrained run
    writes those tokens freely (the same greedy ones), then only what the regex allows."""
    free = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
    for prompt in ("Think:", "Reason step by step:", "Plan:", "Go:"):
        ids = engine.generate(prompt, free)["output_ids"]
        marker = engine.tokenizer.decode(ids[:3])
        if "\ufffd" not in marker and marker.strip():
            break
    else:
        pytest.skip("no greedy output here starts with three tokens of whole characters")
    out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 12, "regex": "(yes|no)!",
                                   "constrain_after": marker})
    assert out["output_ids"][:3] == ids[:3]
    assert out["text"] in (marker + "yes!", marker + "no!") and out["meta_info"]["finish_reason"]["type"] == "stop"
    # a text the output never contains: the grammar never starts, the output is the free one
    never = engine.generate(prompt, {**free, "regex": "(yes|no)!", "constrain_after": "\x00"})
    assert never["output_ids"] == ids


@pytest.mark.parametrize("params, match", [
    ({"constrain_after": "", "regex": "a"}, "constrain_after"),
    ({"constrain_after": "x" * 65, "regex": "a"}, "constrain_after"),
    ({"constrain_after": "\ud800", "regex": "a"}, "constrain_after"),  # a lone surrogate: not text
])
def test_bad_constrain_after_is_a_value_error(engine, params, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams.from_dict(params)
    with pytest.raises(ValueError, match=match):
        engine.generate("x", params)


def test_matcher_before_and_after_the_text(engine):
    tok = engine.tokenizer
    vocab = TokenVocab.from_tokenizer(tok, tok.vocab_size, tok.eos_token_ids)
    backend = OutlinesBackend(vocab, max_workers=1)
    try:
        compiled = backend.compile(GrammarKey("regex", "ab"), 10.0)
        m = AfterText(compiled.new_matcher(), b"</think>", vocab)
        head = tok.encode("hmm </thi", add_special_tokens=False)
        rest = tok.encode("nk>", add_special_tokens=False)
        ab = tok.encode("ab", add_special_tokens=False)
        assert not m.is_accepting() and m.can_continue() and m.forced_bytes() == b""
        assert m.count_valid(head + rest + ab + ab) == len(head + rest + ab)
        assert m.accepting_after(head + rest + ab) and not m.accepting_after(head + rest)
        for t in head:
            assert m.accept(t)
        assert not m.started
        for t in rest:
            assert m.accept(t)
        assert m.started and m.forced_bytes() == b"ab" and not m.is_accepting()
        assert all(m.accept(t) for t in ab) and m.is_accepting()
    finally:
        backend.close()


def test_ids_without_bytes_are_free_text_before_the_text():
    """Before the text every id the mask allows may be drawn: special tokens and ids past the
    tokenizer's vocabulary (a padded model vocabulary) spell nothing; they never complete it."""
    class Inner:
        error = None

        def count_valid(self, tokens):
            return 0

    vocab = TokenVocab([b"<", b"/t>", b""], [], model_vocab_size=64, encode=lambda text: [])
    m = AfterText(Inner(), b"</t>", vocab)
    assert m.count_valid([0, 40, 1, 0]) == 3 and not m.accepting_after([40])
    assert m.accept(40) and m.accept(2) and not m.started
    assert m.accept(0) and m.accept(1) and m.started
