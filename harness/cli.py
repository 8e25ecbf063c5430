"""`evotrainer`: the command line. The only top floor: it parses arguments, calls the library, and turns the library's
typed errors into one clear line and an exit code. Heavy imports (torch, trl, langgraph) happen inside commands so that
`evotrainer --help` starts fast.

    evotrainer --help
    evotrainer env sample --task mapf --n 3
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

app = typer.Typer(
    help="evotrainer: train an RL policy in stages and evolve its training harness between stages.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
env_app = typer.Typer(help="Inspect a task's environment generator: sample instances, print distribution stats.",
                      no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks (figures go to BENCHMARKS.md).", no_args_is_help=True)
skills_app = typer.Typer(help="The skill library shared by runs: list, show, export, import.", no_args_is_help=True)
app.add_typer(env_app, name="env")
app.add_typer(bench_app, name="bench")
app.add_typer(skills_app, name="skills")

console = Console()
err = Console(stderr=True)


class UserError(Exception):
    """Base for errors that are the user's input, not a bug: the CLI prints them as one line and exits 2."""


def fail(msg: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code)


def main() -> None:
    """Console-script entry point: user errors become one line on stderr and exit code 2."""
    from pydantic import ValidationError

    try:
        app()
    except (UserError, ValidationError, ValueError, FileNotFoundError) as exc:  # library errors carry their fix
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(2)


# --- env (issue: foundation / MAPF) ------------------------------------------------------------------------------

# --- bench -------------------------------------------------------------------------------------------------------

# --- train / eval (issue: policy layer) --------------------------------------------------------------------------

# --- skills (issue: autonomous run) ------------------------------------------------------------------------------

# --- run / resume / status / review / report (issue: autonomous run) ---------------------------------------------


if __name__ == "__main__":
    main()
