"""Request inputs checked and turned into token ids before a request reaches the engine core."""
from __future__ import annotations

import functools
import re
from typing import Annotated

import msgspec

from radixflow.runtime.config import EngineConfig
from radixflow.runtime.sampling_params import RequestOptions, SamplingParams, check_priority
from radixflow.runtime.text.tokenizer import Tokenizer

Prompt = str | list[str] | None
InputIds = list[int] | list[list[int]] | None
INPUT_IDS_SHAPE = "input_ids must be a non-empty list of ints or a list of such lists"


def normalize_inputs(tokenizer: Tokenizer, prompt: Prompt, input_ids: InputIds) -> tuple[list[list[int]], bool]:
    """The prompts as token id lists, and whether a list of prompts was given."""
    if (prompt is None) == (input_ids is None):
        raise ValueError("give exactly one of prompt (text) and input_ids")
    if prompt is not None:
        if isinstance(prompt, str):
            return [encode_text(tokenizer, prompt)], False
        if not isinstance(prompt, list) or not prompt or not all(isinstance(p, str) for p in prompt):
            raise ValueError(f"prompt must be a string or a non-empty list of strings, got {_kind(prompt)}")
        return [encode_text(tokenizer, p) for p in prompt], True
    if not isinstance(input_ids, list):
        raise ValueError(f"{INPUT_IDS_SHAPE}, got {_kind(input_ids)}")
    # The shape only, from the first item (a flat prompt's every id is type-checked by
    # check_prompt, which each prompt goes through, in the same C-level pass as its range).
    if input_ids and not isinstance(input_ids[0], list):
        return [list(input_ids)], False
    if input_ids and all(isinstance(x, list) for x in input_ids):
        return [list(x) for x in input_ids], True
    raise ValueError(INPUT_IDS_SHAPE)


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """`text`'s token ids; ValueError for a string that is not Unicode text (a lone surrogate)."""
    try:
        return tokenizer.encode(text)
    except TypeError:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"the prompt is not valid Unicode text: {exc}") from None
        raise


def _kind(value: object) -> str:
    return type(value).__name__


def check_options(rid: object = None, **options: object) -> None:
    """ValueError naming the keyword when a generate call's option has the wrong type (checked
    against RequestOptions' declarations; `rid`: a string, or a list of them for a batch)."""
    try:
        msgspec.convert(options, RequestOptions)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid request option: {exc}") from None
    rids = rid if isinstance(rid, list) else [rid]
    if not all(r is None or isinstance(r, str) for r in rids):
        raise ValueError(f"rid must be a string, or a list of strings for a batch; got {rid!r}")


def check_priority_use(priority: object, config: EngineConfig) -> None:
    """ValueError for a request's `priority` the engine does not take: not an integer of at
    most 2^62 in size, or given to an engine without priority scheduling that refuses it
    (`abort_on_priority_when_disabled`; otherwise it is ignored, as SGLang does)."""
    check_priority(priority)
    if priority is not None and config.abort_on_priority_when_disabled and not config.enable_priority_scheduling:
        raise ValueError("priority is given but this engine does not schedule by priority "
                         "(start it with --enable-priority-scheduling)")


def check_hidden_states_use(return_hidden_states: object, config: EngineConfig) -> None:
    """ValueError for `return_hidden_states` asked of an engine that does not serve it."""
    if return_hidden_states is True and not config.enable_return_hidden_states:
        raise ValueError("return_hidden_states is asked but this engine does not return hidden states "
                         "(start it with --enable-return-hidden-states)")


def stream_inputs(tokenizer: Tokenizer, prompt: str | None, input_ids: list[int] | None,
                  sampling_params: dict | SamplingParams | None) -> tuple[list[int], SamplingParams]:
    """generate_stream's one prompt as token ids and its sampling parameters (n = 1)."""
    prompts, is_batch = normalize_inputs(tokenizer, prompt, input_ids)
    if is_batch:
        raise ValueError("generate_stream takes one prompt, not a list")
    sp = SamplingParams.from_dict(sampling_params)
    if sp.n != 1:
        raise ValueError("generate_stream supports n=1; start n streams instead")
    return prompts[0], sp


def check_prompt(ids: list[int], sp: SamplingParams, vocab: int, max_context_len: int, kv_capacity: int) -> None:
    """ValueError with the reason when a prompt can never be served by an engine of that shape."""
    if not ids:
        raise ValueError("the prompt is empty")
    try:  # types and range in one C-level pass: no Python runs per prompt token
        msgspec.convert(ids, _token_ids_type(vocab))
    except msgspec.ValidationError as e:
        at = re.search(r"\$\[(\d+)\]", str(e))
        bad = ids[int(at.group(1))] if at else None
        if type(bad) is int:
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab})") from None
        raise ValueError(f"{INPUT_IDS_SHAPE} (got {type(bad).__name__} {bad!r})") from None
    if sp.stop_token_ids and max(sp.stop_token_ids) >= vocab:
        raise ValueError(f"sampling_params.stop_token_ids holds {max(sp.stop_token_ids)}, outside the vocabulary "
                         f"[0, {vocab})")
    biased = max(sp.logit_bias_ids, default=-1)
    if biased >= vocab:
        raise ValueError(f"sampling_params.logit_bias holds token id {biased}, outside the vocabulary [0, {vocab})")
    generates = sp.max_new_tokens > 0
    limit = max_context_len - (1 if generates else 0)
    if len(ids) > limit:
        raise ValueError(f"the prompt has {len(ids)} tokens but max_model_len is {max_context_len}"
                         + (f" (at most {limit} prompt tokens when generating)" if generates else ""))
    if len(ids) >= kv_capacity:
        raise ValueError(f"the prompt has {len(ids)} tokens but the KV cache holds only {kv_capacity}")


@functools.lru_cache(maxsize=8)
def _token_ids_type(vocab: int) -> type:
    return list[Annotated[int, msgspec.Meta(ge=0, lt=vocab)]]


def check_embed(embed: bool, sp: SamplingParams) -> None:
    """An embedding request samples nothing: ValueError unless its sampling is prefill-only."""
    if not isinstance(embed, bool):
        raise ValueError(f"embed must be true or false, got {embed!r}")
    if embed and sp.max_new_tokens != 0:
        raise ValueError(f"an embedding request generates no tokens: max_new_tokens must be 0, got {sp.max_new_tokens}")
