"""Built-in demo model: a small random-weight Llama in Hugging Face format, generated deterministically.

The directory is what `radixflow serve` and the tests load when no real model is at hand:

    config.json             LlamaForCausalLM, fp32
    model.safetensors       random weights under Hugging Face Llama tensor names
    tokenizer.json          byte-level BPE trained on data/corpus.txt (shipped as data/demo_tokenizer.json)
    tokenizer_config.json   special tokens and a ChatML chat template
    generation_config.json  EOS = <|end_of_text|> and <|im_end|>

Every byte is a function of (size, DEMO_VERSION): bump the version when anything here changes, so
caches keyed by it never serve a stale model.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tokenizers

if TYPE_CHECKING:  # torch only where a model is written: `radixflow serve`'s API server finds it built
    import torch

DEMO_VERSION = 2
DATA_DIR = Path(__file__).resolve().parent / "data"
CORPUS_PATH = DATA_DIR / "corpus.txt"
TOKENIZER_PATH = DATA_DIR / "demo_tokenizer.json"

BOS, EOT, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (BOS, EOT, IM_START, IM_END, PAD)
NUM_TRAINED_TOKENS = 3067  # + 5 special tokens = 3072 ids

# ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, BOS first. Content may also be a
# list of OpenAI-style parts, of which the text parts are kept. Tools as Qwen2.5 writes them: listed
# in the system turn with the Hermes call format, an assistant's calls as <tool_call> blocks, and
# tool results as <tool_response> blocks in a user turn.
CHAT_TEMPLATE = (
    "{%- macro text(content) -%}\n"
    "{%- if content is string -%}{{- content -}}\n"
    "{%- elif content -%}{%- for part in content if part['type'] == 'text' -%}{{- part['text'] -}}{%- endfor -%}\n"
    "{%- endif -%}\n"
    "{%- endmacro -%}\n"
    "{{- bos_token -}}\n"
    "{%- if tools -%}\n"
    "{{- '<|im_start|>system\\n' -}}\n"
    "{%- if messages[0]['role'] == 'system' -%}{{- text(messages[0]['content']) + '\\n\\n' -}}{%- endif -%}\n"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}\n"
    "{%- for tool in tools -%}{{- '\\n' + tool | tojson -}}{%- endfor -%}\n"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- for message in messages -%}\n"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}\n"
    "{{- raise_exception('Unknown chat role: ' ~ message['role']) -}}\n"
    "{%- endif -%}\n"
    "{%- if message['role'] == 'tool' -%}\n"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + text(message['content']) + '\\n</tool_response><|im_end|>\\n' -}}\n"
    "{%- elif not (tools and loop.first and message['role'] == 'system') -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + text(message['content']) -}}\n"
    "{%- for call in message['tool_calls'] or [] -%}\n"
    "{%- set arguments = call['function']['arguments'] -%}\n"
    "{%- if message['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}\n"
    "{{- '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' -}}\n"
    "{{- (arguments if arguments is string else arguments | tojson) + '}\\n</tool_call>' -}}\n"
    "{%- endfor -%}\n"
    "{{- '<|im_end|>\\n' -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n"
)


@dataclass(frozen=True)
class DemoSpec:
    """Architecture and init scales of one demo size.

    Init: uniform weights (platform-independent with a seeded torch.Generator) with the given
    standard deviations; projections use 1/sqrt(fan_in) so every layer moves the residual
    stream by about as much as the embedding, which keeps greedy output context-dependent.
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    embed_std: float   # tied: small, so the layers (not the input token) dominate the logits
    lm_head_std: float  # untied only; logits spread ~ lm_head_std * sqrt(hidden_size)
    o_proj_gain: float  # o_proj std = gain / sqrt(fan_in); < 1 weakens context averaging
    final_norm_mean: float  # scales all logits; tied embeddings are small, so this restores the spread
    seed: int


SIZES: dict[str, DemoSpec] = {
    "tiny": DemoSpec(
        hidden_size=64, intermediate_size=176, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, tie_word_embeddings=False,
        embed_std=1.0, lm_head_std=0.5, o_proj_gain=1.0, final_norm_mean=1.0, seed=1234,
    ),
    "small": DemoSpec(
        hidden_size=768, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=4, head_dim=64, max_position_embeddings=4096, tie_word_embeddings=True,
        embed_std=0.05, lm_head_std=0.05, o_proj_gain=0.3, final_norm_mean=3.0, seed=5678,
    ),
}


def cache_dir() -> Path:
    """$RADIXFLOW_CACHE, else $XDG_CACHE_HOME/radixflow, else ~/.cache/radixflow: the folder of
    the native kernels' builds too (kernels/native.py's `cache_root`, which this equals).
    NOTE: not that function: importing radixflow.kernels imports torch and Triton, which the API
    server process, which looks the demo model up, does without."""
    if os.environ.get("RADIXFLOW_CACHE"):
        return Path(os.environ["RADIXFLOW_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "radixflow"


def demo_model(size: str = "tiny") -> str:
    """Path of the cached demo model directory `<cache>/demo-<size>-v<N>`, built on first use.

    Safe under concurrent callers: each builds in a private temp dir beside the target and
    renames it into place; the loser of a race discards its copy.
    """
    _spec(size)
    root = cache_dir()
    target = root / f"demo-{size}-v{DEMO_VERSION}"
    if target.is_dir():
        return str(target)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    os.chmod(staging, 0o755)  # mkdtemp makes it owner-only; the cache entry is ordinary data
    try:
        write_demo_model(size, str(staging))
        os.rename(staging, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def write_demo_model(size: str, out_dir: str | os.PathLike[str], spec: DemoSpec | None = None) -> str:
    """Write the demo model of `size` (or of a custom `spec`, for tests that need other shapes) into
    `out_dir` (created if missing); returns `out_dir` as a str."""
    spec = spec if spec is not None else _spec(size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_json = TOKENIZER_PATH.read_bytes()
    ids = _special_ids(tokenizer_json)
    vocab_size = max(ids.values()) + 1
    (out / "tokenizer.json").write_bytes(tokenizer_json)
    _write_json(out / "tokenizer_config.json", _tokenizer_config(spec, ids))
    generation = {"bos_token_id": ids[BOS], "eos_token_id": [ids[EOT], ids[IM_END]], "pad_token_id": ids[PAD]}
    _write_json(out / "generation_config.json", generation)
    _write_json(out / "config.json", _model_config(spec, vocab_size, ids))
    from safetensors.torch import save_file

    save_file(_init_weights(spec, vocab_size), str(out / "model.safetensors"), metadata={"format": "pt"})
    return str(out)


def _spec(size: str) -> DemoSpec:
    if size not in SIZES:
        raise ValueError(f"unknown demo model size {size!r}; choose one of {', '.join(SIZES)}")
    return SIZES[size]


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _special_ids(tokenizer_json: bytes) -> dict[str, int]:
    added = json.loads(tokenizer_json)["added_tokens"]
    ids = {token["content"]: token["id"] for token in added}
    missing = [t for t in SPECIAL_TOKENS if t not in ids]
    assert not missing, f"{TOKENIZER_PATH} lacks special tokens {missing}; run regenerate_demo_tokenizer()"
    return ids


def _tokenizer_config(spec: DemoSpec, ids: dict[str, int]) -> dict[str, Any]:
    added = {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": True} for t in SPECIAL_TOKENS}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": PAD,
        "added_tokens_decoder": added,
        "clean_up_tokenization_spaces": False,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }


def _model_config(spec: DemoSpec, vocab_size: int, ids: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "vocab_size": vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "torch_dtype": "float32",
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOT],
        "pad_token_id": ids[PAD],
        "use_cache": True,
    }


def _init_weights(spec: DemoSpec, vocab_size: int) -> dict[str, torch.Tensor]:
    """Hugging Face Llama state dict; `[out_features, in_features]` per projection, fp32."""
    import torch

    gen = torch.Generator().manual_seed(spec.seed)

    def uniform(shape: tuple[int, ...], std: float, mean: float = 0.0) -> torch.Tensor:
        # uniform(-a, a) has std a / sqrt(3); torch.rand draws the same values on every machine
        half_width = std * math.sqrt(3.0)
        return (torch.rand(shape, generator=gen) * 2.0 - 1.0) * half_width + mean

    h, q_dim = spec.hidden_size, spec.num_attention_heads * spec.head_dim
    kv_dim, inter = spec.num_key_value_heads * spec.head_dim, spec.intermediate_size
    weights = {"model.embed_tokens.weight": uniform((vocab_size, h), spec.embed_std)}
    for layer in range(spec.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        weights[prefix + "input_layernorm.weight"] = uniform((h,), 0.1, mean=1.0)
        weights[prefix + "self_attn.q_proj.weight"] = uniform((q_dim, h), h ** -0.5)
        weights[prefix + "self_attn.k_proj.weight"] = uniform((kv_dim, h), h ** -0.5)
        weights[prefix + "self_attn.v_proj.weight"] = uniform((kv_dim, h), h ** -0.5)
        weights[prefix + "self_attn.o_proj.weight"] = uniform((h, q_dim), spec.o_proj_gain * q_dim ** -0.5)
        weights[prefix + "post_attention_layernorm.weight"] = uniform((h,), 0.1, mean=1.0)
        weights[prefix + "mlp.gate_proj.weight"] = uniform((inter, h), h ** -0.5)
        weights[prefix + "mlp.up_proj.weight"] = uniform((inter, h), h ** -0.5)
        weights[prefix + "mlp.down_proj.weight"] = uniform((h, inter), inter ** -0.5)
    weights["model.norm.weight"] = uniform((h,), 0.1 * spec.final_norm_mean, mean=spec.final_norm_mean)
    if not spec.tie_word_embeddings:
        weights["lm_head.weight"] = uniform((vocab_size, h), spec.lm_head_std)
    return weights


def train_demo_tokenizer(corpus_path: str | os.PathLike[str] = CORPUS_PATH) -> tokenizers.Tokenizer:
    """Train the demo byte-level BPE on the corpus: 256 byte tokens + merges, then the 5 special tokens.

    The shipped data/demo_tokenizer.json is this function's output (see regenerate_demo_tokenizer);
    the model directory copies that file, so its bytes never depend on the installed trainer.
    """
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=NUM_TRAINED_TOKENS, min_frequency=1, show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train([str(corpus_path)], trainer)
    specials = [tokenizers.AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    tokenizer.add_special_tokens(specials)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = tokenizers.processors.Sequence([
        tokenizers.processors.ByteLevel(trim_offsets=False),
        tokenizers.processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS}:1 $B:1", special_tokens=[(BOS, bos_id)],
        ),
    ])
    return tokenizer


def regenerate_demo_tokenizer(out_path: str | os.PathLike[str] = TOKENIZER_PATH) -> str:
    """Retrain from data/corpus.txt and write the tokenizer JSON (default: the shipped file)."""
    text = train_demo_tokenizer().to_str(pretty=True) + "\n"
    Path(out_path).write_text(text, encoding="utf-8")
    return str(out_path)


if __name__ == "__main__":
    print(regenerate_demo_tokenizer())
