"""benchmarks/priority.py runs end to end at a small size and writes its JSON: with preemption
the urgent requests take running seats, and only then (how many depends on timing: a seat may
free first)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "priority.py"


def test_priority_smoke(tmp_path):
    out = tmp_path / "priority.json"
    subprocess.run([sys.executable, str(SCRIPT), "--max-num-seqs", "4", "--background", "8", "--background-tokens",
                    "64", "--urgent", "2", "--urgent-tokens", "4", "--gap-ms", "0", "--rounds", "1", "--out", str(out)],
                   check=True, timeout=300, cwd=tmp_path)
    result = json.loads(out.read_text())["result"]
    assert set(result) == {"off", "queue", "preempt"}
    assert 1 <= result["preempt"]["preemptions"] <= 2
    assert result["off"]["preemptions"] == result["queue"]["preemptions"] == 0
    for entry in result.values():
        assert 0 < entry["urgent_ttft_ms_median"] <= entry["urgent_ttft_ms_max"] and entry["background_s"] > 0
