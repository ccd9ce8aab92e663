"""The language against the real in-process engine (tiny demo model, CPU, greedy)."""
from __future__ import annotations

import pytest
from radixflow.runtime.model.demo import demo_model

import radixflow.lang as rf

GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def backend():
    with rf.Engine(demo_model("tiny")) as engine:
        yield engine


@rf.function
def story(s, start):
    s += "Once upon a time " + start
    s += rf.gen("first", max_tokens=6, temperature=0)
    s += ". Then"
    s += rf.gen("second", max_tokens=6, temperature=0)


def test_program_gens_equal_direct_engine_calls(backend):
    state = story.run(start="a fox", backend=backend)
    engine = backend.engine
    p1 = "Once upon a time a fox"
    first = engine.generate(p1, {"max_new_tokens": 6, **GREEDY})["text"]
    p2 = p1 + first + ". Then"
    second = engine.generate(p2, {"max_new_tokens": 6, **GREEDY})["text"]
    assert (state["first"], state["second"]) == (first, second)
    assert state.text() == p2 + second


def test_second_gen_hits_the_cache(backend):
    state = story.run(start="a cat", backend=backend)
    first, second = state.get_meta_info("first"), state.get_meta_info("second")
    # The second call's prompt starts with the first call's prompt and output: all of the
    # first prompt is served from the cache (and the first output's KV too, mostly).
    assert second["cached_tokens"] >= first["prompt_tokens"]


def test_fork_branches_hit_the_shared_prefill(backend):
    @rf.function
    def prog(s):
        s += "A list of animals that live in the sea, and why they matter:"
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f" {i + 1}." + rf.gen("item", max_tokens=4, temperature=0)
        forks.join()

    state = prog.run(backend=backend)
    metas = state.get_meta_info("item")
    assert all(m["cached_tokens"] >= m["prompt_tokens"] - 3 for m in metas)
    assert len(state["item"]) == 2


def test_select_agrees_with_a_direct_logprob_computation(backend):
    context = "The capital of France is"
    choices = [" Paris", " Berlin", " a potato"]

    @rf.function
    def prog(s):
        s += context + rf.select("city", choices)

    state = prog.run(backend=backend)
    engine = backend.engine
    context_len = engine.generate(context, {"max_new_tokens": 0})["meta_info"]["prompt_tokens"]
    expected = []
    for choice in choices:
        entries = engine.generate(context + choice, {"max_new_tokens": 0}, return_logprob=True,
                                  logprob_start_len=context_len)["meta_info"]["input_token_logprobs"]
        expected.append(sum(e[0] for e in entries) / len(entries))
    assert state.get_meta_info("city")["scores"] == pytest.approx(expected, rel=1e-4)
    assert state["city"] == choices[max(range(3), key=expected.__getitem__)]


def test_streaming_equals_the_whole_text(backend):
    streamed = story.run(start="a bird", backend=backend, stream=True)
    pieces = list(streamed.text_iter())
    whole = story.run(start="a bird", backend=backend)
    assert "".join(pieces) == whole.text() == streamed.text()


def test_traced_program_executes_the_same(backend):
    local = story.run(start="a whale", backend=backend)
    result = rf.execute(rf.trace(story), {"start": "a whale"}, backend)
    assert result["variables"] == local.variables()
    assert result["text"] == local.text()


def test_roles_render_through_the_chat_template(backend):
    if not hasattr(backend.engine.tokenizer, "role_markers"):
        pytest.skip("the runtime tokenizer has no role_markers() yet")

    @rf.function
    def chat(s):
        s += rf.user("Hi")
        s += rf.assistant(rf.gen("answer", max_tokens=4, temperature=0))

    state = chat.run(backend=backend)
    assert state.messages()[0] == {"role": "user", "content": "Hi"}
    assert state.messages()[1]["content"] == state["answer"]
