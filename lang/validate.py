"""validate_ir: reject programs that are malformed or bigger than the server's limits, before running any op."""
from __future__ import annotations

from dataclasses import dataclass

from radixflow.lang import ir, params
from radixflow.lang.select_scoring import method_name


@dataclass(frozen=True)
class Limits:
    max_ops: int = 2000  # ops in the program, nested ones included
    max_branches: int = 256  # fork branches over the whole run (a fork inside a fork multiplies)
    max_total_new_tokens: int = 262_144  # sum of max_new_tokens over every gen the run may make
    max_depth: int = 8  # nesting of if/fork


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _cost(ops: list[ir.Op], limits: Limits, default_tokens: int) -> tuple[int, int]:
    """(worst-case new tokens, fork branches) of running `ops` once."""
    tokens = branches = 0
    for op in ops:
        if isinstance(op, ir.Gen):
            tokens += int(op.params.get("max_new_tokens", default_tokens))
        elif isinstance(op, ir.If):
            costs = [_cost(op.then, limits, default_tokens), _cost(op.else_, limits, default_tokens)]
            tokens += max(c[0] for c in costs)
            branches += max(c[1] for c in costs)
        elif isinstance(op, ir.Fork):
            t, b = _fork_cost(op, limits, default_tokens)
            tokens, branches = tokens + t, branches + b
        _check(branches <= limits.max_branches,
               f"program forks over {limits.max_branches} branches (limit max_branches)")
    return tokens, branches


def _fork_cost(op: ir.Fork, limits: Limits, default_tokens: int) -> tuple[int, int]:
    _check(1 <= op.n <= limits.max_branches,
           f"fork {op.id!r}: n={op.n} must be in [1, {limits.max_branches}] (limit max_branches)")
    _check(not (op.branches and op.body), f"fork {op.id!r}: give branches or body, not both")
    _check(not op.branches or len(op.branches) == op.n,
           f"fork {op.id!r}: {len(op.branches)} branches for n={op.n}")
    if op.branches:
        costs = [_cost(p, limits, default_tokens) for p in op.branches]
        return sum(c[0] for c in costs), op.n + sum(c[1] for c in costs)
    tokens, branches = _cost(op.body, limits, default_tokens)
    return op.n * tokens, op.n * (1 + branches)


def _check_ops(program: ir.Program) -> None:
    """Per-op checks: known sampling keys and choices methods, forks and joins that match."""
    fields = set(params.sampling_fields())
    fork_ids: set[str] = set()
    for op, _ in ir.walk(program.ops):
        if isinstance(op, ir.Gen):
            unknown = set(op.params) - fields
            _check(not unknown, f"gen {op.name!r}: unknown sampling_params {sorted(unknown)}")
            params.check_params(op.params)
            bad = set(op.extras) - set(params.REQUEST_KEYS)
            _check(not bad, f"gen {op.name!r}: unknown request keys {sorted(bad)}")
        elif isinstance(op, ir.Select):
            _check(bool(op.choices) and all(op.choices), f"select {op.name!r}: choices must be non-empty strings")
            method_name(op.method)
        elif isinstance(op, ir.Fork):
            _check(op.id not in fork_ids, f"fork id {op.id!r} is used twice")
            fork_ids.add(op.id)
    for op, _ in ir.walk(program.ops):
        if isinstance(op, ir.Join):
            _check(op.fork in fork_ids, f"join of unknown fork {op.fork!r}")
        ref = op.ref if isinstance(op, ir.If) else op
        if isinstance(ref, ir.VarRef):
            _check(ref.source == "var" or ref.name in program.arguments,
                   f"argument {ref.name!r} is used but not declared")
            _check(ref.fork is None or ref.fork in fork_ids, f"variable {ref.name!r} of unknown fork {ref.fork!r}")


def validate_ir(program: ir.Program, limits: Limits | None = None) -> None:
    """Raise ValueError naming the bound or the op that a program breaks."""
    limits = limits or Limits()
    num_ops = depth = 0
    for _, d in ir.walk(program.ops):
        num_ops, depth = num_ops + 1, max(depth, d)
        _check(num_ops <= limits.max_ops, f"program has more than {limits.max_ops} ops (limit max_ops)")
    _check(depth <= limits.max_depth, f"program nests if/fork {depth} deep; the limit max_depth is {limits.max_depth}")
    _check_ops(program)
    tokens, branches = _cost(program.ops, limits, params.default_max_new_tokens())
    _check(tokens <= limits.max_total_new_tokens,
           f"program may generate {tokens} tokens in total; the limit max_total_new_tokens is "
           f"{limits.max_total_new_tokens}")
