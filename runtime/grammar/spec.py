"""What a request asks to be constrained by: a hashable (kind, text) key."""
from __future__ import annotations

import json
from dataclasses import dataclass

from radixflow.runtime.grammar.ascii_classes import ascii_classes, ascii_schema_patterns
from radixflow.runtime.grammar.structural_tag import normalize as normalize_structural_tag
from radixflow.runtime.sampling_params import SamplingParams

KINDS = ("regex", "json_schema", "choices", "ebnf", "structural_tag")


@dataclass(frozen=True)
class GrammarKey:
    """`kind` is one of KINDS; `text` is the regex, the schema as compact JSON (key order kept:
    it decides the order of generated keys), the choices as a JSON list, the grammar as given, or
    the structural tag as compact JSON (structural_tag.py)."""

    kind: str
    text: str


def grammar_key(sp: SamplingParams) -> GrammarKey | None:
    """The grammar `sp` constrains output with, or None when unconstrained. Regex classes
    \\d \\w \\s mean ASCII (see ascii_classes.py)."""
    if sp.regex is not None:
        return GrammarKey("regex", ascii_classes(sp.regex))
    if sp.json_schema is not None:
        schema = json.loads(sp.json_schema) if isinstance(sp.json_schema, str) else sp.json_schema
        if not isinstance(schema, dict):
            raise ValueError("sampling_params.json_schema must be a JSON object")
        schema = ascii_schema_patterns(schema)
        return GrammarKey("json_schema", json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    if sp.choices is not None:
        if not all(isinstance(c, str) and c for c in sp.choices):
            raise ValueError("sampling_params.choices must be non-empty strings")
        return GrammarKey("choices", json.dumps(list(sp.choices), ensure_ascii=False))
    if sp.ebnf is not None:
        return GrammarKey("ebnf", sp.ebnf)
    if sp.structural_tag is not None:
        return GrammarKey("structural_tag", normalize_structural_tag(sp.structural_tag))
    return None
