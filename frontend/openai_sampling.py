"""OpenAI request fields → the engine's SamplingParams (one mapping, used by both endpoints)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

from radixflow.frontend.errors import APIError, bad_request
from radixflow.frontend.openai_schemas import (
    SHARED_SAMPLING_FIELDS, STRUCTURED_OUTPUTS, VLLM_CONSTRAINTS, ResponseFormat,
)
from radixflow.runtime.sampling_params import SamplingParams

# engine name → OpenAI name, for error messages
RENAMED = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_CONSTRAINTS = ("regex", "json_schema", "choices", "ebnf")  # the engine's; set from one Constraint


@dataclass(frozen=True)
class Constraint:
    """A grammar a route adds to a request (chat: tool_choice "required" or a named function):
    engine params, and the field that errors about it name."""

    params: dict[str, Any]
    param: str


def response_format_params(fmt: ResponseFormat | None, engine: Any) -> dict[str, Any]:
    """`response_format` as engine constraints: json_object → json_schema {"type": "object"},
    json_schema → its schema, structural_tag → structural_tag {structures, triggers}. 400 while the
    engine has no constrained decoding."""
    if fmt is not None and fmt.type != "structural_tag" and (fmt.structures, fmt.triggers, fmt.format) != (None,) * 3:
        raise APIError(400, f"response_format {fmt.type!r} takes no structures, triggers or format "
                       "(structural_tag does)", param="response_format")
    if fmt is None or fmt.type == "text":
        return {}
    if not getattr(engine, "supports_grammar", False):
        raise APIError(400, f"response_format {fmt.type!r} is not supported yet "
                       "(constrained decoding is not available in this engine)", param="response_format")
    if fmt.type == "json_object":
        return {"json_schema": {"type": "object"}}
    if fmt.type == "structural_tag":
        return {"structural_tag": _structural_tag(fmt)}
    if fmt.json_schema is None or fmt.json_schema.schema is None:
        raise APIError(400, "response_format json_schema needs json_schema.schema", param="response_format")
    if not _NAME.fullmatch(fmt.json_schema.name):
        raise APIError(400, "response_format.json_schema.name must be 1-64 of a-z, A-Z, 0-9, _ and -",
                       param="response_format")
    # NOTE: `strict` needs no switch: the schema is always enforced by the grammar, token by
    # token, so output is schema-valid with strict true or false.
    return {"json_schema": fmt.json_schema.schema}


def _structural_tag(fmt: ResponseFormat) -> dict[str, Any]:
    """The engine's structural_tag of a response_format of that type (its contents are checked
    where the grammar compiles)."""
    if fmt.format is not None:
        raise APIError(400, "response_format structural_tag: only the structures / triggers form is supported, "
                       "not format", param="response_format")
    if fmt.structures is None or fmt.triggers is None:
        raise APIError(400, "response_format structural_tag needs structures and triggers", param="response_format")
    return {"structures": [msgspec.structs.asdict(s) for s in fmt.structures], "triggers": fmt.triggers}


def constraint_fields(req: Any) -> list[str]:
    """The fields of `req` that constrain its output, as the client named them: response_format,
    the engine's own names (regex, json_schema, ebnf), vLLM's guided_<name> and
    structured_outputs.<name>."""
    given = ["response_format"] if req.response_format is not None and req.response_format.type != "text" else []
    given += [name for name in ("regex", "json_schema", "ebnf") if getattr(req, name) is not None]
    given += [f"guided_{name}" for name in VLLM_CONSTRAINTS if getattr(req, f"guided_{name}") is not None]
    outputs = req.structured_outputs
    if outputs is not None:
        given += [f"structured_outputs.{name}" for name in (*STRUCTURED_OUTPUTS, "json_object")
                  if getattr(outputs, name) not in (None, False)]
    return given


def request_constraint(req: Any, engine: Any) -> Constraint | None:
    """The request's own constraint, in the engine's terms; 400 when it gives two (one would
    silently replace the other) or an empty `structured_outputs`."""
    fields = constraint_fields(req)
    if req.structured_outputs is not None and not any(f.startswith("structured_outputs.") for f in fields):
        raise APIError(400, "structured_outputs needs one of json, regex, choice, grammar, structural_tag, "
                       "json_object",
                       param="structured_outputs")
    if len(fields) > 1:
        raise APIError(400, f"{', '.join(fields[:-1])} and {fields[-1]} each constrain the output; give one "
                       "of them", param=fields[0])
    if not fields:
        return None
    field = fields[0]
    if field == "response_format":
        return Constraint(response_format_params(req.response_format, engine), field)
    if not getattr(engine, "supports_grammar", False):
        raise APIError(400, f"{field} needs constrained decoding, which this engine does not have", param=field)
    if field.startswith("structured_outputs."):
        name = field.split(".", 1)[1]
        if name == "json_object":
            return Constraint({"json_schema": {"type": "object"}}, field)
        return Constraint({STRUCTURED_OUTPUTS[name]: getattr(req.structured_outputs, name)}, field)
    if field.startswith("guided_"):
        name = field[len("guided_"):]
        return Constraint({VLLM_CONSTRAINTS[name]: getattr(req, field)}, field)
    return Constraint({field: getattr(req, field)}, field)


def _check_openai_ranges(req: Any) -> None:
    """Limits OpenAI documents that are tighter than the engine's own."""
    if req.temperature is not None and req.temperature > 2.0:
        raise APIError(400, "temperature must be in [0, 2]", param="temperature")
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")


def client_names(max_tokens_param: str, prompt_param: str, constraint: Constraint | None) -> dict[str, str]:
    """Engine names → the fields this request used, for bad_request: the max_tokens field the
    client sent (`max_tokens_param`), the route's prompt field, and the field of the constraint
    a grammar error is about (the route's, else the request's own: see request_constraint)."""
    names = {**RENAMED, "max_new_tokens": max_tokens_param, "prompt": prompt_param}
    if constraint is not None:
        names.update(dict.fromkeys(("json_schema", "regex", "choices", "ebnf", "structural_tag", "grammar"),
                                   constraint.param))
    return names


def sampling_params(req: Any, max_tokens: int | None, limits: Any = None,
                    names: dict[str, str] | None = None, constraint: Constraint | None = None) -> SamplingParams:
    """Build and validate the engine's parameters; out-of-range values → 400 naming the field
    as the client did (`names`: see client_names; RENAMED by default).
    `max_tokens` None leaves the engine's default (the route then fits it to the context).
    `constraint`: the route's grammar, or the request's own (request_constraint); the only one."""
    _check_openai_ranges(req)
    params = {name: getattr(req, name) for name in SHARED_SAMPLING_FIELDS if name not in _CONSTRAINTS}
    params["max_new_tokens"] = max_tokens
    params["min_new_tokens"] = req.min_tokens
    if constraint is not None:
        params.update(constraint.params)
    if limits is not None:
        limits.check_sampling(params, names or RENAMED)
    try:
        return SamplingParams.from_dict(params)  # None values mean "the engine's default"
    except ValueError as exc:
        raise bad_request(exc, names or RENAMED) from exc


