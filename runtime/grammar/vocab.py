"""The tokenizer seen byte by byte, as grammar backends and jump-forward need it."""
from __future__ import annotations

from collections.abc import Callable, Iterable


class TokenVocab:
    """Exact bytes of every token id the model can emit, plus EOS and bitmask geometry.

    `token_bytes[i]` is b"" for ids a grammar may never produce: special tokens (EOS included),
    unused ids, ids past the model's vocabulary. Immutable after construction; shared by threads.
    """

    def __init__(self, token_bytes: list[bytes], eos_ids: Iterable[int], model_vocab_size: int,
                 encode: Callable[[str], list[int]], special_bytes: dict[int, bytes] | None = None) -> None:
        self.token_bytes = token_bytes
        # the text of the special tokens other than EOS, which token_bytes leaves empty: what
        # constrain_after sees of them (gpt-oss's channel markers are special tokens)
        self.special_bytes = dict(special_bytes or {})
        self.eos_ids = tuple(sorted(set(eos_ids)))
        self.model_vocab_size = model_vocab_size
        self._encode = encode
        width = max([model_vocab_size, len(token_bytes), *(e + 1 for e in self.eos_ids)])
        self.num_words = (width + 31) // 32  # int32 words per bitmask row
        self.first_byte = [b[0] if b else -1 for b in token_bytes]
        self.single_byte = {b[0]: i for i, b in enumerate(token_bytes) if len(b) == 1}

    @classmethod
    def from_tokenizer(cls, tokenizer, model_vocab_size: int, eos_ids: Iterable[int]) -> TokenVocab:
        """`tokenizer`: radixflow.runtime.text.tokenizer.Tokenizer (uses token_bytes, special ids, encode)."""
        eos = set(eos_ids)
        specials = set(tokenizer.special_token_ids) | eos
        size = min(tokenizer.vocab_size, model_vocab_size)
        table = [b"" if i in specials else tokenizer.token_bytes(i) for i in range(size)]
        marks = {i: tokenizer.token_bytes(i) for i in sorted(specials - eos) if i < size}
        return cls(table, eos, model_vocab_size, lambda text: tokenizer.encode(text, add_special_tokens=False), marks)

    def outlines_map(self) -> dict[bytes, list[int]]:
        """bytes -> token ids, without EOS/special/empty tokens (what outlines_core.Vocabulary takes)."""
        out: dict[bytes, list[int]] = {}
        for i, b in enumerate(self.token_bytes):
            if b:
                out.setdefault(b, []).append(i)
        return out

    def tokenize_forced(self, data: bytes) -> list[int]:
        """The tokenizer's own tokens for a prefix of `data`, stopping where they stop spelling
        `data` exactly (a partial UTF-8 character at the end, a tokenizer adding a prefix space)."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            text = data[: exc.start].decode("utf-8")
        out, pos = [], 0
        for t in self._encode(text) if text else []:
            b = self.token_bytes[t] if t < len(self.token_bytes) else b""
            if not b or data[pos: pos + len(b)] != b:
                break
            out.append(t)
            pos += len(b)
        return out
