"""GrammarCompiler: the engine's entry point: compile (cached, time-limited) and make request state."""
from __future__ import annotations

import importlib.util
import logging
import threading

from radixflow.runtime.grammar.after_text import AfterText
from radixflow.runtime.grammar.backend import (
    CompiledGrammar, GrammarBackend, GrammarCancelled, GrammarError, GrammarTimeout, Gone,
)
from radixflow.runtime.grammar.cache import GrammarCache
from radixflow.runtime.grammar.json_routing import prefers_llguidance
from radixflow.runtime.grammar.spec import GrammarKey, grammar_key
from radixflow.runtime.grammar.state import GrammarState
from radixflow.runtime.grammar.vocab import TokenVocab
from radixflow.runtime.sampling_params import SamplingParams

log = logging.getLogger(__name__)


# Kinds only llguidance compiles (outlines-core has no context-free grammars): they go to it
# whatever the engine's `grammar_backend` is.
LLGUIDANCE_KINDS = frozenset({"ebnf", "structural_tag"})
INSTALL_LLGUIDANCE = "pip install 'radixflow[llguidance]'"


class GrammarCompiler:
    """Compiles grammars for one tokenizer in caller threads (never the engine loop).

    `compile(sp)` blocks its caller for at most about `timeout_s` and raises ValueError with the
    reason when the grammar is invalid or too slow; the result is cached per (kind, text) — the
    tokenizer is fixed per compiler, so it is part of the key implicitly) and the backend it is
    routed to. Each grammar compiles on `backend`, except LLGUIDANCE_KINDS on llguidance, and,
    when `backend` is outlines-core and llguidance is installed, JSON schemas outlines-core would
    cut (json_routing.py); llguidance refusing one of those (a keyword it lacks), outlines-core
    compiles it as before. Backends and the vocabulary tables are built on first use.
    """

    def __init__(self, tokenizer, model_vocab_size: int, eos_ids: frozenset[int], backend: str,
                 timeout_s: float, jump_forward: bool, cache: GrammarCache | None = None) -> None:
        self.tokenizer, self.model_vocab_size, self.eos_ids = tokenizer, model_vocab_size, eos_ids
        self.backend_name, self.timeout_s, self.jump_forward = backend, timeout_s, jump_forward
        self.cache = cache or GrammarCache()
        self._backends: dict[str, GrammarBackend] = {}  # backend name -> backend
        self._vocab: TokenVocab | None = None
        self._init_lock = threading.Lock()
        self.can_route_json = backend == "outlines" and importlib.util.find_spec("llguidance") is not None

    def _ready(self, name: str) -> tuple[GrammarBackend, TokenVocab]:
        """Backend `name` ("outlines" or "llguidance") and the vocabulary; GrammarError when
        llguidance is not installed."""
        with self._init_lock:
            if self._vocab is None:
                self._vocab = TokenVocab.from_tokenizer(self.tokenizer, self.model_vocab_size, self.eos_ids)
            if name not in self._backends:
                self._backends[name] = self._make_backend(name, self._vocab)
            return self._backends[name], self._vocab

    def _make_backend(self, name: str, vocab: TokenVocab) -> GrammarBackend:
        if name == "llguidance":
            if importlib.util.find_spec("llguidance") is None:
                raise GrammarError(f"need the llguidance package: {INSTALL_LLGUIDANCE}")
            from radixflow.runtime.grammar.llguidance_backend import LLGuidanceBackend

            return LLGuidanceBackend(self.tokenizer, vocab)
        from radixflow.runtime.grammar.outlines_backend import OutlinesBackend

        return OutlinesBackend(vocab)

    def compile(self, sp: SamplingParams, cancel: threading.Event | None = None) -> CompiledGrammar | None:
        """The compiled grammar of `sp` (None when unconstrained). ValueError on failure;
        GrammarCancelled once `cancel` is set (the request was aborted: see GrammarCache)."""
        key = grammar_key(sp)
        if key is None:
            return None
        name = self.backend_for(key)
        try:
            backend, _ = self._ready(name)
        except GrammarError as exc:  # the package is missing: raised before the cache, nothing to remember
            raise GrammarError(f"{key.kind} grammars {exc}") from exc
        routed = name != self.backend_name and key.kind not in LLGUIDANCE_KINDS

        def compile_fn(gone: Gone) -> CompiledGrammar:
            return self._compile_routed(backend, key, gone) if routed else backend.compile(key, self.timeout_s, gone)

        # A timeout caused by waiting for a busy worker says nothing about the grammar: not cached.
        remember = lambda err: getattr(err, "ran_s", self.timeout_s) >= 0.9 * self.timeout_s  # noqa: E731
        return self.cache.get_or_compile((name, key), compile_fn, remember, cancel)

    def backend_for(self, key: GrammarKey) -> str:
        """The backend `key` is routed to ("outlines" or "llguidance")."""
        if key.kind in LLGUIDANCE_KINDS:
            return "llguidance"
        if self.can_route_json and key.kind == "json_schema" and prefers_llguidance(key.text):
            return "llguidance"
        return self.backend_name

    def _compile_routed(self, llguidance: GrammarBackend, key: GrammarKey, gone: Gone) -> CompiledGrammar:
        """A JSON schema outlines-core would cut, on llguidance; on outlines-core as before where
        llguidance refuses it (`oneOf` it cannot prove disjoint, `uniqueItems`, a huge float bound)."""
        try:
            return llguidance.compile(key, self.timeout_s, gone)
        except GrammarTimeout:
            raise
        except GrammarError as exc:
            log.info("json_schema left to outlines-core (cut deep down): llguidance refused it: %s", exc)
        outlines, _ = self._ready("outlines")
        return outlines.compile(key, self.timeout_s, gone)

    def new_state(self, sp: SamplingParams, want_logprob: bool,
                  cancel: threading.Event | None = None) -> GrammarState | None:
        """A fresh GrammarState for one request of `sp`, or None when it needs none, or when
        `cancel` was set while its grammar compiled (the request is aborted before it runs).

        Jump-forward is off for requests asking for logprobs: forced tokens are never sampled,
        so they would have none (the token sequence is the same either way). Stop token ids
        the grammar can produce are kept in the state (special ones it never produces).
        """
        if sp.max_new_tokens == 0:
            return None
        try:
            compiled = self.compile(sp, cancel)
        except GrammarCancelled:
            return None
        if compiled is None:
            return None
        vocab = self._vocab  # built by compile()
        stop_ids = frozenset(t for t in sp.stop_token_ids or () if 0 <= t < len(vocab.token_bytes) and vocab.token_bytes[t])
        matcher = compiled.new_matcher()
        if sp.constrain_after is not None:
            matcher = AfterText(matcher, sp.constrain_after.encode(), vocab)
        return GrammarState(matcher, vocab, jump_forward=self.jump_forward and not want_logprob,
                            allow_eos=not sp.ignore_eos, stop_ids=stop_ids)

    def close(self) -> None:
        with self._init_lock:
            for backend in self._backends.values():
                backend.close()


__all__ = ["GrammarCompiler", "GrammarError"]
