"""Constrained decoding: grammars (regex, JSON schema, choices) compiled to token automata.

Map of the package (the engine uses `GrammarCompiler`, `grammar_bitmask` and `advance`):

    spec.py         SamplingParams -> GrammarKey (kind, normalized text)
    vocab.py        the tokenizer byte by byte (TokenVocab); canonical tokenization of forced bytes
    backend.py      the interface: GrammarBackend -> CompiledGrammar -> Matcher; GrammarError
    outlines_backend.py / llguidance_backend.py   the two implementations
    worker.py       killable compile subprocesses for outlines-core (time and memory limits)
    cache.py        LRU of compiled grammars per key, bounded in count and bytes, in-flight dedupe
    compiler.py     GrammarCompiler: the engine-facing glue (caller threads)
    state.py        GrammarState per request, jump-forward plans, `advance` after each token
    mask.py         one batched int32 bitmask per step for the constrained rows

Kept free of imports so the compile worker process starts light.
"""
