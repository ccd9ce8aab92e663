"""The small text and JSON files of a model directory, read with errors that name the file."""
from __future__ import annotations

import json
from typing import Any


def read_json_object(path: str) -> dict[str, Any]:
    """The JSON object file `path` holds; ValueError naming the file when it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def read_text(path: str) -> str:
    """A UTF-8 text file; ValueError naming the file when it is not UTF-8."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text: {e}") from e
