"""ProgramState: the `s` of a running program, and the handle `run()` returns.

`s += expr` queues the expression's ops on the state's executor and returns at once; reads
(`s["x"]`, `s.text()`, ...) wait for what they need. Errors: a failed program's state carries the
exception (`s.error()`); every read then raises ProgramError from it.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from radixflow.lang import ir
from radixflow.lang.context import ProgramContext
from radixflow.lang.executor import Executor, ProgramError, Run
from radixflow.lang.fork import ForkGroup, check_fork_size, check_join_mode, fork_contexts, gather
from radixflow.lang.surface import StateSurface
from radixflow.lang.validate import Limits


class ProgramState(StateSurface):
    def __init__(self, ctx: ProgramContext, run: Run | None = None) -> None:
        self._ctx = ctx
        self._run = run or Run()
        self._executor = Executor(ctx, self._run)

    def _emit(self, ops: list[ir.Op]) -> None:
        self._executor.submit(ops)

    # -- reads ------------------------------------------------------------------------------

    def sync(self) -> None:
        """Wait until every queued op has run (or the program failed)."""
        self._executor.wait(lambda: False)

    def error(self) -> BaseException | None:
        self.sync()
        return self._executor.error

    def _raise_if_failed(self) -> None:
        if self._executor.error is not None:
            raise ProgramError(f"the program failed: {self._executor.error!r}") from self._executor.error

    def get_var(self, name: str) -> Any:
        """The variable's value, waiting for it; KeyError if the program ends without setting it."""
        ctx = self._ctx
        self._executor.wait(lambda: name in ctx.variables)
        if name in ctx.variables:
            return ctx.variables[name]
        self._raise_if_failed()
        raise KeyError(f"variable {name!r} was never set; set: {sorted(ctx.variables)}")

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self.sync()
        self._raise_if_failed()
        self._ctx.set_var(name, value)

    def get_meta_info(self, name: str) -> Any:
        self.get_var(name)
        return self._ctx.meta.get(name)

    def text(self) -> str:
        self.sync()
        self._raise_if_failed()
        return self._ctx.text

    def messages(self) -> list[dict[str, str]]:
        """The finished chat turns, as [{"role": ..., "content": ...}]."""
        self.sync()
        self._raise_if_failed()
        return [dict(m) for m in self._ctx.messages]

    def variables(self) -> dict[str, Any]:
        self.sync()
        self._raise_if_failed()
        return dict(self._ctx.variables)

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Pieces of text as they are appended (all of it, or only variable `var_name`'s)."""
        seen = 0
        events = self._executor.events
        while True:
            self._executor.wait(lambda: len(events) > seen)
            with self._run.cond:
                batch, seen = events[seen:], len(events)
            if not batch:
                self._raise_if_failed()
                return
            for piece, var in batch:
                if piece is None:
                    if var_name is not None and var == var_name:
                        return
                elif piece and (var_name is None or var == var_name):
                    yield piece

    # -- fork / join --------------------------------------------------------------------------

    def fork(self, n: int) -> ForkGroup:
        """`n` branches sharing one prefill-only request for the text so far; n is at most
        Limits().max_branches (256), as a program sent to a server with default limits."""
        check_fork_size(n, Limits().max_branches)
        self.sync()
        self._raise_if_failed()
        branches = fork_contexts(self._ctx, n)
        return ForkGroup(self, [ProgramState(ctx, self._run) for ctx in branches])

    def join(self, forks: ForkGroup, mode: str = "gather_variable") -> None:
        """Wait for the branches; set each variable they set as a list on this state."""
        check_join_mode(mode)
        for branch in forks:
            branch.sync()
            branch._raise_if_failed()
        self.sync()
        self._raise_if_failed()
        gather(self._ctx, [branch._ctx for branch in forks])

    def __repr__(self) -> str:
        return f"ProgramState(text={self._ctx.text[-60:]!r}, variables={sorted(self._ctx.variables)})"
