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


def test_http_floor_smoke(tmp_path):
    """The bare ASGI server streams every token the client asks for (the script asserts the count)."""
    out = tmp_path / "floor.json"
    subprocess.run([sys.executable, str(SCRIPT.parent / "http_floor.py"), "--requests", "4", "--decode", "3",
                    "--repeats", "1", "--out", str(out)], check=True, timeout=300)
    doc = json.loads(out.read_text())
    assert [s["step_s"] for s in doc["settings"]] == [0.0, 0.005, 0.01]
    for setting in doc["settings"]:
        assert setting["tok_per_s"] > 0 and setting["server_cpu_s"] >= 0 and len(setting["runs"]) == 1


def test_engine_overhead_http_smoke(tmp_path):
    """The HTTP part: both servers, the floor and the in-process runs stream every token (the
    script asserts the counts); the burst's first-chunk times are reported for both sides."""
    out = tmp_path / "eo_http.json"
    subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--only", "http", "--http-decode", "3",
                    "--out", str(out)], check=True, timeout=600)
    doc = json.loads(out.read_text())
    http = doc["http"]
    assert doc["sizes"]["http_decode"] == http["decode_len"] == 3
    assert http["ratio"] > 0 and http["ratio_vs_inprocess_stream"] > 0
    assert http["inprocess_steps_per_run"] >= 3 and http["http_core_process_raw"]["steps_per_run"] >= 3
    for spread in (http["http_core_process_raw"]["first_chunk_ms"], http["inprocess_stream_first_chunk_ms"]):
        assert 0 < spread["median"] <= spread["last"]


def test_stream_shape_smoke(tmp_path):
    """benchmarks/stream_shape.py: every server answers every stream (the script checks the
    status) and the API server's CPU time is read for each (server, workload) pair."""
    out = tmp_path / "ss.json"
    subprocess.run([sys.executable, str(SCRIPT.parent / "stream_shape.py"), "--smoke", "--out", str(out)],
                   check=True, timeout=300)
    res = json.loads(out.read_text())["result"]
    for key in ("default/native", "incremental/native", "default/openai"):
        assert res[key]["events"] >= 4 and res[key]["api_cpu_s"] >= 0 and res[key]["wall_s"] > 0
    assert res["default/whole"]["events"] == 4  # one answer per request
