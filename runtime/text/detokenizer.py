"""Incremental detokenizer: the text of a growing token sequence, handed out as it completes."""
from __future__ import annotations

import codecs
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from radixflow.runtime.text.tokenizer import Tokenizer, byte_level_bytes, fallback_byte

log = logging.getLogger(__name__)

# The prompt matters to the first output tokens only through its tail (an unfinished UTF-8
# character or byte-fallback run, a leading-space rule), so the detokenizer is seeded with its
# last few tokens, widened back over tokens that continue a character: starting a request costs
# O(1) in its prompt length.
PREFIX_CONTEXT_TOKENS = 8
MAX_PREFIX_CONTEXT_TOKENS = 64


class _Stream(Protocol):
    """The per-request state of one decoder family."""

    def step(self, ids: Sequence[int]) -> str: ...
    def flush(self) -> str: ...


class _Plan(Protocol):
    """The per-tokenizer part (vocabulary tables), shared by all its requests."""

    def open(self, skip_special_tokens: bool) -> _Stream: ...

    def continues(self, token_id: int) -> bool:
        """Whether the token may continue a character begun by the tokens before it."""
        ...


class IncrementalDetokenizer:
    """Streams `tokenizer.decode(ids, skip_special_tokens)` while `ids` grows, one request at a time.

    Contract: for any split of an id sequence into steps,
    `"".join(step(chunk) for chunk in chunks) + flush() == tokenizer.decode(all_ids, ...)`,
    and no piece ends in a partial character: bytes of an unfinished UTF-8 character (or an
    unfinished run of sentencepiece byte-fallback tokens) wait for the tokens that finish them.
    `prefix_ids` (usually the prompt) are consumed for context only and never returned, so that
    e.g. a sentencepiece model's first generated word keeps its leading space; a character split
    between the prefix and the first step comes out whole in that step. Only their tail is read
    (PREFIX_CONTEXT_TOKENS, widened back over character continuations up to
    MAX_PREFIX_CONTEXT_TOKENS): the cost does not grow with the prompt.

    Each step costs O(new tokens) for ByteLevel, Metaspace and Replace/ByteFallback/Fuse/Strip
    decoders (the per-vocabulary tables are built once per tokenizer and shared). Any other
    decoder falls back to re-decoding the whole sequence each step, which is exact as long as
    decoding more tokens never rewrites earlier text. Not thread-safe: one instance per request.
    """

    def __init__(
        self, tokenizer: Tokenizer, skip_special_tokens: bool = True, prefix_ids: Sequence[int] = ()
    ) -> None:
        plan = _plan_for(tokenizer)
        self._stream = plan.open(skip_special_tokens)
        if prefix_ids:
            self._stream.step(prefix_ids[_context_start(plan, prefix_ids):])

    def step(self, new_ids: Sequence[int]) -> str:
        """Append `new_ids`; return only the text they complete (possibly "")."""
        return self._stream.step(new_ids)

    def flush(self) -> str:
        """End of the sequence: return whatever was held back, decoded as the full decode would."""
        return self._stream.flush()


class _ByteLevelStream:
    """ByteLevel decoders: bytes of all kept tokens, decoded as UTF-8 with U+FFFD for invalid bytes."""

    __slots__ = ("_table", "_utf8", "_holding")

    def __init__(self, table: list[bytes]) -> None:
        self._table = table  # token id -> decoder bytes, b"" for skipped ids
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._holding = False  # the decoder holds bytes of an unfinished character

    def step(self, ids: Sequence[int]) -> str:
        table, size = self._table, len(self._table)
        if len(ids) == 1:
            token_id = ids[0]
            data = table[token_id] if 0 <= token_id < size else b""
        else:
            data = b"".join([table[i] for i in ids if 0 <= i < size])
        if not self._holding and data.isascii():  # the common case, at C speed
            return data.decode("ascii")
        text = self._utf8.decode(data)
        self._holding = bool(self._utf8.getstate()[0])
        return text

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class _ByteLevelPlan:
    def __init__(self, tokenizer: Tokenizer) -> None:
        full = [byte_level_bytes(t) if (t := tokenizer.id_to_token(i)) is not None else b""
                for i in range(tokenizer.vocab_size)]
        kept = list(full)
        for token_id in tokenizer.special_token_ids:
            kept[token_id] = b""
        self._tables = {False: full, True: kept}

    def open(self, skip_special_tokens: bool) -> _Stream:
        return _ByteLevelStream(self._tables[skip_special_tokens])

    def continues(self, token_id: int) -> bool:
        table = self._tables[False]
        data = table[token_id] if 0 <= token_id < len(table) else b""
        return not data or 0x80 <= data[0] < 0xC0  # empty, or a UTF-8 continuation byte first


class _Stage(Protocol):
    """One step of a streamed decoder chain.

    `push` turns the items (token strings) of one step into output items, possibly holding some
    back; `flush` returns what it held. Stages after a Fuse (or ByteLevel) see one growing item.
    """

    def push(self, items: list[str]) -> list[str]: ...
    def flush(self) -> list[str]: ...


class _ReplaceStage:
    def __init__(self, pattern: str, content: str) -> None:
        self.pattern, self.content = pattern, content

    def push(self, items: list[str]) -> list[str]:
        return [item.replace(self.pattern, self.content) for item in items]

    def flush(self) -> list[str]:
        return []


class _StripStage:
    """Strip per item; after a Fuse, `left` leading characters of the whole text (stop must be 0)."""

    def __init__(self, content: str, left: int, right: int, fused: bool) -> None:
        self.content, self.left, self.right, self.fused = content, left, right, fused

    def push(self, items: list[str]) -> list[str]:
        if not self.fused:
            return [_strip(item, self.content, self.left, self.right) for item in items]
        out = []
        for item in items:
            while self.left and item:
                if item[0] != self.content:
                    self.left = 0
                    break
                item, self.left = item[1:], self.left - 1
            out.append(item)
        return out

    def flush(self) -> list[str]:
        return []


def _strip(item: str, content: str, left: int, right: int) -> str:
    start = 0
    while start < min(left, len(item)) and item[start] == content:
        start += 1
    stop = len(item)
    while len(item) - stop < right and stop > 0 and item[stop - 1] == content:
        stop -= 1
    return item[start:stop]


class _MetaspaceStage:
    """The metaspace becomes a space, except in item 0 where it is dropped (unless prepend is never)."""

    def __init__(self, replacement: str, drop_first: bool, fused: bool) -> None:
        self.replacement, self.drop_first, self.fused = replacement, drop_first, fused
        self.index = 0

    def push(self, items: list[str]) -> list[str]:
        out = []
        for item in items:
            first = self.fused or self.index == 0
            self.index += 1
            out.append(item.replace(self.replacement, "" if first and self.drop_first else " "))
        return out

    def flush(self) -> list[str]:
        return []


class _ByteFallbackStage:
    """Runs of "<0xNN>" tokens become their UTF-8 text, or one U+FFFD per byte if invalid."""

    def __init__(self) -> None:
        self.run = bytearray()

    def push(self, items: list[str]) -> list[str]:
        out: list[str] = []
        for item in items:
            byte = fallback_byte(item)
            if byte is not None:
                self.run.append(byte)
                continue
            out.extend(self.flush())
            out.append(item)
        return out

    def flush(self) -> list[str]:
        if not self.run:
            return []
        run, self.run = bytes(self.run), bytearray()
        try:
            return [run.decode("utf-8")]
        except UnicodeDecodeError:
            return ["\ufffd"] * len(run)


class _FuseStage:
    def push(self, items: list[str]) -> list[str]:
        return ["".join(items)] if items else []

    def flush(self) -> list[str]:
        return []


class _ByteLevelStage:
    def __init__(self) -> None:
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, items: list[str]) -> list[str]:
        return [self.utf8.decode(b"".join(byte_level_bytes(item) for item in items))]

    def flush(self) -> list[str]:
        return [self.utf8.decode(b"", final=True)]


class _JoinStage:
    """No decoder at all: the backend joins token strings with single spaces."""

    def __init__(self) -> None:
        self.started = False

    def push(self, items: list[str]) -> list[str]:
        out = []
        for item in items:
            out.append(" " + item if self.started else item)
            self.started = True
        return out

    def flush(self) -> list[str]:
        return []


class _Unsupported(Exception):
    """A decoder step this module cannot stream exactly."""


def _stage_factory(step: dict[str, Any], fused: bool) -> tuple[Callable[[], _Stage], bool]:
    """(factory of a fresh stage, whether its output is fused) for one decoder step."""
    kind = step.get("type")
    if kind == "Replace" and "String" in step.get("pattern", {}):
        pattern, content = step["pattern"]["String"], step["content"]
        if fused and len(pattern) != 1:
            raise _Unsupported("a multi-character Replace after Fuse")
        return (lambda: _ReplaceStage(pattern, content)), fused
    if kind == "Strip":
        if fused and step["stop"]:
            raise _Unsupported("a right Strip after Fuse")
        return (lambda: _StripStage(step["content"], step["start"], step["stop"], fused)), fused
    if kind == "Metaspace":
        drop_first = step.get("prepend_scheme", "always") != "never" and step.get("add_prefix_space", True)
        return (lambda: _MetaspaceStage(step["replacement"], drop_first, fused)), fused
    if kind == "ByteFallback" and not fused:
        return _ByteFallbackStage, False
    if kind == "Fuse":
        return _FuseStage, True
    if kind == "ByteLevel":
        return _ByteLevelStage, True
    raise _Unsupported(f"decoder step {kind}")


class _PipelineStream:
    __slots__ = ("_pieces", "_stages")

    def __init__(self, pieces: list[str | None], stages: list[_Stage]) -> None:
        self._pieces = pieces  # token id -> token string, None for skipped ids
        self._stages = stages

    def step(self, ids: Sequence[int]) -> str:
        pieces, size = self._pieces, len(self._pieces)
        items = [p for i in ids if 0 <= i < size and (p := pieces[i]) is not None]
        for stage in self._stages:
            items = stage.push(items)
        return "".join(items)

    def flush(self) -> str:
        items: list[str] = []
        for stage in self._stages:
            items = stage.push(items) + stage.flush()
        return "".join(items)


class _PipelinePlan:
    """Decoder chains built from Replace, Strip, Metaspace, ByteFallback, Fuse and ByteLevel steps."""

    def __init__(self, tokenizer: Tokenizer, steps: list[dict[str, Any]]) -> None:
        factories: list[Callable[[], _Stage]] = []
        fused = False
        for step in steps:
            factory, fused = _stage_factory(step, fused)
            factories.append(factory)
        if not steps:
            factories.append(_JoinStage)
        full = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
        kept = list(full)
        for token_id in tokenizer.special_token_ids:
            kept[token_id] = None
        self._factories = factories
        self._tables = {False: full, True: kept}

    def open(self, skip_special_tokens: bool) -> _Stream:
        stages = [factory() for factory in self._factories]
        return _PipelineStream(self._tables[skip_special_tokens], stages)

    def continues(self, token_id: int) -> bool:
        table = self._tables[False]
        piece = table[token_id] if 0 <= token_id < len(table) else None
        return piece is None or fallback_byte(piece) is not None  # a byte-fallback run may go on


class _RedecodeStream:
    """Fallback: decode everything each step and hand out the new, settled tail."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
        self._tokenizer, self._skip = tokenizer, skip_special_tokens
        self._ids: list[int] = []
        self._emitted_len = 0

    def step(self, ids: Sequence[int]) -> str:
        self._ids.extend(ids)
        settled = self._tokenizer.decode(self._ids, self._skip).rstrip("\ufffd")
        piece = settled[self._emitted_len:]
        self._emitted_len = max(self._emitted_len, len(settled))
        return piece

    def flush(self) -> str:
        piece = self._tokenizer.decode(self._ids, self._skip)[self._emitted_len:]
        self._emitted_len += len(piece)
        return piece


class _RedecodePlan:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    def open(self, skip_special_tokens: bool) -> _Stream:
        return _RedecodeStream(self._tokenizer, skip_special_tokens)

    def continues(self, token_id: int) -> bool:
        return False


def _context_start(plan: _Plan, prefix_ids: Sequence[int]) -> int:
    """First position of the prefix tail the detokenizer is seeded with."""
    n = len(prefix_ids)
    start, floor = max(0, n - PREFIX_CONTEXT_TOKENS), max(0, n - MAX_PREFIX_CONTEXT_TOKENS)
    while start > floor and plan.continues(prefix_ids[start]):
        start -= 1
    return start


_plans: weakref.WeakKeyDictionary[Tokenizer, _Plan] = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()


def _plan_for(tokenizer: Tokenizer) -> _Plan:
    """The shared per-tokenizer plan (vocabulary tables), built on first use."""
    with _plans_lock:
        plan = _plans.get(tokenizer)
    if plan is not None:
        return plan
    steps = tokenizer.decoder_steps()
    if [step.get("type") for step in steps] == ["ByteLevel"]:
        plan = _ByteLevelPlan(tokenizer)
    else:
        try:
            plan = _PipelinePlan(tokenizer, steps)
        except _Unsupported as e:
            log.warning("detokenizer: %s cannot be streamed; re-decoding every step (O(length))", e)
            plan = _RedecodePlan(tokenizer)
    with _plans_lock:
        return _plans.setdefault(tokenizer, plan)
