"""Constrained decoding: grammars (regex, JSON schema, choices, EBNF, structural tags) compiled to token automata.

Map of the package (the engine uses `GrammarCompiler`, `grammar_bitmask` and `advance`):

    spec.py         SamplingParams -> GrammarKey (kind, normalized text)
    vocab.py        the tokenizer byte by byte (TokenVocab); canonical tokenization of forced bytes
    backend.py      the interface: GrammarBackend -> CompiledGrammar -> Matcher; GrammarError
    outlines_backend.py / llguidance_backend.py   the two implementations (EBNF, structural tags: llguidance only)
    integer_range.py / number_range.py   JSON-schema bounds as exact regexes (outlines-core ignores them)
    json_routing.py JSON schemas outlines-core would cut (free nesting, $ref cycles): to llguidance
    structural_tag.py  structural tags (free text, tagged JSON at triggers) checked, and as Lark grammars
    worker.py       killable compile subprocesses for outlines-core (time and memory limits)
    cache.py        LRU of compiled grammars per key, bounded in count and bytes, in-flight dedupe
    compiler.py     GrammarCompiler: the engine-facing glue (caller threads)
    state.py        GrammarState per request, jump-forward plans, `advance` after each token
    mask.py         one batched int32 bitmask per step for the constrained rows

Decisions:
- Compilation happens in the caller's thread (`Engine.generate`, or an executor thread for
  `generate_stream`) before the request is submitted, so a failure or a timeout is a ValueError
  (HTTP 400) and the engine loop never waits; a request not yet compiled is simply not queued.
- outlines-core builds run in killable worker processes (worker.py explains why and what was
  measured); llguidance builds run on a thread (its own fuel limits bound them).
- Context-free grammars (`ebnf`) and structural tags compile with llguidance whatever
  `grammar_backend` says: outlines-core has none, and routing one kind elsewhere costs one more
  backend object (built on the first such request); without the package they are a ValueError
  naming the extra.
- JSON schemas outlines-core would cut (json_routing.py says which) compile with llguidance when
  the package is installed and outlines-core is the backend, unless one of their bounds is one
  llguidance gets wrong; a schema llguidance refuses, and every schema without the package,
  compiles on outlines-core as before. The cache key holds the backend a schema was routed to.
- JSON compiles compact (no optional whitespace) so the bytes between values are forced.
- Jump-forward and pinning: runs of forced bytes are tokenized the tokenizer's way; with
  `jump_forward` the tokens are appended without sampling (one extend step), without it each
  step's mask allows only the next of them. Token sequences, hence greedy outputs, are the
  same either way (what differs is the number of forward steps, and at temperature > 0 the
  random draws consumed). The last token of a run is held back unless the run ends the grammar.
- Regexes follow the backend's syntax (Rust `regex`, where backslash-d is any Unicode digit).

Kept free of imports so the compile worker process starts light.
"""
