"""Engine configuration: one frozen declaration that the CLI and the HTTP server derive from."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any

import msgspec

from radixflow.runtime.model.quant_config import FLAG_METHODS
from radixflow.runtime.sampling_params import check_priority

SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs")
DTYPES = ("auto", "float32", "float16", "bfloat16")
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")
ATTENTION_BACKENDS = ("auto", "triton", "torch")
DEVICES = ("auto", "cpu", "cuda")
LOAD_FORMATS = ("auto", "dummy")
GRAMMAR_BACKENDS = ("outlines", "llguidance")
SPECULATIVE_ALGORITHMS = ("none", "ngram")
MAX_DRAFT_TOKENS = 16  # drafts per request per step, and the longest n-gram looked up
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# fused module (Phi-3's checkpoints) -> its parts: an adapter on it is served as one on each part
FUSED_LORA_TARGETS: dict[str, tuple[str, ...]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
                                                  "gate_up_proj": ("gate_proj", "up_proj")}


QUANTIZATION_FLAGS = (*FLAG_METHODS, "gguf")  # --quantization: a safetensors method's name, or a GGUF file


def lora_parts(module: str) -> tuple[str, ...]:
    """The modules an adapter target stands for: a fused one's parts, else itself."""
    return FUSED_LORA_TARGETS.get(module, (module,))


def _opt(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    """A config field whose help text (and choices) the CLI reads from metadata."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class EngineConfig:
    """User-facing engine settings. Validated on construction; never mutated afterwards."""

    model: str | None = _opt(None, "Hugging Face model directory, GGUF file, or directory holding one .gguf (absent: SmolLM2-135M-Instruct).")
    load_format: str = _opt("auto", "Weights: auto = the model's safetensors; dummy = random, from config.json alone (benchmarks).", LOAD_FORMATS)
    dtype: str = _opt("auto", "Weight and activation dtype; auto = bfloat16 on CPUs with native bf16 (AVX512-BF16 / AMX), else float32; on CUDA the checkpoint's (bfloat16 for float32 checkpoints).", DTYPES)
    device: str = _opt("auto", "Where the model runs; auto = cuda when available.", DEVICES)
    seed: int = _opt(0, "Seed for sampling of requests that give no seed of their own.")
    max_model_len: int | None = _opt(None, "Longest context (prompt + output) in tokens; default: the model's, at most 262144.")
    kv_cache_tokens: int | None = _opt(None, "KV pool size in tokens (default on CPU: from --cpu-kv-cache-bytes, at most 65536; on CUDA: from --mem-fraction).")
    mem_fraction: float = _opt(0.85, "Fraction of total GPU memory the engine may use (weights + KV pool).")
    kv_cache_dtype: str = _opt("auto", "KV cache storage: auto = the model dtype; fp8_e4m3 halves the bytes.", KV_CACHE_DTYPES)
    quantization: str | None = _opt(None, "The method the checkpoint is quantized with (vLLM's and SGLang's flag: fp8, fbgemm_fp8, modelopt, compressed-tensors, gptq, awq, their _marlin names, gguf); read from the checkpoint's quantization_config anyway, so this only checks it. Quantized weights are dequantized at load; float weights are not quantized.")
    max_num_seqs: int = _opt(256, "Most requests running in one batch.")
    max_prefill_tokens: int = _opt(8192, "Most new prompt tokens in one prefill step.")
    chunked_prefill_size: int = _opt(2048, "Split longer prompts into chunks of this many tokens (<= 0: never chunk).")
    enable_mixed_chunk: bool = _opt(False, "Mixed steps: a prefill step also decodes every running request (one forward), so running requests get a token in every step while prompts arrive or prefill in chunks; the decode tokens come out of the step's --max-prefill-tokens budget (at most half of it).")
    schedule_policy: str = _opt("lpm", "Order of waiting requests: longest prefix match, DFS weight, or arrival.", SCHEDULE_POLICIES)
    enable_priority_scheduling: bool = _opt(False, "Serve requests by their `priority` (SGLang's flag): the waiting queue is ordered by priority first, then by --schedule-policy, and a waiting request that cannot be admitted takes the place of running ones of lower priority (see --priority-scheduling-preemption-threshold). Larger values first unless --schedule-low-priority-values-first.")
    schedule_low_priority_values_first: bool = _opt(False, "With priority scheduling: smaller `priority` values are served first (vLLM's convention) instead of larger ones.")
    priority_scheduling_preemption_threshold: int = _opt(10, "With priority scheduling: a waiting request preempts a running one only when its priority is more than this much higher.")
    disable_priority_preemption: bool = _opt(False, "With priority scheduling: order the queue by priority but never preempt a running request for it.")
    default_priority_value: int | None = _opt(None, "The priority of a request that gives none (unset: 0).")
    abort_on_priority_when_disabled: bool = _opt(False, "Without priority scheduling: refuse a request that gives a `priority` (HTTP 400) instead of ignoring it.")
    enable_return_hidden_states: bool = _opt(False, "Serve `return_hidden_states` (SGLang's flag): such a request's meta_info holds the final hidden state (after the model's last norm) of every position it fed the model. Its prompt is computed in full (no cached prefix: the cache keeps KV, not hidden states), it runs outside CUDA graphs and overlap, and is not drafted for. Without the flag such a request is a 400.")
    lpm_fcfs_threshold: int = _opt(128, "Past this many waiting requests lpm falls back to fcfs (matching costs grow).")
    disable_radix_cache: bool = _opt(False, "Keep no KV between requests (every prompt is prefilled in full).")
    attention_backend: str = _opt("auto", "Attention kernels; auto = triton on CUDA, torch on CPU. Env: RADIXFLOW_ATTENTION_BACKEND.", ATTENTION_BACKENDS)
    disable_cuda_graph: bool = _opt(False, "Run decode steps eagerly instead of replaying captured CUDA graphs.")
    cuda_graph_max_bs: int = _opt(256, "Largest decode batch captured in a CUDA graph.")
    enable_overlap: bool = _opt(False, "Overlap scheduling: while the device (on CPU a worker thread) runs decode step N, process step N-1's tokens; steady decode only (rows with a grammar, penalties, logprobs or a seed are sampled by the loop once their previous token is appended). Off by default: tested on CPU only, not yet validated on a GPU.")
    stream_interval: int = _opt(1, "Streaming sends a chunk every this many new tokens (the first token and the end at once); larger: fewer, bigger events and less server CPU per token. A request's sampling_params.stream_interval overrides it.")
    max_queued_requests: int = _opt(4096, "Requests waiting beyond the running batch are rejected past this (HTTP 429); with priority scheduling a request that outranks a waiting one takes its place instead.")
    grammar_backend: str = _opt("outlines", "Constrained decoding backend.", GRAMMAR_BACKENDS)
    grammar_timeout_s: float = _opt(10.0, "Longest time one grammar may take to compile before the request is rejected.")
    jump_forward: bool = _opt(True, "Append forced grammar continuations without sampling.")
    speculative_algorithm: str = _opt("none", "Speculative decoding. ngram: prompt lookup, with no draft model: a running request whose last tokens occurred earlier in its prompt or output gets the tokens that followed as drafts, all checked in one step, so a step may append several tokens; requests without grammar, penalties, logit bias, logprobs or a seed (others decode as usual beside them); a greedy output is the one plain decoding gives, a sampled one is distributed as plain sampling's. Not with --enable-overlap; tested on CPU only.", SPECULATIVE_ALGORITHMS)
    speculative_num_draft_tokens: int = _opt(4, "Most drafts per request per step (ngram).")
    speculative_ngram_min: int = _opt(3, "Shortest suffix of a request's tokens looked up for drafts (ngram).")
    speculative_ngram_max: int = _opt(4, "Longest suffix looked up; the longest that occurred before wins (ngram).")
    speculative_max_batch: int = _opt(8, "Drafts are proposed only while at most this many requests run: a drafted row computes its drafts too, which pays where a step is bound by reading the weights (small batches), not where it is bound by arithmetic.")
    slo_ttft_ms: float | None = _opt(None, "Goodput SLO: time to first token in ms (unset: not checked).")
    slo_itl_ms: float | None = _opt(None, "Goodput SLO: a request's mean inter-token latency in ms (unset: not checked).")
    slo_e2e_ms: float | None = _opt(None, "Goodput SLO: end-to-end latency in ms (unset: not checked).")
    check_invariants: bool = _opt(False, "After every step, check slot accounting, slot ownership and the radix tree; log and count violations (tests, soaks).")
    cpu_kv_cache_bytes: int = _opt(512 << 20, "KV pool byte budget on CPU when --kv-cache-tokens is not given.")
    chat_template: str | None = _opt(None, "Jinja chat template file replacing the model's own.")
    enable_lora: bool = _opt(False, "Serve LoRA adapters (implied by --lora-modules and --lora-dir).")
    lora_modules: tuple[str, ...] = _opt((), "LoRA adapters to load at start, as NAME=PATH (PEFT directories).")
    lora_dir: str | None = _opt(None, "Directory that adapter paths must lie under; enables the load/unload routes and lora_path given as a path.")
    max_loras: int = _opt(4, "Adapters resident on the device at once (slots allocated at start).")
    max_lora_rank: int = _opt(16, "Largest adapter rank the slots hold.")
    max_loras_per_batch: int | None = _opt(None, "Most distinct adapters in one batch (default: max_loras).")
    max_cpu_loras: int | None = _opt(None, "Adapters whose weights stay in host memory, least recently used dropped first (default: all loaded).")
    lora_target_modules: str | None = _opt(None, "Comma-separated modules the slots cover (default: all of " + ",".join(LORA_TARGET_MODULES) + "; qkv_proj and gate_up_proj mean their parts).")

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_modules", tuple(self.lora_modules))  # a CLI list, normalized once
        object.__setattr__(self, "speculative_algorithm", self.speculative_algorithm.lower())  # SGLang's NGRAM
        self._check_lora()
        self._check_speculative()
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise ValueError(f"{f.name}={getattr(self, f.name)!r} is not one of {', '.join(choices)}")
        positive = ("max_num_seqs", "max_prefill_tokens", "max_queued_requests", "cuda_graph_max_bs", "stream_interval")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.quantization is not None and self.quantization not in QUANTIZATION_FLAGS:
            raise ValueError(f"quantization={self.quantization!r} is not one of {', '.join(QUANTIZATION_FLAGS)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < 16:
            raise ValueError(f"kv_cache_tokens must be >= 16, got {self.kv_cache_tokens}")
        if not 0.0 < self.mem_fraction <= 1.0:
            raise ValueError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        for name in ("slo_ttft_ms", "slo_itl_ms", "slo_e2e_ms"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 (or unset), got {getattr(self, name)}")
        if self.grammar_backend == "llguidance" and importlib.util.find_spec("llguidance") is None:
            raise ValueError("grammar_backend='llguidance' needs the llguidance package: "
                             "pip install 'radixflow[llguidance]' (or use grammar_backend='outlines')")
        if self.cpu_kv_cache_bytes < 1 << 20:
            raise ValueError(f"cpu_kv_cache_bytes must be >= 1 MiB (1048576), got {self.cpu_kv_cache_bytes}")
        if self.priority_scheduling_preemption_threshold < 0:
            raise ValueError(f"priority_scheduling_preemption_threshold must be >= 0, got "
                             f"{self.priority_scheduling_preemption_threshold}")
        for name in ("priority_scheduling_preemption_threshold", "default_priority_value"):
            check_priority(getattr(self, name), name)
        if not self.grammar_timeout_s > 0:  # NaN too
            raise ValueError(f"grammar_timeout_s must be > 0, got {self.grammar_timeout_s}")

    @property
    def lora_enabled(self) -> bool:
        return self.enable_lora or bool(self.lora_modules) or self.lora_dir is not None

    @property
    def lora_targets(self) -> frozenset[str]:
        if self.lora_target_modules is None:
            return frozenset(LORA_TARGET_MODULES)
        names = [m.strip() for m in self.lora_target_modules.split(",") if m.strip()]
        return frozenset(part for m in names for part in lora_parts(m))

    def _check_speculative(self) -> None:
        for name in ("speculative_num_draft_tokens", "speculative_ngram_min", "speculative_ngram_max"):
            if not 1 <= getattr(self, name) <= MAX_DRAFT_TOKENS:
                raise ValueError(f"{name} must be in [1, {MAX_DRAFT_TOKENS}], got {getattr(self, name)}")
        if self.speculative_ngram_min > self.speculative_ngram_max:
            raise ValueError(f"speculative_ngram_min ({self.speculative_ngram_min}) must be <= "
                             f"speculative_ngram_max ({self.speculative_ngram_max})")
        if self.speculative_max_batch < 1:
            raise ValueError(f"speculative_max_batch must be >= 1, got {self.speculative_max_batch}")
        if self.speculative_algorithm != "none" and self.enable_overlap:
            raise ValueError("speculative_algorithm and enable_overlap cannot be combined: an overlapped "
                             "step is launched before the tokens drafts would follow are known")

    def _check_lora(self) -> None:
        for name in ("max_loras", "max_lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_loras_per_batch is not None and not 1 <= self.max_loras_per_batch <= self.max_loras:
            raise ValueError(f"max_loras_per_batch must be in [1, max_loras={self.max_loras}], got {self.max_loras_per_batch}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < 1:
            raise ValueError(f"max_cpu_loras must be >= 1 (or unset), got {self.max_cpu_loras}")
        unknown = sorted(self.lora_targets - set(LORA_TARGET_MODULES))
        if unknown or not self.lora_targets:
            raise ValueError(f"lora_target_modules has unknown modules {unknown}; known: "
                             f"{', '.join(LORA_TARGET_MODULES + tuple(FUSED_LORA_TARGETS))}")
        for item in self.lora_modules:
            if not isinstance(item, str) or "=" not in item or not item.split("=", 1)[0] or not item.split("=", 1)[1]:
                raise ValueError(f"lora_modules entries must be NAME=PATH, got {item!r}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Build from keyword arguments, rejecting unknown names with the list of known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown engine config option(s) {unknown}; known: {sorted(known)}")
        paths = {k: os.fspath(v) for k, v in kwargs.items() if isinstance(v, os.PathLike)}
        try:  # each value's type checked against its field (then __post_init__'s range checks)
            return msgspec.convert({**kwargs, **paths}, cls)
        except msgspec.ValidationError as exc:
            raise ValueError(f"engine config: {exc}") from None
