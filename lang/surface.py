"""StateSurface: what a program body can do to `s`, shared by the running state and the tracer.

Subclasses decide what emitting ops means (queue them for execution, or record them).
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from radixflow.lang import ir
from radixflow.lang.expr import to_expr


class StateSurface:
    def _emit(self, ops: list[ir.Op]) -> None:
        raise NotImplementedError

    def __iadd__(self, expr: Any) -> StateSurface:
        self._emit(to_expr(expr).ops)
        return self

    def system(self, expr: Any = None) -> Any:
        return self._role("system", expr)

    def user(self, expr: Any = None) -> Any:
        return self._role("user", expr)

    def assistant(self, expr: Any = None) -> Any:
        return self._role("assistant", expr)

    def _role(self, role: str, expr: Any) -> Any:
        """With `expr`: append the whole turn now. Without: a context manager for `with s.user():`."""
        if expr is None:
            return self._turn(role)
        self._emit([ir.RoleBegin(role), *to_expr(expr).ops, ir.RoleEnd(role)])
        return None

    @contextmanager
    def _turn(self, role: str) -> Iterator[None]:
        self._emit([ir.RoleBegin(role)])
        yield
        self._emit([ir.RoleEnd(role)])

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Store the text appended inside the block as variable `name`."""
        self._emit([ir.ScopeBegin(name)])
        yield
        self._emit([ir.ScopeEnd(name)])
