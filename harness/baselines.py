"""The experiment's baselines as clients of the stage: a baseline is a *provider* of each stage's harness (its env and
recipe); the stage's own machinery does the rest.

    run = open_run(out / "plr" / "seed0", config)           # a run folder: run.db, harness repo, keyed seed cursor
    rows = run_baseline(run, PLR(PLRConfig()), budget=40)   # setup -> (provide -> train -> remember) per stage

Each stage: the provider returns the harness files the stage trains under (`Provided`; PLR probes the policy on its
levels first and charges the probes to the ledger); `harness.arms.train_policy` trains the policy under them on the
run's keyed train pool and charges its steps; `harness.evaluation.report_eval` judges it on the held-out suite; the
stage's row (`BaselineStage`) is stored in run.db (and as `stage<k>.json`). The setup is the stage's own
`graph.node_setup` (the one warm start, the warm start's held-out score). Compute is read from the run's ledger
(`harness.stagebook.step_equivalents`), and each stage trains what keeps the arm on its budget line.

A stage is finished when its row is stored and its checkpoint `s<k>/` is on disk (earlier checkpoints are deleted as
later ones are saved), so an interrupted baseline restarts at its last finished stage; a stage's provision is kept, so
a re-run stage trains under the same harness without probing again.

Adding a baseline (a learnability sampler, a bandit over levels, a PBT member) is one class with a `provide` method.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field

from harness.arms import train_policy
from harness.evaluation import report_eval, rollouts
from harness.results import NodeResult, Trained
from harness.round0 import harness_models
from harness.run import Run
from harness.stagebook import step_equivalents
from harness.tasks import knobs


class BaselineError(ValueError):
    """A baseline that cannot run as configured; the message names the baseline and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PLRConfig(_Strict):
    probe_n: int = Field(16, ge=2, description="instances per level probed before each stage")
    samples: int = Field(4, ge=2, description="samples per probed instance (at the recipe's temperature)")
    beta: float = Field(0.3, gt=0, description="rank-prioritisation temperature: weight ~ (1 / rank) ** (1 / beta)")
    rho: float = Field(0.3, ge=0, le=1, description="share of the mixture spread uniformly over the levels")


class RandomConfig(_Strict):
    spread: float = Field(0.25, gt=0, le=1, description="a float knob moves uniformly within +-spread x its range; "
                                                         "an integer knob by -1, 0 or +1")
    tries: int = Field(200, ge=1, description="draws before giving up on a random config the generator accepts")


class Provided(NodeResult):
    """What a baseline's provider gave stage k: the harness files it trains under, and what steering it cost."""

    NODE: ClassVar[str] = "provide"
    files: dict[str, str]
    weights: list[float] | None = Field(None, description="the stage's level weights (a level sampler's)")
    probe_tokens: int = Field(0, description="tokens generated to choose the harness (charged to the ledger)")
    state: dict[str, Any] = Field(default_factory=dict, description="the provider's own state for the next stage "
                                  "(a bandit's value estimates): `run.result(k - 1, Provided).state`")


class BaselineStage(NodeResult):
    """A baseline stage's row: what it trained, what it cost so far, how the policy did on the held-out suite."""

    NODE: ClassVar[str] = "baseline"
    stage: int
    checkpoint: str
    steps: int
    train_tokens: int
    probe_tokens: int
    tokens_per_step: float
    compute: float = Field(..., description="the run's step-equivalents after this stage (its ledger)")
    valid: float
    optimal: float
    weights: list[float] | None = None
    seconds: float = 0.0


class Provider(Protocol):
    """A baseline: before stage k (policy at `policy`), the harness the stage trains under. What earlier stages
    provided, trained and scored is in the run (`run.result(j, Provided)`, `run.result(j, BaselineStage)`); tokens
    generated to decide are charged with `run.charge` and reported in `probe_tokens`, so the stage trains fewer steps."""

    def provide(self, run: Run, k: int, policy: str) -> Provided: ...


# --- the providers -----------------------------------------------------------------------------------------------------


def round0_files(run: Run) -> dict[str, str]:
    """The run's round-0 harness (its harness repo's main, which a baseline never changes)."""
    return run.workspace().files("main")


def with_env(files: dict[str, str], env) -> dict[str, str]:
    return {**files, "env.yaml": yaml.safe_dump(env.model_dump(mode="json"), sort_keys=False)}


class FixedTemplate:
    """The round-0 harness, unchanged."""

    def provide(self, run: Run, k: int, policy: str) -> Provided:
        return Provided(files=round0_files(run))


class FixedRandom:
    """One generator config drawn at random at stage 1 (`random_env`, from the run's seed) and kept."""

    def __init__(self, cfg: RandomConfig):
        self.cfg = cfg

    def provide(self, run: Run, k: int, policy: str) -> Provided:
        if k > 1 and (first := run.result(1, Provided)) is not None:
            return Provided(files=first.files)
        files = round0_files(run)
        env = harness_models(files, run.task)[0]
        env = random_env(run.task, env, self.cfg.spread, self.cfg.tries, np.random.default_rng([7, run.config.seed]))
        return Provided(files=with_env(files, env))


class PLR:
    """Prioritised level replay over the round-0 mixture's entries (its levels): the policy is probed on
    `probe_n` fresh probe instances of every level, each level scored by its learnability p(1 - p), and the stage
    trains on `(1 - rho) * rank-prioritised + rho * uniform` (Jiang et al. 2021). Its probes are charged."""

    def __init__(self, cfg: PLRConfig):
        self.cfg = cfg

    def provide(self, run: Run, k: int, policy: str) -> Provided:
        files = round0_files(run)
        env, recipe, _ = harness_models(files, run.task)
        list_field, levels = _levels(run.task, env)
        rates, tokens, secs = [], 0, 0.0
        for i, lv in enumerate(levels):
            one = _with_levels(run.task, env, list_field, [lv], [1.0])
            seeds = run.draw_seeds("probe", self.cfg.probe_n, key=f"s{k}/plr/{i}")
            out, s, t = rollouts(run, policy, seeds, one, self.cfg.samples, recipe.temperature)
            rates.append(float(np.mean([r.valid for r in out])))
            tokens, secs = tokens + t, secs + s
        run.charge(k, "policy", "rollout", seconds=secs, tokens=tokens, label="plr")
        weights = plr_weights([r * (1 - r) for r in rates], self.cfg.beta, self.cfg.rho)
        stage_env = _with_levels(run.task, env, list_field, levels, [round(w, 4) for w in weights])
        return Provided(files=with_env(files, stage_env), weights=weights, probe_tokens=tokens)


def random_env(task, env, spread: float, tries: int, rng: np.random.Generator):
    """A random generator config near `env`: every knob of the task's grammar moved uniformly (floats within
    +-spread x range, integers by -1/0/+1), redrawn until the generator accepts it on a few seeds."""
    from harness.seeds import seeds

    specs = knobs.walk(env, "env", task.spec.entry_key)
    last = ""
    for _ in range(tries):
        data = env.model_dump(mode="json")
        for s in specs:
            if s.integer:
                v = int(min(s.hi, max(s.lo, int(s.current) + int(rng.integers(-1, 2)))))
            else:
                w = spread * (s.hi - s.lo)
                v = float(min(s.hi, max(s.lo, float(s.current) + rng.uniform(-w, w))))
                v = round(v, 3)
            knobs.set_value(data, knobs.split(s.path, "env"), v, task.spec.entry_key, knob=s.path)
        try:
            cand = task.spec.config_model.model_validate(data)
            for sd in seeds("train", 4, start=10_000_000):
                task.generate(cand, sd)
            return cand
        except Exception as exc:  # noqa: BLE001 - any refusal of the generator means: draw again
            last = str(exc).splitlines()[0][:200]
    raise BaselineError(f"random: no config the generator accepts in {tries} draws (last: {last}); lower "
                        "random.spread or raise random.tries")


def _levels(task, env) -> tuple[str, list[BaseModel]]:
    """The round-0 mixture's entries (PLR's levels): the config's list of entries keyed by the task's entry key."""
    key = task.spec.entry_key
    for name in type(env).model_fields:
        value = getattr(env, name)
        if key and isinstance(value, list) and value and all(hasattr(e, key) and hasattr(e, knobs.WEIGHT)
                                                             for e in value):
            return name, value
    raise BaselineError(f"plr: task {task.name}'s generator config has no weighted mixture of keyed entries "
                        "(levels) to prioritise; drop plr from arms")


def _with_levels(task, env, list_field: str, levels: list, weights: list[float]):
    return task.spec.config_model.model_validate(
        {**env.model_dump(mode="json"),
         list_field: [{**lv.model_dump(mode="json"), knobs.WEIGHT: w} for lv, w in zip(levels, weights, strict=True)]})


def plr_weights(scores: list[float], beta: float, rho: float) -> list[float]:
    """Rank prioritisation (Jiang et al. 2021): h_i = (1 / rank_i) ** (1 / beta), mixed with `rho` uniform."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    rank = np.empty(len(scores))
    rank[order] = np.arange(1, len(scores) + 1)
    h = (1.0 / rank) ** (1.0 / beta)
    p = (1 - rho) * h / h.sum() + rho / len(scores)
    return [float(x) for x in p]


# --- the driver: the stage's machinery with the provider in the middle -------------------------------------------------


def stage_split(total: int, stages: int) -> list[int]:
    """`total` step-equivalents split evenly over `stages` (at least one each)."""
    base, extra = divmod(max(total, stages), stages)
    return [base + (1 if k < extra else 0) for k in range(stages)]


def finished_stages(run: Run) -> list[BaselineStage]:
    """The stages a resume keeps: up to the last one whose row is stored and whose checkpoint is on disk."""
    rows = [run.result(k, BaselineStage) for k in range(1, run.config.budget.stages + 1)]
    last = max([i + 1 for i, r in enumerate(rows) if r is not None and (Path(r.checkpoint) / "config.json").exists()],
               default=0)
    return [r for r in rows[:last] if r is not None]


def run_baseline(run: Run, provider: Provider, budget: int, name: str,
                 say: Callable[[str], None] = print) -> list[BaselineStage]:
    """`budget` step-equivalents over the run config's stages: setup, then per stage provide -> train -> report.
    Returns the stage rows (resumed at the last finished stage)."""
    from harness.graph import node_setup

    cfg = run.config
    stages = cfg.budget.stages
    shares = stage_split(budget, stages)
    policy = node_setup(run, {})["policy"]
    done = finished_stages(run)
    if done:
        policy = done[-1].checkpoint
        say(f"{name}: resuming after stage {len(done)}")
    rows = list(done)
    for k in range(len(done) + 1, stages + 1):
        t0 = time.perf_counter()
        run.store.start_stage(run.id, k)
        run.new_stage_instances()
        provided = run.result(k, Provided)
        if provided is None:
            provided = provider.provide(run, k, policy)
            run.save_result(k, provided)
        # cumulative targeting: a stage trains what keeps the arm on its budget line (its steering comes out of it;
        # stage 1's is charged after training, at the tokens per step training measured, and repaid in stage 2)
        before = step_equivalents(run.store, run.id, before=k)
        tps = before["tokens_per_step"]
        steering = provided.probe_tokens / tps if before["steps"] else 0.0
        steps = max(1, round(sum(shares[:k]) - before["compute"] - steering))
        trained = run.result(k, Trained)  # trained before a crash that came before the stage's row: kept
        if trained is None or not (Path(trained.checkpoint) / "config.json").exists():
            trained = train_policy(run, k, "policy", policy, provided.files, steps, f"s{k}/train",
                                   run.path(f"s{k}"), seed=cfg.seed + k)
            run.save_result(k, trained)
        report_eval(run, k, trained.checkpoint)
        test = next(e for e in run.store.evaluations(run.id, stage=k, arm="policy")
                    if e["split"] == "test" and not e["slice_key"])
        after = step_equivalents(run.store, run.id)
        row = BaselineStage(stage=k, checkpoint=trained.checkpoint, steps=len(trained.steps),
                            train_tokens=trained.tokens, probe_tokens=provided.probe_tokens,
                            tokens_per_step=trained.tokens / max(1, len(trained.steps)), compute=after["compute"],
                            valid=test["valid"], optimal=test["optimal"], weights=provided.weights,
                            seconds=time.perf_counter() - t0)
        run.save_result(k, row)
        run.path(f"stage{k}.json").write_text(row.model_dump_json())  # the row, readable without sqlite
        run.store.end_stage(run.id, k, checkpoint=trained.checkpoint, metrics={"valid": row.valid,
                                                                               "optimal": row.optimal})
        if k > 1 and (prev := run.run_dir / f"s{k - 1}").exists():
            shutil.rmtree(prev)
        rows.append(row)
        policy = trained.checkpoint
        say(f"{name} stage {k}/{stages}: {row.steps} steps"
            + (f" (level weights {', '.join(f'{w:.2f}' for w in row.weights)})" if row.weights else "")
            + f", held-out valid {row.valid:.3f}, compute {row.compute:.0f}/{budget} step-eq, {row.seconds:.0f}s")
    run.store.set_run_status(run.id, "finished")
    return rows


def held_out(run: Run, k: int) -> list[float]:
    """Per-instance held-out valid of stage k's policy (`report_eval`'s record; stage 0: the warm start)."""
    return json.loads(run.path("stages", f"s{k}", "test.json").read_text())["valid"]
