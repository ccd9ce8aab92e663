"""The `radixflow` command: help, the demo-model writer, and engine flags derived from the config."""
from __future__ import annotations

import dataclasses
import filecmp
import os
import subprocess
import sys

from radixflow.frontend.cli import build_parser, engine_kwargs
from radixflow.runtime import demo_model
from radixflow.runtime.config import EngineConfig


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "radixflow.frontend.cli", *args],
                          capture_output=True, text=True, timeout=120)


def test_help_lists_commands():
    proc = _cli("--help")
    assert proc.returncode == 0 and "serve" in proc.stdout and "demo-model" in proc.stdout


def test_demo_model_command_writes_the_demo_model(tmp_path):
    proc = _cli("demo-model", "--size", "tiny", "--out", str(tmp_path / "m"))
    assert proc.returncode == 0, proc.stderr
    cached = demo_model("tiny")
    for name in os.listdir(cached):
        assert filecmp.cmp(os.path.join(cached, name), tmp_path / "m" / name, shallow=False), name


def test_demo_model_command_rejects_unknown_size(tmp_path):
    proc = _cli("demo-model", "--size", "huge", "--out", str(tmp_path / "m"))
    assert proc.returncode == 2 and "tiny" in proc.stderr


def test_every_config_field_is_a_serve_flag():
    ns = build_parser().parse_args(["serve", "--max-num-seqs", "7", "--disable-radix-cache",
                                    "--no-jump-forward", "--schedule-policy", "fcfs"])
    kwargs = engine_kwargs(ns)
    assert set(kwargs) == {f.name for f in dataclasses.fields(EngineConfig)}
    cfg = EngineConfig(**kwargs)
    assert (cfg.max_num_seqs, cfg.disable_radix_cache, cfg.jump_forward, cfg.schedule_policy) == (7, True, False, "fcfs")
    defaults = EngineConfig(**engine_kwargs(build_parser().parse_args(["serve"])))
    assert defaults == EngineConfig()
