"""@function: a program (a Python function whose first parameter is the state `s`) and how to run it."""
from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

from radixflow.lang import ir, params
from radixflow.lang.backend import resolve_backend
from radixflow.lang.context import ProgramContext
from radixflow.lang.executor import Run
from radixflow.lang.state import ProgramState
from radixflow.lang.surface import StateSurface


class Function:
    def __init__(self, fn: Callable[..., Any]) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        names = list(inspect.signature(fn).parameters)
        if not names:
            raise TypeError(f"{fn.__name__}: a program's first parameter is the state `s`")
        self.arg_names = names[1:]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Called with a state first (inside another program): run the body on that state.
        Otherwise the same as run()."""
        if args and isinstance(args[0], StateSurface):
            return self.fn(*args, **kwargs)
        return self.run(*args, **kwargs)

    def split_kwargs(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(program arguments, default sampling params for every gen): SGLang's run() accepts
        `temperature=0` and the like next to the program's own arguments."""
        program = {k: v for k, v in kwargs.items() if k in self.arg_names}
        rest = {k: v for k, v in kwargs.items() if k not in self.arg_names}
        defaults, extras = params.split_kwargs(rest, caller="run") if rest else ({}, {})
        if extras:
            raise TypeError(f"run() takes logprob options per gen(), not {sorted(extras)}")
        return program, defaults

    def run(self, *args: Any, backend: Any = None, stream: bool = False, **kwargs: Any) -> ProgramState:
        """Run the program; returns its state. With `stream=True` the body runs on a background
        thread and the state's text_iter() yields text as it is generated. A failure is carried
        by the state: `state.error()` returns it and reads raise ProgramError."""
        arguments, defaults = self.split_kwargs(kwargs)
        ctx = ProgramContext(backend=resolve_backend(backend), stream=stream, default_params=defaults)
        state = ProgramState(ctx, Run())
        state._run.begin()
        if stream:
            threading.Thread(target=self._run_body, args=(state, args, arguments),
                             name=f"rf-{self.__name__}", daemon=True).start()
        else:
            self._run_body(state, args, arguments)
            state.sync()
        return state

    def _run_body(self, state: ProgramState, args: tuple, arguments: dict[str, Any]) -> None:
        """Run the body on this thread (after `state._run.begin()`); failures go to the state."""
        state._run.enter_body()
        try:
            self.fn(state, *args, **arguments)
        except Exception as exc:  # carried by the state; every read re-raises it
            state._executor.fail(exc)
            state._ctx.stopped.set()  # streamed gens in flight close their streams (abort)
        finally:
            state._run.end_body()

    def run_batch(self, batch_kwargs: list[dict[str, Any]], *, backend: Any = None,
                  num_threads: int | str = "auto", progress_bar: bool = False,
                  **defaults: Any) -> list[ProgramState]:
        from radixflow.lang.batch import run_batch

        return run_batch(self, batch_kwargs, backend=backend, num_threads=num_threads,
                         progress_bar=progress_bar, **defaults)

    def trace(self, **bound: Any) -> ir.Program:
        """The program's IR; see radixflow.lang.trace.trace."""
        from radixflow.lang.trace import trace

        return trace(self, **bound)

    def submit(self, endpoint: Any, **kwargs: Any) -> dict[str, Any]:
        """Trace the program and run it next to the engine: POST {url}/v1/programs.

        String arguments travel as program arguments; other values (counts, flags) are fixed
        into the traced structure. Returns {"variables", "text", "meta"}.
        """
        from radixflow.lang.backends.http import Endpoint
        from radixflow.lang.trace import trace

        bound = {k: v for k, v in kwargs.items() if not isinstance(v, str)}
        arguments = {k: v for k, v in kwargs.items() if isinstance(v, str)}
        program = trace(self, **bound)
        if isinstance(endpoint, Endpoint):
            return endpoint.run_program(program, arguments)
        with Endpoint(endpoint) as target:
            return target.run_program(program, arguments)


def function(fn: Callable[..., Any] | None = None) -> Any:
    """Decorator: `@rf.function def prog(s, question): s += ...`."""
    if fn is None:
        return function
    return Function(fn)
