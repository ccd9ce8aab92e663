"""Import arrows point one way: lang → (protocol), frontend → runtime + lang, runtime → radix + kernels."""
from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# package → project packages it may import (at any depth, lazily or not)
ALLOWED = {
    "radix": set(),
    "kernels": set(),
    "runtime": {"radix", "kernels"},
    "lang": {"runtime"},  # only lazily, for the in-process backend and the shared sampling params
    "frontend": {"runtime", "lang"},
}


def _project_imports(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "radixflow" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_one_way(package):
    bad = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, package)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                extra = _project_imports(path) - ALLOWED[package] - {package}
                if extra:
                    bad.append(f"{os.path.relpath(path, ROOT)} imports {sorted(extra)}")
    assert not bad, "\n".join(bad)


def _imported_modules(folder: str, top_level_only: bool) -> list[tuple[str, str]]:
    """(file name, module) for every import in the .py files below `folder` (only the module-level
    statements with `top_level_only`)."""
    found = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(), path)
            for node in tree.body if top_level_only else ast.walk(tree):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                found += [(f, m) for m in mods]
    return found


def test_lang_imports_runtime_only_lazily():
    """Module-level imports in lang/ never reach the runtime (importing lang loads no torch)."""
    bad = [f"{f}: {m}" for f, m in _imported_modules("lang", top_level_only=True) if m.startswith("radixflow.runtime")]
    assert not bad, bad


SERVER_SIDE = ("radixflow.runtime.text", "radixflow.runtime.core_client", "radixflow.runtime.stream_chunks",
               "radixflow.runtime.output_channel", "radixflow.runtime.request_inputs", "radixflow.frontend",
               "radixflow.lang")


def test_engine_core_imports_nothing_of_the_server_side():
    """runtime/core/ (what runs in the engine process) never imports text handling (prompt inputs
    included), the core's client, stream chunks or HTTP: the core works on token ids; text is the
    server side's."""
    bad = [f"{f}: {m}" for f, m in _imported_modules(os.path.join("runtime", "core"), top_level_only=False)
           if m.startswith(SERVER_SIDE)]
    assert not bad, bad
