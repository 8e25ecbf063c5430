"""Docs are tested: every CLI command has help text and appears in the README; the README shows the front door."""

from __future__ import annotations

from pathlib import Path

import typer.main

from harness.cli import app

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _commands(group, prefix: str = "evotrainer"):
    click_group = typer.main.get_command(group) if not hasattr(group, "commands") else group
    for name, cmd in click_group.commands.items():
        path = f"{prefix} {name}"
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, path)
        else:
            yield path, cmd


def test_every_command_has_help_and_is_in_readme():
    cmds = list(_commands(app))
    assert len(cmds) >= 15
    missing_help = [p for p, c in cmds if not (c.help or "").strip()]
    assert not missing_help, f"commands without help text: {missing_help}"
    for path, _ in cmds:
        group, _, leaf = path.rpartition(" ")
        # `evotrainer skills list|show|...` documents several leaves on one line
        assert path in README or any(group in line and leaf in line for line in README.splitlines()), \
            f"{path} is not documented in README.md"


def test_readme_front_door():
    assert "make demo" in README and "make test" in README


def test_every_example_config_loads():
    from harness.config import load_config

    examples = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))
    assert {p.name for p in examples} >= {"mapf_quick.yaml", "mapf_overnight.yaml", "mapf_gpu.yaml", "math_quick.yaml"}
    for p in examples:
        assert p.name in README, f"{p.name} is not mentioned in README.md"
        if p.name.startswith("experiment_"):  # an experiment wraps a run config: experiment_<family>.yaml
            from harness.experiment import load_experiment, plan

            exp = load_experiment(p)
            plan(exp)  # every arm's run config validates
            assert exp.run["task"] == p.stem.split("_")[1], (p.name, exp.run["task"])
            continue
        cfg = load_config(p)
        assert cfg.task == p.name.split("_")[0], (p.name, cfg.task)  # <family>_<what>.yaml
