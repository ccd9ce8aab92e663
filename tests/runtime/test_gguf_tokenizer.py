"""Tokenizers built from GGUF metadata encode and decode exactly as transformers' GGUF tokenizer:
byte-level BPE (the demo vocabulary, SmolLM2's) and SentencePiece-style (scores, no merges)."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("gguf", reason="the gguf package is a radixflow dependency")

from gguf_writer import write_gguf, write_sentencepiece_gguf  # noqa: E402
from smollm2 import hf_tokenizer, smollm2_path  # noqa: E402

from radixflow.runtime.model.demo import CORPUS_PATH, demo_model  # noqa: E402
from radixflow.runtime.text.tokenizer import Tokenizer  # noqa: E402

CORPUS = [
    "Hello world", " leading space", "multiple   spaces  here\n\n\n", "The year 2024 had 366 days.",
    "def f(x):\n\treturn x**2  # squares", "{\"key\": [1, 2.5, null]}", "é ü ñ 日本語 🙂 Привет",
    "I'm sure they'll say we've done it", "a\r\nb\tc", "",
]


def _assert_parity(ours: Tokenizer, ref, extra: list[str]) -> None:
    for text in CORPUS + extra:
        ids = ours.encode(text)
        assert ids == ref.encode(text), text
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True), text
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False), text


def _ref(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


def test_byte_level_bpe_matches_transformers_and_the_source_tokenizer(tmp_path):
    path = write_gguf(demo_model("tiny"), str(tmp_path / "tiny.gguf"), "F16")
    ours = Tokenizer.from_pretrained(path)
    _assert_parity(ours, _ref(path), ["<|im_start|>user\nhi<|im_end|>", "<|begin_of_text|>x<|pad|>"])
    source = Tokenizer.from_dir(demo_model("tiny"))
    for text in CORPUS:
        assert ours.encode(text) == source.encode(text, add_special_tokens=False)
    assert ours.special_token_ids == source.special_token_ids
    assert ours.bos_token_id == source.bos_token_id and ours.eos_token_ids[0] == source.eos_token_ids[0]


@pytest.mark.parametrize("pre,arch", [("llama-bpe", "llama"), ("qwen2", "qwen2")])
def test_pre_tokenizer_type_matches_transformers(tmp_path, pre, arch):
    """tokenizer.ggml.pre picks the split regex (Llama-3's, Qwen2's: digits in threes / one by one)."""
    path = write_gguf(demo_model("tiny"), str(tmp_path / "m.gguf"), "F16", arch=arch, pre=pre)
    _assert_parity(Tokenizer.from_pretrained(path), _ref(path),
                   ["Numbers 1234567 and 12", "It's 3.14159!", "don't STOP'S", "x  \n\n  y", "🙂🙂 12🙂"])


def test_sentencepiece_from_scores_matches_transformers(tmp_path):
    path = write_sentencepiece_gguf(str(tmp_path / "sp.gguf"), CORPUS_PATH.read_text(encoding="utf-8"))
    ours = Tokenizer.from_pretrained(path)
    _assert_parity(ours, _ref(path), ["<s>a</s>", "unknown ☃ bytes"])
    assert ours.encode("hi")[0] == 1  # add_bos_token
    assert ours.token_bytes(ours.encode("\n", add_special_tokens=False)[-1]) == b"\n"  # byte fallback


def test_smollm2_tokenizer_matches_transformers():
    ours = Tokenizer.from_pretrained(smollm2_path())
    ref = hf_tokenizer()
    _assert_parity(ours, ref, ["<|im_start|>system\nYou are helpful.<|im_end|>\n", "<repo_name>x<|endoftext|>"])
    assert ours.bos_token_id == 1 and 2 in ours.eos_token_ids and ours.vocab_size == 49152
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert ours.apply_chat_template(messages, add_generation_prompt=True) == ref.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)


def test_chat_template_file_overrides_the_models(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}")
    tok = Tokenizer.from_pretrained(demo_model("tiny"), chat_template_file=str(template))
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "[user]x"
    with pytest.raises(ValueError, match="does not exist"):
        Tokenizer.from_pretrained(demo_model("tiny"), chat_template_file=str(tmp_path / "missing.jinja"))
    template.write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match="does not compile"):
        Tokenizer.from_pretrained(demo_model("tiny"), chat_template_file=str(template))


def test_unsupported_tokenizer_model_is_named(tmp_path):
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "t5.gguf"), "llama")
    writer.add_tokenizer_model("t5")
    writer.add_token_list(["a", "b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="unsupported GGUF tokenizer model 't5'"):
        Tokenizer.from_pretrained(str(tmp_path / "t5.gguf"))
