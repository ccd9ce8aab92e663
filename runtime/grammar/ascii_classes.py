"""ASCII meaning for \\d \\w \\s (and \\D \\W \\S) in regexes handed to a grammar backend.

outlines-core reads these classes as Unicode (`\\d` admits '꣗' and '٠'); users, SGLang's
`gen_int` / `gen_string` and xgrammar mean ASCII. Escaped backslashes are respected; inside a
character class the positive classes expand in place, and a negated one (`[\\D]`) is left alone
(it cannot be spelled inside a class).
"""
from __future__ import annotations

_WORD = "a-zA-Z0-9_"
_SPACE = " \\t\\n\\r\\f\\v"
_DIGIT = "0-9"
_INSIDE = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_OUTSIDE = {"d": f"[{_DIGIT}]", "w": f"[{_WORD}]", "s": f"[{_SPACE}]",
            "D": f"[^{_DIGIT}]", "W": f"[^{_WORD}]", "S": f"[^{_SPACE}]"}


def ascii_classes(regex: str) -> str:
    """`regex` with the shorthand classes spelled as ASCII sets."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(regex):
        c = regex[i]
        if c == "\\" and i + 1 < len(regex):
            nxt = regex[i + 1]
            table = _INSIDE if in_class else _OUTSIDE
            out.append(table.get(nxt, c + nxt))
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
            out.append(c)
            i += 1
            if regex[i:i + 1] == "^":
                out.append("^")
                i += 1
            if regex[i:i + 1] == "]":  # a leading ']' is a literal
                out.append("]")
                i += 1
            continue
        if c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


def ascii_schema_patterns(schema: object) -> object:
    """A JSON schema with every `pattern` (and `patternProperties` key) made ASCII."""
    if isinstance(schema, list):
        return [ascii_schema_patterns(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "pattern" and isinstance(value, str):
            out[key] = ascii_classes(value)
        elif key == "patternProperties" and isinstance(value, dict):
            out[key] = {ascii_classes(k): ascii_schema_patterns(v) for k, v in value.items()}
        else:
            out[key] = ascii_schema_patterns(value)
    return out
