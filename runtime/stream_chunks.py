"""Builds `generate_stream`'s cumulative chunks from RequestOutputs, on the consumer's side."""
from __future__ import annotations

from typing import Any, Callable

from radixflow.runtime.core.messages import RequestOutput
from radixflow.runtime.core.request import OutputOptions
from radixflow.runtime.result import logprob_triples
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.text.output_text import ClientText, OutputText


class StreamChunks:
    """One request's stream state: its output ids and text so far, grown by each RequestOutput.

    A chunk is SGLang's stream shape: cumulative `text` and `output_ids`, `meta_info` with only
    the logprob entries new since the previous chunk (input logprobs in the first). Several
    outputs that arrived together make one chunk. `incremental`: `text` and `output_ids` hold
    only what is new since the previous chunk (SGLang's --incremental-streaming-output shape;
    `completion_tokens` stays cumulative): a chunk then costs O(its new tokens), where the
    cumulative shape copies the whole output into every chunk. `interval`: outputs are held
    until that many new tokens since the previous chunk (the first output and the finish go at
    once). Loop thread only.

    `text`: the engine sends token ids only and the text is made here (a ClientText: both
    `generate_stream`s, in-process and through the core process); a stop string or regex it finds
    is handed to `end`, which ends the request in the engine with that reason. `done` once the
    request's last output was taken.
    """

    def __init__(self, rid: str, prompt_tokens: int, logprob: OutputOptions, decode: Any,
                 with_text: bool, interval: int = 1, text: ClientText | None = None,
                 end: Callable[[dict[str, Any]], None] | None = None, incremental: bool = False,
                 embed: bool = False) -> None:
        self.rid, self.prompt_tokens, self.logprob = rid, prompt_tokens, logprob
        self.decode, self.with_text, self.interval = decode, with_text, interval
        self.client_text, self.end, self.done = text, end, False
        self.incremental = incremental
        self.output_ids: list[int] = []  # cumulative only: the incremental shape keeps nothing
        self.text = ""
        self.num_output = 0
        self.num_logprobs = 0
        self.is_first = True
        self.embed = embed  # an embedding request's: every chunk carries `embedding` (None until computed)
        self._held: list[RequestOutput] = []
        self._held_tokens = 0

    @classmethod
    def for_stream(cls, tokenizer: Any, rid: str, ids: list[int], sp: SamplingParams, opts: OutputOptions,
                   default_interval: int, return_text_in_logprobs: bool, end: Callable[[dict[str, Any]], None],
                   incremental: bool, embed: bool = False) -> StreamChunks:
        """A `generate_stream`'s builder (Engine's and EngineClient's alike): its text made here
        from `tokenizer`, a stop it finds handed to `end`; `sp.stream_interval` or else
        `default_interval`."""
        decode = ((lambda token: tokenizer.decode([token], skip_special_tokens=False))
                  if return_text_in_logprobs else None)
        return cls(rid, len(ids), opts, decode, return_text_in_logprobs, sp.stream_interval or default_interval,
                   ClientText(OutputText(tokenizer, sp, ids)), end, incremental, embed)

    def add(self, outputs: list[RequestOutput]) -> dict[str, Any] | None:
        """Take outputs that arrived together: the chunk when one is due, else None (held)."""
        text = self.client_text
        if text is not None:
            stopped = text.stop is not None
            outputs = [text.apply(out) for out in outputs]
            if not stopped and text.stop is not None and self.end is not None:
                self.end(text.stop)
        self.done = outputs[-1].finish_reason is not None
        if self.interval == 1:
            return self.chunk(outputs)
        self._held.extend(outputs)
        self._held_tokens += sum(len(out.new_token_ids) for out in outputs)
        if self.is_first or outputs[-1].finish_reason is not None or self._held_tokens >= self.interval:
            held, self._held, self._held_tokens = self._held, [], 0
            return self.chunk(held)
        return None

    def chunk(self, outputs: list[RequestOutput]) -> dict[str, Any]:
        new_logprobs: list = []
        input_logprobs: list = []
        ids = [] if self.incremental else self.output_ids
        text = ""
        for out in outputs:
            ids.extend(out.new_token_ids)
            self.num_output += len(out.new_token_ids)
            text += out.text_delta
            new_logprobs.extend(out.new_logprobs)
            if out.input_logprobs is not None:
                input_logprobs = out.input_logprobs
        if not self.incremental:
            self.text += text
            ids, text = list(ids), self.text
        last = outputs[-1]
        meta: dict[str, Any] = {"id": self.rid, "finish_reason": last.finish_reason,
                                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.num_output,
                                "cached_tokens": last.cached_tokens}
        if last.finished_stats is not None:
            meta.update(last.finished_stats)
        if self.logprob.return_logprob:
            self._add_logprobs(meta, input_logprobs, new_logprobs)
        self.is_first = False
        chunk = {"text": text, "output_ids": ids, "meta_info": meta}
        if self.embed:
            chunk["embedding"] = last.embedding
        return chunk

    def _add_logprobs(self, meta: dict[str, Any], input_logprobs: list, new_logprobs: list) -> None:
        top = self.logprob.top_logprobs_num > 0
        if self.is_first:
            vals, tops = logprob_triples(input_logprobs, self.decode, self.with_text)
            meta["input_token_logprobs"] = vals
            if top:
                meta["input_top_logprobs"] = tops
        vals, tops = logprob_triples(new_logprobs, self.decode, self.with_text)
        self.num_logprobs += len(new_logprobs)
        meta["output_token_logprobs"] = vals
        meta["output_token_logprobs_length"] = self.num_logprobs
        if top:
            meta["output_top_logprobs"] = tops
