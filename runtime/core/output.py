"""After sampling: append a token to a request, detokenize, and decide whether it finished."""
from __future__ import annotations

import time

from radixflow.runtime.core.request import Req


def append_token(req: Req, token: int, eos_ids: frozenset[int], max_context_len: int) -> None:
    """Record `token` as req's next output token and set its finish reason if it ends here.

    A request with output text (`req.output_text`: the in-process engine) is detokenized here
    and its stop strings and regexes checked (runtime/text/output_text.py); a tokens-only
    request (the engine process's) has them checked on the server side, which aborts it with
    the stop reason.
    """
    sp = req.sampling
    req.output_ids.append(token)
    now = time.monotonic()
    req.times.tokens.append(now)
    if req.times.first_token is None:
        req.times.first_token = now
    text = req.output_text
    prev_len = 0 if text is None else text.add(token)
    if token in (sp.stop_token_ids or ()) or (token in eos_ids and not sp.ignore_eos):
        req.finish({"type": "stop", "matched": token})
    elif text is not None and (stop := text.match_stop(prev_len)) is not None:
        req.finish(stop)
    elif len(req.output_ids) >= sp.max_new_tokens or req.seq_len >= max_context_len:
        req.finish({"type": "length", "length": len(req.output_ids)})
    if req.is_finished:
        finalize_text(req)


def finalize_text(req: Req) -> None:
    """Flush the detokenizer's held-back bytes into the text (once, at finish)."""
    if req.output_text is not None:
        req.output_text.finalize()


def visible_text(req: Req) -> str:
    """Text safe to stream (see OutputText.visible_len); "" for a tokens-only request."""
    return "" if req.output_text is None else req.output_text.text[: visible_len(req)]


def visible_len(req: Req) -> int:
    """Length of `visible_text(req)`, without building it."""
    return 0 if req.output_text is None else req.output_text.visible_len(req.is_finished)
