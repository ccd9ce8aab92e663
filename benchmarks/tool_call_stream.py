"""Tool-call parsing cost per output character, per format: the parsers that stream a call's
arguments as they are written (frontend/tool_calls.py, tool_call_formats.py, xml_calls.py), fed a
call in token-sized pieces as a stream feeds them, and the whole text at once as a response does.

    python benchmarks/tool_call_stream.py --out benchmarks/results/tool_call_stream.json
    python benchmarks/tool_call_stream.py --smoke                                       # seconds

Each text is one call of `write_file(path, content)` whose `content` is ~6,000 characters of
Python (newlines, quotes and backslashes escaped in the JSON formats, raw in the XML ones) plus a
text before it. `json_loads` is Python's C JSON decoder on the same JSON call, the floor a parser
that waits for the whole call would pay once. Figures: the best of --reps runs, microseconds per
character of output.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time

from radixflow.frontend.tool_call_formats import auto_parser
from radixflow.frontend.tool_calls import Call, JsonCallsParser, whole

NAMES = frozenset({"write_file"})
STRINGS = {"write_file": frozenset({"path", "content"})}
CODE = "\n".join(f'def f{i}(x):\n    """Say "{i}".\\n"""\n    return x * {i}  # {i}' for i in range(120))
ARGS = {"path": "src/app.py", "content": CODE}


def texts() -> dict[str, tuple[str, object]]:
    """Per format: (the output text, a factory of its parser)."""
    call = json.dumps({"name": "write_file", "arguments": ARGS})
    xml_values = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in ARGS.items())
    glm_values = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in ARGS.items())
    return {
        "hermes": (f"Writing it.\n<tool_call>\n{call}\n</tool_call>", lambda: auto_parser("hermes", NAMES, True)),
        "llama3_json": (json.dumps({"name": "write_file", "parameters": ARGS}),
                        lambda: auto_parser("llama3_json", NAMES, True)),
        "mistral": (f"Writing it.[TOOL_CALLS][{call}]", lambda: auto_parser("mistral", NAMES, True)),
        "mistral_v11": (f"Writing it.[TOOL_CALLS]write_file[ARGS]{json.dumps(ARGS)}",
                        lambda: auto_parser("mistral", NAMES, True)),
        "required": (f"[{call}]", lambda: JsonCallsParser(NAMES)),
        "named": (json.dumps(ARGS), lambda: JsonCallsParser(NAMES, "write_file")),
        "qwen3_coder": (f"Writing it.\n<tool_call>\n<function=write_file>\n{xml_values}</function>\n</tool_call>",
                        lambda: auto_parser("qwen3_coder", NAMES, True, STRINGS)),
        "glm45": (f"Writing it.\n<tool_call>write_file\n{glm_values}</tool_call>",
                  lambda: auto_parser("glm45", NAMES, True, STRINGS)),
    }


def _run(make, pieces: list[str]) -> list[object]:
    parser = make()
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    return events + parser.finish()


def _merged(events: list[object]) -> list[object]:
    """Calls folded and adjacent texts joined: what a client reassembles."""
    out: list[object] = []
    for event in whole(events):
        if isinstance(event, str) and out and isinstance(out[-1], str):
            out[-1] += event
        else:
            out.append(event)
    return out


def _best_us(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--piece", type=int, default=4, help="characters a streamed piece (about a token)")
    ap.add_argument("--smoke", action="store_true", help="one repetition, a check that it runs")
    ap.add_argument("--out", help="write the results here as JSON")
    args = ap.parse_args()
    reps = 1 if args.smoke else args.reps
    rows = []
    for name, (text, make) in texts().items():
        pieces = [text[i:i + args.piece] for i in range(0, len(text), args.piece)]
        calls = [e for e in whole(_run(make, pieces)) if isinstance(e, Call)]
        assert len(calls) == 1 and json.loads(calls[0].arguments) == ARGS, name
        assert _merged(_run(make, pieces)) == _merged(_run(make, [text])), name
        streamed = _best_us(lambda: _run(make, pieces), reps) / len(text)
        at_once = _best_us(lambda: _run(make, [text]), reps) / len(text)
        rows.append({"format": name, "chars": len(text), "streamed_us_per_char": round(streamed, 3),
                     "whole_us_per_char": round(at_once, 3)})
    call = json.dumps({"name": "write_file", "arguments": ARGS})
    floor = _best_us(lambda: json.loads(call), reps) / len(call)
    print(f"{'format':<14}{'chars':>7}{'streamed us/char':>18}{'whole us/char':>15}")
    for row in rows:
        print(f"{row['format']:<14}{row['chars']:>7}{row['streamed_us_per_char']:>18}{row['whole_us_per_char']:>15}")
    print(f"{'json_loads':<14}{len(call):>7}{'':>18}{round(floor, 4):>15}")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(args.out, "w") as f:
            json.dump({"commit": commit, "python": platform.python_version(), "piece_chars": args.piece,
                       "reps": reps, "rows": rows, "json_loads_us_per_char": round(floor, 4)}, f, indent=1)


if __name__ == "__main__":
    main()
