"""Test-only fault injection: make a chosen step point raise for chosen requests or steps.

The step runner calls `check(point, reqs, step)` at each point (the requests being handled);
the default `NO_FAULTS` does nothing, so serving pays one method call and nothing else. Points:

    forward      the model forward of a whole step (a step-level fault by nature)
    sampler      sampling of the step's rows
    grammar      a constrained request's mask and grammar advance
    detokenizer  appending a sampled token (detokenize, stop checks) for a request
"""
from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

POINTS = ("forward", "sampler", "grammar", "detokenizer")


class InjectedFault(RuntimeError):
    """The error an injected fault raises unless told otherwise."""


@dataclass
class Fault:
    """Raise `exc` at `point` for a request in `rids` (None: any request), on steps numbered
    `after_step` or later, with `probability`, at most `times` times (None: always).

    `step_level`: at a per-request point (sampler, grammar, detokenizer) raise in the step's
    batch-wide handling, outside the per-request isolation (an error no request owns); else the
    fault belongs to its requests and fires wherever one of them is handled.
    """

    point: str
    rids: Iterable[str] | None = None
    after_step: int = 0
    probability: float = 1.0
    times: int | None = None
    exc: type[BaseException] = InjectedFault
    step_level: bool = False
    fired: int = field(default=0, init=False)
    fired_for: set[str] = field(default_factory=set, init=False)  # requests whose step or part it failed

    def __post_init__(self) -> None:
        if self.point not in POINTS:
            raise ValueError(f"fault point {self.point!r} is not one of {', '.join(POINTS)}")
        self.rids = None if self.rids is None else frozenset(self.rids)


class FaultInjector:
    """A set of faults, consulted by the step runner. Engine thread only."""

    def __init__(self, faults: list[Fault], seed: int = 0) -> None:
        self.faults = faults
        self._rng = random.Random(seed)

    def check(self, point: str, reqs: Sequence[Any], step: int, step_level: bool = False) -> None:
        """Raise if a fault for `point` matches one of `reqs` (the requests being handled) at
        `step`. `step_level`: the call site is the batch-wide handling outside isolation."""
        for f in self.faults:
            if f.point != point or step < f.after_step or (f.times is not None and f.fired >= f.times):
                continue
            if point != "forward" and f.step_level != step_level:
                continue
            hit = [r.rid for r in reqs if f.rids is None or r.rid in f.rids]
            if hit and self._rng.random() < f.probability:
                f.fired += 1
                # A step-level fault fails the whole step: every request of it, not only `rids`.
                whole_step = point == "forward" or step_level
                f.fired_for.update([r.rid for r in reqs] if whole_step else hit)
                raise f.exc(f"injected {point} fault (step {step}, requests {hit[:4]})")


class NoFaults:
    """The null injector of normal serving."""

    def check(self, point: str, reqs: Sequence[Any], step: int, step_level: bool = False) -> None:
        return None


NO_FAULTS = NoFaults()
