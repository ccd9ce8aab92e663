"""benchmarks/moe_cpu.py runs end to end in --smoke mode: both expert paths agree (the script
checks) and it writes its JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radixflow.runtime.model.packed_linear import can_prepack

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "moe_cpu.py"


@pytest.mark.skipif(not can_prepack(torch.device("cpu"), torch.bfloat16), reason="no oneDNN bf16 on this CPU")
def test_moe_cpu_smoke(tmp_path):
    out = tmp_path / "moe_cpu.json"
    subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], check=True, timeout=300)
    doc = json.loads(out.read_text())
    assert [row["tokens"] for row in doc["rows"]] == [1, 4, 16, 256]
    assert all(row["stacked_ms"] > 0 and row["packed_ms"] > 0 for row in doc["rows"])
