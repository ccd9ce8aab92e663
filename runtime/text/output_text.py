"""A request's output text: incremental detokenization, stop strings and stop regexes.

OutputText serves both places text is made: a non-streamed `generate` request's, on the engine
thread (runtime/core/output.py), and every stream's, on its consumer's side: the engine sends
token ids only and ClientText (used by runtime/stream_chunks.py, for `Engine.generate_stream` and
`EngineClient.generate_stream` alike) turns its messages into text and finds the stops, which end
the request in the engine.
"""
from __future__ import annotations

from typing import Any

import msgspec

from radixflow.runtime.core.messages import RequestOutput, ended_by_token
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.text.detokenizer import IncrementalDetokenizer
from radixflow.runtime.text.stop_regex import StopMatcher, compile_stop_regexes


class OutputText:
    """The text of one request's output tokens so far, and whether a stop string or stop regex
    completed in it. Stop strings are searched across token boundaries; at a match the text is
    trimmed (unless `no_stop_trim`) and final."""

    def __init__(self, tokenizer: Any, sampling: SamplingParams, prompt_ids: list[int]) -> None:
        self.sampling = sampling
        self._special: frozenset[int] = getattr(tokenizer, "special_token_ids", frozenset())
        self.text = ""
        self._detokenizer: IncrementalDetokenizer | None = IncrementalDetokenizer(
            tokenizer, skip_special_tokens=sampling.skip_special_tokens, prefix_ids=prompt_ids)
        self._stops = sampling.stop_strings
        self._longest_stop = max((len(s) for s in self._stops), default=0)
        self.stop_matcher: StopMatcher | None = None
        if sampling.stop_regexes:
            self.stop_matcher = StopMatcher(compile_stop_regexes(tuple(sampling.stop_regexes)))

    @property
    def is_final(self) -> bool:
        return self._detokenizer is None

    def add(self, token: int) -> int:
        """Append `token`'s text; returns the text's length before it (for `match_stop`)."""
        prev_len = len(self.text)
        if self._detokenizer is not None:
            self.text += self._detokenizer.step([token])
        return prev_len

    def end_token(self, token: int) -> None:
        """The token that ended the output by matching a stop token id or EOS: its text is added
        unless it is a special token (EOS, `<|im_end|>`), which vLLM and SGLang leave out of the
        text even when special tokens are shown, or no_stop_trim keeps it."""
        if self.sampling.no_stop_trim or token not in self._special:
            self.add(token)

    def add_all(self, tokens: list[int]) -> None:
        """Append the text of `tokens` at once (a request with no stops to look for)."""
        if self._detokenizer is not None and tokens:
            self.text += self._detokenizer.step(tokens)

    def match_stop(self, prev_len: int) -> dict[str, Any] | None:
        """The stop reason if a stop string or regex completed in the text after `prev_len`
        (the text is then trimmed and final), else None. Regexes see only the new text (linear
        time; see stop_regex.py)."""
        if self._detokenizer is None:
            return None
        if self._stops:
            start = max(0, prev_len - self._longest_stop + 1)
            hits = [(i, s) for s in self._stops if (i := self.text.find(s, start)) != -1]
            if hits:
                idx, stop = min(hits)
                return self._stop_at(idx, stop)
        if self.stop_matcher is not None:
            hit = self.stop_matcher.feed(self.text[prev_len:])
            if hit is not None:
                return self._stop_at(hit[0], self.text[hit[0]:hit[1]])
        return None

    def _stop_at(self, idx: int, matched: str) -> dict[str, Any]:
        if not self.sampling.no_stop_trim:
            self.text = self.text[:idx]
        self._detokenizer = None  # nothing after the stop is added
        return {"type": "stop", "matched": matched}

    def finalize(self) -> None:
        """Flush the detokenizer's held-back bytes into the text (once, at finish)."""
        if self._detokenizer is not None:
            self.text += self._detokenizer.flush()
            self._detokenizer = None

    def visible_len(self, finished: bool) -> int:
        """How much of the text is safe to stream: while running, hold back a tail that could
        begin a stop string, and everything from the earliest start of a stop-regex match still
        forming, so streamed text only ever grows."""
        end = len(self.text)
        if finished:
            return end
        if self._stops:
            end -= self._longest_stop - 1
        if self.stop_matcher is not None:
            end = min(end, self.stop_matcher.hold_from)
        return max(0, end)


class ClientText:
    """A stream's text on its consumer's side: the engine sends token ids only; this detokenizes them
    and finds stop strings and stop regexes (OutputText). At a stop, the tokens after the one
    that completed it are dropped and the request's finish reason is that stop once the core,
    told to end it, reports it finished (its final message carries the request's stats)."""

    def __init__(self, text: OutputText) -> None:
        self.text = text
        self.sent = 0
        self.stop: dict[str, Any] | None = None

    def apply(self, out: RequestOutput) -> RequestOutput:
        """`out` as the consumer sees it: its tokens up to a stop, with their visible text."""
        tokens, logprobs = out.new_token_ids, out.new_logprobs
        if self.stop is not None:
            tokens, logprobs = [], []
        else:
            reason = out.finish_reason
            # a stop token or EOS ends the output before any stop string is looked for, as in-process
            eos = ended_by_token(reason)
            for k, token in enumerate(tokens):
                if eos and k == len(tokens) - 1:
                    self.text.end_token(token)
                    break
                stop = self.text.match_stop(self.text.add(token))
                if stop is not None:
                    self.stop = stop
                    tokens, logprobs = tokens[: k + 1], logprobs[: k + 1]
                    break
        finished = out.finish_reason is not None
        if finished:
            self.text.finalize()
        end = self.text.visible_len(finished or self.text.is_final)
        delta, self.sent = self.text.text[self.sent: end], max(self.sent, end)
        reason = (self.stop or out.finish_reason) if finished else None
        return msgspec.structs.replace(out, new_token_ids=tokens, new_logprobs=logprobs, text_delta=delta,
                                       finish_reason=reason)
