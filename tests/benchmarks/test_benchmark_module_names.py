"""A script run as `python benchmarks/x.py` puts benchmarks/ first on sys.path, so a file there
named like a package a dependency probes for shadows it: `benchmarks/kernels.py` once broke
transformers' import (it looks for the `kernels` package) in every benchmark that loads it."""
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_transformers_imports_with_benchmarks_first_on_the_path(tmp_path):
    pytest.importorskip("transformers")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from transformers import AutoModelForCausalLM, LlamaConfig; LlamaConfig()")
    done = subprocess.run([sys.executable, "-c", code, str(BENCHMARKS)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)  # the repository root would shadow `kernels` itself
    assert done.returncode == 0, done.stderr[-2000:]
