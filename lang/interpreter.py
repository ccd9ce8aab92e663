"""execute(): run a program IR against any Backend. What the server calls for POST /v1/programs.

The IR is data: this runs only the ops of ops.py, never user code.
"""
from __future__ import annotations

from typing import Any

from radixflow.lang import ir
from radixflow.lang.context import ProgramContext
from radixflow.lang.ops import run_ops
from radixflow.lang.validate import Limits, validate_ir

__all__ = ["Limits", "execute", "validate_ir"]


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


def execute(program: ir.Program | dict | bytes | str, arguments: dict[str, Any] | None, backend: Any,
            limits: Limits | None = None) -> dict[str, Any]:
    """Validate and run `program`; returns {"variables", "text", "meta"}.

    Malformed or oversized programs and bad arguments raise ValueError before any request is
    sent. Errors while running (a backend failure, an unset variable) propagate.
    """
    program = ir.decode_program(program)
    validate_ir(program, limits)
    ctx = ProgramContext(backend=backend, arguments=_arguments(program, arguments))
    run_ops(ctx, program.ops)
    return {"variables": ctx.variables, "text": ctx.text, "meta": ctx.meta}
