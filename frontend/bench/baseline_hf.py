"""The "transformers in a loop" baseline: `generate` over static, left-padded batches.

Requests are taken in waves: every request whose parent has finished is ready; ready requests
go in batches of `batch_size`, each batch decoding until its longest request is done (EOS
ignored, exactly max_new_tokens each, as the engine clients ask). Nothing is cached between
calls, and there is no streaming: a request's TTFT is not observable (reported as nan) and its
E2E counts from the start of the run (all requests arrive at once). Constrained requests run
unconstrained here (transformers has no grammar); their output length is capped the same.
"""
from __future__ import annotations

import math
import os
import time
from typing import Any

from radixflow.frontend.bench.metrics import RequestResult
from radixflow.frontend.bench.workloads import Workload


def load_model(path: str, dtype: str = "float32") -> Any:
    """A Hugging Face directory, or a GGUF file (transformers dequantizes it at load)."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    if path.endswith(".gguf"):
        return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                    **kwargs).eval()
    return AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()


def _generate(model: Any, prompts: list[list[int]], max_new: int, pad_id: int) -> list[list[int]]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])      # [batch, width]
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # [batch, width]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
                             do_sample=False, pad_token_id=pad_id)                # [batch, width + max_new]
    return [row[width:].tolist() for row in out]


def run_transformers(model: Any, workload: Workload, batch_size: int = 8,
                     pad_id: int = 0) -> tuple[list[RequestResult], list[list[int]], float]:
    """Same return shape as runner.run_workload."""
    reqs = workload.requests
    prompts: list[list[int] | None] = [None] * len(reqs)
    results: list[RequestResult | None] = [None] * len(reqs)
    t0 = time.perf_counter()
    while any(r is None for r in results):
        ready = [i for i, r in enumerate(reqs) if results[i] is None
                 and (r.parent is None or results[r.parent] is not None)]
        for start in range(0, len(ready), batch_size):
            batch = ready[start:start + batch_size]
            for i in batch:
                r = reqs[i]
                parent = [] if r.parent is None else prompts[r.parent] + results[r.parent].output_ids
                prompts[i] = parent + list(r.new_ids)
            outs = _generate(model, [prompts[i] for i in batch], max(reqs[i].max_new_tokens for i in batch), pad_id)
            now = time.perf_counter() - t0
            for i, out in zip(batch, outs):
                results[i] = RequestResult(len(prompts[i]), out[:reqs[i].max_new_tokens], math.nan, now, [], None)
    return results, prompts, time.perf_counter() - t0  # type: ignore[return-value]
