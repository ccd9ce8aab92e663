"""benchmarks/engine_overhead.py runs end to end in --smoke mode (fake model runner) and writes its JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_overhead.py"


def test_engine_overhead_smoke(tmp_path):
    out = tmp_path / "eo.json"
    subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--only", "decode_step,prefix_ttft,blocked",
                    "--out", str(out)], check=True, timeout=600)
    doc = json.loads(out.read_text())
    for mode in ("generate", "generate_stream", "core_process"):
        assert doc["decode_step"][mode]["steps"] > 0 and doc["decode_step"][mode]["ms_per_step"] > 0
    ttft = doc["prefix_ttft"]
    assert ttft["cached_tokens"] == ttft["prefix_len"] and ttft["fake_runner"]["cached_prefix_ms"] > 0
    blocked = doc["blocked"]
    assert blocked["blocked"]["steps"] > 0 and blocked["none"]["steps"] > 0 and blocked["ratio"] > 0
