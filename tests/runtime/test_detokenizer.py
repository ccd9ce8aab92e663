"""IncrementalDetokenizer: streamed pieces always add up to the full decode, for every decoder family."""
from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from radixflow.runtime.model.demo import CORPUS_PATH, write_demo_model
from radixflow.runtime.text.detokenizer import IncrementalDetokenizer
from radixflow.runtime.text.tokenizer import Tokenizer, fallback_byte

CORPUS = [
    "hello world, the weather is nice today",
    "the café in 日本 serves green tea and cake",
    "numbers like 42 and 3.14 appear in text",
    "a naïve question about the world",
] * 5

PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def demo_tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_dir(write_demo_model("tiny", str(tmp_path_factory.mktemp("demo"))))


def _trained_pieces() -> tuple[list[str], list[tuple[str, str]]]:
    """Metaspace BPE pieces and merges learned from CORPUS."""
    backend = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    backend.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=200, show_progress=False))
    model = json.loads(backend.to_str())["model"]
    vocab = sorted(model["vocab"], key=model["vocab"].get)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return vocab, merges


def _sentencepiece_tokenizer(decoder: decoders.Decoder) -> Tokenizer:
    """Llama-2 layout: <unk> <s> </s>, 256 byte-fallback pieces, then learned pieces."""
    learned, merges = _trained_pieces()
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [p for p in learned if p not in pieces]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True)
    backend = tokenizers.Tokenizer(model)
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoder
    backend.add_special_tokens(["<unk>", "<s>", "</s>"])
    return Tokenizer(backend, bos_token_id=1, eos_token_ids=[2])


SENTENCEPIECE_DECODERS = {
    "llama2": lambda: decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    ),
    "gemma": lambda: decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]),
    "metaspace-first": lambda: decoders.Metaspace(replacement="▁", prepend_scheme="first"),
    "metaspace-never": lambda: decoders.Metaspace(replacement="▁", prepend_scheme="never"),
    "bytefallback-metaspace": lambda: decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()]),
    "per-token-strip": lambda: decoders.Sequence([decoders.Replace("▁", " "), decoders.Strip(" ", 0, 1)]),
}


@pytest.fixture(scope="module", params=sorted(SENTENCEPIECE_DECODERS))
def sp_tok(request: pytest.FixtureRequest) -> Tokenizer:
    return _sentencepiece_tokenizer(SENTENCEPIECE_DECODERS[request.param]())


@pytest.fixture(scope="module")
def byte_level_with_added_tokens(demo_tok: Tokenizer) -> Tokenizer:
    """The demo tokenizer plus added tokens whose text the ByteLevel decoder maps oddly ("é" -> 0xE9)."""
    backend = tokenizers.Tokenizer.from_str(demo_tok.backend.to_str())
    backend.add_tokens([tokenizers.AddedToken(t, special=False) for t in ("é", "日本")])
    backend.add_special_tokens([tokenizers.AddedToken("<tool>", special=True)])
    return Tokenizer(backend)


def _run(
    tok: Tokenizer, ids: list[int], cuts: list[int], skip: bool, settled: Callable[[list[int], str], bool]
) -> str:
    """Stream `ids` in chunks ending at `cuts`; check every intermediate state against a full decode.

    `settled(ids, decode(ids))` says when nothing may be held back any more.
    """
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    emitted = ""
    bounds = [0, *sorted(cuts), len(ids)]
    for start, stop in zip(bounds, bounds[1:]):
        piece = detok.step(ids[start:stop])
        emitted += piece
        partial = tok.decode(ids[:stop], skip)
        # never ahead of the decode of what was seen: no premature U+FFFD, no text that changes later
        assert partial.startswith(emitted), (ids[:stop], emitted, partial)
        if settled(ids[:stop], partial):
            assert emitted == partial, (ids[:stop], emitted, partial)
    emitted += detok.flush()
    assert emitted == tok.decode(ids, skip), (ids, cuts)
    return emitted


def _byte_level_settled(ids: list[int], partial: str) -> bool:
    return not partial.endswith("\ufffd")


def _id_pools(tok: Tokenizer) -> st.SearchStrategy[int]:
    """Any id, plus extra weight on single bytes, partial UTF-8 pieces, special and out-of-range ids."""
    table = [tok.token_bytes(i) for i in range(tok.vocab_size)]
    single = [i for i, b in enumerate(table) if len(b) == 1 and b[0] >= 0x80]
    partial = [i for i, b in enumerate(table) if len(b) > 1 and not _valid_utf8(b)] or single
    return st.one_of(
        st.integers(0, tok.vocab_size - 1),
        st.sampled_from(single),
        st.sampled_from(partial),
        st.sampled_from(sorted(tok.special_token_ids)),
        st.just(tok.vocab_size + 7),
    )


def _valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _sequences(tok: Tokenizer) -> st.SearchStrategy[tuple[list[int], list[int], bool]]:
    return st.lists(_id_pools(tok), max_size=40).flatmap(
        lambda ids: st.tuples(st.just(ids), st.lists(st.integers(0, len(ids)), max_size=8), st.booleans())
    )


def test_byte_level_property(demo_tok: Tokenizer) -> None:
    @PROPERTY
    @given(_sequences(demo_tok))
    def check(case: tuple[list[int], list[int], bool]) -> None:
        ids, cuts, skip = case
        _run(demo_tok, ids, cuts, skip, _byte_level_settled)

    check()


def test_byte_level_with_added_tokens_property(byte_level_with_added_tokens: Tokenizer) -> None:
    tok = byte_level_with_added_tokens
    added = [tok.backend.token_to_id(t) for t in ("é", "日本", "<tool>")]

    @PROPERTY
    @given(st.lists(st.one_of(_id_pools(tok), st.sampled_from(added)), max_size=30),
           st.lists(st.integers(0, 30)))
    def check(ids: list[int], cuts: list[int]) -> None:
        for skip in (True, False):
            _run(tok, ids, [c for c in cuts if c <= len(ids)], skip, _byte_level_settled)

    check()


def test_sentencepiece_property(sp_tok: Tokenizer) -> None:
    has_byte_fallback = any(step["type"] == "ByteFallback" for step in sp_tok.decoder_steps())

    def settled_when(skip: bool) -> Callable[[list[int], str], bool]:
        # everything is out unless the last decoded token may still extend a byte-fallback run
        def settled(ids: list[int], partial: str) -> bool:
            kept = [i for i in ids if i < sp_tok.vocab_size and not (skip and i in sp_tok.special_token_ids)]
            return not kept or not has_byte_fallback or fallback_byte(sp_tok.id_to_token(kept[-1])) is None

        return settled

    @PROPERTY
    @given(_sequences(sp_tok))
    def check(case: tuple[list[int], list[int], bool]) -> None:
        ids, cuts, skip = case
        _run(sp_tok, ids, cuts, skip, settled_when(skip))

    check()


def test_sentencepiece_text_round_trip(sp_tok: Tokenizer) -> None:
    ids = sp_tok.encode("hello world 日本 café ☕ 42", add_special_tokens=False)
    assert _run(sp_tok, ids, list(range(len(ids))), True, lambda ids, partial: False) == sp_tok.decode(ids)


def _single_byte_ids(tok: Tokenizer) -> dict[bytes, int]:
    return {b: i for i in range(tok.vocab_size) if len(b := tok.token_bytes(i)) == 1}


def test_multibyte_character_waits_for_its_last_byte(demo_tok: Tokenizer) -> None:
    byte_ids = _single_byte_ids(demo_tok)
    ids = [byte_ids[bytes([b])] for b in "日".encode()]
    detok = IncrementalDetokenizer(demo_tok)
    assert [detok.step([i]) for i in ids] == ["", "", "日"]
    assert detok.flush() == ""


def test_unfinished_character_is_flushed_as_the_full_decode(demo_tok: Tokenizer) -> None:
    byte_ids = _single_byte_ids(demo_tok)
    ids = [byte_ids[b"A"], byte_ids[b"\xe6"], byte_ids[b"\x97"]]
    detok = IncrementalDetokenizer(demo_tok)
    assert detok.step(ids) == "A"
    assert detok.flush() == "\ufffd" == demo_tok.decode(ids)[1:]


def test_special_tokens(demo_tok: Tokenizer) -> None:
    ids = demo_tok.encode("hi") + [demo_tok.eos_token_ids[-1]]
    assert "".join(IncrementalDetokenizer(demo_tok).step([i]) for i in ids) == "hi"
    shown = IncrementalDetokenizer(demo_tok, skip_special_tokens=False)
    assert "".join(shown.step([i]) for i in ids) == "<|begin_of_text|>hi<|im_end|>"


def test_prefix_ids_give_context_only() -> None:
    tok = _sentencepiece_tokenizer(SENTENCEPIECE_DECODERS["llama2"]())
    prompt, output = tok.encode("hello"), tok.encode("world", add_special_tokens=False)
    assert tok.decode(output) == "world"  # decode alone strips the first leading space
    detok = IncrementalDetokenizer(tok, prefix_ids=prompt)
    assert "".join(detok.step([i]) for i in output) + detok.flush() == " world"


def test_streaming_never_redecodes(demo_tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    sp = _sentencepiece_tokenizer(SENTENCEPIECE_DECODERS["llama2"]())
    for tok in (demo_tok, sp):
        ids = tok.encode("the café in 日本 serves green tea " * 20)
        expected = tok.decode(ids)
        monkeypatch.setattr(tok, "decode", _fail)
        detok = IncrementalDetokenizer(tok)
        assert "".join(detok.step([i]) for i in ids) + detok.flush() == expected
        monkeypatch.undo()


def _fail(*args: object, **kwargs: object) -> str:
    raise AssertionError("the streaming path must not re-decode the sequence")


def test_unsupported_decoder_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    backend = tokenizers.Tokenizer(models.WordPiece({"[UNK]": 0, "hello": 1, "world": 2, "##s": 3, ".": 4}))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    tok = Tokenizer(backend)
    ids = tok.encode("hello worlds. hello")
    with caplog.at_level(logging.WARNING, logger="radixflow.runtime.text.detokenizer"):
        detok = IncrementalDetokenizer(tok)
    assert "re-decoding" in caplog.text
    assert "".join(detok.step([i]) for i in ids) + detok.flush() == tok.decode(ids) == "hello worlds. hello"


def test_no_decoder_joins_with_spaces() -> None:
    backend = tokenizers.Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = Tokenizer(backend)
    ids = tok.encode("a b a")
    assert tok.decode(ids) == "a b a"
    assert _run(tok, ids, [1, 2], True, lambda ids, partial: True) == "a b a"


def test_demo_corpus_streams_token_by_token(demo_tok: Tokenizer) -> None:
    text = CORPUS_PATH.read_text(encoding="utf-8")[:4000] + " café naïve 日本 🙂🚀 ÿ"
    ids = demo_tok.encode(text)
    assert _run(demo_tok, ids, list(range(len(ids))), True, _byte_level_settled) == text


class _TailOnly(list):
    """A prompt that fails the test when anything but its last `limit` ids is read."""

    limit = 64

    def __iter__(self):
        raise AssertionError("the whole prompt was iterated")

    def __getitem__(self, index):
        first = index.indices(len(self))[0] if isinstance(index, slice) else index % len(self)
        assert first >= len(self) - self.limit, f"read prompt position {first} of {len(self)}"
        return super().__getitem__(index)


@pytest.mark.parametrize("decoder", ["byte-level", "llama2", "metaspace-first", "gemma"])
def test_a_long_prompt_is_read_only_at_its_tail(demo_tok: Tokenizer, decoder: str) -> None:
    tok = demo_tok if decoder == "byte-level" else _sentencepiece_tokenizer(SENTENCEPIECE_DECODERS[decoder]())
    unit = tok.encode("the café in 日本 serves green tea and cake. ", add_special_tokens=False)
    prompt = unit * (100_000 // len(unit) + 1)
    output = tok.encode("a naïve question about 日本", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prefix_ids=_TailOnly(prompt))
    text = "".join(detok.step([i]) for i in output) + detok.flush()
    assert text == tok.decode(prompt + output)[len(tok.decode(prompt)):]


def test_a_character_split_at_the_end_of_a_long_prompt_comes_out_whole(demo_tok: Tokenizer) -> None:
    byte_ids = _single_byte_ids(demo_tok)
    head = [byte_ids[bytes([b])] for b in "日本".encode()]  # 6 single-byte tokens
    prompt = demo_tok.encode("green tea " * 5000, add_special_tokens=False) + head[:4]  # 日 done, 本 begun
    detok = IncrementalDetokenizer(demo_tok, prefix_ids=_TailOnly(prompt))
    assert detok.step(head[4:5]) == ""
    assert detok.step(head[5:]) == "本"
