"""Tokenizer: parity with transformers' AutoTokenizer on the demo model, token bytes, chat templates."""
from __future__ import annotations

import json
import random
import shutil
import threading
import time
from pathlib import Path

import pytest
import tokenizers
from tokenizers import decoders, models

from radixflow.runtime.model.demo import write_demo_model
from radixflow.runtime.text.tokenizer import LONG_TEXT_CHARS, Tokenizer

TEXTS = [
    "",
    "Hello, world!",
    "The meeting is on 2024-03-15 at 10:30 am; email alice.smith@example.com.",
    "café naïve 日本語 東京 🙂🚀 Ω ≈ €12.50",
    "  leading spaces\n\n\ttabs and trailing   ",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    '{"name": "Bob", "tags": ["a", "b"], "score": 3.5}',
    "def f(x):\n    return x ** 2  # square\n",
    "<|begin_of_text|>nested <|end_of_text|> specials <|pad|>",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}],
    [
        {"role": "system", "content": "Answer in JSON."},
        {"role": "user", "content": "Give me a café in 日本."},
        {"role": "assistant", "content": '{"name": "Kissa"}'},
        {"role": "user", "content": "Another 🙂"},
    ],
    [{"role": "user", "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "two"}]}],
]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_demo_model("tiny", str(tmp_path_factory.mktemp("demo"))))


@pytest.fixture(scope="module")
def tok(demo_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(str(demo_dir))


@pytest.fixture(scope="module")
def hf(demo_dir: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(demo_dir))


def _copy_with_config(demo_dir: Path, dest: Path, **changes: object) -> Path:
    shutil.copytree(demo_dir, dest)
    config = json.loads((dest / "tokenizer_config.json").read_text())
    config.update(changes)
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest


def test_metadata(tok: Tokenizer, demo_dir: Path) -> None:
    assert tok.path == str(demo_dir)
    assert tok.vocab_size == 3072
    assert tok.bos_token_id == tok.backend.token_to_id("<|begin_of_text|>") == 3067
    # generation_config lists end-of-text and <|im_end|>; tokenizer_config's EOS is a duplicate
    assert tok.eos_token_ids == [3068, 3070]
    assert tok.special_token_ids == frozenset(range(3067, 3072))


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(tok: Tokenizer, hf, add_special_tokens: bool) -> None:
    for text in TEXTS:
        expected = hf.encode(text, add_special_tokens=add_special_tokens)
        assert tok.encode(text, add_special_tokens) == expected, text


def test_encode_adds_bos_only_with_special_tokens(tok: Tokenizer) -> None:
    assert tok.encode("Hello")[0] == tok.bos_token_id
    assert tok.bos_token_id not in tok.encode("Hello", add_special_tokens=False)
    assert tok.encode("") == [tok.bos_token_id]


def test_long_text_is_encoded_the_same_with_the_gil_released(tok: Tokenizer) -> None:
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(7)) for _ in range(15_000)]
    text = " ".join(words)  # distinct words: the BPE word cache cannot make encoding fast
    assert len(text) > 10 * LONG_TEXT_CHARS
    gaps: list[float] = []
    done = threading.Event()

    def tick() -> None:  # a thread that needs the GIL every millisecond, like an event loop
        while not done.is_set():
            start = time.perf_counter()
            time.sleep(0.001)
            gaps.append(time.perf_counter() - start)

    ticker = threading.Thread(target=tick)
    ticker.start()
    start = time.perf_counter()
    ids = tok.encode(text)
    took = time.perf_counter() - start
    done.set()
    ticker.join()
    assert max(gaps) < max(0.1, took / 3), (max(gaps), took)  # encode() would hold the GIL throughout
    assert ids == tok.backend.encode(text).ids
    assert tok.encode(text, False) == tok.backend.encode(text, add_special_tokens=False).ids


def test_encode_rejects_non_text(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="must be a str"):
        tok.encode(b"bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_matches_transformers(tok: Tokenizer, hf, skip_special_tokens: bool) -> None:
    rng = random.Random(0)
    sequences = [tok.encode(text) for text in TEXTS]
    sequences += [[rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 40))] for _ in range(50)]
    for ids in sequences:
        expected = hf.decode(ids, skip_special_tokens=skip_special_tokens)
        assert tok.decode(ids, skip_special_tokens) == expected, ids


def test_decode_round_trips_text(tok: Tokenizer) -> None:
    for text in TEXTS:
        assert tok.decode(tok.encode(text), skip_special_tokens=False) == "<|begin_of_text|>" + text


def test_decode_rejects_negative_ids(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        tok.decode([5, -1])


def test_token_bytes_concatenate_to_the_text(tok: Tokenizer) -> None:
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8"), text


def test_token_bytes_of_single_bytes_and_specials(tok: Tokenizer) -> None:
    all_bytes = [tok.token_bytes(i) for i in range(tok.vocab_size)]
    assert {b for b in all_bytes if len(b) == 1} == {bytes([i]) for i in range(256)}
    assert tok.token_bytes(tok.bos_token_id) == b"<|begin_of_text|>"
    # multi-byte UTF-8 characters exist both whole and split across tokens
    assert "é".encode() in all_bytes or any(b.endswith("é".encode()) for b in all_bytes)
    assert any(_is_partial_utf8(b) for b in all_bytes)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.token_bytes(tok.vocab_size)


def _is_partial_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _sentencepiece_backend() -> tokenizers.Tokenizer:
    """A Llama-2-style tokenizer: metaspace pieces, byte fallback, Strip of the leading space."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    merges = [("h", "e"), ("l", "l"), ("▁", "he"), ("▁he", "ll"), ("▁hell", "o"), ("▁", "w"), ("▁w", "o"),
              ("▁wo", "r"), ("▁wor", "l"), ("▁worl", "d")]
    pieces += ["▁", "h", "e", "l", "o", "w", "r", "d"] + ["".join(m) for m in merges]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True)
    backend = tokenizers.Tokenizer(model)
    backend.normalizer = tokenizers.normalizers.Sequence(
        [tokenizers.normalizers.Prepend("▁"), tokenizers.normalizers.Replace(" ", "▁")]
    )
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.add_special_tokens(["<unk>", "<s>", "</s>"])
    return backend


def test_token_bytes_sentencepiece() -> None:
    tok = Tokenizer(_sentencepiece_backend())
    assert tok.token_bytes(tok.backend.token_to_id("▁hello")) == b" hello"
    assert tok.token_bytes(tok.backend.token_to_id("<0x0A>")) == b"\n"
    assert tok.token_bytes(tok.backend.token_to_id("<0xE6>")) == b"\xe6"
    assert tok.token_bytes(tok.backend.token_to_id("<s>")) == b"<s>"
    ids = tok.encode("hello 日本 world", add_special_tokens=False)
    assert b"".join(tok.token_bytes(i) for i in ids) == " hello 日本 world".encode()
    assert tok.decode(ids) == "hello 日本 world"


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_chat_template_matches_transformers(tok: Tokenizer, hf, add_generation_prompt: bool) -> None:
    for messages in CONVERSATIONS:
        text = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        expected = hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
        assert text == expected
        ids = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        assert ids == hf.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
        )
        assert ids.count(tok.bos_token_id) == 1


def test_chat_template_chatml_layout(tok: Tokenizer) -> None:
    text = tok.apply_chat_template(CONVERSATIONS[1], add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_template_errors(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="Unknown chat role: robot"):
        tok.apply_chat_template([{"role": "robot", "content": "beep"}])
    with pytest.raises(ValueError, match="non-empty list"):
        tok.apply_chat_template([])
    with pytest.raises(ValueError, match="must be a dict"):
        tok.apply_chat_template(["hello"])  # type: ignore[list-item]


def test_chat_template_drops_none_values(tok: Tokenizer) -> None:
    messages = [{"role": "user", "content": "hi", "name": None}]
    assert tok.apply_chat_template(messages) == tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_model_without_template_raises(demo_dir: Path, tmp_path: Path) -> None:
    plain = _copy_with_config(demo_dir, tmp_path / "plain", chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer.from_dir(str(plain)).apply_chat_template([{"role": "user", "content": "hi"}])


def test_template_features(demo_dir: Path, tmp_path: Path) -> None:
    source = (
        "{% for m in messages %}{{ m | tojson }}{% endfor %}|{{ strftime_now('%Y') | length }}"
        "|{{ eos_token }}|{{ extra }}{% generation %}|gen{% endgeneration %}\n"
        "  {% if add_generation_prompt %}>{% endif %}"
    )
    named = _copy_with_config(demo_dir, tmp_path / "named", chat_template=[
        {"name": "default", "template": source},
        {"name": "tool_use", "template": "tools: {{ tools | length }}"},
    ])
    tok = Tokenizer.from_dir(str(named))
    messages = [{"role": "user", "content": "<b>&é</b>"}]
    # tojson keeps HTML characters and non-ASCII as is; trim_blocks eats the newline after a block tag and
    # lstrip_blocks the indentation before one
    assert tok.apply_chat_template(messages, extra=7) == (
        '{"role": "user", "content": "<b>&é</b>"}|4|<|end_of_text|>|7|gen'
    )
    assert tok.apply_chat_template(messages, add_generation_prompt=True, extra=7).endswith("|gen>")
    assert tok.apply_chat_template(messages, tools=[{"name": "a"}, {"name": "b"}]) == "tools: 2"


def test_template_file_overrides_config(demo_dir: Path, tmp_path: Path) -> None:
    override = _copy_with_config(demo_dir, tmp_path / "override")
    (override / "chat_template.jinja").write_text("{{ messages[0]['content'] | upper }}")
    assert Tokenizer.from_dir(str(override)).apply_chat_template([{"role": "user", "content": "hi"}]) == "HI"


def test_template_syntax_error_is_a_value_error(demo_dir: Path, tmp_path: Path) -> None:
    broken = _copy_with_config(demo_dir, tmp_path / "broken", chat_template="{% for %}")
    with pytest.raises(ValueError, match="does not compile"):
        Tokenizer.from_dir(str(broken)).apply_chat_template([{"role": "user", "content": "hi"}])


def test_template_cannot_escape_the_sandbox(demo_dir: Path, tmp_path: Path) -> None:
    evil = _copy_with_config(demo_dir, tmp_path / "evil", chat_template="{{ messages.__class__.__mro__ }}")
    with pytest.raises(ValueError):
        Tokenizer.from_dir(str(evil)).apply_chat_template([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("flags", [{"add_bos_token": False}, {"add_bos_token": True, "add_eos_token": True}])
def test_bos_eos_flags_are_ignored_like_transformers(
    demo_dir: Path, tmp_path: Path, flags: dict[str, bool]
) -> None:
    transformers = pytest.importorskip("transformers")
    flagged = _copy_with_config(demo_dir, tmp_path / "flagged", **flags)
    ours, theirs = Tokenizer.from_dir(str(flagged)), transformers.AutoTokenizer.from_pretrained(str(flagged))
    # transformers 5 leaves tokenizer.json's post-processor in charge when the file exists
    for text in TEXTS[:4]:
        assert ours.encode(text) == theirs.encode(text)
        assert ours.encode(text)[0] == ours.bos_token_id


def test_missing_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no tokenizer.json"):
        Tokenizer.from_dir(str(tmp_path))


def test_continue_final_message_matches_transformers(tok: Tokenizer, hf) -> None:
    """The final message left open, its text the start of what the model writes next: the
    rendering up to that message's content, as transformers' `continue_final_message` cuts it."""
    messages = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "The color is"}]
    text = tok.apply_chat_template(messages, continue_final_message=True)
    assert text == hf.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\nThe color is")
    ids = tok.apply_chat_template(messages, continue_final_message=True, tokenize=True)
    assert ids == hf.apply_chat_template(messages, continue_final_message=True, tokenize=True, return_dict=False)
    spaced = [messages[0], {"role": "assistant", "content": "  The color is "}]
    assert tok.apply_chat_template(spaced, continue_final_message=True) == hf.apply_chat_template(
        spaced, continue_final_message=True, tokenize=False)


def test_continue_final_message_errors(tok: Tokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}]
    with pytest.raises(ValueError, match="add_generation_prompt"):
        tok.apply_chat_template(messages, add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(ValueError, match="final message"):
        tok.apply_chat_template([messages[0], {"role": "assistant", "content": ""}], continue_final_message=True)
