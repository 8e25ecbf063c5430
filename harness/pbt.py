"""Population-based training (PBT) over the recipe's knobs, as a baseline arm that runs on the stage's machinery.

    run = open_run(out / "pbt" / "seed0", config)               # a run folder: run.db, harness repo, keyed seed cursor
    rows = run_pbt(run, PBTConfig(), budget=40, name="pbt")     # setup -> (train members -> fitness -> exploit/explore)

The algorithm is Jaderberg et al. 2017, "Population Based Training of Neural Networks" (arXiv:1711.09846), with its
truncation selection: after every stage each member's fitness is measured, the members are ranked, and each member in
the bottom `quantile` copies the weights and knobs of a member drawn uniformly from the top `quantile` (exploit), then
multiplies each copied knob by a factor drawn from `perturb` (explore: the paper's 0.8 / 1.2). The truncation size is
Ray Tune's rule (ceil(population x quantile), at most half the population), so a population of 2 exchanges one member.
The population starts as the paper's does, from a prior: member 0 at the round-0 recipe, every other member's knobs
drawn log-uniformly within `decades` decades either side of the round-0 value (what a person writing a Tune search
space around their own setting gives, `tune.loguniform(x / 10, x * 10)`), within the Recipe's bounds; and explore
resamples a copied knob from that prior with `resample_probability` (Tune's default 0.25), else perturbs it. A bottom
member copies a top one whatever their fitness (Tune's rule: a population whose members all scored 0, a collapse,
still explores). Why (an outside review, eighty-third session): the population used to start one 0.8 / 1.2 step from
the round-0 recipe, never resample, and copy only a strictly fitter member, so in three stages no knob could leave
x0.51..x1.73 of a broken value: no learning-rate or temperature defect (x0.1 to x10 away) was within its reach, and a
collapsed population never moved at all; a strawman, not the baseline a person would run.

**Why not Ray Tune's `PopulationBasedTraining`.** Tune's scheduler owns the training loop: each member is a Tune trial
(an actor in its own process) that reports a metric every `perturbation_interval` of `time_attr`, and the scheduler
pauses trials and clones Tune checkpoints in Tune's own experiment directory, resumed by `Tuner.restore` from Tune's
own state. A baseline here must train through `harness.arms.train_policy` in the run process (the run's keyed seed
cursor, its policy cache, its ledger in run.db) and resume from the typed results in run.db, like every other arm; with
Tune, PBT would have a second checkpoint store, a second resume path and trials that cannot write the run's ledger, on a
2-core machine where the arms train one after another anyway (Tune's `synch=True` barrier is exactly our stage). Ray
is also an optional extra (`evotrainer[ray]`), which a baseline should not need. What Tune contributes beyond that is
~30 lines (`exploit_explore` below), so PBT is this small driver; it keeps Tune's defaults (quantile 0.25,
perturbation factors 0.8 / 1.2, resample probability 0.25), its truncation size and its copying rule.

**One stage** k (`run_pbt`): the stage's share of the budget (`stage_split` over stages, cumulatively targeted as in
`harness.baselines.run_baseline`, less the fitness probes the previous stage spent) is split over the members
(`stage_split` again); each member trains its steps from its own checkpoint with `train_policy` under the round-0
harness with its knobs written into recipe.yaml (`harness.yamledit.set_leaf_text`, a one-line change per knob), on the
stage's train pool (`s<k>/train`: every member sees the same instances). Its fitness is its valid rate on `probe_n`
fresh probe-split instances of the TARGET (the judge's distribution: `backtest.env`, else the round-0 env), the same
instances for every member (`s<k>/pbt`), scored as the judge scores (`backtest.samples` at its temperature, or one
greedy decode for a greedy judge, at its completion budget) with `harness.evaluation.rollouts`; the probe tokens are
compute, charged to the ledger (label `pbt-probe`), as PLR's probes are. The member with the highest fitness (ties:
the lowest id) is the stage's policy: `report_eval` judges it on the held-out suite and its report is the stage row's
valid/optimal (`BaselineStage`, as every baseline's). Then exploit/explore makes the next stage's population. The held-out suite never chooses anything.

**Records.** Per member and stage: its `Trained` (node `pbt:m<i>:train`) and its `Fitness` (node `pbt:m<i>:fitness`);
per stage: the `Population` (node `pbt`: every member's knobs, next checkpoint and lineage, and what each trained and
scored this stage; stage 0 holds the initial population), a `Provided` (the best member's harness files, so a reader
of baselines' rows finds the stage's env and recipe) and the `BaselineStage` row (also `stage<k>.json`). The row's
`compute` is the run's ledger (`harness.stagebook.step_equivalents`): the whole population's steps plus its probes,
which is what shares the budget.

**Disk and resume.** Member checkpoints live in `pbt/s<k>/m<i>` (a member that copies another points at that
checkpoint; nothing is duplicated); once stage k's row is stored, every earlier stage's folder is deleted. A stage is
finished when its row is stored and its best member's checkpoint is on disk (`harness.baselines.finished_stages`), so an
interrupted PBT restarts after its last finished stage from that stage's stored population; inside a stage, members
already trained or probed are read back, not run again.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.arms import train_policy
from harness.baselines import BaselineError, BaselineStage, Provided, finished_stages, round0_files, stage_split
from harness.evaluation import report_eval, rollouts
from harness.results import NodeResult, Trained
from harness.round0 import harness_models
from harness.run import Run
from harness.stagebook import step_equivalents
from harness.yamledit import set_leaf_text

PROBE_LABEL = "pbt-probe"  # the ledger label of the fitness probes


class PBTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    population: int = Field(4, ge=2, description="members trained side by side; each trains 1/population of every "
                                                 "stage's share of the budget")
    quantile: float = Field(0.25, gt=0, le=0.5, description="truncation selection: members in the bottom quantile "
                            "copy one from the top quantile (ceil(population x quantile), at most half the population)")
    perturb: tuple[float, float] = Field((0.8, 1.2), description="explore: each copied knob is multiplied by one of "
                                         "these factors (drawn uniformly), then kept within the Recipe's bounds")
    knobs: list[str] = Field(["learning_rate", "temperature"], min_length=1, description="the recipe knobs the "
                             "population explores: float GRPO fields of `policies.train.Recipe`, bounded by that "
                             "field's constraints (learning_rate > 0, temperature > 0, top_p in (0, 1], ...)")
    probe_n: int = Field(16, ge=1, description="fresh probe-split instances of the target per stage on which every "
                                               "member's fitness (valid rate) is measured; their tokens are charged")
    decades: float = Field(1.0, ge=0.0, le=4.0, description="the prior: initial members (all but member 0, at the "
                           "round-0 recipe) and resampled knobs are drawn log-uniformly within this many decades "
                           "either side of the round-0 value, within the Recipe's bounds (0: no prior; the initial "
                           "members are one explore step from round 0 and nothing is resampled)")
    resample_probability: float = Field(0.25, ge=0.0, le=1.0, description="explore: each copied knob is drawn again "
                                        "from the prior with this probability, else perturbed (Ray Tune's default)")

    @field_validator("perturb")
    @classmethod
    def _factors(cls, v: tuple[float, float]) -> tuple[float, float]:
        if min(v) <= 0 or v[0] == v[1] == 1:
            raise ValueError(f"perturbation factors must be positive and not both 1, got {v}; e.g. (0.8, 1.2)")
        return v

    @field_validator("knobs")
    @classmethod
    def _float_recipe_knobs(cls, v: list[str]) -> list[str]:
        ok = explorable_knobs()
        bad = [k for k in v if k not in ok]
        if bad:
            raise ValueError(f"pbt cannot explore {bad[0]!r}: choose float GRPO knobs of the recipe "
                             f"({', '.join(ok)}); integer knobs change what a step costs or its batch")
        if len(set(v)) != len(v):
            raise ValueError("a knob is listed twice")
        return v


def explorable_knobs() -> list[str]:
    """The Recipe's float GRPO fields (the SFT warm start's are not trained by a stage)."""
    from policies.train import Recipe

    return [n for n, f in Recipe.model_fields.items() if f.annotation is float and not n.startswith("sft_")]


# --- the population's records -----------------------------------------------------------------------------------------


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Member(_Row):
    id: int
    knobs: dict[str, float] = Field(..., description="the recipe knobs it trains the next stage under")
    checkpoint: str = Field(..., description="the weights it trains the next stage from")
    lineage: list[int] = Field(default_factory=list, description="after each stage, whose weights it continued: "
                                                                  "itself, or the top member it copied")


class MemberStage(_Row):
    """What one member trained and scored in a stage."""

    member: int
    knobs: dict[str, float]
    start: str
    checkpoint: str
    steps: int
    tokens: int
    fitness: float = Field(..., description="valid rate on the stage's probe instances of the target")
    probe_tokens: int


class Population(NodeResult):
    """The population after stage `stage`'s exploit/explore (what the next stage trains), and what this stage's members
    trained and scored (empty at stage 0, the initial population)."""

    NODE: ClassVar[str] = "pbt"
    stage: int
    members: list[Member]
    trained: list[MemberStage] = Field(default_factory=list)
    best: int | None = Field(None, description="the member with the highest fitness (the stage's reported policy)")


class Fitness(NodeResult):
    """One member's fitness probe (node `pbt:m<i>:fitness`)."""

    NODE: ClassVar[str] = "pbt-fitness"
    checkpoint: str
    n: int
    valid: float
    tokens: int
    seconds: float


# --- exploit / explore (pure) -----------------------------------------------------------------------------------------


def truncation(population: int, quantile: float) -> int:
    """Members in each of the top and bottom quantiles: ceil(population x quantile), at most half (Ray Tune's rule)."""
    n = math.ceil(population * quantile)
    return n if n <= population / 2 else population // 2


def recipe_bounds(knob: str) -> tuple[tuple[float, bool] | None, tuple[float, bool] | None]:
    """(lower, upper) bound of a Recipe field from its constraints, each (value, exclusive) or None."""
    import annotated_types as at

    from policies.train import Recipe

    lo = hi = None
    for m in Recipe.model_fields[knob].metadata:
        if isinstance(m, at.Gt):
            lo = (float(m.gt), True)
        elif isinstance(m, at.Ge):
            lo = (float(m.ge), False)
        elif isinstance(m, at.Lt):
            hi = (float(m.lt), True)
        elif isinstance(m, at.Le):
            hi = (float(m.le), False)
    return lo, hi


def perturb(knobs: dict[str, float], factors: tuple[float, float], rng: np.random.Generator) -> dict[str, float]:
    """Explore: every knob times a factor drawn from `factors` (4 significant digits), kept within its Recipe bounds:
    a value past an inclusive bound is set to it; past an exclusive one, to halfway between the old value and it."""
    out = {}
    for name, old in knobs.items():
        v = float(f"{old * float(factors[int(rng.integers(len(factors)))]):.4g}")
        lo, hi = recipe_bounds(name)
        if lo is not None and (v < lo[0] or (lo[1] and v <= lo[0])):
            v = (old + lo[0]) / 2 if lo[1] else lo[0]
        if hi is not None and (v > hi[0] or (hi[1] and v >= hi[0])):
            v = (old + hi[0]) / 2 if hi[1] else hi[0]
        out[name] = v
    return out


def prior_range(knob: str, center: float, decades: float) -> tuple[float, float]:
    """The prior's support for a knob: [center / 10^decades, center x 10^decades] within the Recipe's bounds (an open
    bound is kept a thousandth inside)."""
    lo, hi = center / 10**decades, center * 10**decades
    blo, bhi = recipe_bounds(knob)
    if blo is not None and lo <= blo[0]:  # a positive centre puts lo above 0: only a positive bound is met here
        lo = blo[0] * 1.001 if blo[1] else blo[0]
    if bhi is not None and hi >= bhi[0]:
        hi = bhi[0] * (0.999 if bhi[1] else 1.0)
    return lo, max(lo, hi)


def sample_prior(prior: dict[str, tuple[float, float]], rng: np.random.Generator) -> dict[str, float]:
    """One draw of every knob, log-uniform on its prior's support (4 significant digits, as `perturb`)."""
    return {name: float(f"{math.exp(rng.uniform(math.log(lo), math.log(hi))):.4g}")
            for name, (lo, hi) in prior.items()}


def exploit_explore(fitness: list[float], knobs: list[dict[str, float]], quantile: float,
                    factors: tuple[float, float], rng: np.random.Generator,
                    prior: dict[str, tuple[float, float]] | None = None,
                    resample_probability: float = 0.0) -> list[tuple[int, dict[str, float]]]:
    """Truncation selection (Jaderberg et al. 2017, with Ray Tune's rules): rank the members by fitness (ties: lower id
    ranks higher); each member of the bottom quantile copies a member drawn uniformly from the top quantile (whatever
    their fitness, as Tune clones), then explores each copied knob: drawn again from `prior` with
    `resample_probability`, else perturbed. Returns, per member, (the member whose weights it continues, its knobs)."""
    n = truncation(len(fitness), quantile)
    order = sorted(range(len(fitness)), key=lambda i: (-fitness[i], i))
    top, bottom = order[:n], order[len(order) - n:]
    out = [(i, dict(k)) for i, k in enumerate(knobs)]
    for i in bottom:
        j = top[int(rng.integers(len(top)))]
        new = {}
        for name, value in knobs[j].items():
            if prior is not None and name in prior and rng.random() < resample_probability:
                new.update(sample_prior({name: prior[name]}, rng))
            else:
                new.update(perturb({name: value}, factors, rng))
        out[i] = (j, new)
    return out


def member_files(base: dict[str, str], knobs: dict[str, float]) -> dict[str, str]:
    """The round-0 harness with a member's knobs written into recipe.yaml (one changed line per knob)."""
    text = base["recipe.yaml"]
    for name, value in knobs.items():
        text = set_leaf_text(text, [name], value)
    return {**base, "recipe.yaml": text}


# --- the driver: the stage's machinery, one population per run ---------------------------------------------------------


def round0_knobs(run: Run, cfg: PBTConfig) -> dict[str, float]:
    """The round-0 recipe's values of the knobs the population explores (the prior's centre)."""
    recipe = harness_models(round0_files(run), run.task)[1]
    base = {k: float(getattr(recipe, k)) for k in cfg.knobs}
    if zero := [k for k, v in base.items() if v == 0]:
        raise BaselineError(f"pbt: recipe.{zero[0]} is 0 in the round-0 recipe and a multiplicative perturbation "
                            f"cannot move it; set recipe.{zero[0]} above 0 or drop it from pbt.knobs")
    return base


def prior_of(base: dict[str, float], cfg: PBTConfig) -> dict[str, tuple[float, float]] | None:
    return {k: prior_range(k, v, cfg.decades) for k, v in base.items()} if cfg.decades > 0 else None


def initial_population(run: Run, cfg: PBTConfig, start: str) -> Population:
    """Member 0 at the round-0 recipe's knobs, every other member drawn from the prior (`PBTConfig.decades`; one
    explore step from round 0 without one); all at the warm start."""
    base = round0_knobs(run, cfg)
    prior = prior_of(base, cfg)
    rng = np.random.default_rng([run.config.seed, 0, 11])
    knobs = [base] + [sample_prior(prior, rng) if prior else perturb(base, cfg.perturb, rng)
                      for _ in range(cfg.population - 1)]
    return Population(stage=0, members=[Member(id=i, knobs=k, checkpoint=start) for i, k in enumerate(knobs)])


def _train_member(run: Run, k: int, m: Member, files: dict[str, str], steps: int) -> Trained:
    node = f"pbt:m{m.id}:train"
    trained = run.result(k, Trained, node=node)  # trained before an interruption: kept
    if trained is None or not (Path(trained.checkpoint) / "config.json").exists():
        trained = train_policy(run, k, f"pbt-m{m.id}", m.checkpoint, files, steps, f"s{k}/train",
                               run.path("pbt", f"s{k}", f"m{m.id}"), seed=run.config.seed + k + 1000 * m.id)
        run.save_result(k, trained, node=node)
    return trained


def _fitness(run: Run, k: int, m: Member, ckpt: str, seeds: list[int], shaping) -> Fitness:
    node = f"pbt:m{m.id}:fitness"
    if (f := run.result(k, Fitness, node=node)) is not None and f.checkpoint == ckpt:
        return f
    judge = run.judge
    out, secs, toks = rollouts(run, ckpt, seeds, judge.config(run.task), judge.per_instance,
                               0.0 if judge.decides_greedy else judge.temperature, shaping,
                               max_tokens=judge.max_new_tokens)
    run.charge(k, f"pbt-m{m.id}", "rollout", seconds=secs, tokens=toks, label=PROBE_LABEL)
    f = Fitness(checkpoint=ckpt, n=len(out), valid=float(np.mean([r.valid for r in out])), tokens=toks, seconds=secs)
    run.save_result(k, f, node=node)
    return f


def run_pbt(run: Run, cfg: PBTConfig, budget: int, name: str,
            say: Callable[[str], None] = print) -> list[BaselineStage]:
    """`budget` step-equivalents over the run config's stages, shared by the population: setup, then per stage train
    every member -> fitness -> report the best -> exploit/explore. Returns the stage rows (resumed at the last finished
    stage), as `harness.baselines.run_baseline` does."""
    from harness.graph import node_setup

    if not run.config.eval.suite:
        raise BaselineError("pbt: eval.suite is empty; every stage reports its best member on the held-out suite")
    stages = run.config.budget.stages
    shares = stage_split(budget, stages)
    start = node_setup(run, {})["policy"]
    if run.result(0, Population) is None:
        run.save_result(0, initial_population(run, cfg, start))
    base = round0_files(run)
    shaping = harness_models(base, run.task)[2]
    done = finished_stages(run)
    if done:
        say(f"{name}: resuming after stage {len(done)}")
    rows = list(done)
    for k in range(len(done) + 1, stages + 1):
        t0 = time.perf_counter()
        run.store.start_stage(run.id, k)
        run.new_stage_instances()
        pop = run.result(k - 1, Population)
        if pop is None:
            raise BaselineError(f"pbt: stage {k - 1}'s population is not in {run.run_dir / 'run.db'}; the run "
                                "cannot resume it (start the arm in a fresh folder)")
        # cumulative targeting (as run_baseline): the population trains what keeps the arm on its budget line, less
        # the fitness probes it expects to spend after training: the previous stage's, or before any step measured its
        # tokens (stage 1) their completions over the completions a step samples (before, stage 1 expected none, and
        # a one-stage arm ended over its budget by its probes; stage 2's targeting corrects the estimate)
        before = step_equivalents(run.store, run.id, before=k)
        if before["steps"]:
            expected = sum(t.probe_tokens for t in pop.trained) / before["tokens_per_step"]
        else:
            recipe = harness_models(base, run.task)[1]
            expected = (cfg.population * cfg.probe_n * run.judge.per_instance
                        / (recipe.batch_size * recipe.oversample))
        total = round(sum(shares[:k]) - before["compute"] - expected)
        if total < cfg.population:
            say(f"{name} stage {k}: {total} step-equivalents left on the budget line for {cfg.population} members; "
                f"each trains 1 step (over budget): raise the budget or lower pbt.population / pbt.probe_n")
            total = cfg.population
        per_member = stage_split(total, cfg.population)
        seeds = run.draw_seeds("probe", cfg.probe_n, key=f"s{k}/pbt")
        trained: list[MemberStage] = []
        for m, steps in zip(pop.members, per_member, strict=True):
            t = _train_member(run, k, m, member_files(base, m.knobs), steps)
            f = _fitness(run, k, m, t.checkpoint, seeds, shaping)
            trained.append(MemberStage(member=m.id, knobs=m.knobs, start=m.checkpoint, checkpoint=t.checkpoint,
                                       steps=len(t.steps), tokens=t.tokens, fitness=f.valid, probe_tokens=f.tokens))
        best = max(trained, key=lambda t: (t.fitness, -t.member))
        report_eval(run, k, best.checkpoint)
        test = next(e for e in run.store.evaluations(run.id, stage=k, arm="policy")
                    if e["split"] == "test" and not e["slice_key"])
        nxt = run.result(k, Population)
        if nxt is None:
            moves = exploit_explore([t.fitness for t in trained], [m.knobs for m in pop.members], cfg.quantile,
                                    cfg.perturb, np.random.default_rng([run.config.seed, k, 11]),
                                    prior_of(round0_knobs(run, cfg), cfg), cfg.resample_probability)
            nxt = Population(stage=k, trained=trained, best=best.member, members=[
                Member(id=m.id, knobs=knobs, checkpoint=trained[src].checkpoint, lineage=[*m.lineage, src])
                for m, (src, knobs) in zip(pop.members, moves, strict=True)])
            run.save_result(k, nxt)
        run.save_result(k, Provided(files=member_files(base, best.knobs),
                                    probe_tokens=sum(t.probe_tokens for t in trained),
                                    state={"best": best.member, "knobs": best.knobs}))
        after = step_equivalents(run.store, run.id)
        steps = sum(t.steps for t in trained)
        train_tokens = sum(t.tokens for t in trained)
        row = BaselineStage(stage=k, checkpoint=best.checkpoint, steps=steps, train_tokens=train_tokens,
                            probe_tokens=sum(t.probe_tokens for t in trained),
                            tokens_per_step=train_tokens / max(1, steps), compute=after["compute"],
                            valid=test["valid"], optimal=test["optimal"], seconds=time.perf_counter() - t0)
        run.store.end_stage(run.id, k, checkpoint=best.checkpoint, metrics={"valid": row.valid,
                                                                            "optimal": row.optimal})
        run.save_result(k, row)  # after the stage's close: a resume that finds the row (a finished stage) finds both
        run.path(f"stage{k}.json").write_text(row.model_dump_json())
        for old in run.path("pbt", "x").parent.glob("s*"):  # superseded: every earlier stage's members
            if old.name[1:].isdigit() and int(old.name[1:]) < k:
                shutil.rmtree(old)
        rows.append(row)
        fit = ", ".join(f"m{t.member} {t.fitness:.2f}" for t in trained)
        copies = ", ".join(f"m{m.id}<-m{m.lineage[-1]}" for m in nxt.members if m.lineage[-1] != m.id)
        knobs = ", ".join(f"{n} {v:.3g}" for n, v in best.knobs.items())
        say(f"{name} stage {k}/{stages}: {steps} steps over {cfg.population} members (fitness {fit}; best m"
            f"{best.member}: {knobs}; {copies or 'no copies'}), held-out valid {row.valid:.3f}, compute "
            f"{row.compute:.0f}/{budget} step-eq, {row.seconds:.0f}s")
    run.store.set_run_status(run.id, "finished")
    return rows
