"""fork/join: one shared prefill for the common text, then branches that copy it; join gathers their variables."""
from __future__ import annotations

from typing import Any

from radixflow.lang.context import ProgramContext


def prefill(ctx: ProgramContext) -> None:
    """One prefill-only request for the text so far, so every branch's first request hits the cache."""
    if ctx.text:
        ctx.backend.generate({"text": ctx.text, "sampling_params": {"max_new_tokens": 0}})


def fork_contexts(ctx: ProgramContext, n: int, fork_id: str | None = None) -> list[ProgramContext]:
    """Send the shared prefill once, then return `n` branch copies of `ctx`."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"fork needs a positive number of branches, got {n!r}")
    prefill(ctx)
    return [ctx.child((fork_id, i) if fork_id is not None else None) for i in range(n)]


def gather(parent: ProgramContext, branches: list[ProgramContext]) -> None:
    """Set each variable any branch set since the fork, on `parent`, as a list over the branches
    (None where a branch did not set it); meta info likewise."""
    names: list[str] = []
    for branch in branches:
        names.extend(n for n in branch.set_since_fork if n not in names)
    for name in names:
        metas = [b.meta.get(name) for b in branches]
        parent.set_var(name, [b.variables.get(name) for b in branches],
                       metas if any(m is not None for m in metas) else None)


class ForkGroup(list):
    """The branches of `s.fork(n)`: a list of states, plus `join()` (same as `s.join(forks)`)."""

    def __init__(self, parent: Any, states: list[Any], fork_id: str | None = None) -> None:
        super().__init__(states)
        self.parent = parent
        self.id = fork_id

    def join(self, mode: str = "gather_variable") -> None:
        self.parent.join(self, mode)


def check_join_mode(mode: str) -> None:
    if mode != "gather_variable":
        raise ValueError(f"join mode {mode!r} is not supported; only 'gather_variable'")
