"""Slot residency: pinned adapters are never evicted, idle ones go least recently used first,
and a request over the per-batch adapter cap waits (can_admit False) instead of failing."""
from __future__ import annotations

import pytest
import torch

from lora_adapters import ATTN, write_adapter
from radixflow.runtime import Engine
from radixflow.runtime.core.request import Req
from radixflow.runtime.lora.adapter import load_adapter
from radixflow.runtime.lora.capacity import AdapterCapacity
from radixflow.runtime.lora.slots import LoraSlots
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.model.model_config import load_model_args
from radixflow.runtime.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    model = demo_model("tiny")
    args = load_model_args(model)
    root = tmp_path_factory.mktemp("cap")
    adapters = [load_adapter(write_adapter(str(root / f"a{i}"), model, rank=4, targets=ATTN, seed=i), args, 8,
                             frozenset(ATTN)) for i in range(4)]
    return args, adapters


def _req(adapter) -> Req:
    req = Req(rid=str(id(adapter)), prompt_ids=[1], sampling=SamplingParams())
    req.lora = adapter
    return req


def test_pinned_adapters_stay_and_idle_ones_go_lru(loaded):
    args, (a, b, c, d) = loaded
    slots = LoraSlots(args, frozenset(ATTN), 2, 8, torch.float32, torch.device("cpu"))
    cap = AdapterCapacity(slots, 2)
    ra, rb = _req(a), _req(b)
    cap.acquire(ra)
    cap.acquire(rb)
    assert {ra.lora_id, rb.lora_id} == {0, 1}
    assert not cap.can_admit(_req(c))          # both slots pinned: c waits
    assert cap.can_admit(_req(a))              # a is in the batch already
    cap.release(rb)                            # b idle, a still pinned
    assert cap.can_admit(_req(c))
    rc = _req(c)
    cap.acquire(rc)
    assert rc.lora_id == 1 and slots.holder[ra.lora_id] == a.namespace  # b's slot reused, a kept
    cap.release(ra)
    cap.release(rc)
    rd = _req(d)
    cap.acquire(rd)                            # least recently released (a) goes first
    assert rd.lora_id == 0 and set(slots.holder) == {c.namespace, d.namespace}
    assert cap.num_slot_loads == 4


def test_base_requests_and_the_per_batch_cap(loaded):
    args, (a, b, _, _) = loaded
    cap = AdapterCapacity(LoraSlots(args, frozenset(ATTN), 3, 8, torch.float32, torch.device("cpu")), 1)
    base = Req(rid="base", prompt_ids=[1], sampling=SamplingParams())
    cap.acquire(base)
    assert base.lora_id == -1 and cap.can_admit(base)
    cap.acquire(_req(a))
    assert not cap.can_admit(_req(b)) and cap.can_admit(base)  # cap 1: b waits, base does not


def test_client_fields_never_name_the_base_namespace(tmp_path):
    model = demo_model("tiny")
    path = write_adapter(str(tmp_path / "a"), model, rank=4)
    with Engine(model, lora_modules=[f"a={path}"]) as eng:
        for bad in ("", None.__class__.__name__):
            with pytest.raises(ValueError):
                eng.generate("hi", {"max_new_tokens": 1}, lora=bad)
        ns = eng.loras.registry.resolve("a")[1].namespace
        assert ns.startswith("lora:") and len(ns) == len("lora:") + 64
        with pytest.raises(ValueError, match="unknown LoRA adapter"):  # a namespace is not a name
            eng.generate("hi", {"max_new_tokens": 1}, lora=ns)


def test_unloaded_while_pinned_frees_at_the_last_release_unless_loaded_again(loaded):
    args, (a, b, c, _) = loaded
    slots = LoraSlots(args, frozenset(ATTN), 3, 8, torch.float32, torch.device("cpu"))
    names = {a.namespace, b.namespace, c.namespace}  # what the registry has loaded
    cap = AdapterCapacity(slots, 3, names.__contains__)
    r1, r2, rb = _req(a), _req(a), _req(b)
    for r in (r1, r2, rb):
        cap.acquire(r)
    names.discard(a.namespace)
    cap.forget(a.namespace)                       # unloaded while two requests use it
    assert slots.holder[r1.lora_id] == a.namespace
    assert cap.release(r1) is None                # r2 still uses it
    assert cap.release(r2) == a.namespace         # the last one: the caller drops its KV
    assert cap.num_resident == 1 and a.namespace not in slots.holder
    names.discard(b.namespace)
    cap.forget(b.namespace)
    names.add(b.namespace)                        # loaded again before rb finished
    assert cap.release(rb) is None and cap.num_resident == 1
    rc = _req(c)                                  # queued when c is unloaded: it holds no slot yet
    names.discard(c.namespace)
    cap.forget(c.namespace)
    cap.acquire(rc)                               # admitted afterwards: runs with its adapter
    assert cap.release(rc) == c.namespace and c.namespace not in slots.holder


def test_slots_exist_before_the_kv_pool_is_sized(monkeypatch):
    """On CUDA the KV pool takes mem_fraction minus what is allocated: the adapter slots must
    be allocated by then, or they land outside the budget."""
    from radixflow.runtime.core import model_runner

    events: list[str] = []
    real_slots, real_tokens = model_runner.LoraSlots, model_runner.kv_pool_tokens

    def slots(*args, **kwargs):
        events.append("slots")
        return real_slots(*args, **kwargs)

    def tokens(*args, **kwargs):
        events.append("kv")
        return real_tokens(*args, **kwargs)
    monkeypatch.setattr(model_runner, "LoraSlots", slots)
    monkeypatch.setattr(model_runner, "kv_pool_tokens", tokens)
    with Engine(demo_model("tiny"), enable_lora=True):
        assert events == ["slots", "kv"]
