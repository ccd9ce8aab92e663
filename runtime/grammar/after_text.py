"""A constraint that starts once the output contains a text (`constrain_after`): a thinking
model reasons freely, and the grammar holds from the token after the one that completes the
block's end (`</think>`; gpt-oss's `<|channel|>final<|message|>`, special tokens read as their
text). Bytes that token carries past the text are not matched by the grammar."""
from __future__ import annotations

import ctypes

from radixflow.runtime.grammar.backend import Matcher
from radixflow.runtime.grammar.vocab import TokenVocab


class AfterText:
    """A Matcher that allows every token until the output contains `text`, then is `inner`.
    Before then the output is never a complete match (EOS is not allowed: the constrained part
    is still to come) and nothing is forced."""

    def __init__(self, inner: Matcher, text: bytes, vocab: TokenVocab) -> None:
        self.inner, self._text, self._bytes, self._special = inner, text, vocab.token_bytes, vocab.special_bytes
        self._tail = b""  # the output's last len(text) - 1 bytes, while the text is not yet seen
        self.started = False

    @property
    def error(self) -> str | None:
        return self.inner.error

    def _completes(self, tail: bytes, token: int) -> tuple[bool, bytes]:
        """(whether `token` after `tail` completes the text, the new tail)."""
        # ids past the tokenizer's: b""; a special token: its text (gpt-oss's <|message|>)
        seen = tail + ((self._bytes[token] if token < len(self._bytes) else b"") or self._special.get(token, b""))
        return self._text in seen, seen[max(0, len(seen) - len(self._text) + 1):] if len(self._text) > 1 else b""

    def fill_mask(self, ptr: int, num_words: int) -> None:
        if self.started:
            self.inner.fill_mask(ptr, num_words)
        else:
            ctypes.memset(ptr, 0xFF, num_words * 4)

    def accept(self, token: int) -> bool:
        if self.started:
            return self.inner.accept(token)
        self.started, self._tail = self._completes(self._tail, token)
        return True

    def _split(self, tokens: list[int]) -> int | None:
        """The index in `tokens` after the one that completes the text, or None if none does."""
        tail = self._tail
        for k, token in enumerate(tokens):
            done, tail = self._completes(tail, token)
            if done:
                return k + 1
        return None

    def is_accepting(self) -> bool:
        return self.started and self.inner.is_accepting()

    def can_continue(self) -> bool:
        return not self.started or self.inner.can_continue()

    def forced_bytes(self) -> bytes:
        return self.inner.forced_bytes() if self.started else b""

    def count_valid(self, tokens: list[int]) -> int:
        if self.started:
            return self.inner.count_valid(tokens)
        k = self._split(tokens)
        return len(tokens) if k is None else k + self.inner.count_valid(tokens[k:])

    def accepting_after(self, tokens: list[int]) -> bool:
        if self.started:
            return self.inner.accepting_after(tokens)
        k = self._split(tokens)
        return k is not None and self.inner.accepting_after(tokens[k:])

    def terminates_after(self, tokens: list[int]) -> bool:
        if self.started:
            return self.inner.terminates_after(tokens)
        k = self._split(tokens)
        return k is not None and self.inner.terminates_after(tokens[k:])
