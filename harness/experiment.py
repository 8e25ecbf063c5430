"""The headline experiment: does an evolving harness train a better policy than the alternatives, at equal compute?

    evotrainer experiment examples/experiment_mapf.yaml --seeds 3 --out runs/experiment

Every arm and seed starts from one warm start (the run config's SFT warm start, made once by the stage's own setup in
`<out>/warmstart`, cached), trains the same number of stages with the same recipe, and is judged on the same held-out
test suite, greedy, after every stage. Seeds vary the RL randomness and the random arm's draw, not the warm start, so
the intervals across seeds measure RL variance. (Every arm's run draws its instances from its own keyed seed cursor,
as the loop does, so seeds do not vary the training instances.)

Every arm is a run of the stage's machinery (`harness.run.Run`: run.db, keyed seed cursor, compute ledger, the held-out
report, resume from stored typed results). The evolved arms are the loop itself; a baseline is a provider of each
stage's harness (`harness.baselines`: setup, then provide -> train -> report per stage), so a new baseline is one
provider class added to `BASELINES`. Arms:

- **fixed-random**: one generator config drawn at random at round 0 (each knob of the round-0 env moved uniformly
  within `random.spread` of its range, integers by at most one) and kept: the papers' baseline.
- **fixed-template**: the round-0 harness, unchanged.
- **oracle**: a scenario's known-good harness (`oracle:`, set by `harness.scenarios`), every stage.
- **plr**: prioritised level replay over the levels (the target's mixture entries when the run names a target,
  `backtest.env`, else the round-0 mixture's): before each stage the policy is probed on `plr.probe_n` instances of
  every level (`plr.samples` samples at the training temperature), each level is scored by its learnability p(1 - p),
  and the stage trains on the mixture `(1 - rho) * rank-prioritised + rho * uniform` (Jiang et al. 2021's rank
  prioritisation with temperature `beta`). Its probes are charged.
- **learnability**: the same probes, weights proportional to p(1 - p) over the top-k levels (SFL, Rutherford et al.
  2024). **bandit**: UCB over the levels on the mean |advantage| of the training rollouts themselves, no probes
  (DUMP / SEC style). Both in `harness.baselines`.
- **pbt**: population-based training over the recipe's knobs (`harness.pbt`: Jaderberg et al. 2017 truncation
  selection; the population shares the arm's budget, its fitness probes on the target are charged).
- **evolved-rule**: the full loop (`harness.lifecycle.start_run`) with the rule engineer.
- **evolved-llm**: the full loop with the LLM engineer, when the run config names an endpoint; skipped otherwise.

**Compute** is counted in GRPO step-equivalents: optimiser steps, plus every token the arm generated to judge or
steer itself (the loop's probes and backtest arms' evaluations, PLR's level probes) converted at the arm's own
generated tokens per training step, read from each run's ledger (`harness.stagebook.step_equivalents`). The evolved
arm runs its configured stages; its measured compute is then the budget of every other arm of that seed, split evenly
over the same number of stages (PLR pays its probes out of each stage's share). So the loop pays for its own judging. The held-out suite evaluation after every stage is reporting,
the same for every arm, and is not charged. Without an evolved arm, `budget_steps` sets the budget.

The **harder half** of the suite is fixed before any arm trains: the half of the suite's blocks on which the warm
start is weakest (mean over seeds), so it names no task family.

**Side by side** (`jobs` > 1, `--jobs N`): the arms are units of one schedule (warm start, then per seed the evolved
arm, then that seed's baselines, whose budget it sets) run by N worker processes with cores/N torch threads each; a
scenario set's experiments share one schedule (`run_experiments`). On a 2-core machine a tiny model's GRPO step is no
slower on one thread than on two, so two arms at once take about half the wall time (BENCHMARKS.md).

Interrupted experiments resume: finished arms (`<out>/<arm>/seed<s>/result.json`) are not re-run, a baseline's run
(`<out>/<baseline>/seed<s>`) restarts at its last finished stage, and an evolved arm's run is resumed by the loop's own
resume. What stays here: the experiment's config, its plan, the summary and the page.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.baselines import (  # noqa: F401 - plr_weights, random_env: the baselines' pieces, importable from here
    PLR,
    Bandit,
    BanditConfig,
    FixedRandom,
    FixedTemplate,
    Learnability,
    LearnabilityConfig,
    PLRConfig,
    Provider,
    RandomConfig,
    plr_weights,
    random_env,
)
from harness.pbt import PBTConfig
from harness.stagebook import compute_shares, step_equivalents
from policies import CORES_ENV, cores

ARMS: tuple[str, ...] = ("fixed-random", "fixed-template", "oracle", "plr", "learnability", "bandit", "pbt",
                         "evolved-rule", "evolved-llm")  # BASELINES + POPULATIONS + EVOLVED
EVOLVED = ("evolved-rule", "evolved-llm")
EQUAL_COMPUTE = 0.02  # an evolved arm further than this share from a baseline's budget is not at equal compute with it
# recipe knobs that change what one GRPO step costs: an arm override of one of them would make "equal steps" unequal
COMPUTE_KNOBS = ("batch_size", "num_generations", "oversample", "max_completion_length", "num_iterations", "steps")


class ExperimentError(ValueError):
    """An experiment that cannot run as configured; the message names the arm or field and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExperimentConfig(_Strict):
    run: dict[str, Any] = Field(..., description="the run config every arm shares (warm start, recipe, stages, "
                                                 "suite); the evolved arms run it as is")
    arms: list[str] = Field(["fixed-random", "fixed-template", "plr", "evolved-rule", "evolved-llm"], description=f"arms to run, from {', '.join(ARMS)}")
    seeds: int = Field(3, ge=1, le=50, description="seeds per arm (RL randomness, training instances, the random "
                                                   "draw; the warm start is shared)")
    budget_steps: int | None = Field(None, ge=1, description="GRPO step-equivalents per arm when no evolved arm runs "
                                                             "(with one, its measured compute is the budget)")
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict, description="per-arm recipe overrides, "
                                                 "e.g. {plr: {learning_rate: 1e-4}}; never a knob that changes "
                                                 "what a step costs")
    oracle: dict[str, str] | None = Field(None, description="the known-good harness files the oracle arm trains under "
                                          "every stage ({env.yaml: text, recipe.yaml: text}); a scenario sets it")
    plr: PLRConfig = Field(default_factory=PLRConfig)
    learnability: LearnabilityConfig = Field(default_factory=LearnabilityConfig)
    bandit: BanditConfig = Field(default_factory=BanditConfig)
    pbt: PBTConfig = Field(default_factory=PBTConfig)
    random: RandomConfig = Field(default_factory=RandomConfig)
    quick: dict[str, Any] = Field(default_factory=dict, description="run-config overrides (deep-merged) for --quick")
    skills: Literal["isolated", "shared"] = Field(
        "isolated", description="the skill library of the evolved runs: isolated = each run (arm x seed) starts from "
        "a copy of the library as it stood when the experiment began and hands what it learnt back to it when it "
        "ends, so seeds are independent replicates whatever their order or --jobs; shared = every run reads and "
        "writes the one library as it goes (a later seed, or a run beside it, sees an earlier one's promotions)")

    @field_validator("arms")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        if not v:  # `arms: []` ended in an IndexError traceback after experiment.json was written
            raise ValueError(f"names no arm; list at least one of {', '.join(ARMS)}")
        bad = [a for a in v if a not in ARMS]
        if bad:
            raise ValueError(f"unknown arm {bad[0]!r}; choose from {', '.join(ARMS)}")
        if len(set(v)) != len(v):
            raise ValueError("an arm is listed twice")
        return v


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_experiment(path: str | Path, quick: bool = False) -> ExperimentConfig:
    """The experiment YAML: `run:` a run config (inline, or a path relative to this file), plus the experiment's own
    fields. `quick` deep-merges the `quick:` overrides into the run config."""
    path = Path(path)
    if not path.is_file():
        raise ExperimentError(f"experiment config {path} not found; see examples/experiment_mapf.yaml")
    from sandbox.yamlload import YamlError, load_yaml

    try:
        data = load_yaml(path) or {}
        if not isinstance(data, dict):
            raise ExperimentError(f"{path}: an experiment config is a YAML mapping (run:, arms:, seeds:, ...), got a "
                                  f"{type(data).__name__}; see examples/experiment_mapf.yaml")
        if "scenario" in data and "target" in data:  # a scenario file is the bench's input, not an experiment
            raise ExperimentError(f"{path} is a scenario file (scenario: {data['scenario']}), not an experiment "
                                  f"config: `evotrainer bench scenarios {path.parent} --scenarios "
                                  f"{data['scenario']} --arms ...` runs its arms (oracle included)")
        if isinstance(data.get("run"), str):
            rp = (path.parent / data["run"]).resolve()
            if not rp.is_file():
                raise ExperimentError(f"{path}: run: {data['run']} not found (paths are relative to the experiment "
                                      "file)")
            data["run"] = load_yaml(rp) or {}
    except YamlError as exc:
        raise ExperimentError(str(exc)) from None
    try:
        cfg = ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ExperimentError(f"{path}: {where}: {first['msg'].removeprefix('Value error, ')}") from None
    if quick and cfg.quick:
        cfg = cfg.model_copy(update={"run": _merge(cfg.run, cfg.quick)})
    return cfg


def run_config(cfg: ExperimentConfig, seed: int, arm: str, warm: Path | None = None):
    """The run config of one arm and seed (validated; the seed offsets the run config's own). With `warm` (the
    experiment's shared warm start), the arm starts from that checkpoint instead of training its own."""
    from harness.config import parse_config

    data = _merge(cfg.run, {"seed": int(cfg.run.get("seed", 0)) + seed,
                            "name": f"{cfg.run.get('name', 'exp')}-{arm}-s{seed}"})
    if warm is not None:
        data = _merge(data, {"policy": {"checkpoint": str(warm), "preset": None},
                             "warm_start": {"sft_examples": 0}})
    if arm in EVOLVED:
        from harness.config import switched

        data = {**data, "engineer": switched(data.get("engineer"), "rule" if arm == "evolved-rule" else "llm")}
    if arm in cfg.overrides:
        data = _merge(data, {"recipe": cfg.overrides[arm]})
    return parse_config(data, f"experiment run config ({arm}, seed {seed})")


def plan(cfg: ExperimentConfig) -> dict[str, Any]:
    """Checks made before anything trains: every arm's compute per step is the same, the budget is defined, the
    LLM arm has an endpoint, the shared run config passes `run`'s start checks. Returns {"arms": runnable arms,
    "skipped": {arm: why}, "notes": warnings to say once (a family of one's own whose splits are not held apart)}."""
    skipped: dict[str, str] = {}
    arms = list(cfg.arms)
    for arm, over in cfg.overrides.items():
        if arm not in ARMS:
            raise ExperimentError(f"overrides: unknown arm {arm!r}; choose from {', '.join(ARMS)}")
        from pydantic import ValidationError

        from policies.train import Recipe

        try:  # checked whether or not the arm runs this time (an arm left out of `arms` kept a typo for later)
            Recipe.model_validate({**(cfg.run.get("recipe") or {}), **over})
        except ValidationError as exc:
            e = exc.errors()[0]
            what = "unknown key (typo?)" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
            raise ExperimentError(f"overrides.{arm}.{'.'.join(map(str, e['loc']))}: {what}") from None
        bad = [k for k in over if k in COMPUTE_KNOBS]
        if bad:
            base = (cfg.run.get("recipe") or {}).get(bad[0], "the template's")
            raise ExperimentError(
                f"arm {arm}: overrides.{arm}.{bad[0]} = {over[bad[0]]} changes what one GRPO step costs (the other "
                f"arms use {base}), so its compute budget would differ from theirs; arms must have equal compute. "
                f"Remove it, or set recipe.{bad[0]} in run: for every arm")
    if "evolved-llm" in arms:
        eng = (cfg.run.get("engineer") or {})
        if not (eng.get("base_url") or eng.get("model_path")):
            arms.remove("evolved-llm")
            skipped["evolved-llm"] = ("no LLM endpoint configured: set run.engineer.base_url (an OpenAI-compatible "
                                      "endpoint, e.g. vllm serve) or run.engineer.model_path to run this arm")
        elif eng.get("preflight", True):  # an arm whose every stage fell back to the rule engineer would be
            # reported as the LLM's: refused before anything trains
            from harness.config import EngineerConfig
            from harness.engineer import preflight

            try:
                why = preflight(EngineerConfig.model_validate({**eng, "kind": "llm"}))
            except ValueError:
                why = None  # a malformed engineer section is named by run_config below
            if why is not None:
                raise ExperimentError(f"arm evolved-llm: the engineer cannot answer: {why}; start it, fix "
                                      "run.engineer, or drop evolved-llm from arms")
    if "oracle" in arms and cfg.oracle is None:
        arms.remove("oracle")
        skipped["oracle"] = "no known-good harness: the oracle arm runs a scenario's oracle (evotrainer bench scenarios)"
    if any(a in EVOLVED for a in arms) and cfg.budget_steps is not None:
        raise ExperimentError(f"budget_steps {cfg.budget_steps} with an evolved arm: every baseline's budget is the "
                              "evolved arm's measured compute (equal compute), so a fixed budget would make them "
                              "unequal; remove budget_steps, or drop the evolved arms")
    if not any(a in EVOLVED for a in arms) and cfg.budget_steps is None:
        raise ExperimentError("no evolved arm to measure the budget from: set budget_steps (GRPO step-equivalents "
                              "per arm) or add evolved-rule to arms")
    if levels := [a for a in arms if a in LEVEL_ARMS]:  # refused before the other arms train, not after them
        from harness.baselines import BaselineError, _levels
        from harness.tasks import get_task

        rc = run_config(cfg, 0, levels[0])
        task = get_task(rc.task)
        # the entries a sampler re-weights (`baselines.level_env`): the target's, else the round-0 env's
        data = rc.backtest.env if rc.backtest.env is not None else rc.env if rc.env is not None else \
            yaml.safe_load(task.spec.round0_env)
        env = task.spec.config_model.model_validate(data)
        try:
            _levels(task, env)
        except BaselineError as exc:
            raise ExperimentError(f"arm(s) {', '.join(levels)}: {exc}") from None
    for seed in range(cfg.seeds):
        for arm in arms:
            rc = run_config(cfg, seed, arm)  # a typo in the run config or an override fails here, before training
            if not rc.eval.enabled:
                raise ExperimentError("run.eval.suite is empty: every arm is judged on the held-out suite after each "
                                      "stage; set run.eval.suite (e.g. small) or run.eval.env (a generator config)")
    notes: list[str] = []
    if arms:  # what `run` checks at start, for the run config every arm shares, before the shared warm start trains
        from harness.lifecycle import RunError, held_apart_note, preflight

        rc = run_config(cfg, 0, arms[0])
        try:
            preflight(rc)
        except RunError as exc:
            raise ExperimentError(f"run: {exc}") from None
        notes += [n for n in [held_apart_note(rc)] if n]  # said once, not only in arms' run.db
    return {"arms": arms, "skipped": skipped, "notes": notes}


# --- the arms: baselines through the stage's machinery, the evolved arm through the loop -----------------------------

BASELINES: dict[str, Callable[[ExperimentConfig], Provider]] = {
    "fixed-random": lambda cfg: FixedRandom(cfg.random),
    "fixed-template": lambda cfg: FixedTemplate(),
    "oracle": lambda cfg: _oracle(cfg),
    "plr": lambda cfg: PLR(cfg.plr),
    "learnability": lambda cfg: Learnability(cfg.learnability),
    "bandit": lambda cfg: Bandit(cfg.bandit),
}
LEVEL_ARMS = ("plr", "learnability", "bandit")  # level samplers: they need a weighted mixture of keyed entries
POPULATIONS = ("pbt",)  # baselines that train a population per stage (their own driver on the stage's machinery)
assert set(BASELINES) | set(POPULATIONS) | set(EVOLVED) == set(ARMS), "an arm is neither a baseline nor evolved"


def _oracle(cfg: ExperimentConfig) -> Provider:
    from harness.baselines import OracleHarness

    if cfg.oracle is None:
        raise ExperimentError("the oracle arm needs oracle: (a scenario's known-good harness)")
    return OracleHarness(cfg.oracle)


def suite_blocks(rc) -> list[str]:
    """The held-out test set's block of every instance, in the order the stage's report evaluates them."""
    from harness.tasks import get_task
    from harness.tasks.suites import draw_test

    return [block for block, _ in draw_test(get_task(rc.task), rc.eval)]


def suite_clusters(rc) -> list[int]:
    """The held-out test set's problem of every instance, in the report's order: the index of the first instance
    with the same prompt. A generator over a small space draws one problem several times (the math family's
    one-digit sums: 56 distinct among 336), and a policy solves or misses every copy alike, so intervals over the
    test set resample problems, not copies (`harness.backtest.two_way_bootstrap`'s clusters)."""
    from harness.tasks import get_task
    from harness.tasks.suites import draw_test

    task, first = get_task(rc.task), {}
    return [first.setdefault(task.prompt(inst), i) for i, (_, inst) in enumerate(draw_test(task, rc.eval))]


def check_warm(rc0, folder: Path) -> None:
    """A shared warm start an earlier call made (`folder`) is this call's only when made from these settings;
    refused naming the first difference otherwise."""
    if not (folder / "config.yaml").is_file():
        return
    now = warm_made_from(rc0)
    try:
        from harness.config import RunConfig

        then = warm_made_from(RunConfig.model_validate(yaml.safe_load((folder / "config.yaml").read_text())))
    except Exception as exc:  # noqa: BLE001 - an unreadable record is not taken on trust
        raise ExperimentError(f"{folder}/config.yaml: unreadable ({type(exc).__name__}); remove {folder} to "
                              "make the warm start again") from None
    if (diff := _first_diff(_endpoint_free(then), _endpoint_free(now), "")) is not None:
        raise ExperimentError(f"{folder}: the shared warm start was made from other settings than this call's: "
                              f"{diff}; every arm would start from it (a --quick warm start under a whole "
                              "run): use a new --out, or remove that folder (and the arms made from it)")


def warm_start(rc0, out: Path, say: Callable[[str], None]) -> tuple[Path, list[float]]:
    """The experiment's shared warm start, made by the stage's own setup in a run of its own (`<out>/warmstart`):
    (its checkpoint, its per-instance held-out valid)."""
    from harness.baselines import held_out
    from harness.graph import node_setup
    from harness.lifecycle import open_run

    t0 = time.time()
    folder = out / "warmstart"
    check_warm(rc0, folder)
    run = open_run(folder, rc0)
    try:
        ckpt = Path(node_setup(run, {})["policy"])
        # setup is recorded: the retention a loop's stage applies lets the SFT's resumable checkpoints (optimizer
        # state included) go; this run never reaches a stage (an outside review: 14 MB per scenario on the tiny
        # preset, about 1 GB on `base`, kept)
        from harness.retention import apply_retention

        apply_retention(run, 0)
        per = held_out(run, 0, str(ckpt))  # scored again if the test set changed since it was made
    finally:
        run.close()
        run.store.close()
    say(f"warm start: {ckpt} ({time.time() - t0:.0f}s), shared by every arm and seed")
    return ckpt, per


def warm_made_from(rc) -> dict[str, Any]:
    """What a shared warm start is made from: the task, seed, policy, warm-start section, round-0 env and the recipe
    fields the SFT reads (`policies.train.SFT_RECIPE_FIELDS`: what the stage's setup trains it from)."""
    from policies.train import SFT_RECIPE_FIELDS

    d = rc.model_dump(mode="json")
    return {"task": d["task"], "seed": d["seed"], "policy": d["policy"], "warm_start": d["warm_start"],
            "env": d.get("env"), "recipe": {k: v for k, v in (d.get("recipe") or {}).items()
                                            if str(k) in SFT_RECIPE_FIELDS}}


def run_baseline(arm: str, cfg: ExperimentConfig, seed: int, budget: int, out: Path, warm: Path,
                 say: Callable[[str], None] = print) -> dict[str, Any]:
    """A baseline for one seed in its own run (`out`): `harness.baselines.run_baseline` with the arm's provider."""
    from harness import baselines
    from harness.lifecycle import open_run

    run = open_run(out, run_config(cfg, seed, arm, warm))
    try:
        if arm == "pbt":
            from harness.pbt import run_pbt

            rows = run_pbt(run, cfg.pbt, budget, f"{arm} seed {seed}", say)
        else:
            rows = baselines.run_baseline(run, BASELINES[arm](cfg), budget, f"{arm} seed {seed}", say)
        per = baselines.held_out(run, rows[-1].stage)
        env = yaml.safe_load(run.result(rows[-1].stage, baselines.Provided).files["env.yaml"])  # the last stage's
        comp = step_equivalents(run.store, run.id)
        shares = compute_shares(run.store, run.id)
    finally:
        run.close()
        run.store.close()
    curve = [r.model_dump(exclude={"checkpoint"}) for r in rows]
    return {"arm": arm, "seed": seed, "budget": budget, "compute": comp["compute"], "ledger": comp, "curve": curve,
            "final": curve[-1], "final_per_instance": per, "env": env, "shares": shares}


SKILLS_START = "skills-start.db"  # an experiment's copy of the skill library as it stood when it began


def snapshot_skills(cfg: ExperimentConfig, out: Path) -> Path | None:
    """Before anything of the experiment trains: copy the skill library (`skills.library.default_path`) to
    `<out>/skills-start.db`, the start of every evolved run's own library (`cfg.skills` isolated). Kept when it
    exists, so a resumed experiment starts its remaining runs from the same library as its first ones. None when the
    experiment shares the library, runs no evolved arm, or the library does not exist yet (each run then starts from
    the seed skills)."""
    from skills.library import copy_library, default_path

    snap = out / SKILLS_START
    if cfg.skills != "isolated" or not any(a in EVOLVED for a in cfg.arms):
        return None
    if not snap.exists() and default_path().exists():
        copy_library(default_path(), snap)
    return snap if snap.exists() else None


@contextlib.contextmanager
def own_skills(cfg: ExperimentConfig, out: Path, exp_out: Path, say: Callable[[str], None] = print) -> Iterator[None]:
    """An evolved run's skill library (`cfg.skills` isolated): `<out>/skills.db`, a copy of the experiment's start
    library, is the run's library while it runs (`$EVOTRAINER_SKILLS`, restored after); when the run ends, what it
    learnt (its tries, a skill it filed) is merged into the shared library (`SkillLibrary.merge_from`: a try counts
    once, so a resumed run merges nothing twice). A run that fails merges nothing; its resume does."""
    if cfg.skills != "isolated":
        yield
        return
    from skills.library import SkillLibrary, copy_library, default_path

    shared, own = default_path(), out / "skills.db"
    if not own.exists() and (exp_out / SKILLS_START).exists():
        copy_library(exp_out / SKILLS_START, own)
    before = os.environ.get("EVOTRAINER_SKILLS")
    os.environ["EVOTRAINER_SKILLS"] = str(own)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("EVOTRAINER_SKILLS", None)
        else:
            os.environ["EVOTRAINER_SKILLS"] = before
    with SkillLibrary.open(shared) as lib, SkillLibrary.open(own, seed_dir=None) as mine:
        redefined: list[str] = []
        added, tries = lib.merge_from(mine, redefined)
    if added or tries:
        say(f"skills: {tries} tr{'y' if tries == 1 else 'ies'} and {len(added)} new skill(s) of {out.name} merged "
            f"into {shared}")
    if redefined:
        say(f"skills: {out.name}'s tries of {', '.join(redefined)} not merged: redefined in {shared} while it ran "
            "(its tries tried the old definition)")


def run_evolved(arm: str, cfg: ExperimentConfig, seed: int, out: Path, warm: Path,
                say: Callable[[str], None] = print, progress=None) -> dict[str, Any]:
    """The full loop for one seed (resumed when interrupted); its curve is the loop's own held-out report of every
    stage's continuing policy, its compute the loop's ledger. `out` is `<experiment out>/<arm>/seed<s>`; the run
    learns in a skill library of its own unless the experiment shares one (`own_skills`)."""
    from harness.lifecycle import is_run_dir, resume_run, start_run
    from harness.results import Decided
    from harness.store import RunStore

    rc = run_config(cfg, seed, arm, warm)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    with own_skills(cfg, out, out.parent.parent, say):
        if (run_dir / "run.db").exists() or is_run_dir(run_dir):  # is_run_dir: killed while start_run was creating it
            say(f"{arm} seed {seed}: resuming its run {run_dir}")
            resume_run(run_dir, out, progress=progress)
        else:
            say(f"{arm} seed {seed}: the loop runs in {run_dir} (`evotrainer status {run_dir}` shows it live)")
            start_run(rc, out, "run", progress=progress)
    store = RunStore.open(run_dir / "run.db")
    try:
        run_id = store.runs()[0]
        comp = step_equivalents(store, run_id)
        shares = compute_shares(store, run_id)
        curve, spent = [], 0.0
        for k in range(1, rc.budget.stages + 1):
            d = store.result(run_id, k, Decided)
            if d is None:
                continue
            spent += comp["by_stage"].get(k, 0.0)
            test = [e for e in store.evaluations(run_id, stage=k, arm="policy") if e["split"] == "test"
                    and not e["slice_key"]]
            if not test:
                continue
            per = json.loads((run_dir / "stages" / f"s{k}" / "test.json").read_text())["valid"]
            curve.append({"stage": k, "compute": spent, "valid": test[0]["valid"], "optimal": test[0]["optimal"],
                          "winner": d.winner, "per_instance": per})
            say(f"{arm} seed {seed} stage {k}: {'promoted ' + d.winner if d.winner else 'no promotion'}, "
                f"held-out valid {test[0]['valid']:.3f}, compute {spent:.0f} step-eq")
    finally:
        store.close()
    if not curve:
        raise ExperimentError(f"{arm} seed {seed}: the run {run_dir} finished no stage; see its report")
    return {"arm": arm, "seed": seed, "budget": comp["compute"], "compute": comp["compute"], "ledger": comp,
            "shares": shares, "promoted": [c["winner"] for c in curve if c["winner"]], "run_dir": str(run_dir),
            "curve": [{k: v for k, v in r.items() if k != "per_instance"} for r in curve],
            "final": {k: v for k, v in curve[-1].items() if k != "per_instance"},
            "final_per_instance": curve[-1]["per_instance"]}


# --- the whole experiment -------------------------------------------------------------------------------------------


def mean_ci(xs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval over seeds (the interval is the mean itself for one seed)."""
    a = np.asarray(xs, dtype=float)
    if len(a) < 2:
        return float(a.mean()), float(a.mean()), float(a.mean())
    from harness.sequential import t_quantile

    half = t_quantile(len(a) - 1, 0.025) * a.std(ddof=1) / math.sqrt(len(a))  # Student's t at any seed count
    return float(a.mean()), float(a.mean() - half), float(a.mean() + half)


def lineage_share(rows: list[dict[str, Any]]) -> tuple[float, float, float] | None:
    """Mean [95% t-interval] over seeds of the share of an arm's compute that trained the policy it delivered
    (`harness.stagebook.compute_shares`); None when a seed's result does not say (a result written before it was
    recorded, or a lineage no record made)."""
    got = [r["shares"]["lineage"] / r["shares"]["compute"] for r in rows
           if (r.get("shares") or {}).get("lineage") is not None and r["shares"]["compute"]]
    return mean_ci(got) if got and len(got) == len(rows) else None


def pipelined_share(rows: list[dict[str, Any]]) -> float | None:
    """Mean over seeds of the share of an arm's GRPO steps that ran pipelined (`compute_shares`' `pipelined`); None
    when a seed's result does not say."""
    got = [r["shares"]["pipelined"] for r in rows if (r.get("shares") or {}).get("pipelined") is not None]
    return float(np.mean(got)) if got and len(got) == len(rows) else None


def mixed_trainers(arms: dict[str, dict[str, Any]]) -> str | None:
    """A warning when some arms trained with the rollout pipeline and others without (`recipe.pipeline: auto` turns
    it on where a process has a spare core, so `--jobs` decides it on a small machine: `--jobs 1` on two cores
    pipelines, `--jobs 2` does not): a one-step off-policy GRPO is another trainer, so such arms are not paired
    seed by seed, whatever their configs say. None when they agree or do not say."""
    said = {arm: a["pipelined"] for arm, a in arms.items() if a.get("pipelined") is not None}
    on, off = sorted(a for a, x in said.items() if x >= 0.5), sorted(a for a, x in said.items() if x == 0)
    if not (on and off):
        return None
    return (f"arms trained with two GRPO loops: {', '.join(on)} pipelined their rollouts (recipe.pipeline), "
            f"{', '.join(off)} did not (`--jobs` decides `auto` on a small machine): their comparison mixes two "
            "trainers; run the parts with one `--jobs`, or set recipe.pipeline in the config")


def harder_half(blocks: list[str], warm: list[list[float]]) -> list[str]:
    """The half of the suite's blocks (rounded up) where the warm start is weakest, mean over seeds; ties go to the
    later block (suites list their harder blocks last)."""
    names = list(dict.fromkeys(blocks))
    score = {b: float(np.mean([np.mean([v for v, bb in zip(w, blocks, strict=True) if bb == b]) for w in warm]))
             for b in names}
    order = sorted(names, key=lambda b: (score[b], -names.index(b)))
    return sorted(order[: (len(names) + 1) // 2], key=names.index)


def _part(per: list[float], blocks: list[str], keep: set[str]) -> float:
    vals = [v for v, b in zip(per, blocks, strict=True) if b in keep]
    return float(np.mean(vals)) if vals else float("nan")


def summarize(results: dict[str, list[dict[str, Any]]], blocks: list[str], warm: list[dict[str, Any]],
              hard: list[str], clusters: list[int] | None = None) -> dict[str, Any]:
    """Per arm: final held-out valid (overall, harder half, easier half, per block), optimal, compute; and paired
    per-seed differences of the evolved arms against each baseline (over seeds x test problems: `clusters`, one
    label per instance, groups the copies of one problem, `suite_clusters`)."""
    from harness.backtest import two_way_bootstrap

    hard_set, easy_set = set(hard), set(blocks) - set(hard)
    names = list(dict.fromkeys(blocks))
    arms: dict[str, Any] = {}
    for arm, rows in results.items():
        rows = sorted(rows, key=lambda r: r["seed"])
        fin = [r["final_per_instance"] for r in rows]
        arms[arm] = {
            "seeds": len(rows),
            "valid": mean_ci([float(np.mean(f)) for f in fin]),
            "hard": mean_ci([_part(f, blocks, hard_set) for f in fin]),
            "easy": mean_ci([_part(f, blocks, easy_set) for f in fin]),
            "optimal": mean_ci([r["final"]["optimal"] for r in rows]),
            "compute": mean_ci([r["compute"] for r in rows]),
            "budget": mean_ci([r["budget"] for r in rows]),
            "lineage": lineage_share(rows),
            "pipelined": pipelined_share(rows),
            "blocks": {b: float(np.mean([_part(f, blocks, {b}) for f in fin])) for b in names},
            "promoted": sum(len(r.get("promoted", [])) for r in rows) if arm in EVOLVED else None,
        }
    ws = [w["per_instance"] for w in warm]
    arms_ws = {"valid": mean_ci([float(np.mean(f)) for f in ws]), "hard": mean_ci([_part(f, blocks, hard_set)
                                                                                   for f in ws]),
               "easy": mean_ci([_part(f, blocks, easy_set) for f in ws]),
               "blocks": {b: float(np.mean([_part(f, blocks, {b}) for f in ws])) for b in names}}
    comparisons = {}
    for evo in [a for a in results if a in EVOLVED]:
        for base in [a for a in results if a not in EVOLVED]:
            by_seed = {r["seed"]: r for r in results[base]}
            pairs = [(r, by_seed[r["seed"]]) for r in results[evo] if r["seed"] in by_seed]
            if not pairs:
                continue
            out = {}
            for part, keep in (("valid", set(blocks)), ("hard", hard_set), ("easy", easy_set)):
                diffs = [_part(e["final_per_instance"], blocks, keep) - _part(b["final_per_instance"], blocks, keep)
                         for e, b in pairs]
                if not keep:
                    continue
                ctrl = [[v for v, bb in zip(b["final_per_instance"], blocks, strict=True) if bb in keep]
                        for _, b in pairs]
                cand = [[v for v, bb in zip(e["final_per_instance"], blocks, strict=True) if bb in keep]
                        for e, _ in pairs]  # every seed on the same test instances: seeds x instances, two-way
                cl = None if clusters is None else [c for c, bb in zip(clusters, blocks, strict=True) if bb in keep]
                eff, lo, hi = two_way_bootstrap(ctrl, cand, 2000, 0.025, np.random.default_rng(0), clusters=cl)
                out[part] = {"seeds": mean_ci(diffs), "instances": (eff, lo, hi), "n_instances": sum(map(len, ctrl))}
            # the baselines train the FIRST evolved arm's compute: a second one's comparisons are not at equal
            # compute (named under the table, as `bench scenarios` names them)
            out["unequal_compute_seeds"] = [e["seed"] for e, b in pairs
                                            if abs(e["compute"] - b["budget"]) > EQUAL_COMPUTE * max(b["budget"], 1.0)]
            comparisons[f"{evo} vs {base}"] = out
    return {"arms": arms, "warm_start": arms_ws, "hard_blocks": hard, "comparisons": comparisons}


def run_experiment(cfg: ExperimentConfig, out: str | Path, say: Callable[[str], None] = print,
                   progress=None, jobs: int = 1) -> dict[str, Any]:
    """Run (or resume) every arm x seed, then write results.json, summary.md, curve.png and experiment.html.
    `progress` is the loop's live-progress callback for the evolved arms (`evotrainer run`'s printer in the CLI).
    `jobs` > 1 runs that many arms side by side (`run_experiments`)."""
    return run_experiments([(cfg, Path(out))], say, progress, jobs)[0]


def run_experiments(exps: list[tuple[ExperimentConfig, Path]], say: Callable[[str], None] = print, progress=None,
                    jobs: int = 1, labels: list[str] | None = None) -> list[dict[str, Any]]:
    """Several experiments (a scenario set's) as one schedule of units: each experiment's warm start, then per seed
    its evolved arm (whose measured compute is that seed's budget), then that seed's baselines. `jobs` = 1 runs the
    units one after another in this process; `jobs` > 1 runs that many at once in worker processes with
    `cpu_count // jobs` torch threads each (on a 2-core machine a tiny model's GRPO step is no slower on one thread
    than on two, so two arms side by side finish in about half the time; BENCHMARKS.md). Warm starts that share a
    cache key are made once (the first; the others load it from the cache after it)."""
    labels = labels or [str(o) for _, o in exps]
    locks = _lock_outs([Path(o) for _, o in exps])
    try:
        return _run_experiments(exps, say, progress, jobs, labels)
    finally:
        for lock in locks:
            lock.release()


def _lock_outs(outs: list[Path]) -> list[Any]:
    """One call per experiment folder at a time (`<out>/lock`): two calls into one --out (an experiment run in parts,
    two parts started together) both trained its shared warm start and any arm both named into the same folders,
    checkpoints half written under each other (an outside review); the second is refused, naming the first's pid."""
    locks = []
    try:
        for out in outs:
            out.mkdir(parents=True, exist_ok=True)
            locks.append(lock_out(out, "experiment", ExperimentError))
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks


def lock_out(out: Path, call: str, error: type[Exception]) -> Any:
    """`<out>/lock` for this call (`harness.store.acquire_lock`), or `error` naming the live holder's pid (a dead
    one's heir is named as the store says it); shared by `bench scenarios` and `experiment`."""
    from harness.store import RunLockedError, acquire_lock

    try:
        return acquire_lock(out, call)
    except RunLockedError as exc:
        pid = re.search(r"driven by pid (\d+)", str(exc))
        raise error(f"--out {out} is in use by another {call} call" + (f" (pid {pid.group(1)})" if pid else f" ({exc})")
                    + "; let it finish, or give this call another --out") from None


def _run_experiments(exps: list[tuple[ExperimentConfig, Path]], say, progress, jobs: int,
                     labels: list[str]) -> list[dict[str, Any]]:
    preps = []
    for cfg, out in exps:  # every plan before anything trains
        out = Path(out)
        p = plan(cfg)
        snapshot_skills(cfg, out)  # every experiment's before any of them trains: all start from the same library
        preps.append((cfg, out, p))
    units: dict[tuple, _Unit] = {}
    first_warm: dict[str, tuple] = {}
    for i, (cfg, out, p) in enumerate(preps):
        for arm, why in p["skipped"].items():
            say(f"{arm}: skipped: {why}")
        for note in p["notes"]:
            say(f"warning: {note}")
        arms = p["arms"]
        rc0 = run_config(cfg, 0, arms[0])
        say(f"experiment{' ' + labels[i] if len(exps) > 1 else ''}: arms {', '.join(arms)}; {cfg.seeds} seed(s); "
            f"{rc0.budget.stages} stages each; held-out suite {rc0.eval.name} ({len(suite_blocks(rc0))} instances); "
            f"out {out}")
        add_units(units, first_warm, i, _warm_group(rc0), arms, cfg.seeds, cfg.budget_steps is None)
        check_warm(rc0, out / "warmstart")  # a part made from other settings is refused before anything is made or
    for u in units.values():  # re-scored: the shared warm starts first, then every arm x seed
        if u.kind != "warm":
            _check_before(preps[u.exp][0], preps[u.exp][1] / u.kind / f"seed{u.seed}", u.kind, u.seed)
    for cfg, out, _ in preps:  # after the checks: a refused call leaves the folder's record as the results it holds
        (Path(out) / "experiment.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=1))
    t_start = time.time()
    results = _schedule(units, preps, labels, say, progress, jobs)
    wall = time.time() - t_start  # the whole schedule's (shared by its experiments when they ran side by side)
    summaries = []
    for i, (cfg, out, p) in enumerate(preps):
        rc0 = run_config(cfg, 0, p["arms"][0])
        blocks, clusters = suite_blocks(rc0), suite_clusters(rc0)
        warm_per = results[(i, "warm")]["per_instance"]
        warm = [{"valid": float(np.mean(warm_per)), "per_instance": warm_per}]
        by_arm = {a: [results[(i, s, a)] for s in range(cfg.seeds)] for a in p["arms"]}
        by_arm = _with_earlier_parts(cfg, out, p["arms"], by_arm, results, i, say)
        hard = harder_half(blocks, [w["per_instance"] for w in warm])
        summary = summarize(by_arm, blocks, warm, hard, clusters)
        summary.update({"wall_s": wall, "unit_s": results[(i, "warm")]["t_end"] - results[(i, "warm")]["t_start"]
                        + sum(r.get("wall_s", 0.0) for rows in by_arm.values() for r in rows),
                        "suite": rc0.eval.name, "n_instances": len(blocks), "stages": rc0.budget.stages,
                        "seeds": cfg.seeds, "skipped": p["skipped"], "jobs": jobs, "arms_reported": list(by_arm),
                        "curves": {a: [r["curve"] for r in rows] for a, rows in by_arm.items()},
                        "warm_valid": [w["valid"] for w in warm], "warm_per_instance": warm_per,
                        "test_clusters": clusters})
        (out / "results.json").write_text(json.dumps(summary, indent=1, default=float))
        (out / "summary.md").write_text(table(summary))
        write_plot(summary, out)
        summaries.append(summary)
    return summaries


MADE_FROM = "made_from.json"  # beside an arm x seed's result.json: what it was made from


def made_from(cfg: ExperimentConfig, arm: str, seed: int, budget: int | None) -> dict[str, Any]:
    """What an arm x seed's result depends on: its run config (the harness it trains under, --quick's sizing merged
    in), the experiment's settings for its kind (a curriculum's, the oracle's files, overrides, the skill mode) and its
    compute budget (a baseline's: that seed's evolved arm's compute). Not which other arms or how many seeds a call
    runs, so an experiment can be run in parts."""
    d = cfg.model_dump(mode="json")
    section = {"fixed-random": "random"}.get(arm, arm)  # a baseline's own settings (plr, learnability, bandit, pbt)
    exp = {"overrides": d["overrides"].get(arm), "own": d.get(section) if section in ("random", "plr", "learnability",
           "bandit", "pbt") else None, "oracle": d["oracle"] if arm == "oracle" else None,
           "skills": d["skills"] if arm in EVOLVED else None}
    rc = run_config(cfg, seed, arm)
    return {"arm": arm, "seed": seed, "run": rc.model_dump(mode="json"), "trained_as": trained_as(rc),
            "experiment": exp, "budget": budget, "code": made_by()}


PACKAGES = ("harness", "policies", "sandbox", "skills")  # the code an arm runs: `made_by`


def made_by() -> str:
    """The code this process runs (its packages' source as imported, `harness.sources`): recorded beside what an arm
    was made from, and said, not refused, when an earlier part's differs (`check_made_from`): a bench runs in parts
    across sessions whose code moves, and a part made before a fix is pooled only with that said (an outside review
    found it pooled silently)."""
    from harness.sources import source_digest

    return source_digest(PACKAGES)[:16]


def trained_as(rc: Any) -> dict[str, Any]:
    """A run config's free-form sections as what reads them sees them: its round-0 harness (the template with the
    run's env, recipe and reward written in) through the env, recipe and reward models, and the judge's, the test's
    and the warm start's generator configs through the task's config model. A setting added or dropped there is then a
    difference even where its record has no key for it on one side (an outside review, seventy-ninth session: a
    scenario's round-0 `drop_dead_groups` removed, or a generator setting added to its target, between two parts was pooled
    with the results made before it)."""
    from harness.round0 import harness_models, round0_files
    from harness.tasks import get_task

    model = get_task(rc.task).spec.config_model
    env, recipe, shaping = harness_models(round0_files(rc), get_task(rc.task))
    gen = {"judge": rc.backtest.env, "test": rc.eval.env, "warm_start": rc.warm_start.env}
    return {"env": env.model_dump(mode="json"), "recipe": recipe.model_dump(mode="json"),
            "reward": shaping.model_dump(mode="json") if shaping is not None else None,
            **{k: model.model_validate(v).model_dump(mode="json") if v is not None else None for k, v in gen.items()}}


def _digest(d: dict[str, Any]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _first_diff(a: Any, b: Any, path: str) -> str | None:
    """The first setting two records differ in, or None. A key only one side has is no difference: a newer version's
    new setting (at its default) must not orphan the parts an older one ran."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) & set(b), key=str):
            if (d := _first_diff(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))) is not None:
                return d
        return None
    if a == b:
        return None
    if isinstance(a, str) and isinstance(b, str) and "\n" in a + b:  # a file's text: its first line that differs
        x, y = a.splitlines(), b.splitlines()
        j = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        a, b = (x[j] if j < len(x) else "(end)"), (y[j] if j < len(y) else "(end)")
        path += f" line {j + 1}"
    return f"{path} ({json.dumps(a, default=str)[:60]} then, {json.dumps(b, default=str)[:60]} now)"


def _check_before(cfg: ExperimentConfig, folder: Path, arm: str, seed: int) -> None:
    """`check_made_from` before anything runs, for an arm x seed folder an earlier call made: every setting but the
    budget, which a baseline learns from its evolved arm's result (checked again, budget included, when the arm is
    reached). Why: a scenario whose target was edited between parts re-made and re-scored its warm start on the new
    test set, minutes, before its first arm was refused."""
    try:
        then = json.loads((folder / MADE_FROM).read_text())["made_from"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # none (a fresh folder), or unreadable: said where the arm is reached
    if isinstance(then, dict):
        check_made_from(folder, made_from(cfg, arm, seed, cfg.budget_steps if cfg.budget_steps is not None
                                          else then.get("budget")))


def check_made_from(folder: Path, now: dict[str, Any]) -> str | None:
    """An arm x seed folder made from something other than what this call would run (a scenario or experiment edited
    between parts, --quick beside the full run, another budget) is refused, naming the first difference: its result
    is never pooled with this call's, nor its killed run resumed under the new settings. A folder an older version
    wrote (no record) is taken as it is. Returns a note when it was made by other code (`made_by`): pooled, and said."""
    f = folder / MADE_FROM
    if not f.is_file():
        return None
    try:
        then = json.loads(f.read_text())["made_from"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ExperimentError(f"{f}: unreadable; remove {folder} to re-run that arm") from None
    if not isinstance(then, dict):
        raise ExperimentError(f"{f}: unreadable; remove {folder} to re-run that arm")
    code_then, code_now = then.get("code"), now.get("code")
    then, now = {k: v for k, v in then.items() if k != "code"}, {k: v for k, v in now.items() if k != "code"}
    if (diff := _first_diff(_endpoint_free(_with_defaults(then)), _endpoint_free(now), "")) is not None:
        raise ExperimentError(f"{folder}: made from other settings than this call's: {diff}; "
                              "its results cannot be pooled with these: use a new --out, or remove that folder to "
                              "re-run it")
    if code_now is not None and code_then != code_now:
        return (f"made by other code ({code_then or 'before it was recorded'}, this call's {code_now}): pooled "
                "as made; remove that folder to re-run it on this code")
    return None


def _with_defaults(made: Any) -> Any:
    """A record with its run config read through today's model, so a setting added since it was written shows at its
    default: a key one record lacks is no difference (`_first_diff`), and a new setting the earlier part ran at its
    default but this call sets otherwise was pooled with it (an outside statistics review). A run config today's
    model cannot read is left as written."""
    from pydantic import ValidationError

    from harness.config import RunConfig

    if not (isinstance(made, dict) and isinstance(made.get("run"), dict)):
        return made
    exp = made.get("experiment")
    if made.get("arm") == "pbt" and isinstance(exp, dict) and isinstance(exp.get("own"), dict) \
            and "decades" not in exp["own"]:
        # a PBT made before its prior existed ran as one without a prior (decades 0, no resampling): read so, it
        # differs from today's PBT instead of pooling with it (an outside review: a finished old-PBT seed pooled, a
        # killed one resumed half old, half new)
        made = {**made, "experiment": {**exp, "own": {**exp["own"], "decades": 0.0, "resample_probability": 0.0}}}
    try:
        return {**made, "run": RunConfig.model_validate(made["run"]).model_dump(mode="json")}
    except (ValidationError, ValueError, TypeError):
        return made


def _endpoint_free(x: Any) -> Any:
    """A record with each engineer section stripped of the fields its kind never reads (`harness.config.switched`):
    an evolved-rule arm recorded with the experiment's endpoint (before it was dropped) is the same arm."""
    from harness.config import switched

    if isinstance(x, dict):
        return {k: (switched(v, v["kind"]) if k == "engineer" and isinstance(v, dict) and isinstance(v.get("kind"), str)
                    else _endpoint_free(v)) for k, v in x.items()}
    return x


def _record_made_from(folder: Path, now: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / MADE_FROM).is_file():
        (folder / MADE_FROM).write_text(json.dumps({"digest": _digest(now), "made_from": now}, default=str))


def _with_earlier_parts(cfg: ExperimentConfig, out: Path, arms: list[str], by_arm: dict[str, list[dict[str, Any]]],
                        results: dict[tuple, dict[str, Any]], i: int, say: Callable[[str], None]
                        ) -> dict[str, list[dict[str, Any]]]:
    """This call's arms and every other arm an earlier call finished into the same --out for all of this call's
    seeds, made from these settings and, for a baseline, at this call's evolved compute (`check_made_from`): an
    experiment run in parts (`--arms` a subset per call) reports all of them, in ARMS order."""
    evolved = [a for a in arms if a in EVOLVED]
    got = dict(by_arm)
    for arm in (a for a in ARMS if a not in arms):
        files = [out / arm / f"seed{s}" / "result.json" for s in range(cfg.seeds)]
        if not all(f.is_file() for f in files):
            if have := [s for s, f in enumerate(files) if f.is_file()]:  # said: a silent drop emptied the gap column
                say(f"{arm}: an earlier part has seed(s) {', '.join(map(str, have))} of this call's {cfg.seeds}, "
                    f"left out of the table; run --arms {arm} --seeds {cfg.seeds} to complete it")
            continue
        try:
            for s, f in enumerate(files):
                budget = None if arm in EVOLVED else (cfg.budget_steps or round(results[(i, s, evolved[0])]["compute"]))
                if note := check_made_from(f.parent, made_from(cfg, arm, s, budget)):
                    say(f"{arm} seed {s}, an earlier part: {note}")
        except ExperimentError as exc:
            say(f"{arm}: an earlier part, left out of the table: {exc}")
            continue
        except (KeyError, IndexError) as exc:
            say(f"{arm}: an earlier part, left out of the table: its record lacks {exc}")
            continue
        got[arm] = [json.loads(f.read_text()) for f in files]
    return {a: got[a] for a in ARMS if a in got}


class _Unit:
    """One piece of an experiment's schedule: its warm start ("warm"), or one arm x seed."""

    def __init__(self, key: tuple, kind: str, exp: int, seed: int = 0, after: list[tuple] | None = None):
        self.key, self.kind, self.exp, self.seed, self.after = key, kind, exp, seed, list(after or [])


def _warm_group(rc) -> str:
    """What makes two experiments' warm starts the same cache entry (task, policy, warm start, seed, the env it trains
    on): a conservative key, so two runs never train one warm start side by side."""
    d = rc.model_dump(mode="json")
    ws = d.get("warm_start") or {}
    return json.dumps({"task": d.get("task"), "policy": d.get("policy"), "warm_start": ws, "seed": d.get("seed"),
                       "env": None if ws.get("env") else d.get("env")}, sort_keys=True, default=str)


def add_units(units: dict[tuple, _Unit], first_warm: dict[str, tuple], i: int, wkey: str, arms: list[str], seeds: int,
              budget_from_evolved: bool) -> None:
    """Experiment i's units: its warm start (after the first experiment's of the same warm-start key, whose cache entry
    it then loads: one warm start is never trained twice side by side), then per seed each arm after the warm start,
    and a baseline after that seed's evolved arm when the evolved arm's compute is its budget."""
    units[(i, "warm")] = _Unit((i, "warm"), "warm", i, after=[first_warm[wkey]] if wkey in first_warm else [])
    first_warm.setdefault(wkey, (i, "warm"))
    evolved = [a for a in arms if a in EVOLVED]
    for seed in range(seeds):
        for arm in sorted(arms, key=lambda a: a not in EVOLVED):  # evolved first: its compute is the budget
            after = [(i, "warm")]
            if arm not in EVOLVED and budget_from_evolved:
                after += [(i, seed, a) for a in evolved[:1]]
            units[(i, seed, arm)] = _Unit((i, seed, arm), arm, i, seed, after)


def priorities(units: dict[tuple, _Unit]) -> dict[tuple, tuple[int, int, int]]:
    """Each unit's place among the units ready at once with several workers: warm starts first, the one more units
    depend on (directly or through the warm starts that load it from the cache) before the others, then every arm in
    the order made (each experiment's evolved arm, then its baselines, experiment by experiment, so scenarios finish
    whole and in file order). Made order alone ran the warm start of a scenario set's last family, ready from the first
    second, after every arm of the families before it, with a core idle beside it; ordering the warm starts by their
    successors (a list-schedule priority, Adam, Chandy and Dickson 1974, "A comparison of list schedules for parallel
    processing systems", Comm. ACM 17(12)) starts it as soon as a core frees. Replayed with the unit times of a whole
    `--quick` set (BENCHMARKS.md, fifty-seventh session): 802 s in made order, 781 s this way, the two-core lower bound
    being 780; every unit ordered by its successors (evolved arms of every scenario before any baseline) read the same
    781 and would leave a call stopped midway with no whole scenario."""
    waiting: dict[tuple, set[tuple]] = {k: set() for k in units}
    for k, u in units.items():
        for a in u.after:
            waiting.setdefault(a, set()).add(k)
    below: dict[tuple, set[tuple]] = {}

    def under(k: tuple) -> set[tuple]:  # every unit that waits on k, directly or not (the graph is acyclic, shallow)
        if k not in below:
            below[k] = set().union(*({j} | under(j) for j in waiting.get(k, ()))) if waiting.get(k) else set()
        return below[k]

    return {k: (0, -len(under(k)), i) if u.kind == "warm" else (1, 0, i) for i, (k, u) in enumerate(units.items())}


def _schedule(units: dict[tuple, _Unit], preps: list, labels: list[str], say: Callable[[str], None], progress,
              jobs: int) -> dict[tuple, dict[str, Any]]:
    """Run every unit once its prerequisites are done: in this process (jobs = 1) or in a pool of `jobs` worker
    processes, where warm starts go first, the one most units depend on first (`priorities`). A unit whose result.json
    exists is read back, not run (the experiment resumes). The first failure stops the schedule (units running keep
    their runs; a re-run resumes them) and is raised."""
    results: dict[tuple, dict[str, Any]] = {}
    pending = dict(units)

    def budget_of(u: _Unit) -> int | None:
        cfg = preps[u.exp][0]
        budget = cfg.budget_steps
        if u.kind not in EVOLVED and budget is None:
            ev = [results[k] for k in u.after if k in results and k[-1] in EVOLVED]
            budget = round(ev[0]["compute"]) if ev else None
            if budget is None:
                raise ExperimentError("no budget: the evolved arm recorded no compute")
        return budget

    def args(u: _Unit) -> tuple:
        cfg, out, _ = preps[u.exp]
        if u.kind == "warm":
            return ("warm", cfg.model_dump(mode="json"), str(out), 0, "", "", None, labels[u.exp])
        ws = results[(u.exp, "warm")]["checkpoint"]
        budget = budget_of(u)
        now = made_from(cfg, u.kind, u.seed, budget)
        folder = out / u.kind / f"seed{u.seed}"
        if note := check_made_from(folder, now):  # a killed run of other settings is not resumed under these
            say(f"{_tag(labels, u.exp)}{u.kind} seed {u.seed}: a killed run resumed on this code, {note}")
        _record_made_from(folder, now)
        return (u.kind, cfg.model_dump(mode="json"), str(out), u.seed, u.kind, ws, budget, labels[u.exp])

    def done(u: _Unit, r: dict[str, Any]) -> None:
        results[u.key] = r

    # one worker: in the order made (the total time is the same in any order); several: warm starts first
    rank = priorities(units) if jobs > 1 else {k: (0, 0, i) for i, k in enumerate(units)}

    def ready() -> list[_Unit]:
        return sorted((u for u in pending.values() if all(k in results for k in u.after)), key=lambda u: rank[u.key])

    def read_back(u: _Unit) -> bool:
        if u.kind == "warm":
            return False
        rf = preps[u.exp][1] / u.kind / f"seed{u.seed}" / "result.json"
        if not rf.exists():
            return False
        r = json.loads(rf.read_text())
        warm = results[(u.exp, "warm")]
        n, name = len(warm["per_instance"]), warm.get("suite")
        if len(r.get("final_per_instance") or []) != n or (name and r.get("suite", name) != name):
            raise ExperimentError(f"{rf}: tested on {len(r.get('final_per_instance') or [])} held-out instances of "
                                  f"{r.get('suite', 'its test set')}, the experiment's test set is now {n} of "
                                  f"{name or 'another'} (its eval changed since): a result on another test set cannot "
                                  "be compared; use a new --out, or remove that arm's folder to re-run it")
        note = check_made_from(rf.parent, made_from(preps[u.exp][0], u.kind, u.seed, budget_of(u)))
        say(f"{_tag(labels, u.exp)}{u.kind} seed {u.seed}: done earlier (held-out valid {r['final']['valid']:.3f}), "
            "not re-run" + (f"; {note}" if note else ""))
        done(u, r)
        return True

    if jobs <= 1:
        while pending:
            u = ready()[0]
            del pending[u.key]
            if not read_back(u):
                done(u, _run_unit(*args(u), say=say, progress=progress, tag=_tag(labels, u.exp)))
        return results

    import concurrent.futures as cf
    import multiprocessing as mp

    threads = max(1, (os.cpu_count() or 1) // jobs)
    saved = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", CORES_ENV)}
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ[CORES_ENV] = str(threads)  # each worker's share: nothing in it may count on a core to spare
    say(f"{len(units)} units, {jobs} side by side ({threads} torch thread(s) each)")
    pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                                  initargs=(threads,))
    running: dict[cf.Future, _Unit] = {}
    try:
        while pending or running:
            moved = True
            while moved and len(running) < jobs:  # a unit read back can make others ready
                moved = False
                for u in ready():
                    if len(running) >= jobs:
                        break
                    del pending[u.key]
                    moved = True
                    if read_back(u):  # what it makes ready may go before the rest of this list: take it again
                        break
                    running[pool.submit(_run_unit, *args(u), tag=_tag(labels, u.exp))] = u
            if not running:
                if pending:  # nothing runs and nothing is ready: a prerequisite is missing (a bug, not an input)
                    raise ExperimentError(f"schedule stuck: {sorted(map(str, pending))}")
                break
            f = next(cf.as_completed(running))  # the first to finish
            u = running.pop(f)
            done(u, f.result())  # a unit's error is raised here
    except BaseException:
        if running:
            say(f"stopping: {len(running)} unit(s) still running finish first (a re-run resumes the rest)")
        pool.shutdown(True, cancel_futures=True)
        raise
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    pool.shutdown(True)
    return results


def _tag(labels: list[str], i: int) -> str:
    return f"[{labels[i]}] " if len(labels) > 1 else ""


def _worker_init(threads: int) -> None:
    from policies import cpu_threads

    die_with_parent()
    cpu_threads(threads)


def die_with_parent() -> None:
    """Ask the kernel to SIGTERM this process when its parent dies (Linux `prctl(PR_SET_PDEATHSIG)`): a killed
    `bench scenarios` or `experiment` call must not leave its workers training on, writing into run folders that a
    re-run then finds half-written. Elsewhere a no-op (the workers then outlive a killed parent, as before)."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # no prctl in this libc: keep the old behaviour
        return


def _child_progress(tag: str):
    """A worker's live progress: node entries and the loop's messages, one line each, tagged (no step lines: two
    workers' steps interleaved are noise)."""
    t0 = time.time()

    def on_event(kind: str, data: dict) -> None:
        if kind == "node" and "message" not in data:
            print(f"{tag}{time.time() - t0:6.0f}s stage {data.get('stage')} · {data.get('node')}", flush=True)
        elif kind != "step" and "message" in data:
            print(f"{tag}{time.time() - t0:6.0f}s   {data['message']}", flush=True)

    return on_event


def _run_unit(kind: str, cfg_json: dict[str, Any], out: str, seed: int, arm: str, ws: str, budget: int | None,
              label: str, say: Callable[[str], None] | None = None, progress=None, tag: str = "") -> dict[str, Any]:
    """One unit, in this process or a worker: the warm start ({checkpoint, per_instance}) or one arm x seed (its
    result, also written to `<out>/<arm>/seed<s>/result.json`)."""
    cfg = ExperimentConfig.model_validate(cfg_json)
    out_p = Path(out)
    if say is None:  # a worker: plain tagged lines
        def say(m: str) -> None:
            print(f"{tag}{m}", flush=True)
        progress = _child_progress(tag)
    elif tag:
        outer = say

        def say(m: str) -> None:
            outer(f"{tag}{m}")
    t0, c0 = time.time(), time.process_time()
    if kind == "warm":
        rc0 = run_config(cfg, 0, plan(cfg)["arms"][0])
        ckpt, per = warm_start(rc0, out_p, say)
        say(f"warm start held-out valid {float(np.mean(per)):.3f}")
        return {"checkpoint": str(ckpt), "per_instance": per, "suite": rc0.eval.name, "t_start": t0,
                "t_end": time.time(), "pid": os.getpid()}
    if arm in EVOLVED:
        r = run_evolved(arm, cfg, seed, out_p / arm / f"seed{seed}", Path(ws), say, progress)
    else:
        r = run_baseline(arm, cfg, seed, int(budget), out_p / arm / f"seed{seed}", Path(ws), say)
    r["suite"] = run_config(cfg, seed, arm, Path(ws)).eval.name  # the test set it was scored on (`read_back`)
    r["wall_s"] = time.time() - t0
    r["cpu_s"] = time.process_time() - c0  # this process's CPU (every torch thread), not its subprocesses'
    r["pid"], r["t_start"], r["t_end"] = os.getpid(), t0, time.time()
    r["cores"] = cores()  # the share of the machine it ran on (one per worker side by side: no rollout pipeline)
    final = out_p / arm / f"seed{seed}" / "result.json"
    tmp = final.with_name(f".result.{os.getpid()}.tmp")  # a kill mid-write leaves no truncated result.json, which
    tmp.write_text(json.dumps(r))  # the next call would fail to read instead of running the arm again
    os.replace(tmp, final)
    return r


def _pct(m: tuple[float, float, float]) -> str:
    return f"{100 * m[0]:.1f} [{100 * m[1]:.1f}, {100 * m[2]:.1f}]"


def table(s: dict[str, Any]) -> str:
    """The summary as Markdown: one row per arm, then the paired comparisons, then per block."""
    hard = ", ".join(s["hard_blocks"])
    lines = [(f"Held-out suite `{s['suite']}` ({s['n_instances']} instances, greedy), {s['seeds']} seed(s), "
             f"{s['stages']} stages; mean over seeds [95% t-interval]. Harder half: {hard}."), "",
             ("| arm | valid % | harder half % | easier half % | optimal % | compute (GRPO step-eq) | trained the "
              "delivered policy, % of compute | promotions |"),
             "|---|---|---|---|---|---|---|---|"]
    w = s["warm_start"]
    lines.append(f"| warm start | {_pct(w['valid'])} | {_pct(w['hard'])} | {_pct(w['easy'])} | | 0 | | |")
    for arm, a in s["arms"].items():
        lines.append(f"| {arm} | {_pct(a['valid'])} | {_pct(a['hard'])} | {_pct(a['easy'])} | {_pct(a['optimal'])} "
                     f"| {a['compute'][0]:.0f} | {_pct(a['lineage']) if a.get('lineage') else '-'} "
                     f"| {'' if a['promoted'] is None else a['promoted']} |")
    for arm, why in s.get("skipped", {}).items():
        lines.append(f"| {arm} | skipped: {why} | | | | | | |")
    if mixed := mixed_trainers(s["arms"]):
        lines += ["", f"**Warning**: {mixed}."]
    if s["comparisons"]:
        lines += ["", ("| comparison | valid, points (seeds) | harder half (seeds) | valid (seeds x instances, "
                       "pigeonhole bootstrap) | harder half (seeds x instances) |"), "|---|---|---|---|---|"]
        for name, c in s["comparisons"].items():
            lines.append(f"| {name} | {_pct(c['valid']['seeds'])} | {_pct(c['hard']['seeds'])} | "
                         f"{_pct(c['valid']['instances'])} | {_pct(c['hard']['instances'])} |")
        if off := {name: c["unequal_compute_seeds"] for name, c in s["comparisons"].items()
                   if c.get("unequal_compute_seeds")}:
            lines += ["", "**Not at equal compute** (the baselines train the first evolved arm's compute; "
                      f"further than {EQUAL_COMPUTE:.0%} from it): "
                      + "; ".join(f"{name}, seed(s) {', '.join(map(str, seeds))}" for name, seeds in off.items()) + "."]
    blocks = list(w["blocks"])
    lines += ["", "| block | warm start | " + " | ".join(s["arms"]) + " |", "|---" * (len(s["arms"]) + 2) + "|"]
    for b in blocks:
        mark = " (harder)" if b in s["hard_blocks"] else ""
        lines.append(f"| {b}{mark} | {100 * w['blocks'][b]:.1f} | "
                     + " | ".join(f"{100 * a['blocks'][b]:.1f}" for a in s["arms"].values()) + " |")
    return "\n".join(lines) + "\n"


def key_values(s: dict[str, Any]) -> list[str]:
    """`key: value` lines for scripts."""
    out = [f"experiment_warm_valid: {s['warm_start']['valid'][0]:.4f}"]
    for arm, a in s["arms"].items():
        k = arm.replace("-", "_")
        out += [f"experiment_{k}_valid: {a['valid'][0]:.4f} [{a['valid'][1]:.4f}, {a['valid'][2]:.4f}]",
                f"experiment_{k}_hard: {a['hard'][0]:.4f} [{a['hard'][1]:.4f}, {a['hard'][2]:.4f}]",
                f"experiment_{k}_compute: {a['compute'][0]:.1f}"]
        if a.get("lineage"):
            out.append(f"experiment_{k}_lineage_share: {a['lineage'][0]:.3f}")
    for name, c in s["comparisons"].items():
        k = name.replace(" vs ", "_vs_").replace("-", "_")
        for part in ("valid", "hard"):
            m = c[part]["seeds"]
            out.append(f"experiment_{k}_{part}: {m[0]:+.4f} [{m[1]:+.4f}, {m[2]:+.4f}]")
    out.append(f"experiment_wall_s: {s['wall_s']:.0f}")
    return out


def write_plot(s: dict[str, Any], out: Path) -> None:
    """Held-out valid against compute, one line per arm (mean over seeds at each stage): curve.png and a
    self-contained experiment.html (inline SVG + the summary table)."""
    from harness.report_page import _plt, plot_page

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    w0 = float(np.mean(s["warm_valid"]))
    for arm, curves in s["curves"].items():
        n = min(len(c) for c in curves)
        xs = [0.0] + [float(np.mean([c[i]["compute"] for c in curves])) for i in range(n)]
        ys = [100 * w0] + [100 * float(np.mean([c[i]["valid"] for c in curves])) for i in range(n)]
        ax.plot(xs, ys, marker="o", label=arm)
    ax.set_xlabel("compute (GRPO step-equivalents, mean over seeds)")
    ax.set_ylabel(f"held-out valid % ({s['suite']})")
    ax.legend(fontsize=8, frameon=False)
    page = plot_page(fig, out / "curve.png", "Evolved harness vs fixed and automatic curricula, equal compute", "",
                     table(s))
    (out / "experiment.html").write_text(page)
