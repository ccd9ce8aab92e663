"""trace(): run a program body once with symbolic arguments and values, recording its ops as an IR.

Works for programs whose structure does not depend on generated values. Reading a value inside
Python control flow (`if s["x"] == ...`, `f"{s['x']}"`, `len(arg)`) raises TraceError
("cannot be traced: ..."); `rf.if_(s["x"] == "value", then=..., else_=...)` records an If instead.
"""
from __future__ import annotations

import inspect
import itertools
from typing import Any

from radixflow.lang import ir
from radixflow.lang.expr import Condition, Expr, TraceError
from radixflow.lang.fork import ForkGroup, check_fork_size, check_join_mode
from radixflow.lang.surface import StateSurface
from radixflow.lang.validate import Limits


class Symbol(Expr):
    """A value known only at run time (a variable or an argument). Usable as text, in `+`, and in
    `==`/`!=` comparisons for rf.if_(); anything that needs the actual value fails."""

    __slots__ = ()

    def __init__(self, ref: ir.VarRef) -> None:
        super().__init__([ref])

    @property
    def ref(self) -> ir.VarRef:
        return self.ops[0]

    def _fail(self, what: str) -> TraceError:
        kind = "argument" if self.ref.source == "arg" else "variable"
        return TraceError(f"cannot be traced: {what} needs the value of {kind} {self.ref.name!r}, "
                          "known only at run time")

    def __eq__(self, other: Any) -> Condition:  # type: ignore[override]
        return Condition(self.ref, other)

    def __ne__(self, other: Any) -> Condition:  # type: ignore[override]
        return Condition(self.ref, other, negate=True)

    __hash__ = None  # type: ignore[assignment]

    def __getitem__(self, index: int) -> Symbol:
        """One element of a gathered (joined) list variable (negative: from the end, as in Python)."""
        if not isinstance(index, int) or self.ref.index is not None or self.ref.source != "var":
            raise self._fail("indexing")
        return Symbol(ir.VarRef(name=self.ref.name, index=index))

    def __bool__(self) -> bool:
        raise self._fail("Python control flow")

    def __str__(self) -> str:
        raise self._fail("str()")

    def __format__(self, spec: str) -> str:
        raise self._fail("string formatting")

    def __len__(self) -> int:
        raise self._fail("len()")

    def __iter__(self) -> Any:
        raise self._fail("iteration")

    def __int__(self) -> int:
        raise self._fail("int()")

    def __float__(self) -> float:
        raise self._fail("float()")

    def __repr__(self) -> str:
        return f"Symbol({self.ref!r})"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise self._fail(f".{name}")


class TraceState(StateSurface):
    """The `s` seen while tracing: appends record ops; reads return Symbols."""

    def __init__(self, ops: list[ir.Op], ids: Any, branch: tuple[str, int] | None = None) -> None:
        self.ops, self._ids, self._branch = ops, ids, branch

    def _emit(self, ops: list[ir.Op]) -> None:
        self.ops.extend(ops)

    def get_var(self, name: str) -> Symbol:
        fork, index = self._branch if self._branch else (None, None)
        return Symbol(ir.VarRef(name=name, fork=fork, index=index))

    __getitem__ = get_var

    def fork(self, n: int) -> ForkGroup:
        if isinstance(n, Symbol) or not isinstance(n, int):
            raise TraceError(f"cannot be traced: fork needs a fixed positive int, got {n!r}")
        check_fork_size(n, Limits().max_branches)
        fork_id = f"fork{next(self._ids)}"
        branches = [TraceState([], self._ids, (fork_id, i)) for i in range(n)]
        self.ops.append(ir.Fork(id=fork_id, n=n, branches=[b.ops for b in branches]))
        return ForkGroup(self, branches, fork_id)

    def join(self, forks: ForkGroup, mode: str = "gather_variable") -> None:
        check_join_mode(mode)
        self.ops.append(ir.Join(fork=forks.id))

    def _cannot(self, what: str) -> TraceError:
        return TraceError(f"cannot be traced: {what} reads the program's run-time state")

    def text(self) -> str:
        raise self._cannot("s.text()")

    def messages(self) -> list:
        raise self._cannot("s.messages()")

    def get_meta_info(self, name: str) -> Any:
        raise self._cannot("s.get_meta_info()")

    def set_var(self, name: str, value: Any) -> None:
        raise TraceError("cannot be traced: s.set_var() has no IR op; append text inside s.var_scope(name)")


def _arguments(fn: Any, bound: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """(values to call the body with, symbolic argument names, their str defaults)."""
    parameters = list(inspect.signature(fn).parameters.values())[1:]
    unknown = set(bound) - {p.name for p in parameters}
    if unknown:
        raise TypeError(f"{fn.__name__}() has no parameters {sorted(unknown)}")
    values: dict[str, Any] = {}
    symbolic: list[str] = []
    defaults: dict[str, str] = {}
    for p in parameters:
        if p.name in bound:
            values[p.name] = bound[p.name]
        elif p.default is not inspect.Parameter.empty and not isinstance(p.default, str):
            values[p.name] = p.default  # counts, flags, None: structure, fixed at trace time
        else:
            values[p.name] = Symbol(ir.VarRef(name=p.name, source="arg"))
            symbolic.append(p.name)
            if p.default is not inspect.Parameter.empty:
                defaults[p.name] = p.default
    return values, symbolic, defaults


def trace(f: Any, **bound: Any) -> ir.Program:
    """The IR of program `f`. Parameters given in `bound` are fixed into the IR; the others become
    program arguments (non-str defaults are fixed too)."""
    fn = getattr(f, "fn", f)
    values, symbolic, defaults = _arguments(fn, bound)
    state = TraceState([], itertools.count())
    fn(state, **values)
    return ir.Program(ops=state.ops, arguments=symbolic, defaults=defaults)
