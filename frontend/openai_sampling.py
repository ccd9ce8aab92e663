"""OpenAI request fields → the engine's SamplingParams (one mapping, used by both endpoints)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from radixflow.frontend.errors import APIError, bad_request
from radixflow.frontend.openai_schemas import SHARED_SAMPLING_FIELDS, ResponseFormat
from radixflow.runtime.sampling_params import SamplingParams

# engine name → OpenAI name, for error messages
RENAMED = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


@dataclass(frozen=True)
class Constraint:
    """A grammar a route adds to a request (chat: tool_choice "required" or a named function):
    engine params, and the field that errors about it name."""

    params: dict[str, Any]
    param: str


def response_format_params(fmt: ResponseFormat | None, engine: Any) -> dict[str, Any]:
    """`response_format` as engine constraints: json_object → json_schema {"type": "object"},
    json_schema → its schema. 400 while the engine has no constrained decoding."""
    if fmt is None or fmt.type == "text":
        return {}
    if not getattr(engine, "supports_grammar", False):
        raise APIError(400, f"response_format {fmt.type!r} is not supported yet "
                       "(constrained decoding is not available in this engine)", param="response_format")
    if fmt.type == "json_object":
        return {"json_schema": {"type": "object"}}
    if fmt.json_schema is None or fmt.json_schema.schema is None:
        raise APIError(400, "response_format json_schema needs json_schema.schema", param="response_format")
    if not _NAME.fullmatch(fmt.json_schema.name):
        raise APIError(400, "response_format.json_schema.name must be 1-64 of a-z, A-Z, 0-9, _ and -",
                       param="response_format")
    # NOTE: `strict` needs no switch: the schema is always enforced by the grammar, token by
    # token, so output is schema-valid with strict true or false.
    return {"json_schema": fmt.json_schema.schema}


def _format_constraint(req: Any, engine: Any) -> dict[str, Any]:
    """response_format's constraint; 400 when the request also gives its own regex or json_schema
    (one would silently replace the other)."""
    constraint = response_format_params(req.response_format, engine)
    clash = [name for name in ("regex", "json_schema") if constraint and getattr(req, name) is not None]
    if clash:
        raise APIError(400, f"response_format and {clash[0]} both constrain the output; give one of them",
                       param="response_format")
    return constraint


def _check_openai_ranges(req: Any) -> None:
    """Limits OpenAI documents that are tighter than the engine's own."""
    if req.temperature is not None and req.temperature > 2.0:
        raise APIError(400, "temperature must be in [0, 2]", param="temperature")
    if req.logit_bias:
        raise APIError(400, "logit_bias is not supported", param="logit_bias")
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")


def client_names(req: Any, max_tokens_param: str, prompt_param: str,
                 constraint: Constraint | None = None) -> dict[str, str]:
    """Engine names → the fields this request used, for bad_request: the max_tokens field the
    client sent (`max_tokens_param`), the route's prompt field, and the constraint a grammar
    error is about (the route's `constraint`, else response_format's when it constrains)."""
    names = {**RENAMED, "max_new_tokens": max_tokens_param, "prompt": prompt_param}
    if constraint is not None:
        names.update(json_schema=constraint.param, regex=constraint.param, grammar=constraint.param)
    elif req.response_format is not None and req.response_format.type != "text":
        names.update(json_schema="response_format", grammar="response_format")
    else:
        names["grammar"] = next((n for n in ("regex", "json_schema") if getattr(req, n) is not None), "grammar")
    return names


def sampling_params(req: Any, engine: Any, max_tokens: int | None, limits: Any = None,
                    names: dict[str, str] | None = None, constraint: Constraint | None = None) -> SamplingParams:
    """Build and validate the engine's parameters; out-of-range values → 400 naming the field
    as the client did (`names`: see client_names; RENAMED by default).
    `max_tokens` None leaves the engine's default (the route then fits it to the context).
    `constraint`: the route's own grammar (it checked that the request gives no other)."""
    _check_openai_ranges(req)
    params = {name: getattr(req, name) for name in SHARED_SAMPLING_FIELDS}
    params["max_new_tokens"] = max_tokens
    params["min_new_tokens"] = req.min_tokens
    params.update(_format_constraint(req, engine) if constraint is None else constraint.params)
    if limits is not None:
        limits.check_sampling(params)
    try:
        return SamplingParams.from_dict(params)  # None values mean "the engine's default"
    except ValueError as exc:
        raise bad_request(exc, names or RENAMED) from exc


