"""A ReAct-style loop: the model picks a tool with `select`, the program runs it, and repeats.

    python examples/react_tool_choice.py
"""
from __future__ import annotations

import radixflow.lang as rf
from _common import backend_from_args, report_cache

TOOLS = {
    "calculator": lambda q: str(sum(int(t) for t in q.split() if t.isdigit())),
    "search": lambda q: f"(top result for '{q[:30]}')",
    "finish": lambda q: "",
}


@rf.function
def react(s, question, max_turns=3):
    s += rf.system("You answer questions. Think, then pick a tool: calculator, search or finish.")
    s += rf.user(question)
    for turn in range(max_turns):
        s += rf.assistant("Thought: " + rf.gen(f"thought_{turn}", max_tokens=12, stop="\n")
                          + "\nAction: " + rf.select(f"action_{turn}", list(TOOLS)))
        action = s[f"action_{turn}"]
        if action == "finish":
            break
        s += rf.user("Observation: " + TOOLS[action](question))
    s.set_var("turns", turn + 1)


def main(backend: rf.Engine) -> None:
    before = backend.engine.stats()
    state = react.run(question="What is 12 plus 30?", backend=backend, temperature=0)
    for t in range(state["turns"]):
        print(f"turn {t}: action={state[f'action_{t}']!r} thought={state[f'thought_{t}']!r}")
    assert all(state[f"action_{t}"] in TOOLS for t in range(state["turns"]))
    hits = report_cache(backend, before)
    assert hits["hit_tokens"] > 0, "later calls should reuse the conversation's KV"


if __name__ == "__main__":
    main(backend_from_args(__doc__))
