"""Expressions: what `s += ...` accepts. An Expr is a short sequence of IR ops; `+` concatenates."""
from __future__ import annotations

from typing import Any

from radixflow.lang import ir


class Expr:
    """A sequence of IR ops. `"Answer: " + gen("x")` is Expr([Text("Answer: "), Gen("x")])."""

    __slots__ = ("ops",)

    def __init__(self, ops: list[ir.Op]) -> None:
        self.ops = list(ops)

    def __add__(self, other: Any) -> Expr:
        return Expr(self.ops + to_expr(other).ops)

    def __radd__(self, other: Any) -> Expr:
        return Expr(to_expr(other).ops + self.ops)

    def __repr__(self) -> str:
        return f"Expr({self.ops!r})"


def to_expr(value: Any) -> Expr:
    """str → Text; an Expr stays as it is. Anything else is a TypeError: a number, a bool or None
    has no one obvious text (str(5)? f"{x:.2f}"?), so the program says which it means."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Expr([ir.Text(value)] if value else [])
    raise TypeError(f"cannot append {type(value).__name__} {value!r:.40} to a program: append a str "
                    "(str(x) for a number), gen(), select() or a role")


def concat(*parts: Any) -> Expr:
    ops: list[ir.Op] = []
    for part in parts:
        ops.extend(to_expr(part).ops)
    return Expr(ops)


class Condition:
    """`value == literal` on a traced variable or argument; only rf.if_() consumes it."""

    __slots__ = ("ref", "equals", "negate")

    def __init__(self, ref: ir.VarRef, equals: Any, negate: bool = False) -> None:
        if not isinstance(equals, (str, int, float, bool)):
            raise TypeError(f"a traced value can only be compared with a str, int, float or bool, not {equals!r}")
        self.ref, self.equals, self.negate = ref, equals, negate

    def __bool__(self) -> bool:
        raise TraceError(
            f"cannot be traced: the program branches in Python on {self.ref.name!r}, a value known only "
            "at run time; write rf.if_(s[name] == value, then=..., else_=...) instead")


class TraceError(ValueError):
    """A program whose structure depends on run-time values cannot become an IR."""
