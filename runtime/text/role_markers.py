"""Role markers: the text a chat template puts before and after one turn of each role.

The language renders `with s.user(): ...` incrementally, so it needs each role's begin/end text
rather than a whole rendered conversation. They are read off the template by rendering short
conversations whose contents are sentinels (S0..S3) and cutting the text around them:

    [user S1]                     → prefix_user · S1 · user_end
    [user S1] + generation prompt → ... user_end · assistant_begin
    [user S1, assistant S2]       → ... S2 · assistant_end
    [user S1, assistant S2, user S3] → ... S2 · assistant_end · user_begin · S3
    [system S0, user S1]          → bos · system_begin · S0 · system_end · user_begin · S1

`prefix_user` is `bos · default_system · user_begin`, where `default_system` is the turn some
templates (SmolLM2, Qwen2.5) insert when a conversation does not open with a system message.
NOTE: the BOS text counts as a separate prefix only when it is not also how turns begin: SmolLM2's
BOS is `<|im_start|>`, which opens every ChatML turn and so stays inside the markers.
"""
from __future__ import annotations

from typing import Any

_S = [f"\u2063RF{i}SENTINEL\u2063" for i in range(4)]


def _render(tokenizer: Any, messages: list[tuple[str, int]], generation: bool = False) -> str | None:
    msgs = [{"role": role, "content": _S[i]} for role, i in messages]
    try:
        return tokenizer.apply_chat_template(msgs, add_generation_prompt=generation)
    except ValueError:
        return None


def _between(text: str | None, left: int | None, right: int | None) -> str | None:
    """The text after sentinel `left` (start if None) and before sentinel `right` (end if None)."""
    if text is None:
        return None
    start = 0 if left is None else text.find(_S[left])
    stop = len(text) if right is None else text.find(_S[right])
    if start < 0 or stop < 0:
        return None
    start += 0 if left is None else len(_S[left])
    return text[start:stop] if start <= stop else None


def _strip_suffix(text: str | None, suffix: str) -> str | None:
    return text[: len(text) - len(suffix)] if text is not None and text.endswith(suffix) else None


def _strip_prefix(text: str | None, prefix: str) -> str | None:
    return text[len(prefix):] if text is not None and text.startswith(prefix) else None


def _turn_markers(tokenizer: Any) -> dict[str, Any] | None:
    """user/assistant markers and the text before the first user turn, or None if the template
    does not decompose into per-turn markers."""
    only_user = _render(tokenizer, [("user", 1)])
    user_end = _between(only_user, 1, None)
    with_prompt = _render(tokenizer, [("user", 1)], generation=True)
    assistant_begin = _strip_prefix(_between(with_prompt, 1, None), user_end or "")
    assistant_end = _between(_render(tokenizer, [("user", 1), ("assistant", 2)]), 2, None)
    second = _render(tokenizer, [("user", 1), ("assistant", 2), ("user", 3)])
    user_begin = _strip_prefix(_between(second, 2, 3), assistant_end or "")
    prefix_user = _strip_suffix(_between(only_user, None, 1), user_begin or "")
    parts = (user_end, assistant_begin, assistant_end, user_begin, prefix_user)
    if any(p is None for p in parts):
        return None
    # the assistant turn as the template writes it mid-conversation must match the pieces
    if _between(second, 1, 2) != user_end + assistant_begin:
        return None
    return {"user": [user_begin, user_end], "assistant": [assistant_begin, assistant_end],
            "prefix_user": prefix_user}


def _bos_text(tokenizer: Any) -> str:
    if tokenizer.bos_token_id is None:
        return ""
    return tokenizer.decode([tokenizer.bos_token_id], skip_special_tokens=False)


def role_markers(tokenizer: Any) -> dict[str, Any]:
    """{"bos": str, "default_system": str, "system"?: [begin, end], "user": [...], "assistant": [...]}.

    `bos` is the BOS text the template writes once, or "" when encoding text already adds BOS (so
    a rendered program never starts with two) or when BOS is the template's turn opener.
    `default_system` goes before a first turn that is not a system turn. A role the template
    rejects or cannot express per turn (e.g. a system message folded into a user turn) is left out.
    """
    turns = _turn_markers(tokenizer)
    if turns is None:
        return {"bos": ""}
    user_begin = turns["user"][0]
    bos = _bos_text(tokenizer)
    encode_adds_bos = bool(bos) and tokenizer.encode("a")[:1] == [tokenizer.bos_token_id]
    bos_is_turn_opener = bool(bos) and user_begin.startswith(bos)
    prefix_user = turns["prefix_user"]
    written_bos = bos if bos and not bos_is_turn_opener and prefix_user.startswith(bos) else ""
    out: dict[str, Any] = {"user": turns["user"], "assistant": turns["assistant"]}
    default_system = _strip_prefix(prefix_user, written_bos) if written_bos else prefix_user
    out["default_system"] = default_system if default_system is not None else prefix_user
    with_system = _render(tokenizer, [("system", 0), ("user", 1)])
    before_system = _between(with_system, None, 0)
    if written_bos and before_system is not None:
        before_system = _strip_prefix(before_system, written_bos)
    system_end = _strip_suffix(_between(with_system, 0, 1), user_begin)
    if before_system is not None and system_end is not None:
        out["system"] = [before_system, system_end]
    out["bos"] = "" if encode_adds_bos else written_bos
    return out
