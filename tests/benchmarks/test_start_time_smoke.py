"""benchmarks/start_time.py: both servers start and answer, and the HTTP server process of the
default (core process) setup maps no libtorch."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "start_time.py"


def test_start_time_smoke(tmp_path):
    out = tmp_path / "st.json"
    subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], check=True, timeout=600)
    res = json.loads(out.read_text())["result"]
    assert res["rounds"] == 1 and set(res["runs"]) == {"this/process", "this/thread"}
    assert res["this/process"]["start_s"] > 0 and res["this/thread"]["start_s"] > 0
    if res["this/process"]["api_maps_libtorch"] is not None:  # /proc is there
        assert res["this/process"]["api_maps_libtorch"] is False and res["this/thread"]["api_maps_libtorch"] is True
