"""Chat templates: compiled as transformers compiles them (a sandboxed Jinja environment with its
extensions and globals), and found in a Hugging Face directory (chat_template.jinja or
tokenizer_config.json)."""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from radixflow.runtime.text_files import read_text


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`, which marks assistant text in some templates: the body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str) -> None:
    raise ValueError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters; chat templates expect plain json.dumps.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template the way transformers does: sandboxed, trim_blocks and lstrip_blocks."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"the chat template does not compile: {e}") from e


def chat_templates(path: str, config: Mapping[str, Any]) -> dict[str, str]:
    """Named chat templates: chat_template.jinja (as "default") wins over tokenizer_config.json."""
    jinja_path = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        return {"default": read_text(jinja_path)}
    value = config.get("chat_template")
    if value is None:
        return {}
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list) and all(isinstance(t, Mapping) and {"name", "template"} <= t.keys()
                                       and isinstance(t["name"], str) and isinstance(t["template"], str)
                                       for t in value):
        return {t["name"]: t["template"] for t in value}
    raise ValueError(f"chat_template in {path}/tokenizer_config.json must be a string or a list of "
                     "{name, template} objects")


def template_source(path: str) -> str:
    """The file a Hugging Face directory's chat template comes from (see `chat_templates`)."""
    jinja_path = os.path.join(path, "chat_template.jinja")
    return jinja_path if os.path.isfile(jinja_path) else os.path.join(path, "tokenizer_config.json")
