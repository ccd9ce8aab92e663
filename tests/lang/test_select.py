"""select(): the request protocol and the scoring, checked against a direct computation."""
from __future__ import annotations

import math

import pytest

import radixflow.lang as rf
from radixflow.lang.select_scoring import GreedyTokenSelection, choice_entries

CHOICES = ["billing", "bugs", "sales"]


def preferring(word: str):
    """Logprobs that favour the characters of `word` (and punish everything else)."""
    return lambda prefix, token: -0.1 if token.strip() and token.strip()[0] in word else -2.0


def direct_mean(logprob, context: str, choice: str, tokenize) -> float:
    full = tokenize(context + choice)
    start = len(tokenize(context))
    values = [logprob("".join(full[:p]), full[p]) for p in range(start, len(full))]
    return sum(values) / len(values)


@rf.function
def triage(s, ticket):
    s += "Ticket: " + ticket + "\nTeam:"
    s += rf.select("team", CHOICES)


def test_protocol_prefill_then_one_scored_batch(make_fake, tokenize):
    fake = make_fake(logprob=preferring("bugs"))
    state = triage.run(ticket="crash", backend=fake)
    context = "Ticket: crash\nTeam:"
    prefill, batch = fake.requests
    assert prefill == {"text": context, "sampling_params": {"max_new_tokens": 0}}
    assert batch["text"] == [context + c for c in CHOICES]
    assert batch["sampling_params"]["max_new_tokens"] == 0 and batch["return_logprob"] is True
    assert batch["logprob_start_len"] == len(tokenize(context)) - 1  # prompt_tokens - 1
    assert state["team"] == "bugs"
    assert state.text() == context + "bugs"


def test_picks_highest_mean_logprob_against_direct_computation(make_fake, tokenize):
    logprob = lambda prefix, tok: -((sum(map(ord, tok)) * 7 + len(prefix)) % 11) / 3  # noqa: E731
    fake = make_fake(logprob=logprob)
    state = triage.run(ticket="lost my invoice", backend=fake)
    context = "Ticket: lost my invoice\nTeam:"
    expected = [direct_mean(logprob, context, c, tokenize) for c in CHOICES]
    assert len(set(expected)) == 3
    meta = state.get_meta_info("team")
    assert meta["normalized_prompt_logprobs"] == pytest.approx(expected)
    assert meta["scores"] == pytest.approx(expected)
    assert state["team"] == CHOICES[max(range(3), key=expected.__getitem__)]


def test_boundary_merge_scores_the_merged_token(make_fake):
    # Context ends with a space; the fake tokenizer merges " " with the next character, so the
    # token at position P-1 (" b", " s") belongs to the choice and must be scored.
    logprob = lambda prefix, tok: -0.5 if tok == " s" else -1.0  # noqa: E731

    @rf.function
    def prog(s):
        s += "Team: "
        s += rf.select("team", CHOICES)

    fake = make_fake(logprob=logprob)
    state = prog.run(backend=fake)
    entries = state.get_meta_info("team")["input_token_logprobs"]
    assert [e[2] for e in entries[2]] == [" s", "a", "l", "e", "s"]
    assert [e[2] for e in entries[0]][0] == " b"
    assert state["team"] == "sales"


def test_choice_entries_drop_the_unmerged_context_token():
    entries = [[-1.0, 1, ":"], [-0.2, 2, "x"]]
    assert choice_entries(entries, start=4, prompt_tokens=5, context="abcd:") == [[-0.2, 2, "x"]]
    merged = [[-1.0, 1, ": x"], [-0.2, 2, "y"]]
    assert choice_entries(merged, start=4, prompt_tokens=5, context="abcd:") == merged


def test_unconditional_likelihood_normalized(make_fake):
    def logprob(prefix, tok):
        if "Q:" in prefix:
            return -1.0 if tok == "b" else -0.5
        return -3.0 if prefix.startswith("b") else -0.6  # "bugs" alone is unlikely: normalization helps it

    @rf.function
    def prog(s):
        s += "Q:"
        s += rf.select("team", ["bugs", "sales"], choices_method=rf.unconditional_likelihood_normalized)

    fake = make_fake(logprob=logprob)
    state = prog.run(backend=fake)
    alone = fake.requests[2]
    assert alone["sampling_params"] == {"max_new_tokens": 0} and alone["return_logprob"] is True
    assert [[fake.token_text(i) for i in ids] for ids in alone["input_ids"]] == [list("bugs"), list("sales")]
    # mean(cond - uncond); the first token has no unconditional logprob (counts as 0)
    bugs = ((-1.0 - 0) + 3 * (-0.5 + 3.0)) / 4
    sales = ((-0.5 - 0) + 4 * (-0.5 + 0.6)) / 5
    assert state.get_meta_info("team")["scores"] == pytest.approx([bugs, sales])
    assert state["team"] == "bugs"

    @rf.function
    def plain(s):
        s += "Q:" + rf.select("t", ["bugs", "sales"])

    assert bugs > sales and plain.run(backend=make_fake(logprob=logprob))["t"] == "sales"


def test_greedy_token_selection_pads_short_choices_with_their_mean():
    cond = [[[-0.1, 1, None]], [[-0.1, 1, None], [-0.3, 2, None]], [[-0.4, 3, None]]]
    assert GreedyTokenSelection().scores(cond, None) == [1.0, 0.0, 0.0]


def test_gen_with_choices_method_is_a_select(make_fake):
    @rf.function
    def prog(s):
        s += "Team:" + rf.gen("team", choices=CHOICES, choices_method=rf.token_length_normalized)

    fake = make_fake(logprob=preferring("sales"))
    assert prog.run(backend=fake)["team"] == "sales"
    assert fake.requests[1]["return_logprob"] is True


def test_select_rejects_empty_choices():
    with pytest.raises(ValueError, match="non-empty"):
        rf.select("x", [])
    with pytest.raises(ValueError, match="non-empty"):
        rf.select("x", ["a", ""])
    with pytest.raises(ValueError, match="choices_method"):
        rf.select("x", ["a"], choices_method="nope")


def test_empty_scores_never_win():
    assert math.isinf(rf.token_length_normalized.scores([[[None, 1, None]]], None)[0])
