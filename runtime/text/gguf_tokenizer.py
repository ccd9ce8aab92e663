"""A Tokenizer built from a GGUF file's `tokenizer.*` metadata (GGUF files carry no tokenizer.json).

    tokenizer.ggml.model   gpt2: byte-level BPE from `tokens` + `merges`, text split by the
                           regex `tokenizer.ggml.pre` names; llama: SentencePiece-style BPE with
                           byte fallback, merges from the file or derived from `scores`
    tokenizer.ggml.token_type   3 (control) → special added tokens, 4 (user-defined) → added tokens
    tokenizer.ggml.{bos,eos,padding,unknown}_token_id, add_bos_token, add_eos_token
    tokenizer.chat_template
"""
from __future__ import annotations

from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors

from radixflow.runtime.model.gguf_file import GGUFFile
from radixflow.runtime.text.tokenizer import BYTE_LEVEL_CHARS, Tokenizer, byte_level_bytes

CONTROL, USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> the split regex its merges were learned under (others: GPT-2's own regex)
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT, "pixtral": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT, "megrez": _QWEN2_SPLIT,
}
# pre types whose reference tokenizer splits digits one by one before the GPT-2 regex
DIGIT_SPLIT_PRES = ("smollm",)


def _byte_level_vocab(tokens: list[str]) -> dict[str, int]:
    """Vocabulary spelled in the byte alphabet; a token using other characters is respelled from its UTF-8."""
    alphabet = set(BYTE_LEVEL_CHARS)
    spell = {b: c for c, b in BYTE_LEVEL_CHARS.items()}
    return {(t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))): i
            for i, t in enumerate(tokens)}


def _byte_level_backend(meta: dict[str, Any]) -> tokenizers.Tokenizer:
    tokens, merges = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise ValueError("a gpt2 (byte-level BPE) GGUF tokenizer needs tokenizer.ggml.merges")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(
        vocab=_byte_level_vocab(tokens), merges=pairs, fuse_unk=False))
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre in PRE_TOKENIZER_SPLITS:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre in DIGIT_SPLIT_PRES:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend


def derive_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges implied by a scored vocabulary: every split of a token into two
    vocabulary pieces, best score first; ties as transformers orders them (longer left piece,
    then longer right piece, then vocabulary order), so both build the same tokenizer."""
    vocab = {t: i for i, t in enumerate(tokens)}
    found: list[tuple[str, str, float]] = []
    for token, score in dict(zip(tokens, scores)).items():
        local = [(token[:cut], token[cut:], score) for cut in range(1, len(token))
                 if token[:cut] in vocab and token[cut:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)  # stable under reverse
    return [(left, right) for left, right, _ in found]


def _sentencepiece_backend(meta: dict[str, Any]) -> tokenizers.Tokenizer:
    tokens = meta["tokenizer.ggml.tokens"]
    merges = meta.get("tokenizer.ggml.merges")
    if merges is not None:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    elif "tokenizer.ggml.scores" in meta:
        pairs = derive_merges(tokens, meta["tokenizer.ggml.scores"])
    else:
        raise ValueError("a llama (SentencePiece) GGUF tokenizer needs tokenizer.ggml.scores or merges")
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(
        vocab={t: i for i, t in enumerate(tokens)}, merges=pairs, fuse_unk=True, byte_fallback=True,
        unk_token=tokens[unk_id] if unk_id is not None else None))
    add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if add_prefix else "never", split=False)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)
    return backend


_BUILDERS = {"gpt2": _byte_level_backend, "llama": _sentencepiece_backend}


def _add_marked_tokens(backend: tokenizers.Tokenizer, meta: dict[str, Any], byte_level: bool) -> None:
    """Control tokens become special added tokens, user-defined ones plain added tokens, so both
    match whole in text. In a byte-level vocabulary a 'control' token spelled outside the byte
    alphabet is a converter mislabel and is left alone."""
    tokens, types = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type") or []
    alphabet = set(BYTE_LEVEL_CHARS)
    control = [AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, types)
               if kind == CONTROL and (not byte_level or set(t) <= alphabet)]
    if control:
        backend.add_special_tokens(control)
    vocab = backend.get_vocab()
    user = [AddedToken(t, special=False, normalized=False) for t, kind in zip(tokens, types)
            if kind == USER_DEFINED and t in vocab]
    if user:
        backend.add_tokens(user)


def _post_processor(meta: dict[str, Any], tokens: list[str], default_add_bos: bool) -> Any:
    """BOS/EOS added by `encode` exactly when the file's add_bos_token / add_eos_token say so."""
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", default_add_bos)) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if not add_bos and not add_eos:
        return None
    head = [f"{tokens[bos]}:0"] if add_bos else []
    tail = [f"{tokens[eos]}:0"] if add_eos else []
    specials = ([(tokens[bos], bos)] if add_bos else []) + ([(tokens[eos], eos)] if add_eos else [])
    return processors.TemplateProcessing(
        single=head + ["$A:0"] + tail, pair=head + ["$A:0"] + tail + head + ["$B:1"] + tail,
        special_tokens=list(dict.fromkeys(specials)))


def tokenizer_from_gguf(f: GGUFFile, chat_template: str | None = None) -> Tokenizer:
    """The model's Tokenizer from GGUF metadata; `chat_template` overrides the file's.

    ValueError for a tokenizer model other than gpt2 / llama, or a file without a vocabulary.
    """
    meta = f.metadata
    kind = meta.get("tokenizer.ggml.model")
    if kind not in _BUILDERS:
        raise ValueError(f"{f.path}: unsupported GGUF tokenizer model {kind!r}; supported: {', '.join(_BUILDERS)}")
    if "tokenizer.ggml.tokens" not in meta:
        raise ValueError(f"{f.path}: GGUF file has no tokenizer.ggml.tokens")
    tokens = meta["tokenizer.ggml.tokens"]
    backend = _BUILDERS[kind](meta)
    _add_marked_tokens(backend, meta, byte_level=kind == "gpt2")
    post = _post_processor(meta, tokens, default_add_bos=kind == "llama")
    if post is not None:
        backend.post_processor = post
    names = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
             "pad_token": "padding_token_id"}
    template_tokens = {name: tokens[meta[f"tokenizer.ggml.{key}"]] for name, key in names.items()
                       if f"tokenizer.ggml.{key}" in meta and 0 <= meta[f"tokenizer.ggml.{key}"] < len(tokens)}
    if kind == "gpt2":  # the template sees the text a token stands for, not its byte spelling
        template_tokens = {k: byte_level_bytes(v).decode("utf-8", errors="replace") if set(v) <= set(BYTE_LEVEL_CHARS)
                           else v for k, v in template_tokens.items()}
    template = chat_template if chat_template is not None else meta.get("tokenizer.chat_template")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    eot = meta.get("tokenizer.ggml.eot_token_id")
    return Tokenizer(
        backend, path=f.path, bos_token_id=bos,
        eos_token_ids=[i for i in (eos, eot) if i is not None],
        chat_templates={"default": template} if template else {},
        template_tokens=template_tokens,
    )
