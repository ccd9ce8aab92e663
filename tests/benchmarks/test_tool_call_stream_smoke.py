"""benchmarks/tool_call_stream.py runs end to end in --smoke mode: every format's call comes out
with exactly the arguments written, streamed and whole alike (the script checks), and it writes
its JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "tool_call_stream.py"


def test_tool_call_stream_smoke(tmp_path):
    out = tmp_path / "tool_call_stream.json"
    subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], check=True, timeout=300)
    doc = json.loads(out.read_text())
    assert {row["format"] for row in doc["rows"]} == {
        "hermes", "llama3_json", "mistral", "mistral_v11", "required", "named", "qwen3_coder", "glm45"}
    assert all(row["streamed_us_per_char"] > 0 and row["whole_us_per_char"] > 0 for row in doc["rows"])
