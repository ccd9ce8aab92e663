"""After sampling: append a token to a request, detokenize, and decide whether it finished."""
from __future__ import annotations

import time

from radixflow.runtime.core.request import Req
from radixflow.runtime.text.stop_regex import StopMatcher, compile_stop_regexes


def append_token(req: Req, token: int, eos_ids: frozenset[int], max_context_len: int) -> None:
    """Record `token` as req's next output token and set its finish reason if it ends here.

    Stop strings are searched across token boundaries in the detokenized text; the text is
    trimmed at the match when the request finishes (unless `no_stop_trim`).
    """
    sp = req.sampling
    req.output_ids.append(token)
    now = time.monotonic()
    req.times.tokens.append(now)
    if req.times.first_token is None:
        req.times.first_token = now
    prev_len = len(req.text)
    req.text += req.detokenizer.step([token])
    if token in (sp.stop_token_ids or ()) or (token in eos_ids and not sp.ignore_eos):
        req.finish({"type": "stop", "matched": token})
    elif _match_stop_string(req, prev_len) or _match_stop_regex(req, prev_len):
        pass
    elif len(req.output_ids) >= sp.max_new_tokens or req.seq_len >= max_context_len:
        req.finish({"type": "length", "length": len(req.output_ids)})
    if req.is_finished:
        finalize_text(req)


def _match_stop_string(req: Req, prev_len: int) -> bool:
    stops = req.sampling.stop_strings
    if not stops:
        return False
    window_start = max(0, prev_len - max(len(s) for s in stops) + 1)
    hits = [(i, s) for s in stops if (i := req.text.find(s, window_start)) != -1]
    if not hits:
        return False
    idx, stop = min(hits)
    req.finish({"type": "stop", "matched": stop})
    if not req.sampling.no_stop_trim:
        req.text = req.text[:idx]
    req.detokenizer = None  # the text is final: nothing after the stop is added
    return True


def _stop_matcher(req: Req) -> StopMatcher | None:
    if req.stop_matcher is None and req.sampling.stop_regexes:
        req.stop_matcher = StopMatcher(compile_stop_regexes(tuple(req.sampling.stop_regexes)))
    return req.stop_matcher


def _match_stop_regex(req: Req, prev_len: int) -> bool:
    """Feed only the text new since the last token (linear time; see stop_regex.py)."""
    matcher = _stop_matcher(req)
    if matcher is None:
        return False
    hit = matcher.feed(req.text[prev_len:])
    if hit is None:
        return False
    start, end = hit
    req.finish({"type": "stop", "matched": req.text[start:end]})
    if not req.sampling.no_stop_trim:
        req.text = req.text[:start]
    req.detokenizer = None
    return True


def finalize_text(req: Req) -> None:
    """Flush the detokenizer's held-back bytes into the text (once, at finish)."""
    if req.detokenizer is not None:
        req.text += req.detokenizer.flush()
        req.detokenizer = None


def visible_text(req: Req) -> str:
    """Text safe to stream: while running, hold back a tail that could begin a stop string, and
    everything from the earliest start of a stop-regex match still forming, so streamed text
    only ever grows."""
    return req.text[: visible_len(req)]


def visible_len(req: Req) -> int:
    """Length of `visible_text(req)`, without building it."""
    if req.is_finished:
        return len(req.text)
    end = len(req.text)
    stops = req.sampling.stop_strings
    if stops:
        end -= max(len(s) for s in stops) - 1
    if req.stop_matcher is not None:
        end = min(end, req.stop_matcher.hold_from)
    return max(0, end)

