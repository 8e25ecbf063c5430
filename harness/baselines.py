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

**Level samplers** (PLR, Learnability, Bandit) re-weight a mixture's keyed, weighted entries (its *levels*). Their
levels are the TARGET's when the run config names one (`backtest.env`: the distribution the run is judged on), else
the round-0 env's (`level_env`): a stage then trains on the target's entries re-weighted, under the round-0 harness
otherwise (its recipe, shaping and diagnostics). PLR and Learnability probe the policy on every level before a stage
and charge the probes; Bandit reads the previous stage's own training rollouts (the rewards `harness.arms.
train_policy` keeps per GRPO scoring call, `Trained.rewards`) and probes nothing.

Adding a baseline (a PBT member, another curriculum) is one class with a `provide` method.
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
from harness.records import RewardBatch, read_reward_batches
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


class LearnabilityConfig(_Strict):
    probe_n: int = Field(16, ge=2, description="instances per level probed before each stage")
    samples: int = Field(4, ge=2, description="samples per probed instance (at the recipe's temperature)")
    top_k: int | None = Field(None, ge=1, description="train only on the k levels of highest learnability "
                              "p(1 - p) (plus the rho floor); default: all levels")
    rho: float = Field(0.3, ge=0, le=1, description="share of the mixture spread uniformly over all levels")


class BanditConfig(_Strict):
    c: float = Field(1.0, ge=0, description="UCB exploration coefficient: score = value + c * sqrt(2 ln N / n_i)")
    tau: float = Field(0.2, gt=0, description="softmax temperature over the levels' UCB scores (lower: greedier)")
    alpha: float = Field(0.5, gt=0, le=1, description="a level's value is an exponential moving average over stages "
                         "of its groups' mean |advantage|: value <- (1 - alpha) * value + alpha * this stage's "
                         "(the first observation sets it); 1 = the last stage's only")


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
    probe_completions: int = Field(0, description="completions those tokens were generated in (stage 1 converts its "
                                   "probe tokens into steps with them, before training has measured its tokens per "
                                   "step)")
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


class OracleHarness:
    """The oracle arm's provider: the scenario's known-good harness files (`env.yaml`, `recipe.yaml`, made by
    `harness.scenarios.oracle_files`) over the run's round-0 files, every stage."""

    def __init__(self, files: dict[str, str]):
        self.files = files

    def provide(self, run: Run, k: int, policy: str) -> Provided:
        return Provided(files={**round0_files(run), **self.files})


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


def level_env(run: Run, files: dict[str, str]):
    """The env whose mixture entries a level sampler re-weights: the target's (`backtest.env`) when the run config
    names one, else the round-0 env of `files`."""
    if run.config.backtest.env is not None:
        return run.task.spec.config_model.model_validate(run.config.backtest.env)
    return harness_models(files, run.task)[0]


def probe_levels(run: Run, k: int, policy: str, env, list_field: str, levels: list, probe_n: int, samples: int,
                 temperature: float, label: str) -> tuple[list[float], list[float], int, int]:
    """The policy's valid rate on `probe_n` fresh probe instances of every level alone (`samples` each at
    `temperature`), charged to the ledger under `label`. Returns (rate per level, learnability per level, tokens
    generated, completions generated). A level's learnability is the mean over its instances of p_i(1 - p_i), p_i the instance's own success
    rate over its samples (SFL's score, Rutherford et al. 2024: a level is an instance there; GRPO learns from the
    spread inside one prompt's group), not the pooled rate's p(1 - p), which also pays for differences between
    instances: a level half always and half never solved scored the maximum 0.25 with no learning signal in any group
    (an outside review, seventy-ninth session: PLR put 79% of the mix there)."""
    rates, scores, tokens, secs, made = [], [], 0, 0.0, 0
    for i, lv in enumerate(levels):
        one = _with_levels(run.task, env, list_field, [lv], [1.0])
        seeds = run.draw_seeds("probe", probe_n, key=f"s{k}/{label}/{i}")
        out, s, t = rollouts(run, policy, seeds, one, samples, temperature)
        rates.append(float(np.mean([r.valid for r in out])))
        scores.append(learnability(out))
        tokens, secs, made = tokens + t, secs + s, made + len(out)
    run.charge(k, "policy", "rollout", seconds=secs, tokens=tokens, label=label)
    return rates, scores, tokens, made


def learnability(rollouts_: list) -> float:
    """A level's learnability from its probe rollouts: the mean over its instances (by seed) of p_i(1 - p_i), p_i
    the instance's success rate over its samples (0 for none)."""
    per: dict[int, list[bool]] = {}
    for r in rollouts_:
        per.setdefault(r.seed, []).append(bool(r.valid))
    return float(np.mean([np.mean(v) * (1 - np.mean(v)) for v in per.values()])) if per else 0.0


class PLR:
    """Prioritised level replay over the mixture's entries (its levels, `level_env`): the policy is probed on
    `probe_n` fresh probe instances of every level, each level scored by its learnability (the mean of its instances'
    p_i(1 - p_i): `probe_levels`), and the stage
    trains on `(1 - rho) * rank-prioritised + rho * uniform` (Jiang et al. 2021). Its probes are charged."""

    LABEL = "plr"  # the ledger's label and the probes' seed key

    def __init__(self, cfg: PLRConfig | LearnabilityConfig):
        self.cfg = cfg

    def weights(self, scores: list[float]) -> list[float]:
        """Level weights from the levels' learnability scores p(1 - p)."""
        return plr_weights(scores, self.cfg.beta, self.cfg.rho)

    def provide(self, run: Run, k: int, policy: str) -> Provided:
        files = round0_files(run)
        recipe = harness_models(files, run.task)[1]
        env = level_env(run, files)
        list_field, levels = _levels(run.task, env)
        rates, scores, tokens, made = probe_levels(run, k, policy, env, list_field, levels, self.cfg.probe_n,
                                                   self.cfg.samples, recipe.temperature, self.LABEL)
        weights = self.weights(scores)
        stage_env = _with_levels(run.task, env, list_field, levels, [round(w, 4) for w in weights])
        keys = _keys(run.task, levels)
        return Provided(files=with_env(files, stage_env), weights=weights, probe_tokens=tokens,
                        probe_completions=made, state={"rates": dict(zip(keys, rates, strict=True)),
                               "scores": dict(zip(keys, [round(x, 6) for x in scores], strict=True))})


class Learnability(PLR):
    """The learnability sampler of Rutherford et al. 2024 ("No Regrets: Investigating and Improving Regret
    Approximations for Curriculum Discovery", SFL): the policy is probed on `probe_n` fresh probe instances of every
    level (`level_env`; charged, as PLR's), each level scored by its learnability (the mean of its instances'
    p_i(1 - p_i), p_i an instance's success rate over its samples: `probe_levels`), and
    the stage trains on weights proportional to the score itself (not its rank), restricted to the `top_k` levels of
    highest score, mixed with `rho` uniform over all levels (`learnability_weights`). SFL samples uniformly from a
    buffer of its top-k levels; here the buffer's levels are weighted by their score."""

    LABEL = "learnability"

    def weights(self, scores: list[float]) -> list[float]:
        return learnability_weights(scores, self.cfg.top_k, self.cfg.rho)


class Bandit:
    """A bandit curriculum over the levels (`level_env`) in the style of DUMP (Wang et al. 2025, "DUMP: Automated
    Distribution-Level Curriculum Learning for RL-based LLM Post-training") and SEC (Chen et al. 2025,
    "Self-Evolving Curriculum", arXiv:2505.14970). A level's value is the mean absolute GRPO advantage of its groups
    in the TRAINING rollouts themselves (nothing is probed: `probe_tokens` 0): after stage k-1 trained, its rewards
    per scoring call (`Trained.rewards`) give every group's mean |advantage| as GRPO computed it under that stage's
    recipe (`group_advantages`; every group GRPO scored, with `oversample` > 1 also the dead ones it dropped), each
    level's value is updated as an exponential moving average over stages (`alpha`: SEC's update, here once per stage;
    the first observation sets it) and its count grows by its groups; stage k trains on a
    softmax (temperature `tau`) of the UCB scores `value + c * sqrt(2 ln N / n_i)` (`ucb_weights`; DUMP's rule, N
    all groups, n_i the level's). A level never trained on scores +inf, so stage 1 (no observations) is uniform.
    Values and counts are the provision's `state`, keyed by level, so a resumed run continues them."""

    def __init__(self, cfg: BanditConfig):
        self.cfg = cfg

    def provide(self, run: Run, k: int, policy: str) -> Provided:
        files = round0_files(run)
        env = level_env(run, files)
        list_field, levels = _levels(run.task, env)
        keys = _keys(run.task, levels)
        values: dict[str, float] = {}
        counts: dict[str, int] = {}
        if k > 1:
            prev, trained = run.result(k - 1, Provided), run.result(k - 1, Trained)
            if prev is None or trained is None or trained.rewards is None:
                raise BaselineError(f"bandit: stage {k - 1}'s provision or training rewards are missing from the run "
                                    "(a run trained before rewards were kept); start the bandit arm in a new run")
            values, counts = dict(prev.state["values"]), dict(prev.state["counts"])
            recipe = harness_models(prev.files, run.task)[1]
            seen: dict[str, list[float]] = {}
            for level, adv in group_advantages(read_reward_batches(Path(trained.rewards)), recipe.num_generations,
                                               recipe.scale_rewards, recipe.reward_scale):
                seen.setdefault(level, []).append(adv)
            unknown = sorted(set(seen) - set(keys))
            if unknown:
                raise BaselineError(f"bandit: stage {k - 1} trained on level(s) {unknown} that are not among the "
                                    f"levels {keys}; the task's difficulty slice must name its mixture entries")
            for level, advs in seen.items():
                v = float(np.mean(advs))
                values[level] = v if level not in values else (1 - self.cfg.alpha) * values[level] + self.cfg.alpha * v
                counts[level] = counts.get(level, 0) + len(advs)
        weights = ucb_weights([values.get(key, 0.0) for key in keys], [counts.get(key, 0) for key in keys],
                              self.cfg.c, self.cfg.tau)
        stage_env = _with_levels(run.task, env, list_field, levels, [round(w, 4) for w in weights])
        return Provided(files=with_env(files, stage_env), weights=weights, probe_tokens=0,
                        state={"values": values, "counts": counts})


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
    """The mixture's entries (a level sampler's levels): the config's list of entries keyed by the task's entry key."""
    key = task.spec.entry_key
    for name in type(env).model_fields:
        value = getattr(env, name)
        if key and isinstance(value, list) and value and all(hasattr(e, key) and hasattr(e, knobs.WEIGHT)
                                                             for e in value):
            return name, value
    raise BaselineError(f"task {task.name}'s generator config has no weighted mixture of keyed entries (levels) to "
                        "prioritise; drop the level samplers (plr, learnability, bandit) from arms")


def _keys(task, levels: list) -> list[str]:
    """Each level's key as a string: the value of the task's difficulty slice on the instances it generates."""
    return [str(getattr(lv, task.spec.entry_key)) for lv in levels]


def _with_levels(task, env, list_field: str, levels: list, weights: list[float]):
    return task.spec.config_model.model_validate(
        {**env.model_dump(mode="json"),
         list_field: [{**lv.model_dump(mode="json"), knobs.WEIGHT: w} for lv, w in zip(levels, weights, strict=True)]})


def plr_weights(scores: list[float], beta: float, rho: float) -> list[float]:
    """Rank prioritisation (Jiang et al. 2021): h_i = (1 / rank_i) ** (1 / beta), mixed with `rho` uniform. Tied
    scores share one rank (the lowest of their places, as "min" ranking), so equal levels weigh alike: the scores
    here are p(1 - p) of a few dozen probes, quantised and symmetric (p 0.25 and 0.75 tie), and an order-given rank
    sent 0.72 of the mix to the first of three levels all scoring 0. PLR's staleness term is left out: every level is
    probed afresh before every stage, so no score is stale."""
    s = np.asarray(scores, dtype=float)
    rank = np.array([1 + int(np.sum(s > x)) for x in s], dtype=float)  # "min" ranking: 1 + the levels scoring higher
    h = (1.0 / rank) ** (1.0 / beta)
    p = (1 - rho) * h / h.sum() + rho / len(scores)
    return [float(x) for x in p]


def learnability_weights(scores: list[float], top_k: int | None, rho: float) -> list[float]:
    """SFL's learnability sampling (Rutherford et al. 2024): weights proportional to the scores p(1 - p) of the
    `top_k` highest-scoring levels (all with None; ties go to the earlier level), 0 elsewhere, mixed with `rho`
    uniform over all levels. When those scores are all 0 (every level always or never solved) the weights are
    uniform."""
    s = np.asarray(scores, dtype=float)
    keep = np.argsort(-s, kind="stable")[: top_k or len(s)]
    h = np.zeros(len(s))
    h[keep] = s[keep]
    if h.sum() <= 0:
        return [1.0 / len(s)] * len(s)
    p = (1 - rho) * h / h.sum() + rho / len(s)
    return [float(x) for x in p]


def ucb_weights(values: list[float], counts: list[int], c: float, tau: float) -> list[float]:
    """Softmax at temperature `tau` of UCB scores `value_i + c * sqrt(2 ln N / n_i)` (N = sum of counts). A level
    with n_i = 0 scores +inf: the levels never observed share all the weight (all of them: uniform)."""
    v, n = np.asarray(values, dtype=float), np.asarray(counts, dtype=float)
    unseen = n == 0
    if unseen.any():
        return [float(x) for x in unseen / unseen.sum()]
    score = v + c * np.sqrt(2 * np.log(n.sum()) / n)
    z = np.exp((score - score.max()) / tau)
    return [float(x) for x in z / z.sum()]


def group_advantages(batches: list[RewardBatch], group: int, scale_rewards: str,
                     reward_scale: float = 1.0) -> list[tuple[str, float]]:
    """(level, mean |advantage|) of every GRPO group in the training rollouts' scoring calls, as TRL computes the
    advantage for the recipe: rewards times `reward_scale`, minus the group's mean, divided by the group's std
    (`scale_rewards` group), the call's std (batch) or nothing (none); stds are Bessel-corrected plus 1e-4, as TRL's.
    A group whose rewards all tie has advantage 0."""
    out = []
    for b in batches:
        r = np.asarray(b.rewards, dtype=float) * reward_scale
        if len(r) % group:
            raise BaselineError(f"a scoring call of {len(r)} completions is not whole groups of {group}")
        g = r.reshape(-1, group)
        seeds = np.asarray(b.seeds).reshape(-1, group)
        if (seeds != seeds[:, :1]).any():
            raise BaselineError("a GRPO group mixes instances: the recorded rewards are not in group order")
        adv = g - g.mean(axis=1, keepdims=True)
        if scale_rewards == "group":
            adv = adv / (g.std(axis=1, ddof=1, keepdims=True) + 1e-4)
        elif scale_rewards == "batch":
            adv = adv / (r.std(ddof=1) + 1e-4)
        for i in range(len(g)):
            tie = bool(np.ptp(g[i]) == 0)
            out.append((b.levels[i * group], 0.0 if tie else float(np.abs(adv[i]).mean())))
    return out


# --- the driver: the stage's machinery with the provider in the middle -------------------------------------------------


def stage_split(total: int, stages: int) -> list[int]:
    """`total` step-equivalents split evenly over `stages` (at least one each)."""
    base, extra = divmod(max(total, stages), stages)
    return [base + (1 if k < extra else 0) for k in range(stages)]


def first_tokens_per_step(provided: Provided, task) -> float:
    """Tokens a GRPO step generates, before any step measured it: the probes' tokens per completion times the
    completions a step samples (`batch_size * oversample`) under the provided recipe; inf (no deduction) when the
    probes recorded no completions (a record made before they were counted)."""
    if not provided.probe_completions:
        return float("inf")
    recipe = harness_models(provided.files, task)[1]
    return provided.probe_tokens / provided.probe_completions * recipe.batch_size * recipe.oversample


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
        # cumulative targeting: a stage trains what keeps the arm on its budget line, its steering out of it. Until
        # training has measured its tokens per step (stage 1) the probes' own tokens per completion times the
        # completions a step generates stand in (the ledger charges them at the measured rate after training, and
        # stage 2's targeting corrects the difference; before, stage 1 deducted nothing, so a one-stage arm ended
        # over its budget by its probes)
        before = step_equivalents(run.store, run.id, before=k)
        steering = provided.probe_tokens / (before["tokens_per_step"] if before["steps"] else
                                            first_tokens_per_step(provided, run.task)) if provided.probe_tokens else 0.0
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
        run.store.end_stage(run.id, k, checkpoint=trained.checkpoint, metrics={"valid": row.valid,
                                                                               "optimal": row.optimal})
        run.save_result(k, row)  # after the stage's close: a resume that finds the row (a finished stage) finds both
        run.path(f"stage{k}.json").write_text(row.model_dump_json())
        for old in run.run_dir.glob("s*"):  # superseded: every earlier stage's checkpoint, not only the last one's
            if old.is_dir() and old.name[1:].isdigit() and int(old.name[1:]) < k:  # (a kill between the row and
                shutil.rmtree(old)  # this loop left one behind for good when only s{k-1} was removed)
        rows.append(row)
        policy = trained.checkpoint
        say(f"{name} stage {k}/{stages}: {row.steps} steps"
            + (f" (level weights {', '.join(f'{w:.2f}' for w in row.weights)})" if row.weights else "")
            + f", held-out valid {row.valid:.3f}, compute {row.compute:.0f}/{budget} step-eq, {row.seconds:.0f}s")
    run.store.set_run_status(run.id, "finished")
    return rows


def held_out(run: Run, k: int, ckpt: str | None = None) -> list[float]:
    """Per-instance held-out valid of stage k's policy (`report_eval`'s record; stage 0: the warm start). A record
    made on another test set (the run's `eval` changed since, e.g. a scenario's `test_n`) is never returned as this
    one: with `ckpt` (the policy it scored) it is scored again on today's test set, else it is an error naming it."""
    from harness.evaluation import report_eval

    path = run.path("stages", f"s{k}", "test.json")
    rec = json.loads(path.read_text())
    want, name = [i.seed for i in run.suite()], run.config.eval.name
    # the seeds and the test set's name (`eval.name`: a generator config's hash) together: a target edited in place
    # keeps its seeds and draws other instances from them
    if rec.get("seeds", want) != want or rec.get("suite", name) != name:
        if ckpt is None:
            raise ValueError(f"{path}: scored on another test set ({rec.get('suite', '?')}, {len(rec['seeds'])} "
                             f"instances; the run's eval is now {name}, {len(want)} instances): its eval config "
                             "changed since; use a new output folder")
        report_eval(run, k, ckpt)
        rec = json.loads(path.read_text())
    return rec["valid"]
