"""benchmarks/long_context_decode.py runs end to end at a small size and writes its JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "long_context_decode.py"


def test_long_context_decode_smoke(tmp_path):
    out = tmp_path / "lcd.json"
    subprocess.run([sys.executable, str(SCRIPT), "--context", "5000", "--short", "2", "--decode", "4", "--rounds", "1",
                    "--out", str(out)], check=True, timeout=600)
    doc = json.loads(out.read_text())
    assert doc["context"] == 5000 and doc["long_row_tokens"] == 4096
    assert set(doc["step_ms"]) == {"alone", "gathered", "native"} and all(v > 0 for v in doc["step_ms"].values())
    assert doc["same_tokens"] == {"gathered": 3, "native": 3}  # float32: each layout, each request the same tokens
