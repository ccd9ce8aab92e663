"""The program IR: msgspec Structs, pure data. A program is a list of ops; the server runs it, never user code.

Ops are tagged by the `op` field on the wire (`{"op": "gen", "name": "x", ...}`):

  text         append literal text
  role_begin   open a chat turn (system/user/assistant): appends the template's begin marker
  role_end     close it: appends the end marker, records a message
  gen          one generation request whose prompt is the text so far
  select       pick one of `choices` by scored logprobs (see select_scoring.py)
  var          append the value of a variable (`source="var"`) or a program argument (`source="arg"`)
  scope_begin  start capturing appended text ...
  scope_end    ... and store it as a variable
  if           run `then` or `else` depending on a variable (or argument) equal to a literal
  fork         copy the state into `n` branches (one shared prefill), run each branch's ops in parallel
  join         gather the variables the branches of a fork set, as lists, onto the parent
"""
from __future__ import annotations

from typing import Any, Literal

import msgspec


class _Op(msgspec.Struct, tag_field="op", forbid_unknown_fields=True, omit_defaults=True):
    pass


class Text(_Op, tag="text"):
    text: str


class RoleBegin(_Op, tag="role_begin"):
    role: str


class RoleEnd(_Op, tag="role_end"):
    role: str


REASONING_SUFFIX = "_reasoning_content"  # a gen's reasoning variable: its name + this (SGLang's)


class Gen(_Op, tag="gen"):
    """`params`: native `sampling_params` keys. `extras`: top-level request keys (return_logprob, ...).
    `dtype` ("int", "float", "str", "bool"): `params["regex"]` already constrains the text; the
    stored value is converted. `reasoning`: a reasoning format (runtime/text/reasoning.py): the
    output's block is split off (separate_reasoning), stored as `<name>_reasoning_content`."""

    name: str | None = None
    params: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    dtype: Literal["int", "float", "str", "bool"] | None = None
    reasoning: str | None = None


class Select(_Op, tag="select"):
    name: str | None
    choices: list[str]
    method: str = "token_length_normalized"


class VarRef(_Op, tag="var"):
    """A value: a variable (`source="var"`) or a program argument (`source="arg"`).

    With `fork` set, `name` is read from branch `index` of that fork (required, in [0, n)).
    Without `fork`, `index` picks one element of a list variable (the gathered result of a
    join). Indexes count from 0; negative ones are refused (a branch has one name).
    """

    name: str
    source: Literal["var", "arg"] = "var"
    fork: str | None = None
    index: int | None = None


class ScopeBegin(_Op, tag="scope_begin"):
    name: str


class ScopeEnd(_Op, tag="scope_end"):
    name: str


class If(_Op, tag="if", rename={"else_": "else"}):
    ref: VarRef
    equals: str | int | float | bool
    then: list[Op] = []
    else_: list[Op] = []


class Fork(_Op, tag="fork"):
    """Give exactly one of `branches` (one op list per branch, `len == n`) or `body` (run by
    every branch, with "{fork_index}" in its text replaced by the branch number)."""

    id: str
    n: int
    branches: list[list[Op]] = []
    body: list[Op] = []


class Join(_Op, tag="join"):
    fork: str


Op = Text | RoleBegin | RoleEnd | Gen | Select | VarRef | ScopeBegin | ScopeEnd | If | Fork | Join


class Program(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """`arguments`: names the caller fills at run time; `defaults`: values for those left out."""

    ops: list[Op]
    arguments: list[str] = []
    defaults: dict[str, str] = {}
    version: Literal[1] = 1  # the IR's format; a program of another version is refused, not guessed at


def encode_program(program: Program) -> bytes:
    return msgspec.json.encode(program)


def decode_program(data: bytes | str | dict | Program) -> Program:
    """A Program from JSON bytes/str or a decoded JSON object; malformed input → ValueError."""
    if isinstance(data, Program):
        return data
    try:
        if isinstance(data, dict):
            return msgspec.convert(data, Program)
        return msgspec.json.decode(data, type=Program)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(f"malformed program: {exc}") from exc
    except RecursionError as exc:
        raise ValueError("malformed program: nested too deeply") from exc


def walk(ops: list[Op]):
    """(op, depth) for every op, depth first, including those nested in `if` and `fork`.

    Iterative, so a hostile deeply nested program cannot exhaust the Python stack.
    """
    stack: list[tuple[Op, int]] = [(op, 0) for op in reversed(ops)]
    while stack:
        op, depth = stack.pop()
        yield op, depth
        nested: list[Op] = []
        if isinstance(op, If):
            nested = [*op.then, *op.else_]
        elif isinstance(op, Fork):
            nested = [op for branch in op.branches for op in branch] + list(op.body)
        stack.extend((child, depth + 1) for child in reversed(nested))
