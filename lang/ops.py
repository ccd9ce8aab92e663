"""What each IR op does to a ProgramContext. Local states and the interpreter both run ops through here."""
from __future__ import annotations

import functools
import uuid
from typing import Any, Callable

import msgspec

from radixflow.lang import ir, params
from radixflow.lang.backend import check_finished
from radixflow.lang.context import ProgramContext
from radixflow.lang.fork import BRANCHES, fork_contexts, gather
from radixflow.lang.select_scoring import run_select


def run_ops(ctx: ProgramContext, ops: list[ir.Op]) -> None:
    for op in ops:
        ctx.budget.check_deadline()
        _HANDLERS[type(op)](ctx, op)


def lookup(ctx: ProgramContext, ref: ir.VarRef) -> Any:
    """The value `ref` names; an unset variable or argument, or an index out of range, raises ValueError.

    A fork's branch index is in [0, n) (a branch has one name); a list's element index in
    [-len, len), as in Python. validate_ir checks what it can before the run; this checks the rest.
    """
    if ref.source == "arg":
        if ref.name not in ctx.arguments:
            raise ValueError(f"argument {ref.name!r} was not given")
        return ctx.arguments[ref.name]
    scope = ctx.variables
    if ref.fork is not None and ctx.branch != (ref.fork, ref.index):
        if ref.fork not in ctx.forks:
            raise ValueError(f"variable {ref.name!r} of fork {ref.fork!r}: that fork has not run here")
        branches = ctx.forks[ref.fork]
        if ref.index is None or not 0 <= ref.index < len(branches):
            raise ValueError(fork_index_message(ref, len(branches)))
        scope = branches[ref.index].variables
    if ref.name not in scope:
        raise ValueError(f"variable {ref.name!r} is not set")
    value = scope[ref.name]
    if ref.fork is None and ref.index is not None:
        if not isinstance(value, list) or not -len(value) <= ref.index < len(value):
            raise ValueError(f"variable {ref.name!r} has no element {ref.index}")
        value = value[ref.index]
    return value


def fork_index_message(ref: ir.VarRef, n: int) -> str:
    got = "none" if ref.index is None else str(ref.index)
    return f"variable {ref.name!r} of fork {ref.fork!r} needs an index in [0, {n}) (the branch), got {got}"


def _text(ctx: ProgramContext, op: ir.Text) -> None:
    ctx.append(op.text)


def _role_begin(ctx: ProgramContext, op: ir.RoleBegin) -> None:
    if ctx.role is not None:
        raise ValueError(f"cannot open a {op.role!r} turn inside the open {ctx.role!r} turn")
    markers = ctx.markers()
    begin, _ = markers.pair(op.role)
    if not ctx.text:
        opening = markers.bos + (markers.default_system if op.role != "system" else "")
        if opening:
            ctx.append(opening)
    ctx.append(begin)
    ctx.role, ctx.role_start = op.role, len(ctx.text)


def _role_end(ctx: ProgramContext, op: ir.RoleEnd) -> None:
    if ctx.role != op.role:
        raise ValueError(f"cannot close a {op.role!r} turn: the open turn is {ctx.role!r}")
    ctx.messages.append({"role": op.role, "content": ctx.text[ctx.role_start:]})
    ctx.append(ctx.markers().pair(op.role)[1])
    ctx.role = None


def _gen_body(ctx: ProgramContext, op: ir.Gen) -> dict:
    sampling = {**ctx.default_params, **op.params}
    if ctx.role == "assistant":
        end = ctx.markers().stop_string("assistant")
        if end is not None:
            stop = sampling.get("stop") or []
            stop = [stop] if isinstance(stop, str) else list(stop)
            sampling["stop"] = stop if end in stop else [*stop, end]
    return {"text": ctx.text, "sampling_params": sampling, **op.extras}


def _gen(ctx: ProgramContext, op: ir.Gen) -> None:
    body = _gen_body(ctx, op)
    try:  # the engine's own checks (token ids against the vocabulary, grammars) name the gen too
        if ctx.stream:
            text, meta = _gen_stream(ctx, body, op.name, op.reasoning)
        else:
            response = _generate(ctx, body)
    except ValueError as exc:
        raise ValueError(f"gen {op.name!r}: {exc}") from exc
    if not ctx.stream:
        check_finished(response, f"gen {op.name!r}")
        text, meta = response["text"], response.get("meta_info")
    reasoning = None
    if op.reasoning is not None:
        from radixflow.runtime.text.reasoning import split_reasoning  # pure text: no torch

        reasoning, text = split_reasoning(text, op.reasoning)
    if not ctx.stream:
        ctx.append(text, op.name)
    if op.name is not None:
        ctx.set_var(op.name, params.convert(text, op.dtype), meta)
        if op.reasoning is not None:
            ctx.set_var(op.name + ir.REASONING_SUFFIX, reasoning or "")


def _generate(ctx: ProgramContext, body: dict) -> dict:
    """One non-streamed gen. A backend that can `abort(rid)` gets a request id with it, under
    which the program's stop (its body failed) aborts it."""
    abort = getattr(ctx.backend, "abort", None)
    if abort is None:
        return ctx.backend.generate(body)
    body = {**body, "rid": body.get("rid") or uuid.uuid4().hex}
    with ctx.stopped.tracking(body["rid"], abort):
        return ctx.backend.generate(body)


def _gen_stream(ctx: ProgramContext, body: dict, name: str | None, reasoning: str | None) -> tuple[str, Any]:
    """Append each chunk's new text as it arrives (with a `reasoning` format, the answer's only);
    chunks carry the cumulative completion. Returns the whole output, as written.

    Once `ctx.stopped` is set (the program's body failed) the stream is closed, which aborts the
    request in every backend, instead of generating on to max_new_tokens for nobody.
    """
    text, meta = "", None
    shown = _answer_only(reasoning)
    chunks = ctx.backend.generate_stream({**body, "stream": True})
    try:
        for chunk in chunks:
            if ctx.stopped.is_set():
                raise RuntimeError(f"gen {name!r} stopped: the program's body failed")
            cumulative = chunk["text"]
            if len(cumulative) > len(text):
                for piece in shown(cumulative[len(text):], False):
                    ctx.append(piece, name)
                text = cumulative
            meta = chunk.get("meta_info", meta)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    check_finished({"meta_info": meta}, f"gen {name!r}")
    for piece in shown("", True):
        ctx.append(piece, name)
    return text, meta


def _answer_only(reasoning: str | None) -> Callable[[str, bool], list[str]]:
    """piece, last → the text of it to show: all of it, or with a reasoning format the answer's
    (held back while it may still be a tag)."""
    if reasoning is None:
        return lambda piece, last: [piece] if piece else []
    from radixflow.runtime.text.reasoning import reasoning_parser  # pure text: no torch

    parser = reasoning_parser(reasoning)

    def shown(piece: str, last: bool) -> list[str]:
        events = parser.feed(piece) + (parser.finish() if last else [])
        return [e for e in events if isinstance(e, str)]
    return shown


def _select(ctx: ProgramContext, op: ir.Select) -> None:
    choice, meta = run_select(ctx.backend, ctx.text, op.choices, op.method)
    ctx.append(choice, op.name)
    if op.name is not None:
        ctx.set_var(op.name, choice, meta)


def _var(ctx: ProgramContext, op: ir.VarRef) -> None:
    value = lookup(ctx, op)
    if isinstance(value, (list, dict)):
        raise ValueError(f"variable {op.name!r} holds a {type(value).__name__}; pick one element to insert")
    ctx.append(str(value))


def _scope_begin(ctx: ProgramContext, op: ir.ScopeBegin) -> None:
    ctx.scopes.append((op.name, len(ctx.text)))


def _scope_end(ctx: ProgramContext, op: ir.ScopeEnd) -> None:
    if not ctx.scopes or ctx.scopes[-1][0] != op.name:
        raise ValueError(f"var_scope {op.name!r} ends but was not the innermost open scope")
    _, start = ctx.scopes.pop()
    ctx.set_var(op.name, ctx.text[start:])


def _if(ctx: ProgramContext, op: ir.If) -> None:
    run_ops(ctx, op.then if lookup(ctx, op.ref) == op.equals else op.else_)


def _fork(ctx: ProgramContext, op: ir.Fork) -> None:
    branches = fork_contexts(ctx, op.n, op.id)
    programs = op.branches or [with_fork_index(op.body, i) for i in range(op.n)]
    BRANCHES.run_all([functools.partial(run_ops, b, p) for b, p in zip(branches, programs)])
    ctx.forks[op.id] = branches


def _join(ctx: ProgramContext, op: ir.Join) -> None:
    if op.fork not in ctx.forks:
        raise ValueError(f"join of fork {op.fork!r}, which has not run here")
    gather(ctx, ctx.forks[op.fork])


def with_fork_index(ops: list[ir.Op], index: int) -> list[ir.Op]:
    """`ops` with "{fork_index}" in every text replaced by `index` (nested ops too)."""
    out: list[ir.Op] = []
    for op in ops:
        if isinstance(op, ir.Text):
            op = ir.Text(op.text.replace("{fork_index}", str(index)))
        elif isinstance(op, ir.If):
            op = msgspec.structs.replace(op, then=with_fork_index(op.then, index),
                                         else_=with_fork_index(op.else_, index))
        out.append(op)
    return out


_HANDLERS: dict[type, Callable[[ProgramContext, Any], None]] = {
    ir.Text: _text, ir.RoleBegin: _role_begin, ir.RoleEnd: _role_end, ir.Gen: _gen,
    ir.Select: _select, ir.VarRef: _var, ir.ScopeBegin: _scope_begin, ir.ScopeEnd: _scope_end,
    ir.If: _if, ir.Fork: _fork, ir.Join: _join,
}
