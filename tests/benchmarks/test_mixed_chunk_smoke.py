"""benchmarks/mixed_chunk.py runs end to end at a small size on the tiny model and writes its JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mixed_chunk.py"


def test_mixed_chunk_smoke(tmp_path):
    out = tmp_path / "mixed_chunk.json"
    subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny", "--dtype", "float32", "--smoke", "--rounds", "1",
                    "--out", str(out)], check=True, timeout=600)
    doc = json.loads(out.read_text())
    mixed, plain = doc["settings"]["mixed"], doc["settings"]["prefill_first"]
    # the arrivals' 3 x 96 tokens in chunks of 32 take 9 steps; mixing runs the decode rows in them
    assert mixed["steps"] < plain["steps"]
    assert mixed["gap_p50_ms"] > 0 and plain["gap_max_ms"] >= plain["gap_p50_ms"]
    assert doc["same_outputs"] == "7/7"  # float32: both settings give every request the same tokens
