"""Grammar pieces without the engine: vocabulary bytes, forced-token plans, EOS bits of the
batched mask, the compile cache's bounds, integer bounds, the killable compile worker."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from radixflow.kernels.logits_mask import apply_token_bitmask_ref
from radixflow.runtime.model.demo import demo_model
from radixflow.runtime.grammar.backend import GrammarError
from radixflow.runtime.grammar.cache import GrammarCache
from radixflow.runtime.grammar.mask import grammar_bitmask
from radixflow.runtime.grammar.outlines_backend import OutlinesBackend, bound_integers, escape_literal
from radixflow.runtime.grammar.spec import GrammarKey
from radixflow.runtime.grammar.state import GrammarState, plan_forced_tokens
from radixflow.runtime.grammar.vocab import TokenVocab
from radixflow.runtime.core.request import Req
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_dir(demo_model("tiny"))


@pytest.fixture(scope="module")
def vocab(tokenizer):
    return TokenVocab.from_tokenizer(tokenizer, tokenizer.vocab_size, tokenizer.eos_token_ids)


@pytest.fixture(scope="module")
def backend(vocab):
    b = OutlinesBackend(vocab, max_workers=1)
    yield b
    b.close()


def test_vocab_excludes_special_tokens_and_spells_bytes(tokenizer, vocab):
    for t in tokenizer.special_token_ids:
        assert vocab.token_bytes[t] == b""
    mapping = vocab.outlines_map()
    assert all(t not in tokenizer.special_token_ids for ids in mapping.values() for t in ids)
    assert len(vocab.single_byte) == 256  # byte-level BPE: every byte has a token
    ids = vocab.tokenize_forced('{"name":"'.encode())
    assert b"".join(vocab.token_bytes[t] for t in ids) == b'{"name":"'
    # a partial UTF-8 character at the end is left for sampling
    ids = vocab.tokenize_forced("ab\u00e9".encode()[:-1])
    assert b"".join(vocab.token_bytes[t] for t in ids) == b"ab"


def test_plan_holds_back_last_token_unless_grammar_ends(backend, vocab):
    g = backend.compile(GrammarKey("regex", r'\{"name":"[a-z]+"\}'), 10.0)
    m = g.new_matcher()
    assert m.forced_bytes() == b'{"name":"'
    full = vocab.tokenize_forced(b'{"name":"')
    assert plan_forced_tokens(m, vocab) == full[:-1]
    done = backend.compile(GrammarKey("choices", '["ultraviolet light"]'), 10.0).new_matcher()
    plan = plan_forced_tokens(done, vocab)
    assert b"".join(vocab.token_bytes[t] for t in plan) == b"ultraviolet light"  # nothing to merge with


def _req(grammar_state, sp=None):
    req = Req(rid="r", prompt_ids=[1], sampling=sp or SamplingParams())
    req.grammar = grammar_state
    return req


def _allowed(bitmask_row, vocab_size):
    logits = torch.zeros(1, vocab_size)
    apply_token_bitmask_ref(logits, bitmask_row[None])
    return set(torch.nonzero(logits[0] == 0).flatten().tolist())


def test_bitmask_eos_only_in_accepting_states(backend, vocab, tokenizer):
    g = backend.compile(GrammarKey("regex", "[0-9]{1,3}"), 10.0)
    n = tokenizer.vocab_size
    fresh = GrammarState(g.new_matcher(), vocab, jump_forward=True, allow_eos=True)
    accepting = GrammarState(g.new_matcher(), vocab, jump_forward=True, allow_eos=True)
    assert accepting.accept(vocab.single_byte[ord("7")])
    no_eos = GrammarState(g.new_matcher(), vocab, jump_forward=True, allow_eos=False)
    assert no_eos.accept(vocab.single_byte[ord("7")])
    bitmask, rows = grammar_bitmask([_req(fresh), _req(None), _req(accepting), _req(no_eos)], torch.device("cpu"))
    assert rows.tolist() == [0, 2, 3] and bitmask.dtype == torch.int32
    eos = set(vocab.eos_ids)
    allowed = [_allowed(bitmask[i], n) for i in range(3)]
    assert not allowed[0] & eos and eos <= allowed[1] and not allowed[2] & eos
    assert all(vocab.token_bytes[t].isdigit() for t in allowed[0])
    assert allowed[1] - eos == allowed[2]


def test_pinned_token_when_jump_forward_is_off(backend, vocab, tokenizer):
    g = backend.compile(GrammarKey("regex", r"id: [0-9]+;"), 10.0)
    state = GrammarState(g.new_matcher(), vocab, jump_forward=False, allow_eos=True)
    pinned = state.pinned_token()
    assert pinned is not None
    bitmask, _ = grammar_bitmask([_req(state)], torch.device("cpu"))
    assert _allowed(bitmask[0], tokenizer.vocab_size) == {pinned}


def test_bound_integers_and_escape():
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 1, "maximum": 3},
                                               "b": {"type": "integer", "minimum": 0}}}
    out = bound_integers(schema)
    assert out["properties"]["a"] == {"enum": [1, 2, 3]}
    assert out["properties"]["b"] == {"type": "integer", "minimum": 0}
    assert escape_literal("a.b (c)") == r"a\.b \(c\)"


class _Sized:
    def __init__(self, nbytes):
        self.nbytes = nbytes


def test_cache_bounds_bytes_and_entries_and_dedupes():
    cache = GrammarCache(max_entries=3, max_bytes=100)
    for i in range(3):
        cache.get_or_compile(i, lambda _gone: _Sized(40))
    assert len(cache) == 2 and cache.num_bytes == 80  # bytes bound evicted the oldest
    for i in range(10, 14):
        cache.get_or_compile(i, lambda _gone: _Sized(1))
    assert len(cache) == 3  # count bound
    calls = []

    def slow(_gone):
        calls.append(1)
        time.sleep(0.2)
        return _Sized(1)

    threads = [threading.Thread(target=cache.get_or_compile, args=("k", slow)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1  # one compile for concurrent askers

    def bad(_gone):
        calls.append(1)
        raise GrammarError("nope")

    for _ in range(2):
        with pytest.raises(GrammarError, match="nope"):
            cache.get_or_compile("bad", bad)
    assert len(calls) == 2  # the failure was remembered


def test_cache_stops_a_compile_only_once_every_waiter_left():
    """A waiter whose request was aborted stops waiting; the compile goes on while anyone else
    waits, and is told to stop (`gone()`) once nobody does; a stopped compile is not cached."""
    from radixflow.runtime.grammar.backend import GrammarCancelled

    cache = GrammarCache()
    owner_cancel, joiner_cancel = threading.Event(), threading.Event()
    started, seen_gone = threading.Event(), []

    def compile_fn(gone):
        started.set()
        deadline = time.monotonic() + 5
        while not gone():
            if time.monotonic() > deadline:
                return _Sized(1)
            time.sleep(0.01)
        seen_gone.append(True)
        raise GrammarCancelled("stopped")

    results: dict[str, object] = {}

    def ask(name, cancel):
        try:
            results[name] = cache.get_or_compile("k", compile_fn, cancel=cancel)
        except GrammarCancelled as exc:
            results[name] = exc

    owner = threading.Thread(target=ask, args=("owner", owner_cancel))
    owner.start()
    assert started.wait(5)
    joiner = threading.Thread(target=ask, args=("joiner", joiner_cancel))
    joiner.start()
    time.sleep(0.1)
    joiner_cancel.set()  # one left: the owner still waits, the compile goes on
    joiner.join(5)
    assert isinstance(results["joiner"], GrammarCancelled) and not seen_gone
    owner_cancel.set()  # nobody waits now
    owner.join(5)
    assert isinstance(results["owner"], GrammarCancelled) and seen_gone == [True]
    assert len(cache) == 0  # not remembered: the next ask compiles
    assert isinstance(cache.get_or_compile("k", lambda _gone: _Sized(1)), _Sized)


def test_worker_killed_on_timeout_then_recovers(backend):
    start = time.monotonic()
    with pytest.raises(GrammarError, match="exceeded the 1 s limit"):
        backend.compile(GrammarKey("regex", "[ab]*a[ab]{24}"), 1.0)
    assert time.monotonic() - start < 2.0
    assert backend.compile(GrammarKey("regex", "[0-9]{2}"), 10.0).new_matcher().can_continue()


def test_grammar_key_normalizes_schema_text():
    a = SamplingParams.from_dict({"json_schema": '{"type": "object",  "properties": {"b": {}, "a": {}}}'})
    b = SamplingParams.from_dict({"json_schema": {"type": "object", "properties": {"b": {}, "a": {}}}})
    from radixflow.runtime.grammar.spec import grammar_key

    assert grammar_key(a) == grammar_key(b)
    assert '"b":{},"a":{}' in grammar_key(a).text  # key order kept: it orders generated keys
