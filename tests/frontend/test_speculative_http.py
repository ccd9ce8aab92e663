"""`radixflow serve --speculative-algorithm ngram` over HTTP: a chat stream gives the whole
response's content, and the acceptance counters reach /metrics and meta_info."""
from __future__ import annotations

import json
import re

import httpx

from radixflow.frontend.server import create_app
from radixflow.runtime import EngineClient
from radixflow.runtime.model.demo import demo_model


def _counter(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_served_speculative_decoding(live_server):
    with EngineClient(demo_model("tiny"), dtype="float32", kv_cache_tokens=2048, speculative_algorithm="ngram",
                      speculative_ngram_min=1, check_invariants=True) as engine:
        server = live_server(create_app(engine, "tiny")).start()
        try:
            with httpx.Client(base_url=server.url, timeout=60) as c:
                native = c.post("/generate", json={"input_ids": [5, 6, 7, 5, 6, 7, 5, 6], "sampling_params": {
                    "temperature": 0, "max_new_tokens": 30, "ignore_eos": True}}).json()
                assert len(native["output_ids"]) == 30 and native["meta_info"]["spec_verify_ct"] > 0
                body = {"model": "tiny", "messages": [{"role": "user", "content": "a b a b a b a b"}],
                        "max_tokens": 40, "temperature": 0}
                whole = c.post("/v1/chat/completions", json=body).json()
                with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                    lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ") and ln != "data: [DONE]"]
                deltas = [json.loads(ln)["choices"][0]["delta"].get("content") or "" for ln in lines
                          if json.loads(ln)["choices"]]
                assert "".join(deltas) == whole["choices"][0]["message"]["content"]
                metrics = c.get("/metrics").text
            assert _counter(metrics, "radixflow_spec_decode_accepted_tokens_total") > 0
            assert _counter(metrics, "radixflow_spec_decode_draft_tokens_total") >= \
                _counter(metrics, "radixflow_spec_decode_accepted_tokens_total")
            assert engine.stats().kv_slots_used == 0
        finally:
            server.stop()
