"""benchmarks/quantized_load.py runs end to end at the tiny shape and writes its JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "quantized_load.py"


def test_quantized_load_smoke(tmp_path):
    out = tmp_path / "quantized_load.json"
    subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], check=True, timeout=600)
    doc = json.loads(out.read_text())
    rows = doc["checkpoints"]
    assert set(rows) == {"bf16", "fp8_block128", "ct_int4_group64"} and doc["shape"] == "tiny"
    assert rows["ct_int4_group64"]["bytes"] < rows["fp8_block128"]["bytes"] < rows["bf16"]["bytes"]
    assert all(row["load_s"] > 0 for row in rows.values()) and rows["bf16"]["load_ratio_to_bf16"] == 1.0
