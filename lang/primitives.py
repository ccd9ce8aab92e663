"""The generation primitives: gen(), gen_int(), gen_string(), select(), if_() and separate_reasoning()."""
from __future__ import annotations

from typing import Any

import msgspec

from radixflow.lang import ir, params
from radixflow.lang.expr import Condition, Expr, to_expr
from radixflow.lang.select_scoring import ChoicesMethod, method_name, token_length_normalized


_CONSTRAINTS = ("regex", "json_schema", "choices", "ebnf", "structural_tag")  # the sampling keys that constrain


def check_name(name: Any) -> None:
    """A variable name is a str (or None: the output is not stored)."""
    if name is not None and not isinstance(name, str):
        raise ValueError(f"a variable name must be a str or None, got {type(name).__name__} {name!r}")


def gen(name: str | None = None, *, dtype: Any = None, choices_method: ChoicesMethod | str | None = None,
        **kwargs: Any) -> Expr:
    """One generation request whose prompt is the whole text so far; stores the output as `name`.

    Keyword arguments are the runtime's sampling parameters (`max_new_tokens`, `stop`,
    `temperature`, `regex`, `json_schema`, `choices`, `ebnf`, ...; SGLang's `max_tokens`/`min_tokens` work
    too) and the top-level logprob keys (`return_logprob`, `logprob_start_len`, ...).
    `dtype=int|float|str|bool` constrains the output with a regex and stores the converted value.
    `choices=[...]` constrains the output to one of the strings; with `choices_method` it becomes
    a select() instead (scored by logprobs, as in SGLang).
    """
    check_name(name)
    if choices_method is not None:
        if not kwargs.get("choices"):
            raise ValueError("choices_method needs choices=[...]")
        return select(name, kwargs["choices"], choices_method=choices_method)
    sampling, extras = params.split_kwargs(kwargs)
    kind = params.dtype_name(dtype)
    if kind is not None:
        if any(c in sampling for c in _CONSTRAINTS):
            raise ValueError("give dtype or one of regex/json_schema/choices/ebnf/structural_tag, not both")
        sampling["regex"] = params.DTYPES[kind][0]
    return Expr([ir.Gen(name=name, params=sampling, extras=extras, dtype=kind)])


def gen_int(name: str | None = None, **kwargs: Any) -> Expr:
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> Expr:
    return gen(name, dtype=str, **kwargs)


def select(name: str | None = None, choices: list[str] | None = None,
           choices_method: ChoicesMethod | str = token_length_normalized, temperature: float = 0.0) -> Expr:
    """Append the choice the model scores highest (see select_scoring.py); store it as `name`.

    `temperature` is accepted for SGLang compatibility; only 0 (argmax) is supported.
    """
    check_name(name)
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("select() needs a non-empty list of non-empty strings as choices")
    if temperature != 0.0:
        raise ValueError("select() picks the argmax; only temperature=0 is supported")
    return Expr([ir.Select(name=name, choices=list(choices), method=method_name(choices_method))])


def if_(condition: bool | Condition, then: Any = "", else_: Any = "") -> Expr:
    """`then` when the condition holds, else `else_`.

    Run locally, `s["x"] == "a"` is a plain bool and this just picks an expression. Traced,
    it is a Condition and becomes an If op that the interpreter decides at run time.
    """
    then_ops, else_ops = to_expr(then).ops, to_expr(else_).ops
    if isinstance(condition, Condition):
        if condition.negate:
            then_ops, else_ops = else_ops, then_ops
        return Expr([ir.If(ref=condition.ref, equals=condition.equals, then=then_ops, else_=else_ops)])
    if not isinstance(condition, bool):
        raise TypeError(f"if_() needs a comparison like s['x'] == 'value', got {type(condition).__name__}")
    return Expr(then_ops if condition else else_ops)




def reasoning_format(model_type: str) -> str:
    """The reasoning format `model_type` names (ValueError for an unknown one)."""
    from radixflow.runtime.text.reasoning import check_reasoning_parser  # pure text: no torch

    if not isinstance(model_type, str):  # a traced program's argument: its value comes too late
        raise ValueError(f"separate_reasoning's model_type must be a str written in the program, got {model_type!r}")
    return check_reasoning_parser(model_type, "separate_reasoning's model_type")  # type: ignore[return-value]


def separate_reasoning(expr: Any, model_type: str = "deepseek_r1") -> Expr:
    """The gen()s of `expr` with a thinking model's `<think>` block split off, as SGLang's
    separate_reasoning: a gen stores its answer as its variable and its reasoning as
    `<name>_reasoning_content` ("" without a block), and only the answer joins the text (as
    thinking models' templates drop past reasoning). A constrained gen's grammar holds after
    the block (`</think>`, the format's own closing tag). `model_type`: deepseek_r1 or
    qwen3_thinking (the output starts in the block), qwen3 (a block only when the output opens
    with `<think>`), seed_oss, gpt_oss (harmony channels: the gen keeps special tokens); SGLang's
    dashed names too."""
    from radixflow.runtime.text.reasoning import FORMATS  # pure text: no torch

    fmt = reasoning_format(model_type)
    form = FORMATS[fmt]
    out: list[ir.Op] = []
    for op in to_expr(expr).ops:
        if isinstance(op, ir.Select):
            raise ValueError("separate_reasoning takes gen()s: a select's choices are whole answers")
        if isinstance(op, ir.Gen):
            constrained = any(op.params.get(c) is not None for c in _CONSTRAINTS)
            after: dict[str, Any] = {"constrain_after": form.close_tag} if constrained else {}
            if form.harmony:  # gpt-oss's channels are marked by special tokens, which the text must keep
                after["skip_special_tokens"] = op.params.get("skip_special_tokens", False)
            op = msgspec.structs.replace(op, reasoning=fmt, params={**op.params, **after})
        out.append(op)
    if not any(isinstance(op, ir.Gen) for op in out):
        raise ValueError("separate_reasoning needs a gen() to split")
    return Expr(out)
