"""Per-request grammar state: jump-forward plans, and what happens after each output token."""
from __future__ import annotations

from collections import deque

from radixflow.runtime.grammar.backend import Matcher
from radixflow.runtime.grammar.vocab import TokenVocab
from radixflow.runtime.core.output import append_token, finalize_text
from radixflow.runtime.core.request import Req


def plan_forced_tokens(matcher: Matcher, vocab: TokenVocab, stop_ids: frozenset[int] = frozenset()) -> list[int]:
    """Tokens to emit without a free choice from the matcher's state.

    The forced bytes are tokenized the tokenizer's own way. The last token is held back (it
    is sampled, so the model may pick it or a longer token running on into free text, which
    keeps token boundaries natural) unless the run ends the grammar: then nothing follows it.
    The plan ends before a stop token id (appending it would end the request): that token is
    sampled, under the mask's rule for stop tokens (see mask.py).
    """
    forced = matcher.forced_bytes()
    if not forced:
        return []
    tokens = vocab.tokenize_forced(forced)
    tokens = tokens[: matcher.count_valid(tokens)]
    for k, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[:k]
    if not tokens:
        return []
    spelled = sum(len(vocab.token_bytes[t]) for t in tokens)
    if spelled == len(forced) and matcher.terminates_after(tokens):
        return tokens
    return tokens[:-1]


class GrammarState:
    """Where one request is in its grammar. Created in the caller's thread, then used only by
    the engine thread.

    `plan` holds forced tokens not yet emitted. With jump-forward they are appended at once
    (one extend step computes them all); without, each step's mask pins the next one, so the
    token sequence, and greedy output, is the same either way. A plan is made after every
    freely sampled token and at the start; the held-back token after a plan is sampled freely.

    `stop_ids`: the request's stop token ids the grammar could produce (they end the request
    with their text kept, so one may be drawn only where it completes a match).
    """

    def __init__(self, matcher: Matcher, vocab: TokenVocab, jump_forward: bool, allow_eos: bool,
                 stop_ids: frozenset[int] = frozenset()) -> None:
        self.matcher, self.vocab = matcher, vocab
        self.jump_forward, self.allow_eos = jump_forward, allow_eos
        self.stop_ids = stop_ids
        self.plan: deque[int] = deque()
        self.needs_plan = True

    @property
    def error(self) -> str | None:
        return self.matcher.error

    def pinned_token(self) -> int | None:
        """The one token the next step may produce, or None when the choice is free."""
        self._ensure_plan()
        return self.plan[0] if self.plan else None

    def accept(self, token: int) -> bool:
        if self.plan and self.plan[0] == token:
            self.plan.popleft()
        else:
            self.plan.clear()
            self.needs_plan = True
        return self.matcher.accept(token)

    def _ensure_plan(self) -> None:
        if self.needs_plan:
            self.plan = deque(plan_forced_tokens(self.matcher, self.vocab, self.stop_ids))
            self.needs_plan = False


def advance(req: Req, token: int, eos_ids: frozenset[int], max_context_len: int) -> int:
    """After `append_token(req, token)`: move req's grammar, finish the request when the grammar
    is complete (or stuck), and append forced tokens when jump-forward is on.

    Returns how many forced tokens were appended. Engine thread only.
    """
    g: GrammarState = req.grammar
    if req.is_finished:
        return 0
    if not g.accept(token):
        _finish(req, {"type": "abort", "message": f"token {token} is not allowed by the grammar"})
        return 0
    appended = 0
    while not _finish_if_complete(req, g):
        if not g.jump_forward or g.pinned_token() is None:
            break
        forced = g.plan[0]
        if not g.accept(forced):
            _finish(req, {"type": "abort", "message": "jump-forward token rejected by the grammar"})
            break
        append_token(req, forced, eos_ids, max_context_len)
        appended += 1
        if req.is_finished:
            break
    return appended


def _finish_if_complete(req: Req, g: GrammarState) -> bool:
    if g.matcher.can_continue():
        return False
    if g.matcher.is_accepting():
        _finish(req, {"type": "stop", "matched": None})
    else:
        _finish(req, {"type": "abort", "message": "the grammar has no valid continuation"})
    return True


def _finish(req: Req, reason: dict) -> None:
    req.finish(reason)
    finalize_text(req)
