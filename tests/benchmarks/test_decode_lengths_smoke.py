"""benchmarks/decode_lengths.py runs end to end at a small size (this checkout only) and writes its JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_lengths.py"


def test_decode_lengths_smoke(tmp_path):
    out = tmp_path / "decode_lengths.json"
    subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny", "--dtype", "float32", "--smoke", "--rounds", "1",
                    "--decode", "6", "--out", str(out)], check=True, timeout=600)
    doc = json.loads(out.read_text())
    assert set(doc["shapes"]) == {"equal", "spread", "shared"} and doc["dtype"] == "torch.float32"
    assert doc["shapes"]["shared"]["lengths"] == [56] * 3  # 48 shared + 8 own tokens each
    for shape in doc["shapes"].values():
        assert shape["step_ms"]["this"] > 0 and "baseline" not in shape["step_ms"]
    assert Path(doc["packages"]["this"], "kernels", "torch_decode.py").is_file()
