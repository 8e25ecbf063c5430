"""The run's lifecycle: create a run directory and drive the graph, resume an interrupted run, answer a paused one.

    from harness.lifecycle import start_run, resume_run
    run_dir = start_run(load_config("examples/mapf_quick.yaml"), runs_dir="runs")
    resume_run(run_dir)            # after a crash: re-enters the interrupted node

One driver per run (a lock file); the LangGraph checkpoints live in graph.db, everything else in run.db and on disk.
Errors a user can fix are `RunError`s naming the fix.

Nothing the tool did not create is deleted or overwritten: a run id is a plain name (`check_run_id`), a new run goes
into an absent or empty folder (or one holding only a killed start's lock), a run folder is recognised by the marker
`start_run` writes once its config.yaml is whole, plus its config or database (`is_run_dir`), and a `harness/` folder
is removed only when it is a half-made repo of that run.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from harness.config import EvalConfig, RunConfig, parse_config
from harness.graph import GATE_ACTIONS, build_graph
from harness.round0 import initial_files, make_judge
from harness.run import JUDGE_FILE, Run, RunError, RunInterrupted
from harness.store import RUN_MARKER, RunStore, acquire_lock, created_as

log = logging.getLogger(__name__)

__all__ = ["RUN_MARKER", "RunError", "answer_gate", "check_run_id", "find_run", "is_run_dir", "load_run_config",
           "new_run_id", "open_run", "resume_run", "start_run"]

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_run_id(run_id: str) -> str:
    """`run_id` when it is a plain folder name (1-100 letters, numbers, '.', '_', '-', starting with a letter or digit,
    no '..'), else RunError: an id is joined to --runs-dir, so '..', '/x' or control characters would name another
    folder."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        shown = repr(run_id[:60]) + ("..." if len(run_id) > 60 else "") if isinstance(run_id, str) else repr(run_id)
        raise RunError(f"run id {shown} is not a plain name: use 1-100 letters, numbers, '.', '_' or '-', starting "
                       "with a letter or digit (no '/', no '..')")
    return run_id


def _drive(run: Run, first_input: dict[str, Any] | None, reopen: str | None = None) -> dict[str, Any]:
    """Run the graph from `first_input` (a new run) or from its last checkpoint (None). `reopen` (what the budget edit
    said, from `resume_run(budget=...)`): when the graph has ended, its last `remember` is marked not done, so the
    graph's own edge from `remember` goes on to the next stage's `train`, and the edit is said in the run's events.
    A graph found at its end is the run finished, whatever run.db said (a reopen that failed before it reopened, a
    driver killed between the graph's end and the status)."""
    from harness.graphstore import BoundedSqliteSaver, prune

    conn = sqlite3.connect(run.run_dir / "graph.db", check_same_thread=False)
    try:
        saver = BoundedSqliteSaver(conn)
        saver.setup()
        if dropped := prune(conn, run.id):  # a graph.db written before checkpoints were bounded
            run.event(None, "resume", "graph_pruned", f"graph.db: {dropped} old LangGraph checkpoints deleted (a "
                      f"resume needs only the latest)")
        graph = build_graph(run, saver)
        cfg = {"configurable": {"thread_id": run.id}, "recursion_limit": 10_000}

        def ended() -> bool:
            snap = graph.get_state(cfg)
            return not snap.next and bool(snap.values.get("done"))

        if reopen is not None and ended():
            graph.update_state(cfg, {"done": False}, as_node="remember")
            run.event(None, "resume", "extended", reopen, reopened=True)
        out = graph.invoke(first_input, cfg, durability="sync")
        if first_input is None and ended():
            run.store.set_run_status(run.id, "finished")
        return out
    finally:
        run.close()
        conn.close()


def _open(run_dir: Path, config: RunConfig, progress) -> Run:
    store = RunStore.open(run_dir / "run.db")
    run = Run(run_dir=run_dir, config=config, store=store, progress=progress or (lambda e, d: None))
    return run


def new_run_id(config: RunConfig) -> str:
    return f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def start_run(config: RunConfig, runs_dir: str | Path = "runs", run_id: str | None = None,
              progress: Callable[[str, dict[str, Any]], None] | None = None) -> Path:
    """Create runs/<id>/ (run.db, harness repo, graph.db) and drive the graph to the end of the budget. The folder
    must be absent or empty: a new run never writes into a folder it did not make."""
    auto = run_id is None  # a made-up id: two runs started in the same second each get a folder of their own
    run_id = check_run_id(run_id if run_id is not None else new_run_id(config))
    config = _pinned(config)
    preflight(config)
    if Path(runs_dir).exists() and not Path(runs_dir).is_dir():
        raise RunError(f"--runs-dir {runs_dir} is not a folder; pass a folder for runs/<id>/ (created if missing)")
    # absolute: what the run records (checkpoints, rollouts, its diagnosis) names files by path, and a path as typed
    # (`--runs-dir runs`) failed a resume from any other working directory (BENCHMARKS.md, fifty-fourth session)
    runs_dir = Path(runs_dir).absolute()
    run_dir = runs_dir / run_id
    if auto:
        base = run_id
        for i in range(2, 1000):
            try:
                Path(runs_dir).mkdir(parents=True, exist_ok=True)
                run_dir.mkdir()  # atomic: of two starts in one second, one gets `base`, the other `base-2`
                break
            except FileExistsError:
                run_id = f"{base}-{i}"
                run_dir = runs_dir / run_id
            except OSError as exc:
                raise RunError(f"cannot create the run folder {run_dir}: {exc.strerror}; pass a writable "
                               "--runs-dir") from None
    if (run_dir / "run.db").exists():
        raise RunError(f"run {run_id} already exists in {runs_dir}; resume it with `evotrainer resume {run_dir}`")
    leftovers = {"lock", "config.yaml.tmp"}  # a start killed before its marker: its own lock (and config draft) only
    if run_dir.is_dir() and any(p.name not in leftovers for p in run_dir.iterdir()):
        raise RunError(f"{run_dir} already exists and is not empty; nothing was written: pick another --run-id or "
                       f"--runs-dir" + (f" (or `evotrainer resume {run_dir}`: it is a run killed while being created)"
                                        if is_run_dir(run_dir) else ""))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunError(f"cannot create the run folder {run_dir}: {exc.strerror}; pass a writable --runs-dir") from None
    lock = acquire_lock(run_dir, run_id)
    try:
        # config.yaml whole before the marker: a folder with the marker always has a config a resume can read (a kill
        # between the two used to leave the marker beside an empty config.yaml, which neither run nor resume took)
        tmp = run_dir / "config.yaml.tmp"
        tmp.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        tmp.replace(run_dir / "config.yaml")
        (run_dir / RUN_MARKER).write_text(f"{run_id}\n")
        if progress is not None:  # where it is, first: `status` from another shell needs the folder (a made-up id)
            progress("run", {"message": f"run {run_id} in {run_dir}: `evotrainer status {run_dir}` from another "
                                        "shell"})
        _drive_prepared(run_dir, config, progress, {"run_id": run_id, "stage": 0, "log": []})
    except KeyboardInterrupt:  # Ctrl-C: the CLI says how to go on, with the folder (a made-up id is not typed)
        raise RunInterrupted(run_dir) from None
    finally:
        lock.release()
    return run_dir


def preflight(config: RunConfig) -> None:
    """Every check of a run config that needs no run folder, each a RunError of one line naming the field and the fix,
    before anything trains: the checkpoint or the preset's alphabet, the rollout backend, the scale address, every
    generator config on the splits it is drawn on, the scripted engineer's file, the thread and task environment
    variables, the engineer's endpoint and the skill library. `start_run` calls it; so do `experiment` and `bench
    scenarios` for the run config their arms share (they used to train a warm start, or whole arms, first)."""
    ckpt = config.policy.checkpoint
    if ckpt and not Path(ckpt).is_dir():
        raise RunError(f"policy.checkpoint {ckpt} does not exist; point it at a local Hugging Face model directory "
                       "(with config.json and tokenizer files) or use policy.preset: tiny|small")
    if ckpt:  # architecture, tokenizer, pad token, chat template: one line before anything trains
        from policies.model import PolicyLoadError, check_checkpoint

        try:
            check_checkpoint(ckpt, config.style)
        except PolicyLoadError as exc:
            raise RunError(f"policy.checkpoint: {exc}") from None
        if why := _task_fits_checkpoint(config):
            raise RunError(f"policy.checkpoint: {why}")
    elif why := _task_fits_alphabet(config):
        raise RunError(why)
    if config.policy.backend == "vllm":  # fail before any training, naming the setting and the fix
        from policies.rollout import RolloutBackendError, resolve_backend

        try:
            resolve_backend("vllm")
        except RolloutBackendError as exc:
            raise RunError(f"policy.backend: {exc}") from None
    _check_scale(config)
    _check_generators(config)
    script = config.engineer.script if config.engineer.kind == "scripted" else None
    if script and not Path(script).is_file():  # else every stage would quietly fall back to the rule engineer
        raise RunError(f"engineer.script {script} not found (relative paths are read from {Path.cwd()}); point it at "
                       "the .yaml/.jsonl file of replies, or use engineer.kind: rule")
    if script:  # and read, for the same reason: a file that does not parse fell back at every stage
        from harness.engineer.scripted import ScriptError, load_script

        try:
            load_script(Path(script))
        except ScriptError as exc:
            raise RunError(f"engineer.script: {exc}; fix the file, or use engineer.kind: rule") from None
    from harness.tasks import get_task
    from harness.tasks.base import CheckEnvironment
    from harness.threads import check_env

    check_env()  # a bad thread or core count in the environment is refused before the run folder exists
    if isinstance(task := get_task(config.task), CheckEnvironment):  # and the task's own settings
        try:
            task.check_environment()
        except ValueError as exc:
            raise RunError(str(exc)) from None
    _check_engineer(config)
    _check_library()


FIT_SAMPLE = 32  # instances of each distribution whose prompts and expert answers a checkpoint is checked against


def _task_fits_checkpoint(config: RunConfig) -> str | None:
    """Why a user's checkpoint cannot do this run's task, or None, from its tokenizer and config alone (no weights):
    the longest prompt of the round-0 mix and the target (the run's prompt style, its chat template applied) plus
    the longest completion the run asks for (the recipe's and the judge's budgets, or 1.5 x the expert's longest
    answer when that is more: what the judge is fitted to) beyond the model's positions (before: the warm start
    trained, then the first held-out reading died in an index error); or a tokenizer that cannot write the task's
    answers (the expert's answer, encoded and decoded, no longer scores valid: a vocabulary without the symbols the
    answers use, or a decoder that drops spaces; before: the run trained all night at 0% valid)."""
    import json
    import math

    from harness.seeds import seeds
    from harness.tasks import get_task
    from policies.model import format_prompt, load_tokenizer

    task = get_task(config.task)
    try:
        tok = load_tokenizer(config.policy.checkpoint)
        meta = json.loads((Path(config.policy.checkpoint) / "config.json").read_text())
    except Exception:  # noqa: BLE001 - check_checkpoint has said what is wrong with the folder itself
        return None
    limit = next((meta[k] for k in ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len",
                                    "seq_length") if isinstance(meta.get(k), int)), None)
    try:
        env0, recipe, target = _round0_and_target(config, task)
    except Exception:  # noqa: BLE001 - a bad harness is named where the run builds it
        return None
    style, longest_prompt, longest_answer = config.style, 0, 0
    for env in (env0, target):
        for s in seeds("probe", FIT_SAMPLE):
            inst = task.generate(env, s)
            text = task.prompt(inst, style)
            prompt = format_prompt(tok, text)  # every style: a template (a system prompt) wraps every prompt
            longest_prompt = max(longest_prompt, len(tok(prompt, add_special_tokens=False)["input_ids"]))
            expert = task.expert(inst, style)
            ids = tok(expert, add_special_tokens=False)["input_ids"]
            longest_answer = max(longest_answer, len(ids) + 1)
            back = tok.decode(ids, skip_special_tokens=True)
            if back != expert and task.score(inst, expert).valid and not task.score(inst, back).valid:
                return (f"its tokenizer cannot write {config.task}'s answers: the expert's answer {expert[:60]!r} "
                        f"comes back as {back[:60]!r}, which no longer scores valid (a vocabulary without the symbols "
                        "the answers use, or a decoder that drops spaces); use a tokenizer that round-trips them")
    completion = max(recipe.max_completion_length, config.backtest.max_new_tokens or 0,
                     math.ceil(1.5 * longest_answer))
    if limit is not None and longest_prompt + completion > limit:
        return (f"{config.task}'s prompts take up to {longest_prompt} tokens in style {style} and completions up to "
                f"{completion} (the recipe's and the judge's budgets), more than the model's {limit} positions; use a "
                "checkpoint with a longer context, or a shorter prompt style or max_completion_length")
    return None


def _round0_and_target(config: RunConfig, task):
    """(round-0 env, round-0 recipe, the target env) as the run will have them: the target is `backtest.env`, else
    the round-0 env."""
    from harness.round0 import harness_models
    from sandbox.workspace import TEMPLATE_DIR

    files = {"recipe.yaml": (TEMPLATE_DIR / "recipe.yaml").read_text(), **initial_files(config)}
    env0, recipe, _ = harness_models(files, task)
    target = task.spec.config_model.model_validate(config.backtest.env) if config.backtest.env else env0
    return env0, recipe, target


ALPHABET_SAMPLE = 8  # instances of each distribution whose characters a preset's alphabet is checked against


def _task_fits_alphabet(config: RunConfig) -> str | None:
    """Why a preset model cannot read or write this run's task, or None: a character of the prompts or the expert's
    answers (round-0 mix and target, the run's style) that the family's `spec.alphabet` lacks is `<unk>` to the
    preset's char tokenizer (a family whose alphabet missed two letters trained and scored 27% with no word said)."""
    from harness.seeds import seeds
    from harness.tasks import get_task

    task = get_task(config.task)
    try:
        env0, _, target = _round0_and_target(config, task)
        seen: set[str] = set()
        for env in (env0, target):
            for s in seeds("probe", ALPHABET_SAMPLE):
                inst = task.generate(env, s)
                seen |= set(task.prompt(inst, config.style)) | set(task.expert(inst, config.style))
    except Exception:  # noqa: BLE001 - a bad harness or generator is named where the run builds it
        return None
    missing = sorted(seen - set(task.spec.alphabet))
    if not missing:
        return None
    return (f"task {config.task}: its prompts or answers (style {config.style}) use {len(missing)} character(s) its "
            f"spec.alphabet lacks: {''.join(missing)[:40]!r}; the preset's char tokenizer reads them as <unk>. Add them "
            "to the family's TaskSpec.alphabet")


def _pinned(config: RunConfig) -> RunConfig:
    """The config as the run keeps it (config.yaml, run.db): what could read differently later made fixed now. Paths
    the user gave relative to where they started it (`policy.checkpoint`, `engineer.script`, `engineer.model_path`,
    `engineer.ca_bundle`)
    made absolute, so a resume from another folder finds them; the prompt style, which for a checkpoint is read from
    its `evotrainer.json`, written out (`policy.style`), so a checkpoint deleted, moved or retrained after the start
    cannot switch the run's prompts halfway (the resumed stages prompted in another style, silently)."""
    def absolute(p: str | None) -> str | None:
        return str(Path(p).expanduser().absolute()) if p else p

    policy = config.policy.model_copy(update={"checkpoint": absolute(config.policy.checkpoint),
                                              "style": config.policy.style or config.style})
    eng = config.engineer
    eng = eng.model_copy(update={"script": absolute(eng.script), "ca_bundle": absolute(eng.ca_bundle),
                                 "model_path": eng.model_path if eng.model_path in (None, "policy")
                                 else absolute(eng.model_path)})
    return config.model_copy(update={"policy": policy, "engineer": eng})


def open_run(run_dir: Path, config: RunConfig, progress: Callable[[str, dict[str, Any]], None] | None = None) -> Run:
    """A run folder for a client that drives the stage's nodes itself (the experiment's baselines, its shared warm
    start): made when missing (marker, config.yaml, run.db, harness repo, judge), opened as it is otherwise. The
    caller ends it with `run.close()` and `run.store.close()`."""
    check_run_id(run_dir.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / RUN_MARKER).exists():
        # config.yaml whole before the marker, as `start_run` writes them: a kill between the two left a marker beside
        # no config, and the experiment's "made from other settings" check then passed a changed warm start by
        tmp = run_dir / "config.yaml.tmp"
        tmp.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        tmp.replace(run_dir / "config.yaml")
        (run_dir / RUN_MARKER).write_text(f"{run_dir.name}\n")
    return _prepare(run_dir, config, progress)


def _engineer_problem(config: RunConfig) -> str | None:
    """Why the run's LLM engineer cannot answer now (`harness.engineer.preflight`), or None (also when the check is
    off: `engineer.preflight: false`)."""
    if config.engineer.kind != "llm" or not config.engineer.preflight:
        return None
    from harness.engineer import preflight

    return preflight(config.engineer)


def _check_engineer(config: RunConfig) -> None:
    """An LLM engineer that cannot answer at start is one line with the fix, before anything trains: an overnight
    run would otherwise train all night with every stage's proposal falling back to the rule engineer."""
    why = _engineer_problem(config)
    if why is None:
        return
    fix = ("start the server (e.g. `vllm serve MODEL`) or fix engineer.base_url / model / api_key_env"
           if config.engineer.base_url else "point engineer.model_path at a save_pretrained checkpoint folder")
    raise RunError(f"engineer: {why}; {fix}, use engineer.kind: rule, or set engineer.preflight: false to start anyway "
                   "(a stage the engineer cannot answer falls back to the rule engineer)")


def _check_generators(config: RunConfig) -> None:
    """Every generator config of the run must give instances on the splits the run draws it on: the round-0 `env`
    (train, probe), `warm_start.env` (train), the judge's `backtest.env` (probe, backtest: a generator that refuses a
    split, an evaluation set, which only the test split may draw) and `eval.env` (test). One that cannot is one line
    naming its field here, not an error after the warm start trained (`eval.env`), or after the first stage's
    training. The generator's own words name a knob as `env.<...>`: said here with the field's path. A config that
    misses one seed of `START_DRAWS` is fine (the run draws that seed from a replacement, `drawn.draw_replacing`)."""
    import re

    from harness.seeds import seeds
    from harness.tasks import get_task
    from harness.tasks.drawn import misses

    task = get_task(config.task)
    for field, data, splits in (("env", config.env, ("train", "probe")),
                                ("warm_start.env", config.warm_start.env, ("train",)),
                                ("backtest.env", config.backtest.env, ("probe", "backtest")),
                                ("eval.env", config.eval.env, ("test",))):
        if not data:
            continue
        try:
            env = task.spec.config_model.model_validate(data)
            for split in splits:  # a config may miss a seed (the run draws a replacement), not two of four
                _, failed = misses(task, env, seeds(split, START_DRAWS), START_MISSES)
                if len(failed) >= START_MISSES:
                    raise failed[min(failed)]
        except ValueError as exc:  # a pydantic ValidationError is one
            text = " ".join(str(exc).split())[:400]
            if field != "env":
                text = re.sub(r"(?<![\w.])env\.", f"{field}.", text)
            raise RunError(f"{field}: {text}") from None


START_DRAWS, START_MISSES = 4, 2  # seeds of each split a config's start check draws, and the misses that refuse it
# (before: 2 of 2 had to draw, so a config that misses one seed in a hundred was refused one start in fifty)
APART_CHECK_N = 64  # training instances a family of one's own is drawn for at a run's first start
_apart_notes: dict[str, str | None] = {}  # per process: an experiment's arms open one run folder each


def held_apart_note(config: RunConfig, files: dict[str, str] | None = None) -> str | None:
    """For a family of one's own (not defined under harness/tasks): a warning when an instance of the run's test set
    (`eval`: its generator config or named suite, as the run draws it) has the prompt of one of APART_CHECK_N
    train-split instances of the round-0 env (the harness repo's env.yaml in `files`, by default the round-0 harness
    the config makes): held-out readings would then score instances the policy trains on. A built-in family holds its
    splits apart by content (`harness.seeds.held_apart`, tested for each); a user's `generate` must wrap its draw the
    same way (harness/tasks/base.py), and nothing else checks that it does. `start_run` and `experiment` say it. A
    warning, not a refusal (a level with too few distinct instances collides even when held apart, and `held_apart`
    says so itself); a generator that cannot draw either side (a training-only bank, say) is not checked: the run's
    own draws say what is wrong with it. Once per process for one setting."""
    import json

    from harness.round0 import harness_models, initial_files
    from harness.seeds import seeds
    from harness.tasks import get_task
    from harness.tasks.drawn import built_in
    from harness.tasks.suites import draw_test

    task = get_task(config.task)
    if built_in(task):
        return None
    files = files if files is not None else initial_files(config)
    key = json.dumps([config.task, files.get("env.yaml"), config.eval.model_dump(mode="json"), config.style])
    if key not in _apart_notes:
        try:
            env = harness_models(files, task)[0]
            train = {task.prompt(task.generate(env, s), config.style) for s in seeds("train", APART_CHECK_N)}
            test = draw_test(task, config.eval)
            shared = sum(task.prompt(inst, config.style) in train for _, inst in test)
        except Exception as exc:  # noqa: BLE001 (a check that advises: a family's own error is the run's to report)
            log.debug("held-apart check of %s skipped: %s", config.task, exc)
            shared, test = 0, []
        _apart_notes[key] = None if not shared else (
            f"task {config.task}: {shared} of the {len(test)} test instances have the prompt of one of "
            f"{APART_CHECK_N} train-split instances of the round-0 env, so held-out readings would score instances "
            "the policy trains on: wrap the family's draw in `harness.seeds.held_apart` (harness/tasks/base.py), or "
            "widen a level with too few distinct instances")
    return _apart_notes[key]


def _check_library() -> None:
    """The skill library opens, takes its seeds and passes SQLite's quick check: a damaged file or a read-only home
    is one line with the fix before anything trains (it used to crash the first stage's proposal, after the warm
    start and the stage's training)."""
    from skills.library import SkillLibrary, SkillLibraryError

    try:
        with SkillLibrary.open() as lib:
            lib.check()
    except SkillLibraryError as exc:
        raise RunError(str(exc)) from None


def _check_scale(config: RunConfig) -> None:
    """scale.backend ray without Ray, or an unreachable address: one line with the fix, before anything trains."""
    from harness.scale import ScaleError, check

    try:
        check(config.scale)
    except ScaleError as exc:
        raise RunError(str(exc)) from None


def _half_made_harness(harness: Path, config: RunConfig) -> bool:
    """True when `harness` is what a run killed inside `Workspace.create` leaves: a git repo without a single ref or
    commit whose worktree holds only the harness' own files (so it holds nothing to lose)."""
    import git

    from sandbox.workspace import TEMPLATE_DIR

    ours = {p.relative_to(TEMPLATE_DIR).as_posix() for p in TEMPLATE_DIR.rglob("*") if p.is_file()}
    ours |= set(initial_files(config) or {})
    try:
        repo = git.Repo(harness)
        empty = not repo.head.is_valid() and not list(repo.refs)
        repo.close()
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
        return False
    files = {p.relative_to(harness).as_posix() for p in harness.rglob("*")
             if p.is_file() and ".git" not in p.relative_to(harness).parts[:1]}
    return empty and files <= ours


def _prepare(run_dir: Path, config: RunConfig, progress) -> Run:
    """Open run.db, make the harness repo and the run row if they are missing. Idempotent, so a run killed while it
    was being created resumes like any other. A `harness/` that is not a harness repo is removed only when it is this
    run's own half-made one (`_half_made_harness`); anything else is refused, never deleted."""
    import shutil

    from sandbox.workspace import NotAHarnessRepo, Workspace

    harness = run_dir / "harness"
    repaired: list[str] = []
    if harness.exists():
        try:
            repaired = Workspace(harness).repairs  # a crash's leftovers, repaired on this first open: said below
        except NotAHarnessRepo:
            if not (is_run_dir(run_dir) and harness.is_dir() and not harness.is_symlink()
                    and (not any(harness.iterdir()) or _half_made_harness(harness, config))):
                raise RunError(f"{harness} exists and is not a harness repo this tool made; nothing was deleted: "
                               "move it away, or point evotrainer at a run folder it created") from None
            shutil.rmtree(harness)
    run = _open(run_dir, config, progress)
    for r in repaired:  # before: the driver asked a second open, which had nothing left to repair, so none was said
        run.event(None, "resume", "repair", r)
    if not harness.exists():
        Workspace.create(harness, files_override=initial_files(config) or None)
    notes: list[str] = []
    if not (run_dir / JUDGE_FILE).exists():  # fixed once, from the round-0 harness, before any stage can change it
        if run.id in run.store.runs():  # the run was started (its judge written first), and its judge file is gone
            run.close()
            run.store.close()
            raise RunError(f"{run_dir / JUDGE_FILE} is missing: this run's judge was fixed when it started, and "
                           "making it again now would read a harness its stages may have changed (the promoted "
                           "env and recipe) and the config as edited since; restore the file from a copy of the run "
                           "folder, or start a new run")
        files = Workspace(harness).files("main")
        judge = make_judge(config, files, notes)
        notes += [n for n in [held_apart_note(config, files)] if n]
        tmp = run_dir / (JUDGE_FILE + ".tmp")
        tmp.write_text(judge.model_dump_json(indent=1))
        tmp.replace(run_dir / JUDGE_FILE)
    run.store.create_run(run.id, config.model_dump(mode="json"), budget=config.budget.model_dump(mode="json"))
    for i, note in enumerate(notes):  # shown once, kept in run.db's events
        run.event(0, "setup", "warning", note, key=f"0/budget/{i}")
    from harness.datasette import write_metadata

    write_metadata(run_dir)  # `datasette runs/<id>/run.db --metadata runs/<id>/datasette.json`
    return run


JUDGE_INPUTS = ("env", "samples", "temperature", "max_new_tokens")  # the backtest settings the judge is made from


def _say_judge_edits(run: Run, config: RunConfig) -> None:
    """On a resume: the judge is fixed at run start (judge.json), so a config.yaml edited since then cannot move it. Say
    which of the judge's settings were edited (config.yaml against the config run.db recorded at start), instead of
    resuming as if the edit applied."""
    try:
        started = (run.store.get_run(run.id)["config"] or {}).get("backtest") or {}
    except Exception:  # noqa: BLE001 - a note, never a reason to refuse a resume: the fixed judge is what counts
        return
    now = config.backtest.model_dump(mode="json")
    edits = [f"backtest.{k} {started.get(k)!r} -> {now.get(k)!r}" if k != "env" else "backtest.env"
             for k in JUDGE_INPUTS if k in started and started.get(k) != now.get(k)]
    if edits:
        run.event(None, "resume", "warning",
                  f"config.yaml's judge settings were edited since the run started: {', '.join(edits)}; the judge is "
                  f"fixed at start ({JUDGE_FILE}) and never changes within a run, so the edit has no effect (start a "
                  "new run to judge differently)")


def _apply_threads(run: Run) -> None:
    """The run process's torch threads (`harness.threads`), said once per start or resume."""
    from harness.threads import apply_threads

    n, why = apply_threads(run.config, run.task)
    run.event(None, "setup", "threads", f"torch threads in the run process: {n} ({why})")


def _announce_sandbox(run: Run) -> None:
    """Apply the run's isolation policy for evolved code and say, once per start, what confines it on this machine."""
    from harness.diagnostics import allow_unisolated
    from sandbox.runner import protections

    allowed = run.config.sandbox.allow_unisolated_diagnostics
    allow_unisolated(allowed)
    p = protections()
    if p["isolation"] == "bwrap":
        msg = (f"evolved diagnostics run under bubblewrap; seccomp: {p['seccomp']}; whole-job memory and processes: "
               f"{p['total_memory_and_processes']}; disk: {p['disk']}")
    elif allowed:
        msg = ("WARNING: bubblewrap not found and sandbox.allow_unisolated_diagnostics is true: evolved diagnostics run "
               "as a plain subprocess and can read host files as this user; install bubblewrap (apt-get install "
               "bubblewrap)")
    else:
        msg = ("bubblewrap not found: evolved diagnostics are refused, so candidates that add or change one are "
               "rejected; install bubblewrap (apt-get install bubblewrap), or set "
               "sandbox.allow_unisolated_diagnostics: true to run them unisolated")
    run.event(None, "setup", "sandbox" if p["isolation"] == "bwrap" else "warning", msg)


def _drive_prepared(run_dir: Path, config: RunConfig, progress, first_input: dict[str, Any] | None,
                    reopen: str | None = None) -> None:
    _check_scale(config)
    run = _prepare(run_dir, config, progress)
    try:
        finished = run.store.get_run(run.id)["status"] == "finished"
        if finished and reopen is None and _graph_values(run_dir, run.id).get("done"):
            missing = "" if (run_dir / "report.html").is_file() else \
                f" (its report.html was not written: `evotrainer report {run_dir}` writes it)"
            raise RunError(f"run {run.id} already finished; give it more stages with `evotrainer resume {run_dir} "
                           f"--stages N`, start a new one with `evotrainer run CONFIG` or review it with "
                           f"`evotrainer review {run_dir}`{missing}")
        if first_input is None and run.store.get_run(run.id)["status"] == "paused":
            raise RunError(f"run {run.id} waits at the human gate: answer with `evotrainer approve {run_dir}`, "
                           f"`evotrainer revise {run_dir} \"feedback\"` or `evotrainer abort {run_dir}`")
        if first_input is None:  # a resume
            for r in run.workspace().repairs:
                run.event(None, "resume", "repair", r)
            run.event(None, "resume", "resumed", f"resumed {run.id}")
            _say_judge_edits(run, config)
            if (why := _engineer_problem(config)) is not None:  # a warning, not a refusal: a resume after a kill
                # (often unattended) keeps training; each stage tries the engineer again
                run.event(None, "resume", "warning",
                          f"the LLM engineer cannot answer now ({why}); until it can, each stage's proposal falls back "
                          "to the rule engineer (stop and resume once it answers to keep it out of the run)")
            if not _has_checkpoint(run_dir, run.id):  # killed before the graph's first checkpoint
                first_input = {"run_id": run.id, "stage": 0, "log": []}
                run.event(None, "resume", "fresh_start", f"run {run.id} was stopped before its first stage began "
                          "(nothing of it was recorded): it starts from its setup now")
        run.store.set_run_status(run.id, "running")
        try:  # a bad EVOTRAINER_THREADS / EVOTRAINER_CORES raises here: the run is then interrupted, not "running"
            _announce_sandbox(run)
            _apply_threads(run)
            out = _drive(run, first_input, reopen=reopen)
        except BaseException:
            try:  # best effort: on a full disk this write fails too, and the run's own error is the one to show
                run.store.set_run_status(run.id, "interrupted")
            except sqlite3.Error as exc:
                log.warning("run %s: could not record it as interrupted: %s", run.id, exc)
            raise
        if out and out.get("__interrupt__"):  # paused at the human gate: the pause is in graph.db
            run.store.set_run_status(run.id, "paused")
    finally:
        run.store.close()


def is_run_dir(d: Path) -> bool:
    """A folder `start_run` made: its marker (written once its config.yaml is whole) next to config.yaml or run.db; or, for runs made before the
    marker existed, a config.yaml next to a run.db whose runs table holds this folder's id. One stray config.yaml or
    run.db is not enough."""
    d = Path(d)
    try:
        if not d.is_dir():
            return False
        if (d / RUN_MARKER).is_file() and ((d / "config.yaml").is_file() or (d / "run.db").is_file()):
            return True
        if not ((d / "config.yaml").is_file() and (d / "run.db").is_file()):
            return False
    except OSError:  # a name too long for the file system, a folder we may not read
        return False
    try:
        con = sqlite3.connect(f"{(d / 'run.db').resolve().as_uri()}?mode=ro", uri=True)
        try:
            return con.execute("SELECT 1 FROM runs WHERE id = ?", [d.name]).fetchone() is not None
        finally:
            con.close()
    except sqlite3.Error:
        return False


def find_run(ref: str | Path, runs_dir: str | Path = "runs") -> Path:
    """A run directory from a path or a run id (looked up in runs_dir); see `is_run_dir`."""
    cands = list(dict.fromkeys((Path(ref), Path(runs_dir) / str(ref))))
    for cand in cands:
        if is_run_dir(cand):
            return cand
    where = f"{cands[0]} is not" if len(cands) == 1 else f"neither {cands[0]} nor {cands[1]} is"
    raise RunError(f"no run {str(ref)!r}: {where} a run folder (one made by "
                   f"`evotrainer run` holds its {RUN_MARKER} marker with config.yaml or run.db); `evotrainer runs` "
                   "lists runs, or pass --runs-dir")


def load_run_config(run_dir: Path) -> RunConfig:
    from sandbox.yamlload import load_yaml

    data = load_yaml(run_dir / "config.yaml")
    ev = data.get("eval") if isinstance(data, dict) else None
    unused = EvalConfig.model_fields["suite"].default  # runs written before EvalConfig dropped it beside env
    if isinstance(ev, dict) and ev.get("env") is not None and ev.get("suite") == unused:
        ev.pop("suite")
    return parse_config(data, str(run_dir / "config.yaml"))


def _check_named(run_dir: Path) -> None:
    """A run folder renamed since its start is refused by the commands that drive it: run.db, graph.db and the harness
    repo know the run by the id it was created with (the folder's name then), so driving it under the new name would
    start a second run inside the first one's folder. `status`, `review` and `report` read it as it is."""
    first = created_as(run_dir)
    if first is None and (run_dir / "run.db").is_file():  # an older run: the ids its database holds
        try:
            store = RunStore.open(run_dir / "run.db", read_only=True)
            try:
                ids = store.runs()
            finally:
                store.close()
        except Exception:  # noqa: BLE001 - an unreadable database is named by the driver's own open
            ids = []
        first = ids[0] if len(ids) == 1 else None
    if first is not None and first != run_dir.name:
        raise RunError(f"{run_dir} holds run {first!r}, created under that name and renamed since: its records know it "
                       f"by that id, so it is driven only under it; rename the folder back (mv {run_dir} "
                       f"{run_dir.parent / first}) to resume it (status, review and report read it as it is)")


def _peek(run_dir: Path, sql: str) -> list[Any] | None:
    """Rows of one query about this run (its id the one parameter) from run.db opened read-only, before the driver's
    own open (which migrates and writes); None when the file cannot be read or lacks the table."""
    try:
        con = sqlite3.connect(f"{(run_dir / 'run.db').resolve().as_uri()}?mode=ro", uri=True)
        try:
            return con.execute(sql, [run_dir.name]).fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return None


def _check_not_moved(run_dir: Path) -> None:
    """A run folder moved or copied since its start is refused by the commands that drive it: its records name the
    checkpoints and rollouts it wrote by absolute path, so a moved folder resumed into "No such file" mid-stage and a
    copy beside the original trained on the original's checkpoints (BENCHMARKS.md, fifty-fourth session). Records
    from before paths were absolute say nothing here."""
    import re

    rows = _peek(run_dir, "SELECT result FROM nodes WHERE run = ? LIMIT 50")
    if rows is None:  # no nodes yet, or a database the driver's own open names
        return
    pat = re.compile(r'"(/[^"]*?)/' + re.escape(run_dir.name) + r'/(?:checkpoints|rollouts|stages)/')
    for (text,) in rows:
        m = pat.search(text or "")
        if m is None:
            continue
        made = Path(m.group(1)) / run_dir.name
        if made.resolve() != run_dir.resolve() and is_run_dir(made):  # a copy beside its original: never `mv` over it
            raise RunError(f"{run_dir} is a copy of the run {made}, which is still there: its records name that "
                           f"folder's checkpoints and rollouts, so driving the copy would train on the original's "
                           f"files; resume the original (`evotrainer resume {made}`), or start a new run from the "
                           f"copy's config (`evotrainer run {run_dir}/config.yaml --run-id NEW`); status, review and "
                           "report read the copy as it is")
        if made.resolve() != run_dir.resolve():
            raise RunError(f"{run_dir} was made as {made} and moved or copied since: its records name its checkpoints "
                           f"and rollouts by that path, so driving it here would read {made}'s files or none; move it "
                           f"back (mv {run_dir} {made}) to resume it (status, review and report read it as it is)")
        return


def _check_has_run(run_dir: Path) -> None:
    """A run that got as far as its graph (graph.db) has its row in run.db; without it (a folder copied while its run
    was going on, without run.db-wal, or a -wal deleted) resuming would start the run again from setup on top of its
    checkpoints and records and rewrite run.db. Refused before anything is written, naming the likely cause."""
    if not (run_dir / "graph.db").is_file() or not (run_dir / "run.db").is_file():
        return
    if not _peek(run_dir, "SELECT 1 FROM runs WHERE id = ?"):
        raise RunError(f"{run_dir}/run.db does not hold run {run_dir.name!r} although the run got past its start "
                       "(graph.db): it was most likely copied while the run was going on without run.db-wal, or that "
                       "file was deleted; copy the folder again with its -wal files (or after the run ended) and "
                       "resume that; nothing changed")


def _check_start_checkpoint(run_dir: Path) -> None:
    """A run whose warm start is not done yet reads its `policy.checkpoint` again on resume: gone (moved, deleted),
    it is refused naming that path, since the run's config cannot change its policy (before: the load's own error,
    which advised a preset the resume would refuse). After the warm start the run needs it no more."""
    try:
        ckpt = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("policy", {}).get("checkpoint")
    except (OSError, yaml.YAMLError, AttributeError):
        return  # the config's own check says what is wrong with it
    if not ckpt or Path(ckpt).expanduser().exists():
        return
    if _peek(run_dir, "SELECT 1 FROM nodes WHERE run = ? AND stage = 0 AND node = 'setup'"):
        return
    raise RunError(f"this run started from the checkpoint {ckpt}, which is no longer there, and its warm start is not "
                   "done: put the checkpoint back at that path, then resume (a run's policy cannot change; to start "
                   "from another checkpoint, start a new run); nothing changed")


# what config.yaml may change between a run's start and its resume: how long it runs, who proposes, where it runs,
# what it keeps on disk, when a person is asked. The judge's inputs are fixed in judge.json (an edit is said and has
# no effect: `_say_judge_edits`); anything else would change what the recorded stages and pooled evidence mean
RESUME_EDITABLE = ("budget", "engineer", "scale", "retention", "gate.human", "sandbox")


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def config_edits(started: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """`path old -> new` for each setting of `now` (config.yaml as the resume reads it) that differs from `started`
    (the config run.db recorded at the run's start), outside `RESUME_EDITABLE` and the judge's fixed inputs. A setting
    the start did not record (a field added by a later version) is not an edit."""
    fixed_judge = {f"backtest.{k}" for k in JUDGE_INPUTS}
    before, after = _leaves(started), _leaves(now)
    edits = []
    for path, new in after.items():
        if any(path == p or path.startswith(p + ".") for p in (*RESUME_EDITABLE, *fixed_judge)):
            continue
        known = [q for q in before if q == path or q.startswith(path + ".") or path.startswith(q + ".")]
        if not known:
            continue
        old = before[path] if path in before else "(not set)" if all(path.startswith(q + ".") for q in known) \
            else {q[len(path) + 1:]: before[q] for q in known}
        if old != new:
            edits.append(f"{path} {old!r} -> {new!r}")
    # a key removed from a section that is still there (`env`, `recipe`, ... without one of its keys) falls back to
    # its default: an edit too. Only where the parent is still a mapping now, so a field a later version dropped from
    # a model (its whole section re-validated) is not one
    for path, old in before.items():
        parent = path.rpartition(".")[0]
        if path in after or not parent or any(path == p or path.startswith(p + ".") for p in (*RESUME_EDITABLE,
                                                                                             *fixed_judge)):
            continue
        free_form = parent.split(".")[0] in ("env", "recipe", "reward", "warm_start", "eval", "backtest")
        if free_form and any(q.startswith(parent + ".") for q in after) and not any(
                q == path or q.startswith(path + ".") for q in after):
            edits.append(f"{path} {old!r} -> (removed)")
    return edits


def _check_config_edits(run_dir: Path) -> None:
    """A config.yaml edited since the run started, beyond what a resume may change (`RESUME_EDITABLE`), is refused
    before anything is written, naming each edit: the run's stages, arms and pooled evidence were recorded under the
    config it started with, and an edited task, env or recipe either changed the meaning of that evidence silently or
    failed mid-stage with a message about something else (a task edit: a generator's field error)."""
    import json as _json

    rows = _peek(run_dir, "SELECT config FROM runs WHERE id = ?")
    if not rows or not rows[0][0]:
        return
    try:
        started = _json.loads(rows[0][0])
        now = load_run_config(run_dir).model_dump(mode="json")
    except (ValueError, TypeError):  # an unreadable config.yaml is named by the driver's own load
        return
    if edits := config_edits(started, now):
        shown = "; ".join(edits[:5]) + (f"; and {len(edits) - 5} more" if len(edits) > 5 else "")
        raise RunError(f"{run_dir}/config.yaml was edited since the run started: {shown}. A resume may change only "
                       f"{', '.join(RESUME_EDITABLE)} (budget through `evotrainer resume RUN --stages N`); put the rest "
                       f"back as it was, or start a new run from the edited file (`evotrainer run {run_dir}/config.yaml "
                       "--run-id NEW`); nothing changed")


BUDGET_KEYS = ("stages", "wall_clock", "compute_s", "plateau")  # what `resume_run(budget=...)` may raise


def resume_run(ref: str | Path, runs_dir: str | Path = "runs",
               progress: Callable[[str, dict[str, Any]], None] | None = None,
               budget: dict[str, Any] | None = None) -> Path:
    """Continue an interrupted run from its last LangGraph checkpoint (the interrupted node runs again).

    `budget` ({"stages": 6}, any of `BUDGET_KEYS`; `evotrainer resume RUN --stages 6`): the run's budget is edited
    first (its config.yaml, one line a key; said in its events), so an interrupted run goes on to the new budget and a
    FINISHED one is reopened: its next stage starts from the policy its last stage left (the lineage, as any next
    stage would) under harness@main, with every recorded decision, skill and seed cursor as it was. A budget that
    would stop the run again at once (`harness.stagebook.budget_stop`: the wall clock and the plateau count from the
    run's start), a run a person aborted, and a config the budget edit makes invalid are refused before anything
    changes, naming the fix."""
    run_dir = find_run(ref, runs_dir)
    _check_named(run_dir)
    _check_not_moved(run_dir)
    _check_has_run(run_dir)
    _check_config_edits(run_dir)
    _check_start_checkpoint(run_dir)
    _check_library()
    lock = acquire_lock(run_dir, run_dir.name)
    untouched = True  # a budget refused before anything changed leaves a killed driver's pid for `status` to name
    try:
        reopen = _raise_budget(run_dir, budget, progress) if budget else None
        untouched = False
        _drive_prepared(run_dir, load_run_config(run_dir), progress, None, reopen=reopen)
    except KeyboardInterrupt:
        raise RunInterrupted(run_dir) from None
    finally:
        lock.release(untouched=untouched)
    return run_dir


def _graph_values(run_dir: Path, run_id: str) -> dict[str, Any]:
    """The run graph's state at its latest LangGraph checkpoint ({} before the first)."""
    from harness.graphstore import BoundedSqliteSaver

    if not (run_dir / "graph.db").is_file():
        return {}
    conn = sqlite3.connect(run_dir / "graph.db")
    try:
        tup = BoundedSqliteSaver(conn).get_tuple({"configurable": {"thread_id": run_id}})
    finally:
        conn.close()
    return (tup.checkpoint.get("channel_values") or {}) if tup is not None else {}


def _raise_budget(run_dir: Path, budget: dict[str, Any],
                  progress: Callable[[str, dict[str, Any]], None] | None = None) -> str | None:
    """Edit the run's budget in its config.yaml (see `resume_run`); RunError, with nothing changed, when the edit is
    not valid, the run waits at the human gate, is not a loop run, or has ended and the new budget would not let it
    run one more stage. Returns what the edit said when the run's graph has ended (the driver reopens it and says
    so), else None (said here, in run.db's events and to `progress`, with the stage that ends the run when the new
    budget stops it after the stage it was interrupted in). A stage whose stop was decided under the old budget but
    not yet acted on (a run killed late in its last `remember`) has its stop decided again under the new one."""
    from harness.config import ConfigError
    from harness.results import StopChecked
    from harness.stagebook import budget_stop
    from harness.yamledit import set_leaf_text

    if unknown := sorted(set(budget) - set(BUDGET_KEYS)):
        raise RunError(f"unknown budget key(s) {', '.join(unknown)}: one of {', '.join(BUDGET_KEYS)}")
    if not (run_dir / "graph.db").is_file():
        raise RunError(f"{run_dir} has no graph.db: it is not a run of the loop (an experiment's baseline arm?), so "
                       "it has no budget to raise; nothing changed")
    path = run_dir / "config.yaml"
    old_text = path.read_text()
    old = load_run_config(run_dir)
    data = old.model_dump(mode="json")
    data["budget"] = {**data["budget"], **budget}
    try:
        new = parse_config(data, str(path))
    except ConfigError as exc:
        raise RunError(f"run {run_dir.name}: the budget edit is not valid: {exc}; nothing changed") from None
    store = RunStore.open(run_dir / "run.db", create=False)
    try:
        row = store.get_run(run_dir.name)
        if row["status"] == "paused":
            raise RunError(f"run {run_dir.name} waits at the human gate: answer it first (`evotrainer approve "
                           f"{run_dir}`, `revise` or `abort`), then raise its budget; nothing changed")
        values = _graph_values(run_dir, run_dir.name)
        ended = bool(values.get("done")) and "stage" in values  # (a run killed between its "finished" status and
        # the graph's last checkpoint has not ended: its last `remember` runs again, under the new budget)
        elapsed = time.time() - store.started_at(run_dir.name)
        swp = int(values.get("stages_without_promotion") or 0)

        def stops_after(k: int) -> str | None:  # what the new budget says after stage k
            return budget_stop(new.budget, k, elapsed, lambda: store.seconds_spent(run_dir.name), swp)

        redecided = ""
        if ended:
            said = str(values.get("stop_reason") or "")
            if said.startswith("aborted"):
                raise RunError(f"run {run_dir.name} was {said}; a person stopped it, so it is not reopened: start a "
                               "new run with `evotrainer run CONFIG`; nothing changed")
            k = int(values["stage"]) - 1
            if (why := stops_after(k)) is not None:
                hint = {"stage": f"--stages above {k}",
                        "wall": "--wall-clock above " + (f"{elapsed / 3600:.1f}h" if elapsed >= 3600
                                                         else f"{elapsed / 60:.0f}m")
                        + " (it counts from the run's start)",
                        "compute": "--compute-s above what the ledger spent",
                        "plateau": "--plateau above the stages it went without a promotion, or 0"}
                fix = next((v for key, v in hint.items() if why.startswith(key)), "a larger budget")
                raise RunError(f"run {run_dir.name} finished after stage {k} ({said}); with the new budget it would "
                               f"stop again at once ({why}): pass {fix}; nothing changed")
        if not ended and "stage" in values and "stages" in budget and new.budget.stages < int(values["stage"]):
            # an interrupted run is in stage k: a stage budget below k cannot end it where it says (the stage it is
            # in runs to its end first, so the run would stop after k stages under a budget that says fewer)
            k = int(values["stage"])
            raise RunError(f"run {run_dir.name} was interrupted in stage {k}: a stage budget of "
                           f"{new.budget.stages} is below the stages it has begun; pass --stages {k} to stop it "
                           f"after the stage it is in (or more to go on); nothing changed")
        again = None  # a stage whose stop was decided under the old budget and not yet acted on
        if not ended and "stage" in values and (stop := store.result(run_dir.name, int(values["stage"]),
                                                                    StopChecked)) is not None \
                and stop.reason and not stop.reason.startswith("aborted"):
            k = int(values["stage"])
            if stops_after(k) is None:
                again = k
                redecided = f"; stage {k}'s stop ({stop.reason}) decided again: it goes on"
        if not ended and again is None and "stage" in values and (why := stops_after(k := int(values["stage"]))) \
                and why != budget_stop(old.budget, k, elapsed, lambda: store.seconds_spent(run_dir.name), swp):
            # the edit ends the run: a budget stops new stages, never one begun, so the stage the run was
            # interrupted in runs to its end first (said: it used to look as if the edit were ignored)
            redecided = (f"; it stops after stage {k}, the stage it was interrupted in, which runs to its end first "
                         f"({why})")
        try:
            text = old_text
            for key, value in budget.items():
                text = set_leaf_text(text, ["budget", key], value)
        except (KeyError, ValueError) as exc:
            raise RunError(f"run {run_dir.name}: its config.yaml's budget cannot be edited in place ({type(exc).__name__}: "
                           f"{exc}); edit config.yaml by hand or start a new run; nothing changed") from None
        tmp = path.with_name("config.yaml.tmp")
        tmp.write_text(text)
        tmp.replace(path)
        store.set_run_budget(run_dir.name, new.budget.model_dump(mode="json"))
        if again is not None:  # after the edit: a failed write leaves the old decision with the old budget
            store.save_result(run_dir.name, again, StopChecked(reason=None))
        before, after = old.budget.model_dump(mode="json"), new.budget.model_dump(mode="json")
        edits = ", ".join(f"budget.{key} {before[key]!r} -> {after[key]!r}" for key in budget)
        if ended:
            return f"{edits} (finished run, reopened for more stages)"
        said = f"{edits} ({row['status']} run{redecided})"
        store.add_event(run_dir.name, "extended", said)
        if progress is not None:
            progress("event", {"message": said})
        return None
    finally:
        store.close()


def answer_gate(ref: str | Path, action: str, feedback: str = "", runs_dir: str | Path = "runs",
                progress: Callable[[str, dict[str, Any]], None] | None = None) -> Path:
    """Answer a run waiting at the human gate (approve | revise | abort) and continue it in this process. A run that
    is not waiting (running, finished, already answered) is a RunError saying so; nothing changes."""
    from langgraph.types import Command

    if action not in GATE_ACTIONS:
        raise RunError(f"unknown gate answer {action!r}; choose one of {', '.join(GATE_ACTIONS)}")
    if action == "revise" and not feedback.strip():
        raise RunError("revise needs feedback: evotrainer revise RUN \"what to change and why\"")
    run_dir = find_run(ref, runs_dir)
    _check_named(run_dir)
    _check_not_moved(run_dir)
    _check_has_run(run_dir)
    _check_config_edits(run_dir)
    lock = acquire_lock(run_dir, run_dir.name)
    untouched = True
    try:
        store = RunStore.open(run_dir / "run.db", create=False)
        try:
            status = store.get_run(run_dir.name)["status"]
        finally:
            store.close()
        if status != "paused":
            if status == "running" and lock.stale_pid is not None:  # its driver was killed: what `status` says
                status = f"interrupted: its driver, pid {lock.stale_pid}, died; `evotrainer resume {run_dir}`"
            untouched = True
            raise RunError(f"run {run_dir.name} is not waiting at a gate (status: {status}); nothing changed")
        untouched = False
        _drive_prepared(run_dir, load_run_config(run_dir), progress,
                        Command(resume={"action": action, "feedback": feedback}))
    except KeyboardInterrupt:
        raise RunInterrupted(run_dir) from None
    finally:
        lock.release(untouched=untouched)
    return run_dir


def _has_checkpoint(run_dir: Path, run_id: str) -> bool:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(run_dir / "graph.db", check_same_thread=False)
    try:
        return SqliteSaver(conn).get_tuple({"configurable": {"thread_id": run_id}}) is not None
    finally:
        conn.close()
