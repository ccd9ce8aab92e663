"""A chat request's `tools`, `tool_choice` and `parallel_tool_calls`: checked (400s naming the
field), the tools as the chat template gets them, and the constraint of tool_choice "required" or
a named function, compiled like any json_schema (one grammar per distinct tool set, cached).

    none      tools are not shown to the template; the text is plain content
    auto      (the default with tools) the text is parsed for calls in the server's format
              (`--tool-call-parser`, Hermes `<tool_call>` blocks by default; at most one call with
              parallel_tool_calls false)
    required  the output is a JSON array of one or more {"name", "arguments"} calls of the tools
              (exactly one with parallel_tool_calls false)
    named     the output is the named function's arguments object
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from radixflow.frontend.errors import APIError
from radixflow.frontend.openai_schemas import ChatRequest, NamedToolChoice, Tool
from radixflow.frontend.openai_sampling import Constraint, constraint_fields
from radixflow.frontend.tool_call_formats import SPECIAL_TOKEN_FORMATS, auto_parser
from radixflow.frontend.xml_calls import string_parameters
from radixflow.frontend.tool_calls import JsonCallsParser, Parser

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function names
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
_DEFS = ("$defs", "definitions")  # where a schema's "#/$defs/X" / "#/definitions/X" refs point


@dataclass(frozen=True)
class ToolPlan:
    """What the request's tool fields mean for its prompt, its grammar and its response."""

    mode: str  # "none" | "auto" | "required" | "named"
    names: frozenset[str]
    named: str | None = None  # the function of mode "named"
    constraint: Constraint | None = None  # required / named
    call_format: str = "hermes"  # auto: the server's --tool-call-parser
    parallel: bool = True  # auto: parallel_tool_calls not false (else the first call only)
    strings: Mapping[str, frozenset[str]] = field(default_factory=dict)  # auto: string-typed parameters per tool

    @property
    def keeps_special_tokens(self) -> bool:
        """The output's call markers are special tokens the text must keep (Mistral's
        `[TOOL_CALLS]` and `[ARGS]`, DeepSeek's, Kimi's), unless the request says otherwise."""
        return self.mode == "auto" and self.call_format in SPECIAL_TOKEN_FORMATS

    def parser(self) -> Parser | None:
        """A fresh parser for one choice's text; None when the text is plain content."""
        if self.mode == "auto":
            return auto_parser(self.call_format, self.names, self.parallel, self.strings)
        if self.mode in ("required", "named"):
            return JsonCallsParser(self.names, self.named)
        return None


NO_TOOLS = ToolPlan("none", frozenset())


def template_tools(req: ChatRequest) -> list[dict[str, Any]] | None:
    """The tools as transformers hands them to a chat template ({"type": "function", "function":
    {...}} each, unset fields left out); None with tool_choice "none", so the model is not told."""
    if not req.tools or req.tool_choice == "none":
        return None
    return msgspec.to_builtins(req.tools)


def tool_chars(req: ChatRequest) -> int:
    """Characters the tools add to the prompt, for the prompt-size limit."""
    return len(msgspec.json.encode(req.tools)) if req.tools else 0


def tool_plan(req: ChatRequest, limits: Any, supports_grammar: bool, call_format: str = "hermes") -> ToolPlan:
    """Check the tool fields and plan the request; APIError(400) naming the field otherwise.
    `call_format`: how "auto" output is parsed (a tool_call_formats.PARSERS name)."""
    choice = req.tool_choice
    if not req.tools:
        if isinstance(choice, NamedToolChoice) or choice == "required":
            raise APIError(400, "tool_choice needs tools to choose from", param="tool_choice")
        if req.parallel_tool_calls is not None:
            raise APIError(400, "parallel_tool_calls is only allowed with tools", param="parallel_tool_calls")
        return NO_TOOLS
    names = _check_tools(req.tools)
    if choice == "none":
        return ToolPlan("none", names)
    if choice is None or choice == "auto":
        strings = string_parameters({t.function.name: t.function.parameters for t in req.tools})
        return ToolPlan("auto", names, call_format=call_format, parallel=req.parallel_tool_calls is not False,
                        strings=strings)
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise APIError(400, f"tool_choice names the function {choice.function.name!r}, which is not "
                       "among the tools", param="tool_choice")
    if not supports_grammar:
        raise APIError(400, "tool_choice 'required' or a named function needs constrained decoding, "
                       "which this engine does not have", param="tool_choice")
    clash = constraint_fields(req)
    if clash:
        raise APIError(400, f"tool_choice and {clash[0]} both constrain the output; give one of them",
                       param="tool_choice")
    if isinstance(choice, NamedToolChoice):
        tool = next(t for t in req.tools if t.function.name == choice.function.name)
        schema, named = _parameters(tool), choice.function.name
    else:
        schema, named = _calls_schema(req.tools, one=req.parallel_tool_calls is False), None
    limits.check_grammar(schema, "tools")
    return ToolPlan("named" if named else "required", names, named, Constraint({"json_schema": schema}, "tools"))


def _check_tools(tools: list[Tool]) -> frozenset[str]:
    names: set[str] = set()
    for i, tool in enumerate(tools):
        name = tool.function.name
        if not _NAME.fullmatch(name):
            raise APIError(400, f"tools[{i}].function.name must be 1-64 of a-z, A-Z, 0-9, _ and -", param="tools")
        if name in names:
            raise APIError(400, f"tools[{i}].function.name {name!r} is given twice", param="tools")
        names.add(name)
        parameters = tool.function.parameters
        if parameters is not None and parameters.get("type", "object") != "object":
            raise APIError(400, f"tools[{i}].function.parameters must be a JSON schema of type 'object'",
                           param="tools")
    return frozenset(names)


def _parameters(tool: Tool) -> dict[str, Any]:
    """The arguments' schema: the tool's parameters, or an empty object when it has none."""
    parameters = tool.function.parameters
    return _NO_PARAMETERS if parameters is None else {"type": "object", **parameters}


def _calls_schema(tools: list[Tool], one: bool) -> dict[str, Any]:
    """[{"name": <a tool>, "arguments": <its parameters>}, ...]: at least one call (exactly one when
    `one`). The tools' $defs move to the top, where their "#/$defs/..." refs now point. A tool whose
    parameters refer to their own root ("#", "#/properties/...") moves to $defs too, as
    "<name>.arguments", its refs rebased there: at the array's root they would mean the array."""
    defs: dict[str, dict[str, Any]] = {}
    calls = []
    for i, tool in enumerate(tools):
        at = f"#/$defs/{tool.function.name}.arguments"
        parameters, rebased = _rebase_refs(_parameters(tool), at)
        for key in _DEFS:
            moved = parameters.get(key) or {}
            if not isinstance(moved, dict):
                raise APIError(400, f"tools[{i}].function.parameters.{key} must be an object of schemas",
                               param="tools")
            for name, value in moved.items():
                _define(defs, key, name, value)
        parameters = {k: v for k, v in parameters.items() if k not in _DEFS}
        if rebased:
            _define(defs, "$defs", at.rsplit("/", 1)[1], parameters)
            parameters = {"$ref": at}
        calls.append({"type": "object", "properties": {"name": {"const": tool.function.name},
                                                        "arguments": parameters},
                      "required": ["name", "arguments"], "additionalProperties": False})
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1, **defs}
    return {**schema, "maxItems": 1} if one else schema


def _define(defs: dict[str, dict[str, Any]], key: str, name: str, value: Any) -> None:
    if defs.setdefault(key, {}).setdefault(name, value) != value:
        raise APIError(400, f"tools define {key}/{name} differently; tool_choice 'required' "
                       "needs one definition per name", param="tools")


_DATA = ("const", "enum", "default", "examples")  # in a schema, values rather than schemas
_NAMED = ("properties", "patternProperties", "dependentSchemas", *_DEFS)  # maps of names to schemas


def _rebase_refs(schema: dict[str, Any], at: str) -> tuple[dict[str, Any], bool]:
    """A copy of `schema` whose local refs outside $defs / definitions ("#", "#/properties/x"),
    its $defs' included, point under the JSON pointer `at`, and whether there was any; values
    (const, enum, ...) are left as they are. Iterative: the parameters may be nested past
    Python's recursion limit before the depth limit refuses them."""
    rebased = False

    def rebase(ref: Any) -> Any:
        nonlocal rebased
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            return ref
        if any(ref.startswith(f"#/{key}/") for key in _DEFS):
            return ref
        rebased = True
        return at + ref[1:]

    root: dict[str, Any] = {}
    stack: list[tuple[Any, Any, bool]] = [(schema, root, False)]  # (source, its copy, a map of names)
    while stack:
        source, copy, names = stack.pop()
        for key, value in (source.items() if isinstance(source, dict) else enumerate(source)):
            if isinstance(value, (dict, list)) and (names or key not in _DATA):
                child: Any = {} if isinstance(value, dict) else [None] * len(value)
                stack.append((value, child, not names and key in _NAMED))
                value = child
            elif key == "$ref" and not names:
                value = rebase(value)
            copy[key] = value
    return root, rebased
