"""Whether a process on this host still runs, told apart from a later process given its pid."""
from __future__ import annotations

import os


def _proc_stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start(pid: int) -> bytes | None:
    """When process `pid` started (clock ticks since boot, from procfs), or None if unknown:
    with its pid, it names the process even after the pid is reused."""
    fields = _proc_stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def process_alive(pid: int, start: bytes | None = None) -> bool:
    """Whether process `pid` (on this host) still runs: not gone, not a zombie, and (given
    `start`, its `process_start`) not another process that was given the same pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        return True
    fields = _proc_stat(pid)
    if fields is None:
        return True  # no procfs: existing is all that is known
    return fields[0] != b"Z" and (start is None or process_start(pid) == start)
