"""Tokenizer: a Hugging Face tokenizer directory (tokenizer.json and its configs) or GGUF metadata, plus chat templates."""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import jinja2
import tokenizers

from radixflow.runtime.text.chat_template import chat_templates, compile_chat_template, template_source
from radixflow.runtime.text_files import read_json_object, read_text

# The named special tokens of tokenizer_config.json, which chat templates see as variables.
TEMPLATE_TOKEN_KEYS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
LONG_TEXT_CHARS = 8192  # longer texts are encoded with the GIL released (see encode)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


BYTE_LEVEL_CHARS: dict[str, int] = {char: byte for byte, char in _bytes_to_unicode().items()}


def byte_level_bytes(token: str) -> bytes:
    """Bytes of a byte-level BPE token string, as the ByteLevel decoder computes them.

    NOTE: like the `tokenizers` decoder, a token holding any character outside the byte table
    (an added token such as "日本") stands for its own UTF-8 encoding instead.
    """
    try:
        return bytes([BYTE_LEVEL_CHARS[char] for char in token])
    except KeyError:
        return token.encode("utf-8")


def fallback_byte(token: str) -> int | None:
    """The byte of a sentencepiece byte-fallback token such as "<0x0A>", else None.

    Mirrors the `tokenizers` ByteFallback check: six characters, "<0x", two hex digits, ">"
    (Rust's radix parser also takes a "+" sign, so "<0x+A>" counts too).
    """
    if len(token) != 6 or not token.startswith("<0x") or not token.endswith(">"):
        return None
    sign_or_digit, digit = token[3], token[4]
    if digit in _HEX_DIGITS and (sign_or_digit in _HEX_DIGITS or sign_or_digit == "+"):
        return int(token[3:5], 16)
    return None


def _read_json(path: str) -> dict[str, Any]:
    """A JSON object file, or {} when the file does not exist."""
    return read_json_object(path) if os.path.isfile(path) else {}


def _token_content(value: Any) -> str | None:
    """A special-token entry of tokenizer_config.json: a string, an AddedToken dict or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"expected a token string or {{'content': ...}} in tokenizer_config.json, "
                     f"got {value!r}")


def _id_list(value: Any) -> list[int]:
    """An `eos_token_id`-style field: an int, a list of ints or null."""
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"expected a token id or a list of token ids, got {value!r}")
    return values


def _register_config_tokens(backend: tokenizers.Tokenizer, config: Mapping[str, Any]) -> None:
    """Add the config's special tokens that tokenizer.json lacks as added tokens, as transformers does."""
    known = {token.content for token in backend.get_added_tokens_decoder().values()}
    new: list[tokenizers.AddedToken] = []
    for entry in config.get("added_tokens_decoder", {}).values():
        content = _token_content(entry)
        if content is not None and content not in known:
            special = bool(entry.get("special", False))
            new.append(tokenizers.AddedToken(content, special=special, normalized=False))
            known.add(content)
    extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
    named = [config.get(key) for key in TEMPLATE_TOKEN_KEYS] + list(extra if isinstance(extra, list) else [])
    for value in named:
        content = _token_content(value)
        if content is not None and content not in known:
            new.append(tokenizers.AddedToken(content, special=True, normalized=False))
            known.add(content)
    if new:
        backend.add_tokens(new)


def _token_ids(backend: tokenizers.Tokenizer, token: str | None) -> list[int]:
    """[id] of a token string in the vocabulary, [] for None or an unknown string."""
    token_id = backend.token_to_id(token) if token is not None else None
    return [] if token_id is None else [token_id]


class Tokenizer:
    """Text <-> token ids for one model, plus its chat template.

    Wraps a `tokenizers.Tokenizer` (`backend`). Encoding and decoding match transformers'
    AutoTokenizer on the same directory: tokenizer.json's post-processor alone decides whether
    BOS/EOS are added (transformers 5 ignores `add_bos_token`/`add_eos_token` when tokenizer.json
    exists), and decode never applies `clean_up_tokenization_spaces`. Ids past the vocabulary
    are dropped by `decode`, as the backend does. Safe to share between threads once built.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        path: str = "",
        bos_token_id: int | None = None,
        eos_token_ids: Sequence[int] = (),
        chat_templates: Mapping[str, str] | None = None,
        template_tokens: Mapping[str, str] | None = None,
    ) -> None:
        """Wrap a ready backend; `from_dir` is the usual way in.

        `chat_templates` maps names to Jinja sources ("default" is used); `template_tokens` are the
        named special tokens (bos_token, eos_token, ...) templates see as variables.
        """
        self.backend = backend
        self.path = path
        self.bos_token_id = bos_token_id
        self.eos_token_ids: list[int] = list(dict.fromkeys(eos_token_ids))
        self.chat_templates: dict[str, str] = dict(chat_templates or {})
        self._template_tokens = dict(template_tokens or {})
        vocab = backend.get_vocab(with_added_tokens=True)
        self.vocab_size: int = max(vocab.values(), default=-1) + 1
        specials = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
        # NOTE: the backend skips special tokens by their text, so every id spelling one counts.
        self.special_token_ids: frozenset[int] = frozenset(i for t, i in vocab.items() if t in specials)

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load tokenizer.json, tokenizer_config.json, generation_config.json and chat_template.jinja.

        BOS is tokenizer_config's bos_token, else generation_config's bos_token_id. EOS ids are
        generation_config's eos_token_id (int or list) followed by tokenizer_config's eos_token.
        """
        path = os.fspath(path)
        tokenizer_file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(tokenizer_file):
            raise ValueError(f"{path} has no tokenizer.json (radixflow needs a fast-tokenizer file)")
        try:
            backend = tokenizers.Tokenizer.from_file(tokenizer_file)
        except Exception as e:  # NOTE: the tokenizers binding raises a bare Exception for any bad file
            raise ValueError(f"{tokenizer_file} cannot be read as a fast-tokenizer file: {e}") from e
        config = _read_json(os.path.join(path, "tokenizer_config.json"))
        generation = _read_json(os.path.join(path, "generation_config.json"))
        _register_config_tokens(backend, config)
        template_tokens = {key: content for key in TEMPLATE_TOKEN_KEYS
                           if (content := _token_content(config.get(key))) is not None}
        bos_ids = _token_ids(backend, template_tokens.get("bos_token"))
        bos_ids = bos_ids or _id_list(generation.get("bos_token_id"))
        eos_ids = _id_list(generation.get("eos_token_id"))
        eos_ids += _token_ids(backend, template_tokens.get("eos_token"))
        return cls(
            backend,
            path=path,
            bos_token_id=bos_ids[0] if bos_ids else None,
            eos_token_ids=eos_ids,
            chat_templates=chat_templates(path, config),
            template_tokens=template_tokens,
        )

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], chat_template_file: str | None = None) -> Tokenizer:
        """The tokenizer of a model path: a GGUF file (from its metadata) or a Hugging Face directory.

        `chat_template_file` (a Jinja file) replaces the model's own chat template. Every chat
        template is compiled here, so a broken one fails at start-up (ValueError naming its file),
        not on each chat request.
        """
        path = os.fspath(path)
        template = None
        if chat_template_file is not None:
            if not os.path.isfile(chat_template_file):
                raise ValueError(f"chat template file {chat_template_file!r} does not exist")
            template = read_text(chat_template_file)
        if os.path.isfile(path):
            from radixflow.runtime.model.gguf_file import read_gguf
            from radixflow.runtime.text.gguf_tokenizer import tokenizer_from_gguf

            tok = tokenizer_from_gguf(read_gguf(path), chat_template=template)
            source = f"{path} (tokenizer.chat_template)"
        else:
            tok = cls.from_dir(path)
            source = template_source(path)
            if template is not None:
                tok.chat_templates = {"default": template}
        for name, text in tok.chat_templates.items():
            try:
                compile_chat_template(text)
            except ValueError as e:
                where = chat_template_file if chat_template_file is not None else source
                raise ValueError(f"{where}: chat template {name!r}: {e}") from e
        return tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` lets the post-processor add BOS (and EOS) if it does."""
        if not isinstance(text, str):
            raise ValueError(f"text to encode must be a str, got {type(text).__name__}")
        if len(text) > LONG_TEXT_CHARS:
            # NOTE: `tokenizers` releases the GIL in encode_batch only, not in encode: a long
            # prompt tokenized on a worker thread would otherwise stall the event loop throughout.
            return self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; invalid UTF-8 shows as U+FFFD, exactly as the backend decodes."""
        try:
            return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        except (OverflowError, TypeError) as e:
            raise ValueError(f"token ids must be non-negative ints: {e}") from e

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of `token_id` (added tokens included), None for an unused id."""
        return self.backend.id_to_token(token_id)

    def decoder_steps(self) -> list[dict[str, Any]]:
        """The backend decoder as a flat list of step configs (Sequence decoders unnested)."""
        if self.backend.decoder is None:
            return []
        steps, pending = [], [json.loads(self.backend.decoder.__getstate__())]
        while pending:
            step = pending.pop(0)
            if step.get("type") == "Sequence":
                pending[:0] = step["decoders"]
            else:
                steps.append(step)
        return steps

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes `token_id` stands for; b"" for an unused id.

        Byte-level BPE tokens map through the GPT-2 byte table, sentencepiece pieces turn the
        metaspace into b" " (no leading-space stripping) and "<0xNN>" into that byte, added tokens
        are their UTF-8 text.
        """
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})")
        return self._token_bytes_table[token_id]

    @cached_property
    def _token_bytes_table(self) -> list[bytes]:
        steps = self.decoder_steps()
        kinds = {step.get("type") for step in steps}
        added = {i for i, t in self.backend.get_added_tokens_decoder().items()}
        replacements = [(s["pattern"]["String"], s["content"]) for s in steps
                        if s.get("type") == "Replace" and "String" in s.get("pattern", {})]
        replacements += [(s["replacement"], " ") for s in steps if s.get("type") == "Metaspace"]
        byte_fallback = "ByteFallback" in kinds or bool(getattr(self.backend.model, "byte_fallback", False))

        def to_bytes(token_id: int) -> bytes:
            token = self.backend.id_to_token(token_id)
            if token is None:
                return b""
            if token_id in added:
                return token.encode("utf-8")
            if "ByteLevel" in kinds:
                return byte_level_bytes(token)
            if byte_fallback and (byte := fallback_byte(token)) is not None:
                return bytes([byte])
            for pattern, content in replacements:
                token = token.replace(pattern, content)
            return token.encode("utf-8")

        return [to_bytes(i) for i in range(self.vocab_size)]

    def apply_chat_template(
        self,
        messages: list[dict],
        /,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        continue_final_message: bool = False,
        **kwargs: Any,
    ) -> str | list[int]:
        """Render `messages` with the model's chat template, as transformers' apply_chat_template.

        Templates see `messages`, `add_generation_prompt`, the named special tokens
        (`bos_token`, ...), `tools`, `documents` and any extra `kwargs`. Keys whose value is None
        are dropped from messages first. With `tokenize`, the text is encoded without adding
        special tokens (the template writes BOS itself). `continue_final_message` leaves the last
        message open: the rendering ends with its content, which the model goes on writing.
        Raises ValueError for a model without a template, malformed messages, or a template that
        rejects the conversation, or fails on a variable of the wrong type (`bos_token + ...` with
        a number): the variables are the caller's data. `self` and `messages` are positional-only,
        so a template variable of either name is just a variable.
        """
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
        if not all(isinstance(m, Mapping) for m in messages):
            raise ValueError("every chat message must be a dict")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message continues the last message; add_generation_prompt would "
                             "open a new one: set one of them")
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        context = {**self._template_tokens, "tools": None, "documents": None, **kwargs,
                   "messages": messages, "add_generation_prompt": add_generation_prompt}
        template = compile_chat_template(self._select_template(has_tools=context["tools"] is not None))
        text = _render(template, context)
        if continue_final_message:
            text = _open_final_message(text, messages[-1].get("content"), _content_end(template, context))
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def role_markers(self) -> dict[str, Any]:
        """Each role's begin/end text under the chat template (see runtime/text/role_markers.py)."""
        from radixflow.runtime.text.role_markers import role_markers

        return role_markers(self)

    def _select_template(self, has_tools: bool) -> str:
        if not self.chat_templates:
            raise ValueError(f"the model at {self.path or '<in memory>'} has no chat template; "
                             "send raw prompts (completions) instead of chat messages")
        if has_tools and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        if "default" in self.chat_templates:
            return self.chat_templates["default"]
        names = sorted(self.chat_templates)
        raise ValueError(f"the model has chat templates {names} but none named 'default'")


def _render(template: Any, context: dict[str, Any]) -> str:
    try:
        return template.render(context)
    except jinja2.TemplateError as e:
        raise ValueError(f"the chat template failed to render: {e}") from e
    except (TypeError, AttributeError, LookupError, ArithmeticError) as e:
        raise ValueError(f"the chat template failed to render: {type(e).__name__}: {e}") from e


_MARK = "\x00radixflow-final-message-end\x00"


def _final_text(content: Any) -> str | None:
    """The final message's text to continue: a string, or its content parts' last text."""
    if isinstance(content, list):
        content = content[-1].get("text") if content and isinstance(content[-1], Mapping) else None
    return content if isinstance(content, str) else None


def _content_end(template: Any, context: dict[str, Any]) -> int | None:
    """Where the final message's content ends at the latest: the rendering with a mark after that
    content, cut at the mark (the markup after it may hold the content's text too: "<" or "d" in
    "<|im_end|>"). None when the template does not render the mark."""
    messages = context["messages"]
    content = messages[-1].get("content")
    if _final_text(content) is None:
        return None
    if isinstance(content, list):
        content = [*content[:-1], {**content[-1], "text": content[-1]["text"] + _MARK}]
    else:
        content += _MARK
    marked = _render(template, {**context, "messages": [*messages[:-1], {**messages[-1], "content": content}]})
    at = marked.rfind(_MARK)
    return at if at >= 0 else None


def _open_final_message(text: str, content: Any, end: int | None) -> str:
    """`text` cut right after the final message's content: where it last appears as given, else
    stripped (some templates trim messages), as transformers cuts it, searching only before `end`
    (its trailing whitespace less for the stripped text, which a trimming template dropped)."""
    content = _final_text(content)
    if content is None or not content.strip():
        raise ValueError("continue_final_message needs a final message with text to continue")
    end = len(text) if end is None else end
    trailing = len(content) - len(content.rstrip())
    for piece, limit in ((content, end), (content.strip(), end - trailing)):
        at = text.rfind(piece, 0, limit)
        if at >= 0:
            return text[:at + len(piece)]
    raise ValueError("continue_final_message: the chat template does not render the final message's text")
