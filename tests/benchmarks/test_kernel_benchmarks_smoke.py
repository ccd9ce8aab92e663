"""benchmarks/attention_kernels.py and benchmarks/engine_decode.py run end to end in --smoke mode and write their JSON."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    # scripts, not a package: load by path, under a name that cannot clash with radixflow's `kernels`
    spec = importlib.util.spec_from_file_location(f"radixflow_bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_kernels_smoke(tmp_path):
    bench = _load("attention_kernels")
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "kernels.json").read_text())
    rows = doc["rows"]
    assert doc["meta"]["smoke"] and doc["meta"]["copy_peak_gbps"] > 0
    assert not [r for r in rows if "error" in r or "skipped" in r]
    impls = {(r["kind"], r["impl"]) for r in rows}
    assert {("decode", "ours"), ("decode", "ours_fp8"), ("decode", "torch_ref"), ("decode", "sdpa"),
            ("decode", "gather_sdpa"), ("extend", "ours"), ("extend", "ours_fp8"), ("extend", "sdpa"),
            ("decode_splits", "ours")} <= impls
    checked = [r for r in rows if "max_abs_err" in r]
    assert checked and all(r["max_abs_err"] < 1e-3 for r in checked)  # fp32 smoke shapes: ours == SDPA
    assert all(r["ms"] > 0 and math.isfinite(r["kv_gbps"]) for r in rows)
    assert "decode" in (tmp_path / "kernels_summary.txt").read_text()


def test_engine_decode_smoke(tmp_path):
    bench = _load("engine_decode")
    assert bench.main(["--smoke", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "engine_decode.json").read_text())
    rows = result["rows"]
    # graphs off first, then on (both eager on CPU), then overlap on
    assert [(r["batch"], r["overlap"]) for r in rows] == [(1, False), (1, False), (3, False), (3, True)]
    assert list(result["meta"]["overlap_speedup"]) == ["3"] and result["meta"]["overlap_speedup"]["3"] > 0
    for r in rows:
        assert r["decode_tokens"] == r["batch"] * (r["decode_len"] - 1)  # every token after the first
        assert r["decode_tok_per_s"] > 0 and r["preemptions"] == 0


def test_cpu_prefill_smoke(tmp_path, monkeypatch):
    from radixflow.kernels import native

    monkeypatch.setenv(native.ENV_SWITCH, "1")
    if native.library() is None:
        assert native._compiler() is None, "a C compiler is on PATH: the native kernels must build"
        pytest.skip("no C compiler: nothing to compare")
    bench = _load("cpu_prefill")
    out = tmp_path / "cpu_prefill.json"
    assert bench.main(["--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (row,) = result["kernel"]
    assert row["native_ms"] > 0 and row["torch_ms"] > 0
    assert row["max_abs_diff"] < 2e-2  # bf16 outputs of the same attention
    assert [r["op"] for r in result["elementwise"]] == ["rmsnorm+residual", "rope", "silu_mul"]
    assert all(r["native_ms"] > 0 and r["torch_ms"] > 0 for r in result["elementwise"])


def test_cpu_linear_smoke(tmp_path, monkeypatch):
    from radixflow.kernels import native, native_layers

    monkeypatch.setenv(native.ENV_SWITCH, "1")
    import torch

    if not native_layers.linear_supports(torch.zeros(16, 2, dtype=torch.bfloat16)):
        pytest.skip("the native linear kernel does not build here (no AVX512-BF16)")
    bench = _load("cpu_linear")
    out = tmp_path / "cpu_linear.json"
    assert bench.main(["--rows", "1,7", "--layers", "1", "--rounds", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["rows"] for r in rows] == [1, 7]
    assert all(r[f"{side}_{part}_ms"] > 0 for r in rows for side in ("native", "onednn") for part in ("layers", "head"))


def test_fused_layers_ab_smoke(tmp_path):
    """Both paths on the tiny model, equal greedy tokens checked by the script; exit 1 when the
    fused path was not taken (no AVX512-BF16 projections here): then skipped."""
    import subprocess
    import sys

    from radixflow.kernels import native, native_layers

    lib = native.library()
    if lib is None or not lib.linear_lanes() or not native_layers.sum_lanes():
        pytest.skip("the fused forward needs the native kernels with AVX512-BF16")
    out = tmp_path / "fused_layers_ab.json"
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "fused_layers_ab.py"
    subprocess.run([sys.executable, str(script), "--model", "tiny", "--smoke", "--rounds", "2", "--decode", "4",
                    "--out", str(out)], check=True, timeout=600)
    doc = json.loads(out.read_text())
    assert doc["fused_path_taken"] and doc["same_greedy_tokens"]
    assert set(doc["results"]) == {"2x40", "turn", "prefill"}
    assert all(len(r["ms_runs"][side]) == 2 and r["ms"][side] > 0 for r in doc["results"].values()
               for side in ("fused", "layers"))
