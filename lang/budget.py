"""Budget: what one running program may still spend (characters held, wall-clock time), shared by its fork branches."""
from __future__ import annotations

import threading
import time


class ProgramTimeout(RuntimeError):
    """The program ran past its deadline (limit deadline_s)."""


class Budget:
    """Counts the characters a run holds as they grow (its text, fork copies, variables) and
    checks its deadline. Thread-safe: every fork branch of one program charges the same budget.
    `spend` raises ValueError past `max_text_chars`; `check_deadline` raises ProgramTimeout."""

    def __init__(self, max_text_chars: int | None = None, deadline_s: float | None = None) -> None:
        self.max_text_chars = max_text_chars
        self.deadline = None if deadline_s is None else time.monotonic() + deadline_s
        self.deadline_s = deadline_s
        self.chars = 0
        self._lock = threading.Lock()

    def spend(self, num_chars: int) -> None:
        if self.max_text_chars is None:
            return
        with self._lock:
            self.chars += num_chars
            used = self.chars
        if used > self.max_text_chars:
            raise ValueError(f"the program's text grew past {self.max_text_chars} characters "
                             f"(limit max_text_chars)")

    def check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise ProgramTimeout(f"the program ran longer than {self.deadline_s} s (limit deadline_s)")


UNLIMITED = Budget()
