"""Engine runs the model-family tests share (imported by name: tests/runtime is on sys.path): one
set of requests through the engine's attention paths, against transformers' greedy tokens, or the
Triton path (in the interpreter) against the torch one."""
from __future__ import annotations

import torch

from radixflow.runtime import Engine
from test_model_parity import _hf_greedy  # noqa: E402

SHARED = [5, 77, 300, 12, 9, 9, 41, 7, 3, 88, 19, 5, 77, 300]
# two requests on a shared prefix (the second reuses the first's cache) and one apart
PROMPTS = [SHARED + [2, 17], SHARED + [250, 9, 250, 9], [901, 44, 2, 17, 17, 250, 9]]
WARM = [5, 77, 300, 12, 9, 9, 41, 7, 3, 88, 19]
BATCH = [WARM + [2, 17], [901, 44, 2, 17, 17, 250, 9]]


def assert_greedy_as_transformers(model_dir: str, hf, sampling: dict, inspect=None, **options) -> None:
    """PROMPTS' greedy tokens through an engine of `options` (the first alone, then the other two on
    its cached prefix) equal transformers'; `inspect(engine)` first, where given."""
    with Engine(model_dir, kv_cache_tokens=2048, dtype="float32", **options) as engine:
        if inspect is not None:
            inspect(engine)
        first = engine.generate(input_ids=PROMPTS[0], sampling_params=sampling)
        rest = engine.generate(input_ids=PROMPTS[1:], sampling_params=sampling)
        assert rest[0]["meta_info"]["cached_tokens"] >= len(SHARED) - 1  # the prefix was reused
    for prompt, out in zip(PROMPTS, [first, *rest]):
        assert out["output_ids"] == _hf_greedy(hf, prompt, sampling["max_new_tokens"])


def assert_triton_as_torch(model_dir: str, monkeypatch, sampling: dict, max_new_tokens: int, warm=WARM,
                           batch=BATCH, chunked_prefill_size: int = 8) -> None:
    """`batch` after `warm` (so it extends over a cached prefix) through the model as CUDA runs it
    (FORCE_TRITON_OPS and the Triton attention, in the interpreter) gives the torch path's greedy
    tokens and logprobs."""
    from radixflow.runtime.model import model

    runs = []
    for triton in (False, True):
        monkeypatch.setattr(model, "FORCE_TRITON_OPS", triton)
        backend = "triton" if triton else "torch"
        with Engine(model_dir, device="cpu", dtype="float32", kv_cache_tokens=512,
                    chunked_prefill_size=chunked_prefill_size, attention_backend=backend) as engine:
            engine.generate(input_ids=warm, sampling_params={**sampling, "max_new_tokens": 1})
            outs = engine.generate(input_ids=batch, return_logprob=True,
                                   sampling_params={**sampling, "max_new_tokens": max_new_tokens})
        runs.append(([o["output_ids"] for o in outs],
                     [[lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]] for o in outs]))
    assert runs[1][0] == runs[0][0]
    torch.testing.assert_close(torch.tensor(runs[1][1]), torch.tensor(runs[0][1]), rtol=1e-4, atol=1e-4)
