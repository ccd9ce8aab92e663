"""Engine.encode: a prompt's last-token final hidden state (after the model's last norm),
L2-normalized, through every path a prompt takes (alone, batched, on a cached prefix, in chunks,
with an adapter, through the core process)."""
from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F

from radixflow.runtime import Engine, EngineClient

PROMPTS = [[5, 77, 300, 12, 9, 41, 8, 8, 3], [901, 44, 2, 17], [5, 77, 300, 12, 9, 41, 60, 61, 62, 63, 64], [7]]


def _hf_embedding(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        hidden = hf.model(torch.tensor([ids])).last_hidden_state[0, -1]
    return F.normalize(hidden.float(), dim=0)


@pytest.mark.parametrize("family", ["llama3", "qwen3", "gemma3"])
def test_encode_is_the_normalized_last_hidden_state_of_transformers(hf_checkpoint, family):
    model_dir, hf = hf_checkpoint(family)
    with Engine(model_dir, dtype="float32", kv_cache_tokens=512) as engine:
        one = engine.encode(input_ids=PROMPTS[0])
        many = engine.encode(input_ids=PROMPTS)
        engine.check_accounting()
    assert set(one) == {"embedding", "meta_info"} and one["meta_info"]["prompt_tokens"] == len(PROMPTS[0])
    assert len(one["embedding"]) == hf.config.hidden_size
    torch.testing.assert_close(torch.tensor(one["embedding"]), _hf_embedding(hf, PROMPTS[0]), rtol=1e-4, atol=1e-5)
    for ids, out in zip(PROMPTS, many):
        torch.testing.assert_close(torch.tensor(out["embedding"]), _hf_embedding(hf, ids), rtol=1e-4, atol=1e-5)
        assert abs(torch.tensor(out["embedding"]).norm().item() - 1.0) < 1e-5


def test_cached_prefixes_chunks_and_repeats_give_the_same_embedding(hf_checkpoint):
    """The prefix cache and chunked prefill change only where the KV comes from: a prompt whose
    every token but the last is cached (its second encode) still computes the last one."""
    model_dir, _ = hf_checkpoint("llama3")
    with Engine(model_dir, dtype="float32", kv_cache_tokens=512) as engine:
        alone = [torch.tensor(engine.encode(input_ids=p)["embedding"]) for p in PROMPTS]
    with Engine(model_dir, dtype="float32", kv_cache_tokens=512, chunked_prefill_size=4) as engine:
        engine.generate(input_ids=PROMPTS[0][:6], sampling_params={"max_new_tokens": 2})  # a shared prefix cached
        first = engine.encode(input_ids=PROMPTS)
        again = engine.encode(input_ids=PROMPTS)
        engine.check_accounting()
        stats = engine.stats()
    assert first[0]["meta_info"]["cached_tokens"] >= 6 and again[1]["meta_info"]["cached_tokens"] == len(PROMPTS[1]) - 1
    for want, a, b in zip(alone, first, again):
        torch.testing.assert_close(torch.tensor(a["embedding"]), want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(torch.tensor(b["embedding"]), want, rtol=1e-4, atol=1e-5)
    assert stats.num_running == 0 and stats.num_waiting == 0


def test_embeddings_and_generations_share_steps_without_changing_either(hf_checkpoint):
    model_dir, _ = hf_checkpoint("llama3")
    sp = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}
    with Engine(model_dir, dtype="float32", kv_cache_tokens=512) as engine:
        want_gen = engine.generate(input_ids=PROMPTS[1], sampling_params=sp)["output_ids"]
        want_emb = engine.encode(input_ids=PROMPTS[2])["embedding"]

    async def both(engine):
        async def gen():
            return [c async for c in engine.generate_stream(input_ids=PROMPTS[1], sampling_params=sp)][-1]

        async def emb():
            return [c async for c in engine.generate_stream(input_ids=PROMPTS[2], sampling_params={"max_new_tokens": 0},
                                                            embed=True)]
        return await asyncio.gather(gen(), emb())

    for kind in (Engine, EngineClient):
        with kind(model_dir, dtype="float32", kv_cache_tokens=512) as engine:
            gen, emb = asyncio.run(both(engine))
        assert gen["output_ids"] == want_gen
        assert len(emb) == 1 and emb[0]["output_ids"] == [] and emb[0]["meta_info"]["completion_tokens"] == 0
        torch.testing.assert_close(torch.tensor(emb[0]["embedding"]), torch.tensor(want_emb), rtol=1e-4, atol=1e-5)


def test_encode_through_the_core_process(hf_checkpoint):
    model_dir, hf = hf_checkpoint("qwen3")
    with EngineClient(model_dir, dtype="float32", kv_cache_tokens=512) as engine:
        outs = engine.encode(input_ids=PROMPTS[:2])
        text = engine.encode("hello there")
    for ids, out in zip(PROMPTS, outs):
        torch.testing.assert_close(torch.tensor(out["embedding"]), _hf_embedding(hf, ids), rtol=1e-4, atol=1e-5)
    assert len(text["embedding"]) == hf.config.hidden_size


def test_an_adapter_embeds_as_its_merged_weights(hf_checkpoint, tmp_path):
    from lora_adapters import ALL, merge_adapter, write_adapter

    model_dir, _ = hf_checkpoint("llama3")
    adapter = write_adapter(str(tmp_path / "a"), model_dir, targets=ALL)
    with Engine(model_dir, dtype="float32", kv_cache_tokens=512, lora_modules=[f"a={adapter}"]) as engine:
        adapted = engine.encode(input_ids=PROMPTS[0], lora="a")["embedding"]
        base = engine.encode(input_ids=PROMPTS[0])["embedding"]
    with Engine(merge_adapter(model_dir, adapter, str(tmp_path / "m")), dtype="float32", kv_cache_tokens=512) as merged:
        want = merged.encode(input_ids=PROMPTS[0])["embedding"]
    torch.testing.assert_close(torch.tensor(adapted), torch.tensor(want), rtol=1e-4, atol=1e-5)
    assert (torch.tensor(adapted) - torch.tensor(base)).abs().max() > 1e-3


def test_bad_embedding_requests_are_refused_and_the_engine_serves_on(hf_checkpoint):
    model_dir, _ = hf_checkpoint("llama3")

    async def stream(engine, **kwargs):
        return [c async for c in engine.generate_stream(input_ids=PROMPTS[1], **kwargs)]

    with Engine(model_dir, dtype="float32", kv_cache_tokens=512) as engine:
        with pytest.raises(ValueError, match="empty|at least one"):
            engine.encode(input_ids=[])
        with pytest.raises(ValueError, match="max_new_tokens must be 0"):
            asyncio.run(stream(engine, sampling_params={"max_new_tokens": 3}, embed=True))
        with pytest.raises(ValueError, match="vocabulary|vocab"):
            engine.encode(input_ids=[1, 10 ** 9])
        with pytest.raises(ValueError, match="rids"):
            engine.encode(input_ids=PROMPTS[:2], rid=["x"])
        assert len(engine.encode(input_ids=PROMPTS[1])["embedding"]) == 64
        engine.check_accounting()


def _bare_copy(model_dir: str, hf, out) -> None:
    """`hf`'s base model saved bare into `out`, beside model_dir's config and tokenizer files."""
    import os
    import shutil

    hf.model.save_pretrained(str(out))
    for f in os.listdir(model_dir):
        if not f.startswith("model."):  # the config (the LM's, as embedding checkpoints name it) and tokenizer
            shutil.copy(os.path.join(model_dir, f), out)


def test_a_base_model_saved_without_its_lm_wrapper_loads(hf_checkpoint, tmp_path):
    """Embedding checkpoints (Qwen3-Embedding) hold the bare model: `layers.0...`, no `model.`
    prefix, the LM head tied to the embeddings."""
    model_dir, hf = hf_checkpoint("qwen2")  # tied embeddings
    _bare_copy(model_dir, hf, tmp_path)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "embed_tokens.weight" in set(f.keys())
    with Engine(str(tmp_path), dtype="float32", kv_cache_tokens=512) as engine:
        out = engine.encode(input_ids=PROMPTS[0])
    torch.testing.assert_close(torch.tensor(out["embedding"]), _hf_embedding(hf, PROMPTS[0]), rtol=1e-4, atol=1e-5)


def test_an_embedding_is_its_requests_first_output_for_timings_and_slos(hf_checkpoint):
    """An embedding has no token: its time to first output is its time to the embedding, so it
    counts in the prefill and TTFT figures and meets a TTFT SLO it is within (it used to miss
    every one)."""
    model_dir, _ = hf_checkpoint("llama3")
    with Engine(model_dir, dtype="float32", kv_cache_tokens=512, slo_ttft_ms=60_000, slo_e2e_ms=60_000) as engine:
        outs = engine.encode(input_ids=PROMPTS[:3])
        stats = engine.stats()
    timings = outs[0]["meta_info"]["timings"]
    assert timings["ttft_s"] is not None and timings["prefill_s"] is not None
    assert timings["ttft_s"] <= timings["e2e_s"]
    assert stats.good_requests == 3 and stats.slo_violations["ttft"] == 0


def test_a_bare_checkpoint_without_a_head_to_tie_is_refused_clearly(hf_checkpoint, tmp_path):
    """A bare model whose config does not tie the head has no LM head to generate with:
    refused at load, saying so, rather than a missing-tensor error."""
    import json

    model_dir, hf = hf_checkpoint("llama3")  # untied
    _bare_copy(model_dir, hf, tmp_path)
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["tie_word_embeddings"] is False
    with pytest.raises(ValueError, match="no LM head"):
        Engine(str(tmp_path), dtype="float32", kv_cache_tokens=512)
