"""LoRA serving under concurrency: load / unload / replace racing requests of the adapters."""
from __future__ import annotations

import shutil
import threading

import pytest

from lora_adapters import ATTN, write_adapter
from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model

GREEDY = {"max_new_tokens": 8, "temperature": 0.0}
PROMPT = "the river ran a small cat sat"


@pytest.fixture(scope="module")
def model():
    return demo_model("tiny")


@pytest.fixture(scope="module")
def adapters(model, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return [write_adapter(str(root / f"a{i}"), model, rank=8, targets=ATTN, seed=10 + i) for i in range(3)]


def test_n_samples_of_one_request_run_on_the_weights_it_asked_for(model, adapters, monkeypatch):
    """An n > 1 request resolves its adapter once: a replace while its samples are being
    submitted cannot give some samples the old weights and others the new ones."""
    with Engine(model, dtype="float32", lora_modules=[f"x={adapters[0]}", f"new={adapters[1]}"]) as eng:
        old = eng.generate(PROMPT, GREEDY, lora="x")["output_ids"]
        new = eng.generate(PROMPT, GREEDY, lora="new")["output_ids"]
        assert old != new
        submit, submitted = eng.loop.submit, []

        def replace_after_the_first_sample(req) -> None:
            submit(req)
            submitted.append(req)
            if len(submitted) == 2:  # the prefill, then one sample: x gets new weights now
                eng.load_lora_adapter("x", adapters[1])
        monkeypatch.setattr(eng.loop, "submit", replace_after_the_first_sample)
        samples = eng.generate(PROMPT, {**GREEDY, "n": 3}, lora="x")
        monkeypatch.undo()
        assert [s["output_ids"] for s in samples] == [old] * 3
        assert eng.generate(PROMPT, GREEDY, lora="x")["output_ids"] == new
        eng.check_accounting()
        assert eng.loras.capacity.pins == {}


def test_unloads_between_overlapped_steps_never_strand_a_finished_request(model, adapters):
    """With overlap scheduling an unload drains the step in flight before dropping the adapter's
    KV; a request that the drain finished is answered (it was left undelivered, its caller hung)."""
    with Engine(model, dtype="float32", enable_overlap=True, check_invariants=True,
                lora_modules=[f"a={adapters[0]}"]) as eng:
        want = eng.generate(PROMPT, GREEDY, lora="a")["output_ids"]
        stop, errors, outs = threading.Event(), [], []

        def generate() -> None:
            try:
                while not stop.is_set():
                    outs.append(eng.generate(PROMPT, GREEDY, lora="a")["output_ids"])
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        def churn() -> None:
            try:
                for i in range(60):
                    eng.load_lora_adapter("b", adapters[1 + i % 2])
                    eng.unload_lora_adapter("b")
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                stop.set()
        threads = [threading.Thread(target=generate, daemon=True) for _ in range(2)]
        threads.append(threading.Thread(target=churn, daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        assert not any(t.is_alive() for t in threads), "a request was never answered"
        assert errors == [] and outs and all(o == want for o in outs)
        eng.check_accounting()
        assert eng.stats().invariant_violations == 0 and eng.loras.capacity.pins == {}


def test_a_reread_racing_a_reload_of_the_same_path_keeps_the_reload(model, adapters, tmp_path, monkeypatch):
    """A name whose weights left host memory is read again from disk by its next request; when
    the name is reloaded (same path, new file) while that read runs, the reload wins: later
    requests get the new weights, not the stale content the slower read found."""
    path = str(tmp_path / "a")
    shutil.copytree(adapters[0], path)
    with Engine(model, dtype="float32", max_cpu_loras=1,
                lora_modules=[f"a={path}", f"b={adapters[1]}", f"new={adapters[2]}"]) as eng:
        new = eng.generate(PROMPT, GREEDY, lora="new")["output_ids"]
        old = eng.generate(PROMPT, GREEDY, lora="a")["output_ids"]
        assert old != new
        eng.generate(PROMPT, GREEDY, lora="b")  # a's weights leave host memory
        read, reg = eng.loras.registry._read, eng.loras.registry

        def reload_during_the_read(p: str):
            adapter = read(p)
            if p == path:  # the request's re-read found the old file; now it is replaced and reloaded
                monkeypatch.setattr(reg, "_read", read)
                shutil.rmtree(path)
                shutil.copytree(adapters[2], path)
                eng.load_lora_adapter("a", path)
            return adapter
        monkeypatch.setattr(reg, "_read", reload_during_the_read)
        assert eng.generate(PROMPT, GREEDY, lora="a")["output_ids"] in (old, new)
        assert eng.generate(PROMPT, GREEDY, lora="a")["output_ids"] == new
        eng.check_accounting()
        assert eng.loras.capacity.pins == {}
