"""structural_tag: free text in which every trigger opens a tagged JSON value, as a Lark grammar.

The form SGLang and vLLM take: `{"structures": [{"begin", "schema", "end"}, ...], "triggers":
[...]}` (JSON text or a dict; a `"type": "structural_tag"` key is allowed). Output is free text
until it reaches a trigger; from there it must go on with the `begin` of a structure whose begin
starts with that trigger, then JSON of that structure's schema, then its `end`, then free text
again. Free text never holds a trigger otherwise. In llguidance's Lark dialect:

    start: (structure_0 | structure_1 ...)* FREE
    FREE: any text & ~(any text, a trigger, any text)
    trigger_j[lazy]: FREE "trigger j"                  lazy: ends at the trigger's first occurrence
    structure_i: trigger_j "rest of begin i" %json {schema i} "end i"

Literals are JSON strings (llguidance reads them so), never regexes, so no character of a trigger,
a begin or an end is an operator. Kept free of llguidance: spec.py builds keys with `normalize`.
"""
from __future__ import annotations

import json
from typing import Any, NoReturn

from radixflow.runtime.grammar.ascii_classes import ascii_schema_patterns

# As many structures as an EBNF grammar has rules (llguidance_backend.MAX_EBNF_RULES).
MAX_STRUCTURES = 500
# NOTE: each trigger is excluded from free text by one negated regex, which llguidance's lexer
# derives byte by byte: 200 triggers cost up to 19 ms a token, and at 500 the lexer passed its
# limit at the first "<" of free text, ending the request (measured, llguidance 1.9.1).
MAX_TRIGGERS = 64
FIELD = "sampling_params.structural_tag"
_ANY = "/(?s:.*)/"
_KEYS = {"type", "structures", "triggers"}
_STRUCTURE_KEYS = {"begin", "schema", "end"}


def normalize(value: str | dict[str, Any]) -> str:
    """The tag as compact JSON text `{"structures": [...], "triggers": [...]}` (triggers without
    repeats; schemas with ASCII regex classes, keys in order): the grammar key's text. ValueError
    starting with FIELD when the tag is not of the supported form."""
    try:
        return _normalize(json.loads(value) if isinstance(value, str) else value)
    except RecursionError:
        _fail("nests too deeply to be read")


def _normalize(tag: object) -> str:
    if not isinstance(tag, dict):
        _fail("must be a JSON object with structures and triggers")
    if "format" in tag:
        _fail('only the {"structures": [...], "triggers": [...]} form is supported, not "format"')
    _check(tag.get("type", "structural_tag") == "structural_tag", 'type must be "structural_tag"')
    _check(set(tag) <= _KEYS, f"unknown keys {sorted(set(tag) - _KEYS)}; the form is structures and triggers")
    given = _list(tag.get("structures"), "structures", MAX_STRUCTURES)
    triggers = _triggers(tag.get("triggers"))
    structures = [_structure(s, i, triggers) for i, s in enumerate(given)]
    return json.dumps({"structures": structures, "triggers": triggers}, separators=(",", ":"), ensure_ascii=False)


def _triggers(value: object) -> list[str]:
    triggers = _list(value, "triggers", MAX_TRIGGERS)
    _check(all(isinstance(t, str) and t for t in triggers), "triggers must be non-empty strings")
    return list(dict.fromkeys(triggers))


def _structure(value: object, i: int, triggers: list[str]) -> dict[str, Any]:
    where = f"structures[{i}]"
    _check(isinstance(value, dict) and set(value) == _STRUCTURE_KEYS,
           f"{where} must be an object with begin, schema and end")
    begin, schema, end = value["begin"], value["schema"], value["end"]
    _check(isinstance(begin, str) and isinstance(end, str), f"{where}.begin and {where}.end must be strings")
    _check(isinstance(schema, dict), f"{where}.schema must be a JSON schema object")
    _check(any(begin.startswith(t) for t in triggers), f"{where}.begin {begin!r} starts with none of the triggers")
    return {"begin": begin, "schema": ascii_schema_patterns(schema), "end": end}


def _list(value: object, name: str, limit: int) -> list:
    _check(isinstance(value, list) and value, f"{name} must be a non-empty list")
    _check(len(value) <= limit, f"{name}: {len(value)} given; at most {limit} are allowed")
    return value


def _check(ok: object, what: str) -> None:
    if not ok:
        _fail(what)


def _fail(what: str) -> NoReturn:
    raise ValueError(f"{FIELD}: {what}")


def to_lark(text: str, json_options: dict[str, Any]) -> str:
    """The Lark grammar of a normalized tag; `json_options` (llguidance's `x-guidance` keys) fix
    how every structure's JSON is spelled."""
    tag = json.loads(text)
    triggers, structures = tag["triggers"], tag["structures"]
    lines = ["%llguidance {}",
             "start: (" + " | ".join(f"structure_{i}" for i in range(len(structures))) + ")* FREE",
             f"FREE: {_ANY} & ~({_ANY} (" + " | ".join(_literal(t) for t in triggers) + f") {_ANY})"]
    lines += [f"trigger_{j}[lazy]: FREE {_literal(t)}" for j, t in enumerate(triggers)
              if any(s["begin"].startswith(t) for s in structures)]
    for i, s in enumerate(structures):
        heads = " | ".join(f"trigger_{j} {_literal(s['begin'][len(t):])}" for j, t in enumerate(triggers)
                           if s["begin"].startswith(t))
        schema = json.dumps({**s["schema"], "x-guidance": json_options})
        lines.append(f"structure_{i}: ({heads}) %json {schema} {_literal(s['end'])}")
    return "\n".join(lines)


def structure_schemas(text: str) -> list[dict[str, Any]]:
    return [s["schema"] for s in json.loads(text)["structures"]]


def structure_begins(text: str) -> list[str]:
    return [s["begin"] for s in json.loads(text)["structures"]]


def _literal(text: str) -> str:
    """A Lark string literal (JSON escapes); "" where the text is empty (nothing to match)."""
    return json.dumps(text) if text else ""
