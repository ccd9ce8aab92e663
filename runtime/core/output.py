"""After sampling: append a token to a request, detokenize, and decide whether it finished."""
from __future__ import annotations

import time

from radixflow.runtime.core.messages import ended_by_token
from radixflow.runtime.core.request import Req


def append_token(req: Req, token: int, eos_ids: frozenset[int], max_context_len: int,
                 now: float | None = None) -> None:
    """Record `token` as req's next output token and set its finish reason if it ends here.
    `now`: the step's time (one clock read per step), else read here.

    A request with output text (`req.output_text`: a non-streamed `generate` request with stop
    strings or regexes) is detokenized here and its stops checked (runtime/text/output_text.py);
    a streamed request is tokens only: its consumer makes the text and ends it at a stop.
    """
    if req.finish_ids is None:
        finish_limits(req, eos_ids, max_context_len)
    out = req.output_ids
    out.append(token)
    times = req.times
    if now is None:
        now = time.monotonic()
    times.tokens.append(now)
    if times.first_token is None:
        times.first_token = now
    text = req.output_text
    if text is None:
        if token in req.finish_ids:
            req.finish({"type": "stop", "matched": token})
        elif len(out) >= req.output_limit:
            req.finish({"type": "length", "length": len(out)})
        return
    if token in req.finish_ids:
        text.end_token(token)
        req.finish({"type": "stop", "matched": token})
    elif (stop := text.match_stop(text.add(token))) is not None:
        req.finish(stop)
    elif len(out) >= req.output_limit:
        req.finish({"type": "length", "length": len(out)})
    if req.finish_reason is not None:
        finalize_text(req)


def append_plain(sampled: list[tuple[Req, object]], now: float) -> tuple[int, list[tuple[Req, object]]]:
    """`append_token` for each (req, outcome) pair of a step whose request needs nothing but
    its token appended and its finish checked: a token (outcome `(token, None, None)`), no
    text, grammar or logprob, its limits read. In one loop, no call per request: the engine's
    per-step loop. Returns how many it appended and the pairs it left (in order) for the
    general path: the others, and requests already finished."""
    rest = []
    count = 0
    for pair in sampled:
        req, outcome = pair
        if (outcome.__class__ is not tuple or outcome[1] is not None or req.output_text is not None
                or req.grammar is not None or req.finish_ids is None or req.finish_reason is not None):
            rest.append(pair)
            continue
        token = outcome[0]
        out = req.output_ids
        out.append(token)
        times = req.times
        times.tokens.append(now)
        if times.first_token is None:
            times.first_token = now
        if token in req.finish_ids:
            req.finish({"type": "stop", "matched": token})
        elif len(out) >= req.output_limit:
            req.finish({"type": "length", "length": len(out)})
        count += 1
    return count, rest


def finish_limits(req: Req, eos_ids: frozenset[int], max_context_len: int) -> None:
    """Set what ends req by token (its stop token ids, and EOS unless ignored) and by length
    (max_new_tokens, or the context length), read once per request by `append_token`."""
    sp = req.sampling
    req.finish_ids = frozenset(sp.stop_token_ids or ()) | (frozenset() if sp.ignore_eos else eos_ids)
    req.output_limit = min(sp.max_new_tokens, max_context_len - len(req.prompt_ids))


def finalize_text(req: Req) -> None:
    """Flush the detokenizer's held-back bytes into the text (once, at finish); a deferred text
    is made here from all the output tokens, in one detokenizer step."""
    deferred = req.deferred_text
    if deferred is not None:
        req.deferred_text = None
        ids = req.output_ids
        if ended_by_token(req.finish_reason):
            deferred.add_all(ids[:-1])
            deferred.end_token(ids[-1])
        else:
            deferred.add_all(ids)
        req.output_text = deferred
    if req.output_text is not None:
        req.output_text.finalize()


def visible_text(req: Req) -> str:
    """Text safe to show (see OutputText.visible_len); "" for a tokens-only request."""
    text = req.output_text
    return "" if text is None else text.text[: text.visible_len(req.is_finished)]
