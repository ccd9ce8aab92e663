"""The `radixflow` command: `serve` (HTTP server), `top` (a server's numbers in the terminal),
`bench` (serving benchmark and its plots) and `demo-model` (write the built-in model)."""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import types
import typing
from typing import Any

from radixflow.runtime.config import EngineConfig


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_engine_flags(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One flag per EngineConfig field; help, default and choices come from the declaration."""
    hints = typing.get_type_hints(EngineConfig)
    group = parser.add_argument_group("engine")
    for f in dataclasses.fields(EngineConfig):
        if f.name in skip:
            continue
        hint = hints[f.name]
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else ()
        base = next((a for a in args if a is not type(None)), hint)
        help_text = f"{f.metadata['help']} (default: {f.default})"
        if typing.get_origin(base) is tuple:  # a list flag: --lora-modules a=x b=y
            group.add_argument(_flag(f.name), nargs="+", default=f.default, help=help_text)
        elif base is bool:
            action = argparse.BooleanOptionalAction if f.default else "store_true"
            group.add_argument(_flag(f.name), action=action, default=f.default, help=help_text)
        else:
            choices = f.metadata.get("choices")  # all lower case: taken in any case (SGLang's NGRAM)
            group.add_argument(_flag(f.name), type=str.lower if choices else base, default=f.default,
                               choices=choices, help=help_text)


def engine_kwargs(ns: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineConfig) if f.name not in skip}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixflow", description="radixflow LLM serving runtime")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve a model over HTTP (OpenAI and native APIs)")
    serve.add_argument("--demo-size", default=None,
                       help="serve the random-weight demo model of this size (tiny, small) instead of the default model")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=30000)
    serve.add_argument("--served-model-name", default=None,
                       help="model name in the API (default: the --model path, radixflow-demo-SIZE, or SmolLM2-135M-Instruct)")
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--engine-core", choices=("process", "thread"), default="process",
                       help="run the engine core in its own process (default) or on a thread of the HTTP "
                            "server's process (debugging)")
    serve.add_argument("--api-server-count", type=int, default=1,
                       help="HTTP server processes sharing the port and one engine core (default: 1)")
    serve.add_argument("--incremental-streaming-output", action="store_true",
                       help="native /generate streams send each chunk's new text and output_ids only, not the "
                            "whole output so far (SGLang's flag; OpenAI streams always send deltas)")
    from radixflow.frontend.tool_call_formats import ALIASES, PARSERS

    serve.add_argument("--tool-call-parser", choices=(*PARSERS, *ALIASES), default="hermes",
                       help="the format of the model's tool calls under tool_choice 'auto': hermes "
                            "(<tool_call> blocks), llama3_json, mistral ([TOOL_CALLS]), pythonic, qwen3_coder "
                            "(<function=...> blocks), glm45 / glm47 (<arg_key> pairs), granite "
                            "(<tool_call>[...]), phi4_mini_json or gpt_oss (harmony messages to functions.NAME; "
                            "also gpt-oss, openai) (default: hermes)")
    from radixflow.runtime.text.reasoning import ALIASES as REASONING_ALIASES, FORMATS

    names = dict.fromkeys([*FORMATS, *REASONING_ALIASES])  # qwen3 has no dashed spelling
    serve.add_argument("--reasoning-parser", choices=tuple(names),
                       default=None,
                       help="split a thinking model's <think> block from its answer in chat responses "
                            "(message.reasoning_content): deepseek_r1 or qwen3_thinking (the output starts "
                            "in the block), qwen3 (only when the output opens with <think>), seed_oss (as "
                            "qwen3, with <seed:think> tags), gpt_oss (harmony's analysis channel; also "
                            "gpt-oss, openai_gptoss) (default: none)")
    serve.add_argument("--enable-weight-updates", action="store_true",
                       help="answer POST /update_weights_from_disk (SGLang's: serve another checkpoint of the "
                            "same model, e.g. each step of an RL run); off by default, since it reads any path "
                            "on this machine")
    serve.add_argument("--max-stored-responses", type=int, default=None,
                       help="/v1/responses kept in memory for previous_response_id and GET /v1/responses/{id}, "
                            "least recently used dropped first; per API server process and lost on restart "
                            "(default: 1000 with one API server; several keep none, since a later request may "
                            "reach another process)")
    add_engine_flags(serve)
    from radixflow.frontend.limits import add_limit_flags

    add_limit_flags(serve)

    top = sub.add_parser("top", help="a refreshing terminal view of a server's eight numbers (from /metrics)")
    top.add_argument("--url", default="http://127.0.0.1:30000", help="the server's base URL")
    top.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    top.add_argument("--once", action="store_true", help="print one frame and exit")

    from radixflow.frontend.bench.cli import add_parser as add_bench_parser

    add_bench_parser(sub)

    demo = sub.add_parser("demo-model", help="write the built-in random-weight demo model")
    demo.add_argument("--size", default="tiny", help="tiny or small")
    demo.add_argument("--out", required=True, help="output directory")
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if ns.command == "demo-model":
        from radixflow.runtime.model.demo import write_demo_model

        try:
            print(write_demo_model(ns.size, ns.out))
        except ValueError as exc:
            print(f"radixflow: {exc}", file=sys.stderr)
            return 2
        return 0
    if ns.command == "bench":
        from radixflow.frontend.bench.cli import main as bench_main

        return bench_main(ns)
    if ns.command == "top":
        from radixflow.frontend.top import run

        try:
            run(ns.url, ns.interval, ns.once)
        except KeyboardInterrupt:
            return 0
        except OSError as exc:
            print(f"radixflow top: cannot read {ns.url}/metrics: {exc}", file=sys.stderr)
            return 1
        return 0
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from radixflow.frontend.server import serve

    return serve(ns, engine_kwargs(ns))


if __name__ == "__main__":
    sys.exit(main())
