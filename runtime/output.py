"""After sampling: append a token to a request, detokenize, and decide whether it finished."""
from __future__ import annotations

import re
import time

from radixflow.runtime.request import Req


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
    elif _match_stop_string(req, prev_len) or _match_stop_regex(req):
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


def _match_stop_regex(req: Req) -> bool:
    for pattern in req.sampling.stop_regexes:
        m = re.search(pattern, req.text)
        if m is not None:
            req.finish({"type": "stop", "matched": m.group(0)})
            if not req.sampling.no_stop_trim:
                req.text = req.text[: m.start()]
            req.detokenizer = None
            return True
    return False


def finalize_text(req: Req) -> None:
    """Flush the detokenizer's held-back bytes into the text (once, at finish)."""
    if req.detokenizer is not None:
        req.text += req.detokenizer.flush()
        req.detokenizer = None


def visible_text(req: Req) -> str:
    """Text safe to stream: while running, hold back a tail that could begin a stop string,
    so streamed text only ever grows."""
    stops = req.sampling.stop_strings
    if req.is_finished or not stops:
        return req.text
    hold = max(len(s) for s in stops) - 1
    return req.text[: max(0, len(req.text) - hold)]
