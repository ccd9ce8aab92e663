"""radixflow.lang: the frontend language. Programs of several generation calls, run locally or traced to an IR.

    import radixflow.lang as rf

    @rf.function
    def qa(s, question):
        s += rf.user(question)
        s += rf.assistant(rf.gen("answer", max_tokens=64))

    state = qa.run(question="...", backend=rf.Engine())

Importing this package imports no runtime code (no torch); `Engine` and `Endpoint` load theirs
when first used.
"""
from __future__ import annotations

import importlib
from typing import Any

from radixflow.lang.backend import Backend, BackendError, get_default_backend, set_default_backend
from radixflow.lang.executor import ProgramError
from radixflow.lang.expr import Expr, TraceError
from radixflow.lang.function import Function, function
from radixflow.lang.interpreter import Limits, ProgramTimeout, execute, validate_ir
from radixflow.lang.primitives import gen, gen_int, gen_string, if_, select, separate_reasoning
from radixflow.lang.roles import (
    assistant, assistant_begin, assistant_end, system, system_begin, system_end, user, user_begin, user_end,
)
from radixflow.lang.select_scoring import (
    greedy_token_selection, token_length_normalized, unconditional_likelihood_normalized,
)
from radixflow.lang.state import ProgramState
from radixflow.lang.trace import trace

_LAZY = {"Engine": "radixflow.lang.backends.engine", "Endpoint": "radixflow.lang.backends.http"}

__all__ = [
    "Backend", "BackendError", "Endpoint", "Engine", "Expr", "Function", "Limits", "ProgramError", "ProgramTimeout",
    "ProgramState", "TraceError", "assistant", "assistant_begin", "assistant_end", "execute",
    "function", "gen", "gen_int", "gen_string", "get_default_backend", "greedy_token_selection",
    "if_", "select", "separate_reasoning", "set_default_backend", "system", "system_begin", "system_end",
    "token_length_normalized", "trace", "unconditional_likelihood_normalized", "user",
    "user_begin", "user_end", "validate_ir",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'radixflow.lang' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
