"""Sampling parameters: declared once here; the HTTP schemas and the language's gen() derive from it."""
from __future__ import annotations

import json
from typing import Any

import msgspec

GREEDY_BELOW = 1e-5  # a temperature under this is greedy: dividing logits by it would overflow fp32
INT64_MAX = 2**63 - 1  # bounds of the integer fields (what the engine core's messages carry)
SEED_RANGE = (-2**63, 2**64 - 1)  # what torch.manual_seed takes; n > 1 samples wrap within it
MAX_CONSTRAIN_AFTER_CHARS = 64
_INT_FIELDS = ("max_new_tokens", "min_new_tokens", "top_k", "n", "stream_interval")
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # OpenAI's: -100 bans a token, +100 all but forces it
MAX_LOGIT_BIAS = 300  # entries of one request's logit_bias


class SamplingParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """How to sample one request's output. Names follow SGLang's native `sampling_params`.

    `max_new_tokens=0` prefills only (the prompt lands in the prefix cache).
    `temperature=0` (or any under GREEDY_BELOW) is greedy. `top_k=-1`, `top_p=1`, `min_p=0` disable those filters.
    `stop` strings end generation at their first occurrence and are trimmed from the text
    (unless `no_stop_trim`). At most one of `regex`, `json_schema`, `choices`, `ebnf`,
    `structural_tag` constrains output; `ebnf` is a context-free grammar in GBNF style (`root ::=
    "yes" | "no"`), or in Lark syntax as llguidance takes it (a `start:` rule); `structural_tag`
    is SGLang's `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}` (JSON text or a
    dict: free text, a tagged JSON value at each trigger); both always compile with llguidance.
    `stream_interval`: a streamed request gets a chunk every this many new tokens (the first
    token and the end at once); None: the engine's `stream_interval` setting.
    `constrain_after`: the constraint holds from the token after the one whose text completes
    this text in the output (a thinking model's `</think>`: it reasons freely first); any token
    before (EOS not: the constrained part is still to come). No effect without a constraint.
    `logit_bias`: token id (a decimal string, as OpenAI's JSON keys; int keys are read too) →
    a value in [-100, 100] added to that token's logit before the grammar mask, penalties,
    temperature and filters (greedy too); at most MAX_LOGIT_BIAS entries.
    """

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    ignore_eos: bool = False
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    n: int = 1
    seed: int | None = None
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    choices: list[str] | None = None
    ebnf: str | None = None
    structural_tag: str | dict[str, Any] | None = None
    stream_interval: int | None = None
    constrain_after: str | None = None
    logit_bias: dict[str, float] | None = None

    @classmethod
    def from_dict(cls, params: dict[str, Any] | SamplingParams | None) -> SamplingParams:
        """Build from a request dict; None values mean 'default' (SGLang clients send every key).
        SGLang's other names are read too (see `_sglang_names`)."""
        if isinstance(params, SamplingParams):  # its fields were set without a type check
            params = msgspec.structs.asdict(params)
        elif params is not None and not isinstance(params, dict):
            raise ValueError(f"sampling_params must be a dict (or a SamplingParams), got {type(params).__name__}")
        cleaned = _sglang_names({k: v for k, v in (params or {}).items() if v is not None})
        if cleaned.get("stop") == []:
            del cleaned["stop"]
        if isinstance(cleaned.get("logit_bias"), dict):
            cleaned["logit_bias"] = _bias_keys(cleaned["logit_bias"])
        try:
            sp = msgspec.convert(cleaned, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid sampling_params: {exc}") from exc
        sp.validate()
        return sp

    def validate(self) -> None:
        """Raise ValueError naming the field when a value is out of range."""
        for name in _INT_FIELDS:
            value = getattr(self, name)
            _check(value is None or value <= INT64_MAX, name, f"must be at most {INT64_MAX}")
        _check(self.max_new_tokens >= 0, "max_new_tokens", "must be >= 0")
        _check(self.stream_interval is None or self.stream_interval >= 1, "stream_interval", "must be >= 1")
        _check(0 <= self.min_new_tokens <= self.max_new_tokens, "min_new_tokens", "must be in [0, max_new_tokens]")
        _check(self.temperature >= 0.0, "temperature", "must be >= 0")
        _check(0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]")
        _check(self.top_k == -1 or self.top_k >= 1, "top_k", "must be -1 (off) or >= 1")
        _check(0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]")
        _check(self.repetition_penalty > 0.0, "repetition_penalty", "must be > 0")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]")
        _check(1 <= self.n <= 128, "n", "must be in [1, 128]")
        _check(all(s for s in self.stop_strings), "stop", "strings must be non-empty")
        _check(all(0 <= t <= INT64_MAX for t in self.stop_token_ids or []), "stop_token_ids",
               "must be token ids (>= 0)")
        self._check_logit_bias()
        _check(self.seed is None or SEED_RANGE[0] <= self.seed <= SEED_RANGE[1], "seed",
               f"must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]")
        constraints = [c for c in (self.regex, self.json_schema, self.choices, self.ebnf, self.structural_tag)
                       if c is not None]
        _check(len(constraints) <= 1, "regex", "at most one of regex, json_schema, choices, ebnf, structural_tag "
               "may be set")
        _check(self.choices is None or len(self.choices) > 0, "choices", "must not be empty")
        _check(self.constrain_after is None or 0 < len(self.constrain_after) <= MAX_CONSTRAIN_AFTER_CHARS,
               "constrain_after", f"must be 1-{MAX_CONSTRAIN_AFTER_CHARS} characters")
        _check(self.constrain_after is None or _is_text(self.constrain_after), "constrain_after",
               "must be Unicode text (it is matched as UTF-8; a lone surrogate is not)")
        if self.stop_regexes:
            from radixflow.runtime.text.stop_regex import compile_stop_regexes

            compile_stop_regexes(tuple(self.stop_regexes))  # ValueError: invalid, unsupported, too big
        for name in ("json_schema", "structural_tag"):
            _check_json(name, getattr(self, name))

    def _check_logit_bias(self) -> None:
        bias = self.logit_bias or {}
        _check(len(bias) <= MAX_LOGIT_BIAS, "logit_bias", f"holds {len(bias)} entries; at most {MAX_LOGIT_BIAS}")
        bad = [k for k in bias if not _is_token_id(k)]
        _check(not bad, "logit_bias", f"{_BIAS_KEYS}, got {bad[:1]!r}")
        low, high = LOGIT_BIAS_RANGE
        bad = next((v for v in bias.values() if not low <= v <= high), None)  # NaN compares false
        _check(bad is None, "logit_bias", f"values must be in [{low:g}, {high:g}], got {bad}")

    def for_sample(self, j: int) -> SamplingParams:
        """Sample j of an n > 1 request: n = 1 and seed + j, wrapped into [0, 2^64) (the same
        generator state for torch, and never past the seed range)."""
        return msgspec.structs.replace(self, n=1, seed=None if self.seed is None else (self.seed + j) % 2**64)

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def stop_regexes(self) -> list[str]:
        return [self.stop_regex] if isinstance(self.stop_regex, str) else list(self.stop_regex or [])

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW or self.top_k == 1

    @property
    def is_penalized(self) -> bool:
        """A frequency, presence or repetition penalty applies."""
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0)

    @property
    def logit_bias_ids(self) -> list[int]:
        """The token ids `logit_bias` biases (its keys, validated as decimal ids)."""
        return [int(k) for k in self.logit_bias or ()]

    @property
    def is_constrained(self) -> bool:
        return (self.regex is not None or self.json_schema is not None or self.choices is not None
                or self.ebnf is not None or self.structural_tag is not None)


# SGLang sampling keys radixflow reads under another name, or ignores (no effect on output);
# any other unknown key is refused (forbid_unknown_fields).
ALIASES = {"sampling_seed": "seed"}
IGNORED = ("custom_params",)


def _sglang_names(params: dict[str, Any]) -> dict[str, Any]:
    for alias, name in ALIASES.items():
        if alias in params:
            value = params.pop(alias)
            params.setdefault(name, value)
    for name in IGNORED:
        params.pop(name, None)
    return params


_BIAS_KEYS = 'keys must be token ids written in decimal ("42")'


def _bias_keys(bias: dict) -> dict | None:
    """Int keys (the Python API's) as the decimal strings OpenAI's JSON sends; an empty dict
    is no bias."""
    bad = [k for k in bias if type(k) not in (str, int)]
    _check(not bad, "logit_bias", f"{_BIAS_KEYS}, got {bad[:1]!r}")
    return {str(k) if type(k) is int else k: v for k, v in bias.items()} or None


def _is_token_id(key: str) -> bool:
    """A token id in canonical decimal, at most 19 digits (int() of a longer one is slow, or a
    ValueError past Python's digit limit): "0", "42"; not "-1", "05", " 5", "4.0"."""
    return len(key) <= 19 and key.isascii() and key.isdigit() and (key == "0" or key[0] != "0")


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


PRIORITY_LIMIT = 1 << 62  # priorities (and their differences) stay within an int64


def check_priority(value: object, name: str = "priority") -> None:
    """ValueError starting with `name` unless `value` is None or an integer of at most 2^62 in size."""
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not -PRIORITY_LIMIT <= value <= PRIORITY_LIMIT:
        raise ValueError(f"{name} must be an integer between -2^62 and 2^62, got {value!r}")


def _check(ok: bool, name: str, what: str) -> None:
    if not ok:
        raise ValueError(f"sampling_params.{name} {what}")


def _check_json(name: str, value: Any) -> None:
    """A JSON-valued field (a dict, or its JSON text) the engine core's messages can carry."""
    if isinstance(value, dict):
        try:  # what the engine core's messages carry: integers in [-2^63, 2^64)
            msgspec.msgpack.encode(value)
        except (OverflowError, TypeError, RecursionError) as exc:
            raise ValueError(f"{name} holds a value the engine cannot take: {exc!r}") from None
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} is not valid JSON: {exc}") from exc
        except RecursionError:
            raise ValueError(f"{name} nests too deeply to be read") from None


class RequestOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Per-request options beside the sampling parameters, declared once: the top-level fields
    of a native /generate body, `Engine.generate` keywords of the same names, the language's
    gen() request keys.

    `logprob_start_len`: first prompt position whose logprob is returned; absent means output
    logprobs only (as SGLang, so a warm prompt still hits the cache), -1 the same.
    """

    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    session_id: str | None = None  # requests of one conversation or program run (session goodput)
    lora_path: str | None = None  # LoRA adapter: a loaded name, or a path under --lora-dir; None: the base
    priority: int | None = None  # with priority scheduling, the request's rank; None: the engine's default
    return_hidden_states: bool = False  # meta_info["hidden_states"] (needs --enable-return-hidden-states)

    def validate(self) -> None:
        """ValueError starting with the field's name when a value is out of range."""
        check_priority(self.priority)
        if self.top_logprobs_num < 0:
            raise ValueError(f"top_logprobs_num is {self.top_logprobs_num}; it must be >= 0")
        if self.logprob_start_len is not None and self.logprob_start_len < -1:
            raise ValueError(f"logprob_start_len is {self.logprob_start_len}; it must be >= -1 (-1: output only)")

    def engine_kwargs(self) -> dict[str, Any]:
        """As Engine.generate keywords, `logprob_start_len` resolved (absent → -1, output only);
        `lora_path` only when given (the base model otherwise)."""
        kwargs = msgspec.structs.asdict(self)
        if kwargs["lora_path"] is None:
            del kwargs["lora_path"]
        if kwargs["logprob_start_len"] is None:
            kwargs["logprob_start_len"] = -1
        return kwargs


def request_option_names() -> tuple[str, ...]:
    return RequestOptions.__struct_fields__


def field_names() -> tuple[str, ...]:
    """The declared parameter names, for schemas and the language to derive from."""
    return SamplingParams.__struct_fields__
