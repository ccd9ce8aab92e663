"""Role markers: the text a chat template puts before and after one turn of each role.

The language renders `with s.user(): ...` incrementally, so it needs each role's begin/end text
rather than a whole rendered conversation. They are read off the template by rendering a
sentinel message after a neutral context and splitting around it.
"""
from __future__ import annotations

from typing import Any

_SENTINEL = "\u2063RFSENTINEL\u2063"
_CONTEXT = {"system": [], "user": [], "assistant": [{"role": "user", "content": "hi"}]}


def role_markers(tokenizer: Any) -> dict[str, Any]:
    """{"bos": str, "system": [begin, end], "user": [...], "assistant": [...]} for the model.

    `bos` is the BOS text the template writes, or "" when encoding text already adds BOS (so a
    rendered program never starts with two). A role the template rejects is left out.
    """
    bos_text = ""
    if tokenizer.bos_token_id is not None:
        bos_text = tokenizer.decode([tokenizer.bos_token_id], skip_special_tokens=False)
    out: dict[str, Any] = {}
    for role, context in _CONTEXT.items():
        try:
            full = tokenizer.apply_chat_template(context + [{"role": role, "content": _SENTINEL}])
            prefix = tokenizer.apply_chat_template(context) if context else ""
        except ValueError:
            continue
        if prefix and full.startswith(prefix):
            full = full[len(prefix):]
        if _SENTINEL not in full:
            continue
        begin, end = full.split(_SENTINEL, 1)
        if bos_text and begin.startswith(bos_text):
            begin = begin[len(bos_text):]
        out[role] = [begin, end]
    encode_adds_bos = bool(bos_text) and tokenizer.encode("a")[:1] == [tokenizer.bos_token_id]
    out["bos"] = "" if encode_adds_bos else bos_text
    return out
