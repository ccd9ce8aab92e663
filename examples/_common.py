"""Shared by the examples: a backend on the default model (SmolLM2) and a prefix-cache hit report."""
from __future__ import annotations

import argparse

import radixflow.lang as rf


def backend_from_args(description: str) -> rf.Engine:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", default=None, help="model path (default: SmolLM2-135M-Instruct)")
    args = ap.parse_args()
    return rf.Engine(args.model)


def report_cache(backend: rf.Engine, before) -> dict:
    """Print and return the prefix-cache hits the program got (from the engine's counters)."""
    after = backend.engine.stats()
    hit = after.prefix_hit_tokens - before.prefix_hit_tokens
    query = after.prefix_query_tokens - before.prefix_query_tokens
    print(f"prefix cache: {hit} of {query} prompt tokens hit ({hit / max(query, 1):.0%})")
    return {"hit_tokens": hit, "query_tokens": query}
