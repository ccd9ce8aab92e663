"""Reading one field of a config.json: present, of its type, in range, or a ValueError naming it."""
from __future__ import annotations

import math
from typing import Any


def flag(cfg: dict[str, Any], name: str, default: bool) -> bool:
    """A true / false field (`default` when absent or null); ValueError for another value."""
    value = cfg.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_nonnegative_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def required(cfg: dict[str, Any], name: str) -> Any:
    if cfg.get(name) is None:
        raise ValueError(f"the required field {name} is missing")
    return cfg[name]


def optional(cfg: dict[str, Any], name: str, default: Any) -> Any:
    return default if cfg.get(name) is None else cfg[name]


def check_positive_number(name: str, value: object, nullable: bool = False) -> None:
    if nullable and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive number{' or null' if nullable else ''}, got {value!r}")
