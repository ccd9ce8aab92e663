"""A thinking model's reasoning, apart from its answer: the text it writes in a
`<think> ... </think>` block before the answer (the server's `--reasoning-parser`, the language's
`separate_reasoning`; frontend/reasoning.py makes it a chat message's `reasoning_content`).

    deepseek_r1     the template opens the block, so the output thinks from its first token (an
                    opening <think> it writes anyway is dropped); without </think> it is all
                    reasoning (an output cut while thinking)
    qwen3           reasoning only when the output opens with <think>; otherwise all content
                    (Qwen3 with enable_thinking false, or an answer without thinking)
    qwen3_thinking  as deepseek_r1 (Qwen3 thinking models, whose template opens the block)
    seed_oss        as qwen3, with Seed-OSS's tags <seed:think> ... </seed:think>
    gpt_oss         gpt-oss's harmony messages (runtime/text/harmony.py): the analysis channel
                    is reasoning, the others content; the text keeps its special tokens
    deepseek_v3     DeepSeek-V3.1: as deepseek_r1 when the template is told to think (`thinking`
                    true among its variables), else as qwen3: its template thinks only when asked
    kimi            Kimi's older ◁think▷ ... ◁/think▷ block, read as qwen3's
    kimi_k2         Kimi K2's <think> block, read as qwen3's, which also ends where a tool-call
                    section opens (K2 may call tools without closing it); the section is content

A parser is fed a choice's text as it is generated and returns events, `Thought` pieces and
content text; text that may still be a tag (`</thi`) is held back until it cannot be, and so is
whitespace at the block's edges, which is dropped (the newlines models write around the tags),
as is whitespace between `</think>` and the answer. Fed whole or in pieces, it gives the same
reasoning and content.
"""
from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"


def partial_tag(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that `text` ends with."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0

@dataclass(frozen=True)
class Format:
    """A reasoning format: its block's tags, and whether the output is in the block from its first
    token (the template opened it). `harmony`: gpt-oss's messages, whose markers are special
    tokens (the text keeps them; close_tag is where the answer opens)."""

    opened: bool
    open_tag: str = OPEN
    close_tag: str = CLOSE
    harmony: bool = False
    thinks_by_default: bool = True  # False: the template thinks only when its variables ask (DeepSeek-V3.1)
    ends_before: tuple[str, ...] = ()  # markers that also end the block, kept as the content's start (Kimi K2)


FORMATS = {"deepseek_r1": Format(True), "qwen3": Format(False), "qwen3_thinking": Format(True),
           "seed_oss": Format(False, "<seed:think>", "</seed:think>"),
           "gpt_oss": Format(False, "<|channel|>analysis<|message|>", "<|channel|>final<|message|>", harmony=True),
           "deepseek_v3": Format(True, thinks_by_default=False), "kimi": Format(False, "◁think▷", "◁/think▷"),
           "kimi_k2": Format(False, ends_before=("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>"))}
# SGLang spells them with dashes; vLLM calls gpt-oss's openai_gptoss; GLM-4.5's <think> block (SGLang's
# glm45) is read as qwen3's: thinking when the output opens with <think>
ALIASES = {**{name.replace("_", "-"): name for name in FORMATS}, "openai_gptoss": "gpt_oss", "glm45": "qwen3",
           "deepseek_v31": "deepseek_v3"}


def check_reasoning_parser(name: str | None, what: str = "--reasoning-parser") -> str | None:
    """The format `name` means (None: no parser); ValueError naming `what` (where the name was
    given) for an unknown one."""
    if name is None:
        return None
    name = ALIASES.get(name, name)
    if name not in FORMATS:
        raise ValueError(f"{what} must be one of {', '.join(FORMATS)}; got {name!r}")
    return name


def leaves_open(text: str, fmt: Format = FORMATS["qwen3"]) -> bool:
    """Whether `text` ends inside a block: its last opening tag is not closed after it."""
    return text.rfind(fmt.open_tag) > text.rfind(fmt.close_tag)


@dataclass(frozen=True)
class Thought:
    """A piece of the reasoning."""

    text: str


_START, _THINKING, _AFTER, _CONTENT = range(4)


class ReasoningParser:
    """One choice's text split into Thought pieces and content (see the module's docstring).
    `opened`: the output starts inside the block. `saw_block`: whether it was in one."""

    def __init__(self, opened: bool, fmt: Format = FORMATS["qwen3"]) -> None:
        self._opened, self._open, self._close = opened, fmt.open_tag, fmt.close_tag
        self._ends = fmt.ends_before
        self._state = _START
        self._held = ""  # text that may still be a tag, or whitespace at the block's end
        self._leading = False  # in the block, before its first character other than whitespace
        self.saw_block = False

    def feed(self, text: str) -> list[Thought | str]:
        out: list[Thought | str] = []
        text, self._held = self._held + text, ""
        while text:
            if self._state == _START:
                if text.startswith(self._open):
                    text = text[len(self._open):]
                    self._think()
                elif self._open.startswith(text):
                    self._held = text  # maybe the opening tag, not yet whole
                    break
                elif self._opened:
                    self._think()
                else:
                    self._state = _CONTENT
            elif self._state == _THINKING:
                end = text.find(self._close)
                before = min((at for at in (text.find(m) for m in self._ends) if at >= 0), default=-1)
                if before >= 0 and (end < 0 or before < end):  # a marker that ends the block and starts the content
                    out.append(Thought(self._lead(text[:before].rstrip())))
                    text, self._state = text[before:], _CONTENT
                    continue
                if end < 0:
                    keep = max(partial_tag(text, tag) for tag in (self._close, *self._ends))
                    body = text[:len(text) - keep]
                    shown = body.rstrip()
                    self._held = body[len(shown):] + text[len(text) - keep:]
                    text = shown
                    out.append(Thought(self._lead(text)))
                    break
                out.append(Thought(self._lead(text[:end].rstrip())))
                text = text[end + len(self._close):]
                self._state = _AFTER
            elif self._state == _AFTER:  # whitespace between </think> and the answer is dropped
                text = text.lstrip()
                if text:
                    self._state = _CONTENT
            else:
                out.append(text)
                text = ""
        return [e for e in out if (e.text if isinstance(e, Thought) else e)]

    def finish(self) -> list[Thought | str]:
        """What was held back: a partial tag at the end is text like any other."""
        held, self._held = self._held, ""
        if not held:
            return []
        if self._state == _START:
            self.saw_block = self._opened
            return [Thought(held) if self._opened else held]
        if self._state == _THINKING:
            text = self._lead(held.rstrip())
            return [Thought(text)] if text else []
        return [held]

    def _think(self) -> None:
        self._state, self.saw_block, self._leading = _THINKING, True, True

    def _lead(self, text: str) -> str:
        """Whitespace at the start of the block is dropped, up to its first other character."""
        if self._leading:
            text = text.lstrip()
            self._leading = not text
        return text


def reasoning_parser(name: str, opened: bool | None = None) -> ReasoningParser:
    """A fresh parser of format `name` (a FORMATS key) for one output; `opened` (default: the
    format's, where its template thinks by default) whether it starts inside the block. gpt_oss: harmony.HarmonyReasoning."""
    fmt = FORMATS[name]
    if fmt.harmony:
        from radixflow.runtime.text.harmony import HarmonyReasoning  # it imports this module

        return HarmonyReasoning()  # type: ignore[return-value]  # the same interface
    return ReasoningParser(fmt.opened and fmt.thinks_by_default if opened is None else opened, fmt)


def split_reasoning(text: str, name: str) -> tuple[str | None, str]:
    """A whole output's (reasoning, answer) under format `name` (a FORMATS key); reasoning None
    when the output had no block."""
    parser = reasoning_parser(name)
    events = parser.feed(text) + parser.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, Thought))
    return reasoning if parser.saw_block else None, "".join(e for e in events if isinstance(e, str))
