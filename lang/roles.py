"""Chat roles: system()/user()/assistant() expressions and the backend's role markers that render them.

The backend derives the markers from the model's chat template; this module only consumes them:
`{"bos": str, "default_system": str, "system": [begin, end], "user": [begin, end], "assistant": [begin, end]}`.
`default_system` (optional) is the turn the template inserts when a conversation does not open
with a system message (SmolLM2, Qwen2.5); it is written before such a first turn.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from radixflow.lang import ir
from radixflow.lang.expr import Expr, to_expr

ROLES = ("system", "user", "assistant")

# `<|im_end|>`, `<|eot_id|>`, `</s>`, `<end_of_turn>`: special tokens the runtime already stops on
# (EOS ids) and never prints, so they make useless stop strings.
_SPECIAL = re.compile(r"<\|[^\s]*\|>|</?[A-Za-z_][\w.\-]*>")


@dataclass(frozen=True)
class RoleMarkers:
    bos: str
    turns: dict[str, tuple[str, str]]  # role → (begin, end)
    default_system: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoleMarkers:
        """Validate the backend's `role_markers()` answer; a malformed one raises ValueError."""
        if not isinstance(data, dict):
            raise ValueError(f"role_markers must be a dict, got {type(data).__name__}")
        bos = data.get("bos") or ""
        default_system = data.get("default_system") or ""
        turns: dict[str, tuple[str, str]] = {}
        for role, pair in data.items():
            if role in ("bos", "default_system"):
                continue
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
                raise ValueError(f"role_markers[{role!r}] must be [begin, end] strings, got {pair!r}")
            turns[role] = (pair[0], pair[1])
        for key, value in (("bos", bos), ("default_system", default_system)):
            if not isinstance(value, str):
                raise ValueError(f"role_markers[{key!r}] must be a str, got {value!r}")
        return cls(bos=bos, turns=turns, default_system=default_system)

    def pair(self, role: str) -> tuple[str, str]:
        if role not in self.turns:
            raise ValueError(f"the backend's chat template has no role {role!r}; it has {sorted(self.turns)}")
        return self.turns[role]

    def stop_string(self, role: str) -> str | None:
        """The end marker as a stop string for a gen inside `role`, unless it is a special token."""
        end = self.pair(role)[1].strip()
        if not end or _SPECIAL.fullmatch(end):
            return None
        return end


def role(name: str, expr: Any = None) -> Expr:
    """A whole turn: begin marker, `expr`, end marker."""
    inner = to_expr(expr).ops if expr is not None else []
    return Expr([ir.RoleBegin(name), *inner, ir.RoleEnd(name)])


def system(expr: Any = None) -> Expr:
    return role("system", expr)


def user(expr: Any = None) -> Expr:
    return role("user", expr)


def assistant(expr: Any = None) -> Expr:
    return role("assistant", expr)


def system_begin() -> Expr:
    return Expr([ir.RoleBegin("system")])


def system_end() -> Expr:
    return Expr([ir.RoleEnd("system")])


def user_begin() -> Expr:
    return Expr([ir.RoleBegin("user")])


def user_end() -> Expr:
    return Expr([ir.RoleEnd("user")])


def assistant_begin() -> Expr:
    return Expr([ir.RoleBegin("assistant")])


def assistant_end() -> Expr:
    return Expr([ir.RoleEnd("assistant")])
