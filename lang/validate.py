"""validate_ir: reject programs that are malformed or bigger than the server's limits, before running any op."""
from __future__ import annotations

from dataclasses import dataclass, field

from radixflow.lang import ir, ops, params
from radixflow.lang.primitives import reasoning_format
from radixflow.lang.select_scoring import method_name


def _limit(default: float | int, help_text: str) -> int:
    return field(default=default, metadata={"help": help_text})  # type: ignore[return-value]


@dataclass(frozen=True)
class Limits:
    """What one program submitted over HTTP may do. The server's flags are derived from these
    fields (`--program-max-ops` ...); every violation is a ValueError naming the limit."""

    max_ops: int = _limit(2000, "ops in a program, nested ones included")
    max_branches: int = _limit(256, "fork branches over a whole run (a fork inside a fork multiplies)")
    max_total_new_tokens: int = _limit(262_144, "tokens a run may generate in total: max_new_tokens of "
                                       "every gen, plus one per select choice")
    max_requests: int = _limit(4096, "engine requests a run may make (gens, select choices, fork prefills)")
    max_choices: int = _limit(1024, "choices of one select")
    max_depth: int = _limit(8, "nesting of if/fork")
    max_text_chars: int = _limit(4_000_000, "characters a run may hold: its text, every fork's copy "
                                 "and every variable, counted as they grow")
    deadline_s: float = _limit(300.0, "wall-clock seconds a run may take; then it is stopped (504)")
    max_concurrent: int = _limit(64, "programs running at once; more get 429")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass
class _Cost:
    tokens: int = 0
    branches: int = 0
    requests: int = 0

    def add(self, other: _Cost, times: int = 1) -> None:
        self.tokens += times * other.tokens
        self.branches += times * other.branches
        self.requests += times * other.requests


def _gen_cost(op: ir.Gen) -> _Cost:
    """One request (n > 1 is refused by _check_ops) of the max_new_tokens it will run with: the
    converted value ("2047" and 2047.0 are 2047), the default when null or absent."""
    return _Cost(tokens=params.check_params(op.params).max_new_tokens, requests=1)


def _cost(ops: list[ir.Op], limits: Limits) -> _Cost:
    """Worst-case cost of running `ops` once."""
    total = _Cost()
    for op in ops:
        if isinstance(op, ir.Gen):
            total.add(_gen_cost(op))
        elif isinstance(op, ir.Select):
            total.add(_Cost(tokens=len(op.choices), requests=len(op.choices) + 2))
        elif isinstance(op, ir.If):
            costs = [_cost(op.then, limits), _cost(op.else_, limits)]
            total.add(_Cost(max(c.tokens for c in costs), max(c.branches for c in costs),
                            max(c.requests for c in costs)))
        elif isinstance(op, ir.Fork):
            total.add(_fork_cost(op, limits))
        _check(total.branches <= limits.max_branches,
               f"program forks over {limits.max_branches} branches (limit max_branches)")
    return total


def _fork_cost(op: ir.Fork, limits: Limits) -> _Cost:
    _check(1 <= op.n <= limits.max_branches,
           f"fork {op.id!r}: n={op.n} must be in [1, {limits.max_branches}] (limit max_branches)")
    _check(not (op.branches and op.body), f"fork {op.id!r}: give branches or body, not both")
    _check(not op.branches or len(op.branches) == op.n,
           f"fork {op.id!r}: {len(op.branches)} branches for n={op.n}")
    cost = _Cost(branches=op.n, requests=1)  # the shared prefill
    if op.branches:
        for branch in op.branches:
            cost.add(_cost(branch, limits))
    else:
        cost.add(_cost(op.body, limits), times=op.n)
    return cost


def _check_ops(program: ir.Program, limits: Limits) -> None:
    """Per-op checks: known sampling keys and choices methods, forks and joins that match."""
    fields = set(params.sampling_fields())
    fork_sizes: dict[str, int] = {}  # fork id → n (ids are unique in a program)
    for op, _ in ir.walk(program.ops):
        if isinstance(op, ir.Gen):
            unknown = set(op.params) - fields
            _check(not unknown, f"gen {op.name!r}: unknown sampling_params {sorted(unknown)}")
            _check_gen_values(op)
            n = op.params.get("n")
            _check(n in (None, 1), f"gen {op.name!r}: n={n} is not supported in a program (its text holds one "
                   "completion); use a fork of n branches")
            bad = set(op.extras) - set(params.request_keys())
            _check(not bad, f"gen {op.name!r}: unknown request keys {sorted(bad)}")
            choices = op.params.get("choices") or []
            _check(len(choices) <= limits.max_choices,
                   f"gen {op.name!r}: {len(choices)} choices; the limit max_choices is {limits.max_choices}")
        elif isinstance(op, ir.Select):
            _check(bool(op.choices) and all(op.choices), f"select {op.name!r}: choices must be non-empty strings")
            _check(len(op.choices) <= limits.max_choices,
                   f"select {op.name!r}: {len(op.choices)} choices; the limit max_choices is {limits.max_choices}")
            method_name(op.method)
        elif isinstance(op, ir.Fork):
            _check(op.id not in fork_sizes, f"fork id {op.id!r} is used twice")
            fork_sizes[op.id] = op.n
    for op, _ in ir.walk(program.ops):
        if isinstance(op, ir.Join):
            _check(op.fork in fork_sizes, f"join of unknown fork {op.fork!r}")
        ref = op.ref if isinstance(op, ir.If) else op
        if isinstance(ref, ir.VarRef):
            _check_ref(ref, program, fork_sizes)


def _check_gen_values(op: ir.Gen) -> None:
    """The gen's sampling values and reasoning format, as the engine will check them; the
    ValueError names the gen."""
    try:
        params.check_params(op.params)
        if op.reasoning is not None:
            reasoning_format(op.reasoning)
    except ValueError as exc:
        raise ValueError(f"gen {op.name!r}: {exc}") from None


def _check_ref(ref: ir.VarRef, program: ir.Program, fork_sizes: dict[str, int]) -> None:
    """A declared argument; a fork that exists, read at a branch index in [0, n). (A list
    element's index, negative ones counting from the end as in Python, is checked at run time.)"""
    _check(ref.source == "var" or ref.name in program.arguments, f"argument {ref.name!r} is used but not declared")
    if ref.fork is None:
        return
    _check(ref.fork in fork_sizes, f"variable {ref.name!r} of unknown fork {ref.fork!r}")
    n = fork_sizes[ref.fork]
    _check(ref.index is not None and 0 <= ref.index < n, ops.fork_index_message(ref, n))


def validate_ir(program: ir.Program, limits: Limits | None = None) -> None:
    """Raise ValueError naming the bound or the op that a program breaks."""
    limits = limits or Limits()
    num_ops = depth = 0
    for _, d in ir.walk(program.ops):
        num_ops, depth = num_ops + 1, max(depth, d)
        _check(num_ops <= limits.max_ops, f"program has more than {limits.max_ops} ops (limit max_ops)")
    _check(depth <= limits.max_depth, f"program nests if/fork {depth} deep; the limit max_depth is {limits.max_depth}")
    _check_ops(program, limits)
    cost = _cost(program.ops, limits)
    _check(cost.tokens <= limits.max_total_new_tokens,
           f"program may generate {cost.tokens} tokens in total; the limit max_total_new_tokens is "
           f"{limits.max_total_new_tokens}")
    _check(cost.requests <= limits.max_requests,
           f"program may make {cost.requests} engine requests; the limit max_requests is {limits.max_requests}")
