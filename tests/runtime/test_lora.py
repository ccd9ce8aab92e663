"""Multi-LoRA serving: mixed batches against merged weights, cache identity by content, capacity."""
from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from lora_adapters import ALL, ATTN, merge_adapter, write_adapter
from radixflow.runtime import Engine
from radixflow.runtime.model.demo import demo_model

GREEDY = {"max_new_tokens": 8, "temperature": 0.0}
PROMPTS = ["the river ran", "a small cat sat", "numbers one two", "once upon a time", "red green blue",
           "she said that"]
# (rank, targets) of the five adapters: fused qkv parts alone and together, the MLP, all seven
SHAPES = [(1, ("q_proj",)), (8, ATTN), (4, ("gate_proj", "up_proj")), (16, ALL), (8, ("v_proj", "down_proj"))]


@pytest.fixture(scope="module")
def model():
    return demo_model("tiny")


@pytest.fixture(scope="module")
def adapters(model, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return [write_adapter(str(root / f"a{i}"), model, rank=r, targets=t, seed=i) for i, (r, t) in enumerate(SHAPES)]


def concurrent(engine: Engine, jobs: list[tuple[str, str | None]], sp: dict = GREEDY) -> list[dict]:
    """Submit every (prompt, lora) from its own thread at once; results in job order."""
    out: list[dict | None] = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def run(i: int, prompt: str, lora: str | None) -> None:
        barrier.wait()
        out[i] = engine.generate(prompt, sp, lora=lora)

    threads = [threading.Thread(target=run, args=(i, p, lo)) for i, (p, lo) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out  # type: ignore[return-value]


def test_mixed_batch_matches_merged_weights_and_base_rows_match_plain_engine(model, adapters, tmp_path):
    names = [f"a{i}" for i in range(len(adapters))]
    jobs = [(PROMPTS[i], names[i]) for i in range(5)] + [(PROMPTS[5], None)]
    with Engine(model, dtype="float32", max_loras=5,
                lora_modules=[f"{n}={p}" for n, p in zip(names, adapters)]) as eng:
        mixed = concurrent(eng, jobs)
        assert eng.loras.capacity.peak_in_batch >= 2  # rows of different adapters shared steps
    with Engine(model, dtype="float32") as plain:
        base = [plain.generate(p, GREEDY)["output_ids"] for p in PROMPTS]
    assert mixed[5]["output_ids"] == base[5]
    changed = 0
    for i in range(5):
        with Engine(merge_adapter(model, adapters[i], str(tmp_path / f"m{i}")), dtype="float32") as merged:
            want = merged.generate(PROMPTS[i], GREEDY)["output_ids"]
        assert mixed[i]["output_ids"] == want, f"adapter {i} {SHAPES[i]}"
        changed += want != base[i]
    assert changed >= 3  # the adapters matter: most change the greedy continuation


def test_chunked_prefill_and_retraction_keep_adapter_outputs(model, adapters):
    long_prompt = " ".join(PROMPTS * 3)
    sp = {"max_new_tokens": 6, "temperature": 0.0}
    with Engine(model, dtype="float32", lora_modules=[f"a3={adapters[3]}"]) as eng:
        want = eng.generate(long_prompt, sp, lora="a3")["output_ids"]
    with Engine(model, dtype="float32", lora_modules=[f"a3={adapters[3]}"], chunked_prefill_size=8,
                disable_radix_cache=True) as eng:
        assert eng.generate(long_prompt, sp, lora="a3")["output_ids"] == want
    # a pool too small for all at once: requests are retracted and recomputed with their adapter
    jobs = [(p, "a1" if i % 2 else "a3") for i, p in enumerate(PROMPTS)]
    sp = {"max_new_tokens": 24, "temperature": 0.0}
    with Engine(model, dtype="float32", lora_modules=[f"a1={adapters[1]}", f"a3={adapters[3]}"]) as eng:
        roomy = concurrent(eng, jobs, sp)
    with Engine(model, dtype="float32", lora_modules=[f"a1={adapters[1]}", f"a3={adapters[3]}"],
                kv_cache_tokens=64, disable_radix_cache=True) as eng:
        tight = concurrent(eng, jobs, sp)
        assert eng.stats().num_preemptions > 0
    assert [r["output_ids"] for r in tight] == [r["output_ids"] for r in roomy]


def test_cache_isolation_by_content(model, adapters):
    prompt = " ".join(PROMPTS)
    with Engine(model, dtype="float32", lora_modules=[f"a={adapters[1]}", f"b={adapters[2]}",
                                                      f"a_again={adapters[1]}"]) as eng:
        first = eng.generate(prompt, GREEDY, lora="a")
        assert first["meta_info"]["cached_tokens"] == 0
        assert eng.generate(prompt, GREEDY, lora="b")["meta_info"]["cached_tokens"] == 0
        assert eng.generate(prompt, GREEDY)["meta_info"]["cached_tokens"] == 0  # the base shares nothing
        same = eng.generate(prompt, GREEDY, lora="a_again")  # another name, identical weights
        assert same["meta_info"]["cached_tokens"] > 0
        assert same["output_ids"] == first["output_ids"]


def test_reload_with_new_weights_never_reuses_old_kv(model, adapters, tmp_path):
    prompt = " ".join(PROMPTS)
    fresh = write_adapter(str(tmp_path / "new"), model, rank=8, targets=ATTN, seed=99)
    with Engine(model, dtype="float32", lora_modules=[f"x={adapters[1]}", f"other={fresh}"]) as eng:
        want = eng.generate(prompt, GREEDY, lora="other")["output_ids"]
        eng.unload_lora_adapter("other")
        eng.generate(prompt, GREEDY, lora="x")
        cached_before = eng.scheduler.cache.total_size()
        eng.load_lora_adapter("x", fresh)  # same name, new weights
        assert eng.scheduler.cache.total_size() < cached_before  # the old weights' KV is gone
        again = eng.generate(prompt, GREEDY, lora="x")
        assert again["meta_info"]["cached_tokens"] == 0
        assert again["output_ids"] == want


def test_unload_frees_kv_and_forgets_the_name(model, adapters):
    prompt = " ".join(PROMPTS)
    with Engine(model, dtype="float32", lora_modules=[f"a={adapters[0]}"]) as eng:
        eng.generate(prompt, GREEDY)
        base_cached = eng.scheduler.cache.total_size()
        eng.generate(prompt, GREEDY, lora="a")
        assert eng.scheduler.cache.total_size() > base_cached
        free_before = eng.runner.kv_pool.num_free
        eng.unload_lora_adapter("a")
        assert eng.scheduler.cache.total_size() == base_cached  # the base's KV stays
        assert eng.runner.kv_pool.num_free > free_before
        assert eng.lora_adapters() == {}
        with pytest.raises(ValueError, match="unknown LoRA adapter"):
            eng.generate(prompt, GREEDY, lora="a")
        with pytest.raises(ValueError, match="no adapter named"):
            eng.unload_lora_adapter("a")


def test_lru_swap_when_more_adapters_than_slots(model, adapters):
    mods = [f"a{i}={p}" for i, p in enumerate(adapters)]
    jobs = [(PROMPTS[i % len(PROMPTS)], f"a{i % 5}") for i in range(10)]
    with Engine(model, dtype="float32", max_loras=5, lora_modules=mods) as eng:
        want = [r["output_ids"] for r in concurrent(eng, jobs)]
    with Engine(model, dtype="float32", max_loras=2, max_cpu_loras=3, lora_modules=mods) as eng:
        got = concurrent(eng, jobs)
        cap, reg = eng.loras.capacity, eng.loras.registry
        assert cap.num_slot_loads > 2 and cap.num_resident <= 2 and cap.peak_in_batch <= 2
        assert reg.num_in_host <= 3  # host LRU: 5 adapters, weights of at most 3 kept
        assert reg.load_time.count > len(adapters)  # dropped weights were read again from disk
    assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in got)
    assert [r["output_ids"] for r in got] == want


def test_lora_requests_need_lora_enabled(model):
    with Engine(model) as eng:
        with pytest.raises(ValueError, match="not enabled"):
            eng.generate("hi", GREEDY, lora="a")
        with pytest.raises(ValueError, match="not enabled"):
            eng.load_lora_adapter("a", "/nowhere")


@pytest.mark.parametrize("req_slots", [[2, -1, 0, 2, 0], [1, -1, 0, 1, 0]])  # scattered / consecutive slots
def test_torch_batched_path_matches_kernel_path_and_row_formula(model, adapters, req_slots):
    """LoraBatch on CPU (gather + bmm) against the SGMV kernels (interpreter) and a per-row loop."""
    from radixflow.runtime.lora.adapter import load_adapter
    from radixflow.runtime.lora.batch import make_lora_batch
    from radixflow.runtime.lora.slots import LoraSlots
    from radixflow.runtime.model.model_config import load_model_args

    args = load_model_args(model)
    slots = LoraSlots(args, frozenset(ALL), 3, 16, torch.float32, torch.device("cpu"))
    loaded = [load_adapter(adapters[i], args, 16, frozenset(ALL)) for i in (1, 3)]
    slots.write(0, loaded[0])
    slots.write(max(req_slots), loaded[1])
    lens = [3, 2, 1, 5, 7]
    x = torch.randn(sum(lens), args.hidden_size)
    y0 = torch.randn(sum(lens), args.q_size + 2 * args.kv_size)
    outs = []
    for use_triton in (False, True):
        y = y0.clone()
        make_lora_batch(slots, req_slots, lens, x.device, use_triton).apply(1, "qkv", x, y)
        outs.append(y)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    row, want = 0, y0.clone()
    for slot, n in zip(req_slots, lens):
        for t in range(row, row + n):
            if slot >= 0:
                ad = loaded[0 if slot == 0 else 1]
                a, b = ad.weights[(1, "k_proj")]
                want[t, args.q_size:args.q_size + args.kv_size] += ad.scale * (b @ (a @ x[t]))
        row += n
    k_cols = slice(args.q_size, args.q_size + args.kv_size)
    torch.testing.assert_close(outs[0][:, k_cols], want[:, k_cols], rtol=1e-4, atol=1e-4)
    assert torch.equal(outs[0][3:5], y0[3:5])  # the base request's rows are untouched


def test_unload_while_in_use_frees_its_kv_when_the_last_request_ends(model, adapters):
    """A running request keeps its adapter to the end; then the adapter's KV leaves the tree and
    its slot is freed, with no request failing."""
    prompt = " ".join(PROMPTS)
    with Engine(model, dtype="float32", lora_modules=[f"a={adapters[0]}"]) as eng:
        eng.generate(prompt, GREEDY)
        base_cached = eng.scheduler.cache.total_size()

        async def run() -> dict:
            chunks = []
            async for chunk in eng.generate_stream(prompt, {**GREEDY, "max_new_tokens": 40}, lora="a"):
                if not chunks:
                    eng.unload_lora_adapter("a")  # running, holding its adapter
                chunks.append(chunk)
            return chunks[-1]
        last = asyncio.run(run())
        assert last["meta_info"]["finish_reason"]["type"] == "length"
        eng.generate(prompt, GREEDY)  # one more step on the loop after the finish
        assert eng.scheduler.cache.total_size() == base_cached
        assert eng.loras.capacity.num_resident == 0


def test_unload_while_queued_frees_its_kv_and_slot_when_it_ends(model, adapters):
    """A request still waiting behind a full batch when its adapter is unloaded runs with it; when
    it ends, the adapter's KV leaves the tree and its slot is freed (not left to LRU)."""
    with Engine(model, dtype="float32", max_num_seqs=1, schedule_policy="fcfs",
                lora_modules=[f"a={adapters[1]}"]) as eng:
        ns = eng.loras.registry.resolve("a")[1].namespace

        async def run() -> list[dict]:
            base = eng.generate_stream(PROMPTS[0], {**GREEDY, "max_new_tokens": 40})
            lora = eng.generate_stream(PROMPTS[1], GREEDY, lora="a")
            first = [asyncio.ensure_future(base.__anext__()), asyncio.ensure_future(lora.__anext__())]
            await asyncio.sleep(0)  # both submitted; the batch holds one: the adapter's request waits
            assert eng.loras.capacity.pins == {}  # it holds no slot yet
            eng.unload_lora_adapter("a")
            lasts = []
            for stream, head in zip((base, lora), first):
                chunk = await head
                async for chunk in stream:
                    pass
                lasts.append(chunk)
            return lasts
        lasts = asyncio.run(run())
        assert [c["meta_info"]["finish_reason"]["type"] for c in lasts] == ["length", "length"]
        eng.check_accounting()  # a turn of the loop: the stats below are those after both finished
        stats = eng.stats()  # the per-request counters by adapter ("": base) add up to the totals
        assert {name: s.finish_counts for name, s in stats.by_lora.items()} == {"": {"length": 1}, "a": {"length": 1}}
        assert sum(s.good_requests for s in stats.by_lora.values()) == stats.good_requests == 2
        for reason, n in stats.miss_tokens.items():
            assert sum(s.miss_tokens.get(reason, 0) for s in stats.by_lora.values()) == n
        assert [t.lora_name for t in eng.recent_timings] == ["", "a"]
        cap = eng.loras.capacity
        assert cap.num_resident == 0 and ns not in cap.slots.holder
        eng.load_lora_adapter("again", adapters[1])  # the same content, so the same namespace
        again = eng.generate(PROMPTS[1], GREEDY, lora="again")
        assert again["meta_info"]["cached_tokens"] == 0  # nothing of the namespace was left cached
        assert again["output_ids"] == lasts[1]["output_ids"]


def test_host_lru_reread_of_changed_file_drops_the_old_namespace(model, adapters, tmp_path):
    """Weights dropped by the host LRU are read again from disk; when the file changed, the name
    gets a new namespace and the old one's KV and slot go (no name uses them any more)."""
    import shutil
    path = str(tmp_path / "a")
    shutil.copytree(adapters[1], path)
    prompt = " ".join(PROMPTS)
    with Engine(model, dtype="float32", max_cpu_loras=1, lora_modules=[f"a={path}", f"b={adapters[2]}"]) as eng:
        old = eng.loras.registry.resolve("a")[1].namespace
        eng.generate(prompt, GREEDY, lora="a")
        eng.generate(prompt, GREEDY, lora="b")  # a's weights leave host memory
        assert eng.loras.registry.num_in_host == 1
        shutil.rmtree(path)
        write_adapter(path, model, rank=8, targets=ATTN, seed=77)  # the file changes on disk
        eng.generate(prompt, GREEDY, lora="a")  # read again: a new namespace
        assert eng.loras.registry.resolve("a")[1].namespace != old
        eng.generate(prompt, GREEDY)  # one more turn of the loop
        eng.check_accounting()
        assert old not in eng.loras.capacity.slots.holder
        eng.load_lora_adapter("old", adapters[1])  # the old content again: the old namespace
        assert eng.generate(prompt, GREEDY, lora="old")["meta_info"]["cached_tokens"] == 0


def test_overlap_scheduling_keeps_adapter_outputs(model, adapters):
    """Overlapped decode steps carry each row's adapter: a mixed batch of five adapters and the
    base model gives what it gives with overlap off."""
    names = [f"a{i}" for i in range(len(adapters))]
    jobs = [(PROMPTS[i], names[i]) for i in range(5)] + [(PROMPTS[5], None)]
    sp = {**GREEDY, "max_new_tokens": 16, "ignore_eos": True}
    outs = {}
    for overlap in (False, True):
        with Engine(model, dtype="float32", max_loras=5, enable_overlap=overlap, check_invariants=True,
                    lora_modules=[f"{n}={p}" for n, p in zip(names, adapters)]) as eng:
            outs[overlap] = [r["output_ids"] for r in concurrent(eng, jobs, sp)]
            assert (eng.loop.step.num_overlapped_steps > 0) == overlap
            assert not eng.invariant_violations
    assert outs[True] == outs[False]


def test_mixed_steps_keep_adapter_outputs(model, adapters):
    """Mixed steps carry each row's adapter, prefill and decode rows alike: requests of five
    adapters and the base model arriving while others decode give what they give unmixed."""
    names = [f"a{i}" for i in range(len(adapters))]
    sp = {**GREEDY, "max_new_tokens": 16, "ignore_eos": True}
    outs = {}
    for mixed in (False, True):
        with Engine(model, dtype="float32", max_loras=5, enable_mixed_chunk=mixed, chunked_prefill_size=4,
                    check_invariants=True, lora_modules=[f"{n}={p}" for n, p in zip(names, adapters)]) as eng:
            def decode_first(eng=eng, mixed=mixed):  # base rows and an adapter's, decoding when the rest arrive
                base = eng.generate(PROMPTS[:2], sp)
                outs[mixed, "first"] = [r["output_ids"] for r in base] + [eng.generate(PROMPTS[2], sp, lora="a4")["output_ids"]]
            first = threading.Thread(target=decode_first)
            first.start()
            late = concurrent(eng, [(PROMPTS[i] + " and then", names[i]) for i in range(5)], sp)
            first.join()
            outs[mixed, "late"] = [r["output_ids"] for r in late]
            assert (eng.loop.step.num_mixed_steps > 0) == mixed
            assert not eng.invariant_violations
    assert outs[True, "first"] == outs[False, "first"]
    assert outs[True, "late"] == outs[False, "late"]


def test_adapters_on_fused_projections_serve_as_their_parts(hf_checkpoint, tmp_path):
    """Phi-3's checkpoints fuse q|k|v and gate|up, so PEFT adapters for it target `qkv_proj` and
    `gate_up_proj`: each is served as its parts (the one lora_A with each part's rows of lora_B),
    and the output equals the merged weights'."""
    model_dir, _ = hf_checkpoint("phi3")
    prompt = [5, 77, 300, 12, 9, 41]
    sp = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    adapter = write_adapter(str(tmp_path / "fused"), model_dir, targets=("qkv_proj", "o_proj", "gate_up_proj",
                                                                         "down_proj"))
    with Engine(model_dir, dtype="float32", lora_modules=[f"a={adapter}"]) as eng:
        adapted = eng.generate(input_ids=prompt, sampling_params=sp, lora="a")["output_ids"]
        base = eng.generate(input_ids=prompt, sampling_params=sp)["output_ids"]
    with Engine(merge_adapter(model_dir, adapter, str(tmp_path / "merged")), dtype="float32") as merged:
        assert adapted == merged.generate(input_ids=prompt, sampling_params=sp)["output_ids"]
    assert adapted != base
    part = write_adapter(str(tmp_path / "q"), model_dir, targets=("qkv_proj",))
    with Engine(model_dir, dtype="float32", enable_lora=True, lora_target_modules="q_proj,k_proj,o_proj") as eng:
        with pytest.raises(ValueError, match=r"target modules \['v_proj'\] are not in the engine's"):
            eng.load_lora_adapter("q", part)


def test_fused_names_in_the_engine_targets_mean_their_parts():
    from radixflow.runtime.config import EngineConfig

    cfg = EngineConfig(enable_lora=True, lora_target_modules="qkv_proj,o_proj,gate_up_proj")
    assert cfg.lora_targets == frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"})
