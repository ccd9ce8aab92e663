"""Fork/join: one shared prefill for the question, then several branches in parallel.

    python examples/parallel_tips.py
"""
from __future__ import annotations

import radixflow.lang as rf
from _common import backend_from_args, report_cache


@rf.function
def tips(s, topic, n=3):
    s += rf.system("You give short, practical tips.")
    s += rf.user(f"Give a tip about {topic}.")
    forks = s.fork(n)
    for i, f in enumerate(forks):
        f += rf.assistant(f"Tip {i + 1}: " + rf.gen("tip", max_tokens=12, stop="\n", temperature=0.8, seed=i))
    forks.join()
    s += rf.user("Summarize the tips in one line.")
    s += rf.assistant(rf.gen("summary", max_tokens=16, temperature=0))


def main(backend: rf.Engine) -> None:
    before = backend.engine.stats()
    state = tips.run(topic="saving energy at home", backend=backend)
    for i, tip in enumerate(state["tip"]):
        print(f"tip {i + 1}: {tip!r}")
    print("summary:", repr(state["summary"]))
    assert len(state["tip"]) == 3
    hits = report_cache(backend, before)
    assert hits["hit_tokens"] > 0, "branches share the prefilled question"


if __name__ == "__main__":
    main(backend_from_args(__doc__))
