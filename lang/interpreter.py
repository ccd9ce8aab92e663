"""execute(): run a program IR against any Backend. What the server calls for POST /v1/programs.

The IR is data: this runs only the ops of ops.py, never user code.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixflow.lang import ir
from radixflow.lang.budget import Budget, ProgramTimeout
from radixflow.lang.context import ProgramContext
from radixflow.lang.ops import run_ops
from radixflow.lang.validate import Limits, validate_ir

__all__ = ["Limits", "ProgramTimeout", "execute", "prepare", "validate_ir"]


def _arguments(program: ir.Program, arguments: dict[str, Any] | None) -> dict[str, Any]:
    given = dict(arguments or {})
    unknown = set(given) - set(program.arguments)
    if unknown:
        raise ValueError(f"unknown program arguments {sorted(unknown)}; the program takes {program.arguments}")
    values: dict[str, Any] = {}
    for name in program.arguments:
        if name in given:
            value = given[name]
        elif name in program.defaults:
            value = program.defaults[name]
        else:
            raise ValueError(f"missing program argument {name!r}")
        if not isinstance(value, (str, int, float, bool)):
            raise ValueError(f"program argument {name!r} must be a string or number, got {type(value).__name__}")
        values[name] = value
    return values


def prepare(program: ir.Program | dict | bytes | str, arguments: dict[str, Any] | None,
            limits: Limits | None = None) -> tuple[ir.Program, dict[str, Any]]:
    """Decode and validate a program and its arguments (ValueError), sending nothing."""
    program = ir.decode_program(program)
    validate_ir(program, limits)
    return program, _arguments(program, arguments)


class _VariableEvents:
    """A context listener that reports each variable as it is set (for streamed programs)."""

    def __init__(self, on_variable: Callable[[str, Any], None]) -> None:
        self.on_variable = on_variable
        self.ctx: ProgramContext | None = None

    def on_text(self, piece: str, var: str | None) -> None:
        pass

    def on_var(self, name: str) -> None:
        assert self.ctx is not None
        self.on_variable(name, self.ctx.variables[name])


def execute(program: ir.Program | dict | bytes | str, arguments: dict[str, Any] | None, backend: Any,
            limits: Limits | None = None,
            on_variable: Callable[[str, Any], None] | None = None) -> dict[str, Any]:
    """Validate and run `program`; returns {"variables", "text", "meta"}.

    Malformed or oversized programs and bad arguments raise ValueError before any request is
    sent. Errors while running (a backend failure, an unset variable, text past
    `limits.max_text_chars`) propagate; past `limits.deadline_s` ProgramTimeout is raised
    at the next op.
    `on_variable(name, value)`, when given, is called (on this thread) as each top-level
    variable is set; fork branches report theirs when they are joined.
    """
    limits = limits or Limits()
    program, values = prepare(program, arguments, limits)
    budget = Budget(limits.max_text_chars, limits.deadline_s)
    ctx = ProgramContext(backend=backend, arguments=values, budget=budget)
    if on_variable is not None:
        events = _VariableEvents(on_variable)
        ctx.listener, events.ctx = events, ctx
    run_ops(ctx, program.ops)
    return {"variables": ctx.variables, "text": ctx.text, "meta": ctx.meta}
