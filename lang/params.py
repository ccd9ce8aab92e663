"""gen() keyword arguments → native request fields, derived from the runtime's SamplingParams declaration.

The sampling parameter names are declared once, in `radixflow.runtime.sampling_params`; this module
only adds SGLang's frontend spellings (`max_tokens`) and the top-level logprob request keys. The
runtime module is imported inside the functions, never at import time (it is light: msgspec only).
"""
from __future__ import annotations

import json
from typing import Any

# SGLang frontend spelling → native sampling_params name.
ALIASES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens", "lora": "lora_path"}


# dtype → (regex the output must match, conversion of the matched text)
DTYPES: dict[str, tuple[str, Any]] = {
    "int": (r"[-+]?[0-9]+", int),
    "float": (r"[-+]?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?", float),
    "str": (r'"[^"\n]*"', lambda text: text[1:-1]),
    "bool": (r"(True|False)", lambda text: text == "True"),
}


def sampling_fields() -> tuple[str, ...]:
    from radixflow.runtime.sampling_params import SamplingParams

    return SamplingParams.__struct_fields__


def request_keys() -> tuple[str, ...]:
    """Keys that live at the top level of a /generate body, not inside sampling_params
    (declared once, as RequestOptions)."""
    from radixflow.runtime.sampling_params import request_option_names

    return request_option_names()


def split_kwargs(kwargs: dict[str, Any], caller: str = "gen") -> tuple[dict[str, Any], dict[str, Any]]:
    """Split keyword arguments into (sampling_params, top-level request keys); None means unset.

    Unknown names raise TypeError listing the accepted ones; values are checked by SamplingParams.
    """
    fields, request = sampling_fields(), request_keys()
    params: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for key, value in kwargs.items():
        if value is None:
            continue
        name = ALIASES.get(key, key)
        if name in request:
            extras[name] = value
        elif name in fields:
            params[name] = value
        else:
            accepted = ", ".join(sorted({*fields, *ALIASES, *request}))
            raise TypeError(f"{caller}() got an unexpected keyword argument {key!r}; accepted: {accepted}")
    if isinstance(params.get("json_schema"), dict):
        params["json_schema"] = json.dumps(params["json_schema"])
    if params.get("n", 1) != 1:
        raise ValueError(f"{caller}(n=...) is not supported: use s.fork(n) for several samples")
    check_params(params)
    return params, extras


def check_params(params: dict[str, Any]) -> Any:
    """The SamplingParams the engine will run `params` as (values converted as the whole API
    converts them: "4" is 4); ValueError (the runtime's own validation) when one is out of range."""
    from radixflow.runtime.sampling_params import SamplingParams

    return SamplingParams.from_dict(params)


def dtype_name(dtype: Any) -> str | None:
    """`int`, `"int"`, ... → "int"; None stays None."""
    if dtype is None:
        return None
    name = dtype.__name__ if isinstance(dtype, type) else dtype
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of int, float, str, bool; got {dtype!r}")
    return name


def convert(text: str, dtype: str | None) -> Any:
    """The stored value of a gen: its text, or the text converted per `dtype`."""
    if dtype is None:
        return text
    try:
        return DTYPES[dtype][1](text.strip())
    except ValueError as exc:
        raise ValueError(f"generated text {text!r} is not a valid {dtype}") from exc
