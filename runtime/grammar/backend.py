"""The grammar backend interface: compile a GrammarKey once, then one Matcher per request."""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from radixflow.runtime.grammar.spec import GrammarKey


Gone = Callable[[], bool]  # whether nobody waits for a compile any more (polled while it runs)


def never() -> bool:
    return False


class GrammarError(ValueError):
    """A grammar that cannot be used: invalid, unsupported, too slow or too big to compile."""


class GrammarTimeout(GrammarError):
    """The compile ran past its time limit (says nothing about whether the grammar is valid)."""


class GrammarCancelled(Exception):
    """Every request waiting for the compile was aborted meanwhile: it was stopped, and says
    nothing about the grammar (not a GrammarError: never cached, never a client's error)."""


class Matcher(Protocol):
    """One request's position in a grammar. Used by one thread at a time (the engine loop).

    EOS is never a token a matcher consumes: the engine finishes the request on EOS itself.
    `error` is set when the matcher broke down at run time (the request is then aborted).
    """

    error: str | None

    def fill_mask(self, ptr: int, num_words: int) -> None:
        """Write the allowed-token bits of the current state into int32 words at `ptr`
        (token t at bit t % 32 of word t // 32); EOS bits are fixed by the caller."""

    def accept(self, token: int) -> bool:
        """Consume `token` (not EOS); False if the grammar rejects it."""

    def is_accepting(self) -> bool:
        """The output so far is a complete match (EOS may end it)."""

    def can_continue(self) -> bool:
        """Some non-EOS token is allowed next."""

    def forced_bytes(self) -> bytes:
        """Bytes every continuation of the output starts with (b"" when the next byte is free
        or the state is accepting)."""

    def count_valid(self, tokens: list[int]) -> int:
        """How many of `tokens`, in order from the current state, the grammar accepts."""

    def accepting_after(self, tokens: list[int]) -> bool:
        """After consuming `tokens` the output would be a complete match (False if one of them
        is not allowed). Does not change the state."""

    def terminates_after(self, tokens: list[int]) -> bool:
        """After consuming `tokens` (all valid) the output would be complete with no
        continuation possible. Does not change the state."""


class CompiledGrammar(Protocol):
    """Immutable once compiled; shared between requests through the cache."""

    nbytes: int   # approximate memory held, for the cache bound

    def new_matcher(self) -> Matcher: ...


class GrammarBackend(Protocol):
    def compile(self, key: GrammarKey, timeout_s: float, gone: Gone = never) -> CompiledGrammar:
        """Compile `key`; GrammarError with the reason on failure or past `timeout_s`;
        GrammarCancelled once `gone()` (nobody waits for it any more) where it can stop."""

    def close(self) -> None: ...
