"""Request limits: one table (a frozen dataclass per side), each a `radixflow serve` flag, checked before any work.

`RequestLimits` bounds single requests on every route; the program limits are the language's own
`radixflow.lang.Limits` (flags prefixed `--program-`). Every check raises APIError naming the
limit and the value, before tokenization, grammar compilation or a program's first op.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from radixflow.frontend.errors import APIError
from radixflow.lang.validate import Limits as ProgramLimits


def _limit(default: float, help_text: str) -> Any:
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class RequestLimits:
    max_body_bytes: int = _limit(8 * 1024 * 1024, "request body bytes; larger bodies get 413")
    body_timeout_s: float = _limit(60.0, "seconds a request body may pause between two of its parts; a body "
                                   "that stops arriving longer gets 408 and frees its connection")
    max_prompt_chars: int = _limit(1_000_000, "characters of prompt text in one request (all prompts and "
                                   "messages together), checked before tokenization")
    max_prompt_tokens: int = _limit(262_144, "token ids given in one request (input_ids / token prompts)")
    max_prompts: int = _limit(256, "prompts in one batched request")
    max_messages: int = _limit(8192, "chat messages in one request, checked before the chat template renders them")
    max_stop: int = _limit(64, "stop strings (and stop regexes) of one request")
    max_stop_chars: int = _limit(1024, "characters of one stop string or stop regex")
    max_n: int = _limit(128, "samples per prompt (n)")
    max_score_pairs: int = _limit(1024, "(item, label) pairs of one /v1/score request (items x label_token_ids): "
                                  "each is a request of its own")
    max_top_logprobs: int = _limit(20, "top logprobs per position (logprobs / top_logprobs / top_logprobs_num)")
    max_choices: int = _limit(1024, "choices of one constrained request")
    max_grammar_chars: int = _limit(65_536, "characters of one regex, JSON schema, EBNF grammar or structural tag")
    max_json_depth: int = _limit(64, "nesting depth of a JSON schema (json_schema, response_format, each schema "
                                 "of a structural tag)")
    max_user_chars: int = _limit(256, "characters of `user` (OpenAI) / `session_id` (native), which the engine "
                                 "keeps per session; 256 fits a UUID, a hash or an e-mail address")

    def check(self, ok: bool, name: str, value: Any, param: str | None = None) -> None:
        if not ok:
            raise APIError(400, f"{param or name} is {value}; the limit {name} is {getattr(self, name)}",
                           param=param, code="limit_exceeded")

    def check_sampling(self, params: dict[str, Any], rename: dict[str, str] | None = None) -> None:
        """Bounds on raw sampling fields (before SamplingParams / grammar compilation); `rename`:
        engine names → the fields the client used, for the errors."""
        rename = rename or {}
        stops = _as_list(params.get("stop")) + _as_list(params.get("stop_regex"))
        self.check(len(stops) <= self.max_stop, "max_stop", len(stops), "stop")
        longest = max((len(s) for s in stops if isinstance(s, str)), default=0)
        self.check(longest <= self.max_stop_chars, "max_stop_chars", longest, "stop")
        n = params.get("n")
        if isinstance(n, int):
            self.check(n <= self.max_n, "max_n", n, rename.get("n", "n"))
        choices = params.get("choices")
        if isinstance(choices, list):
            self.check(len(choices) <= self.max_choices, "max_choices", len(choices), rename.get("choices", "choices"))
        for key in ("regex", "json_schema", "ebnf", "structural_tag"):
            value = params.get(key)
            if value is not None:
                self.check_grammar(value, rename.get(key, key), is_json_text=key in _SCHEMA_DEPTH,
                                   wrapper_depth=_SCHEMA_DEPTH.get(key, 0))

    def check_grammar(self, value: Any, param: str, is_json_text: bool = False, wrapper_depth: int = 0) -> None:
        """A regex, JSON schema, EBNF grammar or structural tag's size and nesting depth;
        `is_json_text`: a string `value` is JSON text, as deep as the value it holds;
        `wrapper_depth`: levels above the schemas, not counted."""
        size = len(value) if isinstance(value, str) else len(repr(value))
        self.check(size <= self.max_grammar_chars, "max_grammar_chars", size, param)
        depth = text_depth(value) if is_json_text and isinstance(value, str) else json_depth(value)
        depth = max(0, depth - wrapper_depth)
        self.check(depth <= self.max_json_depth, "max_json_depth", depth, param)

    def check_text(self, total_chars: int, param: str) -> None:
        self.check(total_chars <= self.max_prompt_chars, "max_prompt_chars", total_chars, param)

    def check_ids(self, total_ids: int, param: str) -> None:
        self.check(total_ids <= self.max_prompt_tokens, "max_prompt_tokens", total_ids, param)

    def check_prompts(self, num_prompts: int, param: str) -> None:
        self.check(num_prompts <= self.max_prompts, "max_prompts", num_prompts, param)

    def check_messages(self, num_messages: int, param: str) -> None:
        self.check(num_messages <= self.max_messages, "max_messages", num_messages, param)

    def check_session(self, session_id: str | None, param: str) -> None:
        if session_id is not None:
            self.check(len(session_id) <= self.max_user_chars, "max_user_chars", len(session_id), param)

    def check_top_logprobs(self, value: int, param: str) -> None:
        self.check(0 <= value <= self.max_top_logprobs, "max_top_logprobs", value, param)


# JSON-valued constraints → levels above their schemas: a structural tag's sit 3 down,
# {"structures": [{"schema": ...}]}
_SCHEMA_DEPTH = {"json_schema": 0, "structural_tag": 3}


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value) if isinstance(value, list) else [value]


def json_depth(value: Any) -> int:
    """Nesting depth of decoded JSON (iterative: a hostile value cannot exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in item)
    return deepest


# a string (to its end when unclosed: each character is read once), or a bracket
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


def text_depth(text: str) -> int:
    """Nesting depth of the JSON in `text` (json_depth of its value when it is valid), from its
    brackets outside strings: decoding deep text would exhaust the decoder's stack."""
    deepest = depth = 0
    for token in _TOKENS.findall(text):
        if token in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in ("]", "}"):
            depth -= 1
    return deepest


# -- flags -----------------------------------------------------------------------------------

_TABLES = ((RequestLimits, ""), (ProgramLimits, "program_"))


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per limit; help and default come from the declarations above."""
    group = parser.add_argument_group("limits")
    for table, prefix in _TABLES:
        for f in dataclasses.fields(table):
            name = prefix + f.name
            group.add_argument("--" + name.replace("_", "-"), type=_positive(type(f.default)), default=f.default,
                               dest=name, help=f"{f.metadata['help']} (default: {f.default})")


def _positive(kind: type) -> Any:
    """argparse type of a limit: above 0 (a body timeout of 0 or nan would fail every request
    with a body; a cap of 0 or below would refuse everything)."""
    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:  # nan compares false
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its "invalid float value" message
    return parse


def limits_from_flags(ns: argparse.Namespace) -> tuple[RequestLimits, ProgramLimits]:
    request = RequestLimits(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(RequestLimits)})
    program = ProgramLimits(**{f.name: getattr(ns, "program_" + f.name) for f in dataclasses.fields(ProgramLimits)})
    return request, program


def limit_table() -> list[tuple[str, Any, str]]:
    """(flag, default, help) of every limit, for the README and --help."""
    return [("--" + (prefix + f.name).replace("_", "-"), f.default, f.metadata["help"])
            for table, prefix in _TABLES for f in dataclasses.fields(table)]
