"""What every process of a server pays at start: torch, not torch._dynamo (2 s more to import on
two cores). Nothing on the serving path imports it: not the API server's modules, not building
an engine (random weights or a checkpoint), not a prefill over a cached prefix (the CPU extend's
causal mask)."""
from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
import radixflow.frontend.server
assert "torch._dynamo" not in sys.modules, "the API server's modules import torch._dynamo"
from radixflow.runtime import Engine, demo_model
shared = list(range(40, 80))
for model, kw in ((demo_model("tiny"), {}), (demo_model("tiny"), {"load_format": "dummy"})):
    with Engine(model, dtype="float32", kv_cache_tokens=1024, **kw) as engine:
        engine.generate(input_ids=shared + [5, 6], sampling_params={"max_new_tokens": 2})
        out = engine.generate(input_ids=shared + [7, 8, 9], sampling_params={"max_new_tokens": 2})
        assert out["meta_info"]["cached_tokens"] >= len(shared), out["meta_info"]
    assert "torch._dynamo" not in sys.modules, ("serving imported torch._dynamo", kw)
print("ok")
"""


def test_serving_never_imports_torch_dynamo():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
