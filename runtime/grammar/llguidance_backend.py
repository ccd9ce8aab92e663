"""llguidance backend: lazy (derivative-based) lexer + Earley parser; compiles in milliseconds."""
from __future__ import annotations

import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import llguidance as llg
import numpy as np

from radixflow.runtime.grammar.backend import GrammarCancelled, GrammarError, GrammarTimeout, Gone, never
from radixflow.runtime.grammar.spec import GrammarKey
from radixflow.runtime.grammar.structural_tag import structure_begins, structure_schemas, to_lark
from radixflow.runtime.grammar.vocab import TokenVocab
from radixflow.runtime.grammar.worker import POLL_S

# Compact JSON, as the outlines backend: {"a":1,"b":[2,3]}.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
# NOTE: llguidance follows a chain of rules (r0 ::= "w" r1, r1 ::= "w" r2, ...) recursively, about
# 3 KB of stack per rule: a chain of ~2,500 overflowed an 8 MB thread stack and killed the whole
# process (measured, llguidance 1.9.1), and its GBNF converter (Python, holding the GIL) takes
# time quadratic in such a chain: 0.4 s at 500 rules, 7 s at 2,000 (2 cores). So an EBNF grammar
# has at most MAX_EBNF_RULES rules, and builds run on threads with BUILD_STACK_BYTES of stack
# (address space; pages are committed as used).
MAX_EBNF_RULES = 500
BUILD_STACK_BYTES = 64 << 20
# a GBNF (`name ::=`) or Lark (`name:`) rule's head; counts a literal that looks like one too
_RULE = re.compile(r"(?:\A|\s)[?!]?[A-Za-z_][\w.-]*\s*:")
_STACK_LOCK = threading.Lock()


def short_error(error: str) -> str:
    """llguidance's error, cut to its first line and 300 characters (some quote the whole grammar)."""
    line = error.strip().split("\n", 1)[0]
    return line if len(line) <= 300 else line[:300] + "..."


def to_grammar(key: GrammarKey) -> str:
    if key.kind == "regex":
        return llg.LLMatcher.grammar_from_regex(key.text)
    if key.kind == "json_schema":
        return llg.LLMatcher.grammar_from_json_schema(key.text, defaults=JSON_OPTIONS)
    if key.kind == "choices":
        return llg.grammar_from("choice", key.text)
    if key.kind == "ebnf":  # GBNF converted to Lark; a grammar already in Lark syntax is kept
        num_rules = len(_RULE.findall(key.text))
        if num_rules > MAX_EBNF_RULES:
            raise ValueError(f"{num_rules} rules; at most {MAX_EBNF_RULES} are allowed")
        return llg.grammar_from("ebnf", key.text)
    if key.kind == "structural_tag":
        return llg.LLMatcher.grammar_from_lark(to_lark(key.text, JSON_OPTIONS))
    raise GrammarError(f"unknown grammar kind {key.kind!r}")


class LLGuidanceGrammar:
    def __init__(self, template: llg.LLMatcher, nbytes: int) -> None:
        self.template, self.nbytes = template, nbytes

    def new_matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self.template.deep_copy())


class LLGuidanceMatcher:
    def __init__(self, matcher: llg.LLMatcher) -> None:
        self.m = matcher
        self.error: str | None = None

    def fill_mask(self, ptr: int, num_words: int) -> None:
        self.m.unsafe_compute_mask_ptr(ptr, num_words * 4)
        if self.m.is_error():
            self.error = f"grammar error: {short_error(self.m.get_error())}"

    def accept(self, token: int) -> bool:
        return self.m.consume_token(token)

    def is_accepting(self) -> bool:
        return self.m.is_accepting()

    def can_continue(self) -> bool:
        return not self.m.is_stopped()

    def forced_bytes(self) -> bytes:
        return b"" if self.m.is_accepting() else self.m.compute_ff_bytes()

    def count_valid(self, tokens: list[int]) -> int:
        return self.m.validate_tokens(tokens)

    def accepting_after(self, tokens: list[int]) -> bool:
        if self.m.validate_tokens(tokens) < len(tokens) or not self.m.consume_tokens(tokens):
            return False
        accepting = self.m.is_accepting()
        self.m.rollback(len(tokens))
        return accepting

    def terminates_after(self, tokens: list[int]) -> bool:
        if not self.m.consume_tokens(tokens):
            return False
        stopped = self.m.is_stopped()
        self.m.rollback(len(tokens))
        return stopped


class LLGuidanceBackend:
    """Builds matchers on a thread (llguidance bounds its own work with LLParserLimits, so a
    timed-out build cannot run away; the caller is answered at `timeout_s` regardless)."""

    def __init__(self, tokenizer, vocab: TokenVocab) -> None:
        self.tokenizer = llg.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab.num_words * 32,
                                         eos_token=list(vocab.eos_ids) or None)
        self.eos_ids = frozenset(vocab.eos_ids)
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="radixflow-llguidance")

    def _build(self, key: GrammarKey) -> LLGuidanceGrammar:
        """Errors start with the kind (the request field they are about)."""
        try:
            grammar = to_grammar(key)
        except ValueError as exc:
            raise GrammarError(f"{key.kind} is not valid: {exc}") from exc
        matcher = llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(self._whose_error(key) or
                               f"{key.kind}: grammar does not compile: {short_error(matcher.get_error())}")
        if matcher.is_stopped() or self._only_empty(matcher):
            raise GrammarError(f"{key.kind}: grammar matches only the empty string: nothing to generate")
        self._probe(key, matcher)
        if key.kind == "structural_tag":
            for i, begin in enumerate(structure_begins(key.text)):
                self._probe(key, matcher, begin, where=f" structures[{i}]")
        return LLGuidanceGrammar(matcher, len(grammar) * 4)

    def _whose_error(self, key: GrammarKey) -> str | None:
        """For a structural tag that does not compile: the first structure whose schema does not,
        named (llguidance's own message points into the Lark text radixflow wrote)."""
        if key.kind != "structural_tag":
            return None
        for i, schema in enumerate(structure_schemas(key.text)):
            grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
            is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
            if is_error:
                return f"{key.kind}: structures[{i}].schema does not compile: {short_error(messages[0])}"
        return None

    def _only_empty(self, matcher: llg.LLMatcher) -> bool:
        """Whether the grammar's start allows nothing but ending (`root ::= ""`)."""
        if not matcher.is_accepting():
            return False
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        return set(np.flatnonzero(bits).tolist()) <= self.eos_ids

    def _probe(self, key: GrammarKey, matcher: llg.LLMatcher, prefix: str = "", where: str = "") -> None:
        """Some grammars compile, then fail at their first mask: no text matches them (`root ::=
        root`), or what the output must start with passes llguidance's limits (an alternation of
        thousands of words, a forced run of a million bytes). Run the start of one on a copy, so
        that is a GrammarError here rather than an error ending the request at its first step.
        `prefix`: text to consume first (a structure's begin: where its JSON starts)."""
        probe = matcher.deep_copy()
        if prefix and not probe.consume_tokens(self.tokenizer.greedy_tokenize(prefix)) and not probe.is_error():
            raise GrammarError(f"{key.kind}:{where} does not compile: the grammar refuses {prefix!r}")
        forced = [] if probe.is_error() else probe.compute_ff_tokens()
        if not probe.is_error() and (not forced or probe.consume_tokens(forced)):
            probe.compute_bitmask()
        if probe.is_error():
            raise GrammarError(f"{key.kind}:{where} grammar does not compile (no text matches it, or it passes "
                               f"llguidance's limits): {short_error(probe.get_error())}")

    def _submit(self, key: GrammarKey) -> Future:
        """The pool starts its threads inside submit(): they get BUILD_STACK_BYTES of stack."""
        with _STACK_LOCK:
            default = threading.stack_size(BUILD_STACK_BYTES)
            try:
                return self._pool.submit(self._build, key)
            finally:
                threading.stack_size(default)

    def compile(self, key: GrammarKey, timeout_s: float, gone: Gone = never) -> LLGuidanceGrammar:
        """Once `gone()`, the caller stops waiting (the build, bounded by llguidance's limits, ends
        on its own)."""
        future = self._submit(key)  # converting an EBNF grammar counts too
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return future.result(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
            except FutureTimeout as exc:
                if gone():
                    raise GrammarCancelled("nobody waits for this compile any more") from exc
                if time.monotonic() >= deadline:
                    raise GrammarTimeout(f"{key.kind}: grammar compilation exceeded the {timeout_s:g} s limit") from exc

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
