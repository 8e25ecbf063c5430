"""The judge: the sequential promotion gate on paired outcomes, the regression check, and the arms of the online A/B
backtest of a candidate against the control.

Everything here lives OUTSIDE the sandbox: nothing a run evolves can relax `GateConfig`, the sequential procedure
(`harness.sequential`) or how the held-out instances are scored. Evolved diagnostics may only add vetoes (`arm_vetoes`).

    from harness.backtest import GateConfig, paired_bootstrap, verdicts
    effect, lo, hi = paired_bootstrap(control, candidate, n_boot=2000, alpha=0.05, rng=np.random.default_rng(0))
    [verdict] = verdicts(control_eval, control_files, [("s1c1", files, candidate_eval)], GateConfig(), judge="fp")

One judge, one path: `verdicts` is the one function that turns arms' per-instance outcomes into verdicts at a look
(vetoes of both trees' evolved diagnostics, then `harness.sequential.decide` on the evidence pooled with earlier
inconclusive tests: promoted, rejected = refuted, or inconclusive; `one_look` is the same procedure at one look for
outcomes held without arms); `regression` is the
one check that a policy fell below its start (the probe, the start judge). An arm is trained by `train_arm` and judged
by `judge_arm`, both called only through `harness.scale.execute_arm` on a `harness.scale.ArmJob`: the live loop
(`harness.arms`) and the calibration benchmark (`harness/benchmarks/calibration.py`) submit the same job and call the
same `verdicts`. Tests: tests/test_gate.py, tests/test_backtest.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.config import GateConfig
from harness.records import Evidence, Rollout, Verdict, cut, problem_label, valid_live_share
from harness.seeds import check_split


class GateError(ValueError):
    """Outcomes that cannot be compared (unpaired, empty, out of [0, 1])."""


# --- paired statistics ------------------------------------------------------------------------------------------------


def paired_bootstrap(control: list[float] | np.ndarray, candidate: list[float] | np.ndarray, n_boot: int,
                     alpha: float, rng: np.random.Generator) -> tuple[float, float, float]:
    """Effect (mean of candidate - control over paired instances) and its one-sided bounds (alpha and 1 - alpha
    percentiles of the bootstrap distribution of the mean paired difference). Vectorised: one (n_boot, n) index draw."""
    c = np.asarray(control, dtype=np.float64)
    k = np.asarray(candidate, dtype=np.float64)
    if c.shape != k.shape or c.ndim != 1:
        raise GateError(f"paired outcomes must be two equal-length lists, got {c.shape} and {k.shape}")
    if len(c) == 0:
        raise GateError("no paired outcomes: evaluate both arms on at least one backtest instance")
    if not 0.0 < alpha < 0.5:
        raise GateError(f"alpha must be in (0, 0.5), got {alpha}")
    d = k - c
    effect = float(d.mean())
    if np.all(d == d[0]):  # no variation: the bootstrap distribution is a point
        return effect, effect, effect
    idx = rng.integers(0, len(d), (n_boot, len(d)))
    means = d[idx].mean(axis=1)
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return effect, float(lo), float(hi)


def two_way_bootstrap(control: list[list[float]] | np.ndarray, candidate: list[list[float]] | np.ndarray,
                      n_boot: int, alpha: float, rng: np.random.Generator,
                      clusters: list[Any] | None = None) -> tuple[float, float, float]:
    """Effect (mean of candidate - control over a seeds x instances table: every seed judged on the SAME instances) and
    its alpha and 1 - alpha percentile bounds from the pigeonhole bootstrap, which resamples seeds and instances
    independently, each with replacement (Owen, "The pigeonhole bootstrap", Annals of Applied Statistics 1(2), 2007).
    Why not the paired bootstrap over the flattened table: an instance's outcomes are correlated across seeds (arms that
    share a warm start solve and miss the same instances), so resampling (seed, instance) cells independently treats
    one instance's luck as several independent draws and understates the interval. Owen shows the pigeonhole variance
    is mildly conservative. One seed: the paired bootstrap over instances.

    With few seeds that holds only asymptotically: resampling 3 seeds gives 10 distinct seed sets and shrinks the seed
    variance by (S - 1) / S, and a reviewer's simulation (fifty-second session; 3 seeds x 200 binary instances, a
    seed-to-seed sd of the difference of 0.10-0.19) read 76-85% coverage for the 95% interval. So from two seeds on
    the interval is at least as wide as Student's t over the seeds' mean differences (S - 1 degrees of freedom), which
    covered 94-95% there: the wider of the two bounds on each side.

    `clusters` (one label per instance): instances with one label are the same problem drawn more than once (a
    generator over a small space: the math family's one-digit sums, 56 distinct problems among a 1,000-instance test
    set's 336 one-digit ones), whose outcomes move together; the instance side then resamples CLUSTERS, each with all
    of its instances (the cluster bootstrap: Davison and Hinkley, "Bootstrap Methods and their Application", 1997,
    section 3.8; Field and Welsh, "Bootstrapping clustered data", JRSS B 69(3), 2007), the mean taken over the
    instances drawn. Without it a repeated problem counts as several independent draws and the interval is too
    narrow."""
    d = _paired_table(control, candidate, alpha)
    effect = float(d.mean())
    if np.all(d == d.flat[0]):
        return effect, effect, effect
    rows, cols = _pigeonhole(*d.shape, n_boot, rng, clusters)
    lo, hi = np.quantile(_boot_means(d, rows, cols), [alpha, 1.0 - alpha])
    if d.shape[0] > 1:
        half = _seed_half(d.mean(axis=1), alpha)
        lo, hi = min(lo, effect - half), max(hi, effect + half)
    return effect, float(lo), float(hi)


def _paired_table(control: Any, candidate: Any, alpha: float) -> np.ndarray:
    """candidate - control as a checked seeds x instances table (`two_way_bootstrap`'s input)."""
    c = np.asarray(control, dtype=np.float64)
    k = np.asarray(candidate, dtype=np.float64)
    if c.shape != k.shape or c.ndim != 2:
        raise GateError(f"a seeds x instances table of paired outcomes is needed, got {c.shape} and {k.shape}")
    if 0 in c.shape:
        raise GateError("no paired outcomes: evaluate both arms on at least one instance")
    if not 0.0 < alpha < 0.5:
        raise GateError(f"alpha must be in (0, 0.5), got {alpha}")
    return k - c


def _pigeonhole(s: int, n: int, n_boot: int, rng: np.random.Generator,
                clusters: list[Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The pigeonhole bootstrap's resampling weights (`two_way_bootstrap`): how often each of `s` seeds (rows) and
    each of `n` instances (columns; a drawn cluster brings all its instances) is drawn, one row per resample."""
    rows = rng.multinomial(s, np.full(s, 1.0 / s), n_boot) if s > 1 else np.ones((n_boot, 1))
    if clusters is not None:
        if len(clusters) != n:
            raise GateError(f"{len(clusters)} cluster labels for {n} instances: pass one per instance")
        _, ids = np.unique(np.asarray([str(c) for c in clusters]), return_inverse=True)
        m = int(ids.max()) + 1
        cols = rng.multinomial(m, np.full(m, 1.0 / m), n_boot)[:, ids]  # each drawn cluster brings all its instances
    else:
        cols = rng.multinomial(n, np.full(n, 1.0 / n), n_boot)
    return rows, cols


def _boot_means(d: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """The mean of a seeds x instances table under each resample's weights (`_pigeonhole`): linear in the table."""
    return ((rows @ d) * cols).sum(axis=1) / (d.shape[0] * np.maximum(cols.sum(axis=1), 1))


def _seed_half(per_seed: np.ndarray, alpha: float) -> float:
    """Student's t half-width over the seeds' means (S - 1 degrees of freedom): `two_way_bootstrap`'s floor."""
    from harness.sequential import t_quantile

    s = len(per_seed)
    return t_quantile(s - 1, alpha) * float(np.std(per_seed, ddof=1)) / np.sqrt(s)


def ratio_bootstrap(numerator: Any, denominator: Any, n_boot: int, alpha: float, rng: np.random.Generator,
                    clusters: list[Any] | None = None, widest: float = 100.0) -> tuple[float, float, float]:
    """A ratio of two paired means over one seeds x instances table, theta = mean(numerator) / mean(denominator)
    (each a table of differences, e.g. an arm's gain over fixed-template and the oracle's: the share of the gap an arm
    recovers), with its alpha / 1 - alpha interval by Fieller's method (Fieller, "Some problems in interval
    estimation", JRSS B 16(2), 1954): theta is in the interval when the linear contrast numerator - theta x
    denominator has an interval (`two_way_bootstrap`'s: the pigeonhole bootstrap with its Student's t floor over
    seeds, both tables resampled with the SAME weights) that holds 0. Why not the ratio's own bootstrap percentiles:
    a denominator near 0 in a few resamples sends the ratio to +-infinity and makes its percentiles arbitrary, while
    the contrast stays linear; the interval so found is bounded where the denominator's own interval excludes 0
    (as Fieller's is), and unbounded (an end at -inf or +inf) where it does not. The ends are found by bisection
    where the contrast's bound crosses 0, searched within `widest` of the estimate (an end past it is reported
    infinite). (nan, -inf, inf)
    when the denominator's mean is 0. Where the denominator's interval holds 0, Fieller's set is the whole line or
    the line less an interval ((-inf, a] with [b, inf)): both are reported as the unbounded ends found from the
    estimate, so an infinite end means "unbounded", not that every value inside was accepted (a statistics review;
    the scenario table asks for a share only where the gap's interval, the same resampling as the denominator's,
    excludes 0, where the set is one bounded interval)."""
    num = np.asarray(numerator, dtype=np.float64)
    den = np.asarray(denominator, dtype=np.float64)
    if num.shape != den.shape or num.ndim != 2 or 0 in num.shape:
        raise GateError(f"two seeds x instances tables of one shape are needed, got {num.shape} and {den.shape}")
    if not 0.0 < alpha < 0.5:
        raise GateError(f"alpha must be in (0, 0.5), got {alpha}")
    if den.mean() == 0:
        return float("nan"), float("-inf"), float("inf")
    theta = float(num.mean() / den.mean())
    if den.mean() < 0:  # the same ratio over a positive denominator: the contrast then falls as theta rises
        num, den = -num, -den
    rows, cols = _pigeonhole(*num.shape, n_boot, rng, clusters)
    nb, db = _boot_means(num, rows, cols), _boot_means(den, rows, cols)
    ns, ds = num.mean(axis=1), den.mean(axis=1)

    def bounds(t: float) -> tuple[float, float]:
        lo, hi = np.quantile(nb - t * db, [alpha, 1.0 - alpha])
        if len(ns) > 1:
            est, half = float(ns.mean() - t * ds.mean()), _seed_half(ns - t * ds, alpha)
            lo, hi = min(lo, est - half), max(hi, est + half)
        return float(lo), float(hi)

    def crossing(inside: float, outside: float, side: int) -> float:
        for _ in range(60):  # bisection: 60 halvings of a bracket `widest` wide; the bound is 0 between the two
            mid = (inside + outside) / 2
            if (bounds(mid)[side] <= 0) == (side == 0):
                inside = mid
            else:
                outside = mid
        return (inside + outside) / 2

    below = float("-inf") if bounds(theta - widest)[0] <= 0 else crossing(theta, theta - widest, 0)
    above = float("inf") if bounds(theta + widest)[1] >= 0 else crossing(theta, theta + widest, 1)
    return theta, below, above


def slice_keys(slices: dict[str, str]) -> list[str]:
    """'<key>=<value>' keys of one instance's slices, each dimension separately."""
    return [f"{k}={v}" for k, v in sorted(slices.items())]


# --- the decision -----------------------------------------------------------------------------------------------------


def one_look(control_outcomes: list[float], candidate_outcomes: list[float], slices: list[dict[str, str]],
             gate: GateConfig, vetoes: list[str] | None = None, candidate_id: str = "candidate", comparisons: int = 1,
             samples: int = 1) -> Verdict:
    """One pair judged at one look with its evidence spent: the fixed-n special case of the sequential procedure
    (`sequential_verdict` with a plan of one look of n instances and one pair), for callers that hold per-instance
    outcomes rather than arms (tests, notebooks). The loop decides through `verdicts`."""
    n = len(control_outcomes)
    if len(slices) != n or len(candidate_outcomes) != n:
        raise GateError(f"{len(slices)} slice labels and {len(candidate_outcomes)} candidate outcomes for {n} control "
                        "outcomes: pass one of each per instance")
    if n < 2:
        raise GateError("no paired outcomes to judge: evaluate both arms on at least two backtest instances")
    arms = [ArmEval(seeds=list(range(n)), outcomes=[float(x) for x in xs], slices=list(slices), samples=samples)
            for xs in (control_outcomes, candidate_outcomes)]
    plan = gate.model_copy(update={"max_pairs": 1, "first_look": n}).plan(n)
    return sequential_verdict(candidate_id, arms[0], arms[1], gate, plan, "one-look", [], list(vetoes or []),
                              comparisons, samples)


def choose_winner(verdicts: list[Verdict]) -> tuple[Verdict | None, list[Verdict]]:
    """Among promoted verdicts the one with the highest lower bound wins (ties: larger effect, then id); the other
    promoted ones become rejected with 'beaten by <winner>'. Returns (winner or None, all verdicts in input order)."""
    promoted = [v for v in verdicts if v.decision == "promoted"]
    if not promoted:
        return None, list(verdicts)
    best = max(promoted, key=lambda v: (v.evidence.ci_low, v.evidence.effect, v.candidate) if v.evidence
               else (float("-inf"), float("-inf"), v.candidate))
    out: list[Verdict] = []
    for v in verdicts:
        if v.decision == "promoted" and v is not best:
            assert v.evidence is not None and best.evidence is not None
            v = v.model_copy(update={
                "decision": "rejected",
                "reason": (f"beaten by {best.candidate}: lower bound {v.evidence.ci_low:+.3f} vs "
                           f"{best.evidence.ci_low:+.3f} (effect {v.evidence.effect:+.3f} vs "
                           f"{best.evidence.effect:+.3f}); was: {v.reason}")})
        out.append(v)
    return best, out


# --- online backtest: arms -------------------------------------------------------------------------------------------


class Judge(BaseModel):
    """How backtest arms are scored. Fixed once at run start from the run config (the user's target), stored outside
    the sandbox (`runs/<id>/judge.json`): nothing a run evolves (env.yaml, the recipe's temperature) can move it, so a
    promotion that drops 5x5 boards from training cannot also drop them from every later backtest."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    env: dict[str, Any] = Field(..., description="instance distribution of the backtest seeds (the task's config)")
    samples: int = Field(4, ge=0, description="completions sampled per backtest instance: the per-instance outcome is "
                                              "a success probability, so small policy shifts are visible; 0: a greedy "
                                              "judge (one greedy decode per instance decides, nothing is sampled)")
    temperature: float = Field(0.5, gt=0.0, description="sampling temperature of those completions (and of the "
                                                        "probes, greedy judge or not)")
    greedy: bool = Field(True, description="also decode greedily once per instance (reported, never decides; a greedy "
                                           "judge decides on that decode)")
    max_new_tokens: int = Field(96, ge=1)

    @property
    def decides_greedy(self) -> bool:
        """`samples` 0: each instance's one greedy decode is its outcome (0 or 1), as the held-out test suite scores."""
        return self.samples == 0

    @property
    def per_instance(self) -> int:
        """Completions behind each per-instance outcome: `samples`, or the greedy judge's one decode."""
        return max(1, self.samples)

    def config(self, task: Any) -> BaseModel:
        return task.spec.config_model.model_validate(self.env)


class ArmEval(BaseModel):
    """Per-instance outcomes of one arm on the backtest seeds (aligned with `seeds`) and the scored rollouts."""

    model_config = ConfigDict(extra="forbid")
    seeds: list[int]
    outcomes: list[float] = Field(..., description="per-instance mean of the main metric over samples")
    slices: list[dict[str, str]]
    greedy: list[float] = Field(default_factory=list, description="per-instance greedy outcome (reported only)")
    samples: int = 1
    temperature: float = 0.0
    rollouts: list[Rollout] = Field(default_factory=list, repr=False)
    seconds: float = 0.0
    tokens: int = 0

    @model_validator(mode="after")
    def _aligned(self) -> ArmEval:
        if not len(self.seeds) == len(self.outcomes) == len(self.slices):
            raise ValueError("seeds, outcomes and slices must have the same length")
        if self.greedy and len(self.greedy) != len(self.seeds):
            raise ValueError("greedy outcomes must align with seeds")
        return self

    @property
    def valid(self) -> float:
        return float(np.mean(self.outcomes)) if self.outcomes else 0.0

    @property
    def problems(self) -> list[str]:
        """One label per instance (aligned with `seeds`): a short hash of its prompt, so copies of one problem (a
        level with few distinct problems draws one again) share it and the gate counts them once
        (`harness.sequential.PairEvidence.clusters`); [] when some instance has no rollout to read it from."""
        first: dict[int, str] = {}
        for r in self.rollouts:
            first.setdefault(r.seed, r.prompt)
        if any(s not in first for s in self.seeds):
            return []
        return [problem_label(first[s]) for s in self.seeds]

    def extend(self, more: ArmEval) -> ArmEval:
        """This arm's outcomes followed by a later batch's (the looks of a sequential decision)."""
        return self.model_copy(update={
            "seeds": [*self.seeds, *more.seeds], "outcomes": [*self.outcomes, *more.outcomes],
            "slices": [*self.slices, *more.slices], "greedy": [*self.greedy, *more.greedy] if self.greedy and
            more.greedy else [], "rollouts": [*self.rollouts, *more.rollouts], "seconds": self.seconds + more.seconds,
            "tokens": self.tokens + more.tokens})

    def prefix(self, n: int) -> ArmEval:
        """The first n instances (the candidate that stopped looking is compared on those only)."""
        keep = set(self.seeds[:n])
        return self.model_copy(update={"seeds": self.seeds[:n], "outcomes": self.outcomes[:n],
                                       "slices": self.slices[:n], "greedy": self.greedy[:n],
                                       "rollouts": [r for r in self.rollouts if r.seed in keep]})

    @classmethod
    def from_rollouts(cls, rollouts: list[Rollout], greedy: list[float] | None = None, samples: int = 1) -> ArmEval:
        """An arm's per-instance outcomes rebuilt from its stored backtest rollouts (the mean over an instance's
        samples, instances in seed order), as the loop reads a recorded arm back."""
        by: dict[int, list[Rollout]] = {}
        for x in rollouts:
            by.setdefault(x.seed, []).append(x)
        seeds_ = sorted(by)
        return cls(seeds=seeds_, outcomes=[float(np.mean([x.valid for x in by[s]])) for s in seeds_],
                   slices=[by[s][0].slices for s in seeds_], greedy=list(greedy or []), samples=samples,
                   rollouts=rollouts)


def read_harness(files: dict[str, str], task: Any) -> tuple[BaseModel, Any, BaseModel]:
    """(env config, Recipe, reward shaping) from a harness tree's files (`env.yaml`, `recipe.yaml` with `reward:`)."""
    from policies.train import Recipe

    missing = [f for f in ("env.yaml", "recipe.yaml") if f not in files]
    if missing:
        raise GateError(f"harness files lack {missing}: pass Workspace.files(ref) of a harness repo")
    env = task.spec.config_model.model_validate(yaml.safe_load(files["env.yaml"]) or {})
    rec = dict(yaml.safe_load(files["recipe.yaml"]) or {})
    shaping = task.spec.shaping_model.model_validate(rec.pop("reward", None) or {})
    return env, Recipe.model_validate(rec), shaping


# --- the one code path of an arm: train_arm + judge_arm (the live loop and the calibration benchmark both call them) ---


def train_arm(model, tok, task: Any, files: dict[str, str], steps: int, train_seeds: list[int], seed: int,
              style: str | None = None, instances: list | None = None, progress=None, tensorboard_dir=None,
              record: list | None = None, callbacks: list | None = None):
    """GRPO `steps` steps on `model` (in place) under the harness `files`: its env draws the training instances of
    `train_seeds` (train split only; the prefix the steps consume), its recipe and reward shaping train. `seed` is the
    arm's training randomness (equal for both arms of a real decision). `instances` (already generated from that env
    and those seeds) skips generation. `record` (a list) collects the training rollouts' rewards, one
    `harness.records.RewardBatch` per GRPO scoring call. `callbacks`: extra transformers TrainerCallbacks. Returns
    `policies.train.GRPOMetrics`, each step with its `valid_live_share` (`harness.records.valid_live_share` of its
    scoring call) and `valid` (the share of its completions that were valid) when the calls are one a step."""
    from harness.policy_glue import grpo_rows, reward_fn
    from policies.train import train_grpo

    env, recipe, shaping = read_harness(files, task)
    recipe = recipe.model_copy(update={"steps": steps, "seed": seed})
    seeds_used = list(train_seeds)[: steps * recipe.prompts_per_step]
    if instances is not None:
        instances = instances[: len(seeds_used)]
    rows = grpo_rows(task, env, seeds_used, style, instances=instances)  # refuses seeds outside the train split
    batches = record if record is not None else []
    first = len(batches)
    m = train_grpo(model, tok, rows, reward_fn(task, shaping, batches), recipe, progress=progress,
                   tensorboard_dir=tensorboard_dir, callbacks=callbacks)
    mine = batches[first:]
    # one scoring call per generated batch (a step's, or every num_iterations steps' when the optimiser passes over a
    # batch several times: the steps between log no reward): each step's validity-live and valid share are those of
    # the batch it trained on
    made = [k for k, st in enumerate(m.steps) if math.isfinite(st.reward_mean)]
    if mine and len(mine) == len(made) and made[0] == 0:
        for k, step in enumerate(m.steps):
            batch = mine[sum(j <= k for j in made) - 1]
            step.valid_live_share = valid_live_share(batch, recipe.num_generations)
            step.valid = sum(batch.valid) / len(batch.valid) if batch.valid else None
    return m


def judge_arm(model, tok, task: Any, instances: list, judge: Judge, sampling_seed: int, style: str | None = None,
              backend: str = "transformers", batch_size: int = 64) -> ArmEval:
    """Score a trained arm on the backtest instances: `judge.samples` completions per instance at the judge's fixed
    temperature (the outcome is the per-instance success rate: what decides) and, if `judge.greedy`, one greedy
    completion (reported). A greedy judge (`samples` 0) decodes each instance greedily once and decides on that (the
    rollouts are the greedy ones; `greedy` repeats the outcomes). Unshaped: the task's own scorer."""
    from harness.policy_glue import evaluate
    from policies.rollout import SamplingParams

    seeds_ = [i.seed for i in instances]
    check_split(seeds_, "backtest")
    t0 = time.perf_counter()
    if judge.decides_greedy:  # one greedy decode per instance is the outcome, and the recorded (reported) greedy one
        gv, g = _decode_greedy(model, tok, task, instances, judge, style, backend, batch_size)
        return ArmEval(seeds=seeds_, outcomes=gv, slices=[task.slices(i) for i in instances], greedy=list(gv), samples=1,
                       temperature=0.0, rollouts=g.rollouts, seconds=time.perf_counter() - t0, tokens=g.new_tokens)
    rep = evaluate(model, tok, task, instances, style, params=SamplingParams(
        temperature=judge.temperature, n=judge.samples, seed=sampling_seed, max_new_tokens=judge.max_new_tokens,
        batch_size=batch_size, backend=backend))
    valid = np.zeros(len(instances))
    for r in rep.rollouts:
        valid[r.group] += r.valid
    tokens = rep.new_tokens
    greedy: list[float] = []
    if judge.greedy:
        greedy, more = judge_greedy(model, tok, task, instances, judge, style, backend, batch_size)
        tokens += more
    return ArmEval(seeds=seeds_, outcomes=(valid / judge.samples).tolist(), slices=[task.slices(i) for i in instances],
                   greedy=greedy, samples=judge.samples, temperature=judge.temperature, rollouts=rep.rollouts,
                   seconds=time.perf_counter() - t0, tokens=tokens)


def judge_greedy(model, tok, task: Any, instances: list, judge: Judge, style: str | None = None,
                 backend: str = "transformers", batch_size: int = 64) -> tuple[list[float], int]:
    """(per-instance greedy validity, new tokens): one greedy completion per instance at the judge's completion budget,
    unshaped (the task's own scorer), as the held-out test suite decodes."""
    gv, g = _decode_greedy(model, tok, task, instances, judge, style, backend, batch_size)
    return gv, g.new_tokens


def _decode_greedy(model, tok, task: Any, instances: list, judge: Judge, style: str | None, backend: str,
                   batch_size: int) -> tuple[list[float], Any]:
    """(per-instance greedy validity, the evaluation: its rollouts and new tokens), for `judge_greedy` and a greedy
    judge's `judge_arm`."""
    from harness.policy_glue import evaluate
    from policies.rollout import SamplingParams

    g = evaluate(model, tok, task, instances, style, params=SamplingParams(
        temperature=0.0, max_new_tokens=judge.max_new_tokens, batch_size=batch_size, backend=backend))
    gv = np.zeros(len(instances))
    for r in g.rollouts:
        gv[r.group] = r.valid
    return gv.tolist(), g


def arm_vetoes(control_files: dict[str, str], candidate_files: dict[str, str], control: ArmEval,
               candidate: ArmEval, stands: Callable[[str, str], str | None] | None = None,
               void: list[str] | None = None) -> list[str]:
    """Vetoes of the evolved diagnostics of BOTH trees (the incumbent's files, then the candidate's where they
    differ), so a candidate cannot escape a veto by revising or deleting the diagnostic that would block it. With
    `stands` (path, source -> why the block is void, or None: `harness.diagjudge.veto_stands`, the diagnostic judge's
    veto checks run again at the block), a block whose veto fails its re-check does not count: it goes to `void`
    with why, for the verdict's record."""
    from harness.diagnostics import arm_metrics, run_vetoes

    cm, km = arm_metrics(control.rollouts), arm_metrics(candidate.rollouts)
    trees = [{p: s for p, s in control_files.items() if p.startswith("diagnostics/")},
             {p: s for p, s in candidate_files.items() if p.startswith("diagnostics/") and control_files.get(p) != s}]
    out: list[str] = []
    for files in trees:
        for path, source in sorted(files.items()):
            for reason in run_vetoes({path: source}, control.rollouts, candidate.rollouts, cm, km):
                if stands is not None and (why := stands(path, source)) is not None:
                    gone = f"{reason} (void: {why})"
                    if void is not None and gone not in void:
                        void.append(gone)
                elif reason not in out:
                    out.append(reason)
    return out


# --- the one judge: arms' outcomes -> verdicts, and the one regression check ------------------------------------------


def judge_fingerprint(judge: Judge, gate: GateConfig, task: str) -> str:
    """Identity of what scores a decision's evidence: the task, the judge (distribution, samples, temperature, length)
    and the gate's statistical settings. Evidence is pooled only under the same fingerprint, so a resumed run with an
    edited config never silently pools with what the old one recorded."""
    import hashlib
    import json

    keep = {k: v for k, v in gate.model_dump(mode="json").items()
            if k not in ("human", "learning_signal", "learning_signal_arm_sd")}
    blob = json.dumps({"task": task, "judge": judge.model_dump(mode="json"), "gate": keep}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def has_valid_live(curve: list[dict[str, Any]]) -> bool:
    """Did every step of this training curve record its validity-live share (`GRPOStep.valid_live_share`)?"""
    return bool(curve) and all(x.get("valid_live_share") is not None for x in curve)


def live_shares(curve: list[dict[str, Any]], validity: bool | None = None) -> list[float]:
    """Per GRPO step of an arm's training curve: the share of its groups that were live. On validity
    (`valid_live_share`: some completions valid, some not) when every step recorded it; else on reward (not every
    completion scored alike, 1 - `dead_group_share`: the same under a binary reward, more under a shaped one, whose
    spread among wrong answers is no signal of what the judge scores). Steps without it (or nan) are skipped.
    `validity` forces one count (two arms are compared on the same one: `has_valid_live` of both)."""
    if validity if validity is not None else has_valid_live(curve):
        return [float(x["valid_live_share"]) for x in curve if math.isfinite(float(x["valid_live_share"]))]
    shares = (x.get("dead_group_share") for x in curve)
    return [1.0 - float(d) for d in shares if d is not None and math.isfinite(float(d))]


def finished_shares(curve: list[dict[str, Any]]) -> list[float]:
    """Per GRPO step of an arm's training curve: the share of its completions that ended within the completion budget
    (1 - `GRPOStep.clipped_ratio`, what the trainer logs as `completions/clipped_ratio`). Steps that did not record
    it (or nan) are skipped: an empty list when none did."""
    shares = (x.get("clipped_ratio") for x in curve)
    return [1.0 - float(c) for c in shares if c is not None and math.isfinite(float(c))]


def learning_signal_bound(control: list[float], candidate: list[float], alpha: float, arm_sd: float = 0.0
                          ) -> tuple[float, float]:
    """(gain, one-sided lower bound at 1 - alpha) of the candidate's mean per-step live-group share over the
    control's: Welch's unequal-variance t interval (Welch 1947, "The generalization of Student's problem when several
    different population variances are involved"), with the Welch-Satterthwaite degrees of freedom and the t quantile
    of `harness.sequential.t_quantile`. Steps are the units: the groups within one step share the policy of that
    moment, so they are not independent draws. `arm_sd` is each arm's training noise on its mean share (a random
    effect per arm: a one-way random-effects model, the two arms' levels drawn around the harness's), added in
    quadrature, `2 * arm_sd**2`, to the steps' variance: the steps' scatter alone cannot see it, and live A/A pairs
    show it (over 222 such pairs their gains' sd 0.040 against a mean Welch se of 0.035, so an arm sd of 0.013,
    bootstrap 90% [0.006, 0.018]; the steps-only bound cleared 0 at alpha 0.05 in 17 of them, 7.7%, with the term at
    0.02 in 7, 3.2%). The degrees of freedom stay the steps':
    the arm term is taken as known, as `gate.arm_noise_sd` is for the target. (nan, nan) with fewer than 2 steps a
    side."""
    c, x = np.asarray(control, dtype=float), np.asarray(candidate, dtype=float)
    if len(c) < 2 or len(x) < 2:
        return float("nan"), float("nan")
    gain = float(x.mean() - c.mean())
    parts = [(float(c.var(ddof=1)) / len(c), len(c)), (float(x.var(ddof=1)) / len(x), len(x))]
    return gain, _welch_lower(gain, parts, 2 * arm_sd**2, 1.0, alpha)


def _welch_lower(estimate: float, parts: list[tuple[float, int]], extra: float, scale: float, alpha: float) -> float:
    """One-sided lower bound at 1 - alpha of `estimate`, whose variance is `scale**2` x (the sum of the `parts`'
    variances, each (variance of a term, its count of samples), plus `extra`, a variance taken as known): the t quantile
    at the parts' Welch-Satterthwaite degrees of freedom (Satterthwaite 1946), their pooled count's when every part
    is constant. The estimate itself when the variance is 0."""
    from harness.sequential import t_quantile

    steps = sum(v for v, _ in parts)
    se = math.sqrt(steps + extra) * scale
    if se == 0:
        return estimate
    dof = steps**2 / sum(v**2 / (n - 1) for v, n in parts) if steps else float(sum(n for _, n in parts) - len(parts))
    return estimate - t_quantile(dof, alpha) * se


def learning_signal_ratio_bound(control: list[float], candidate: list[float], ratio: float, alpha: float,
                                arm_sd: float = 0.0, earlier: list[tuple[list[float], list[float]]] = ()
                                ) -> tuple[float, float]:
    """(contrast, one-sided lower bound at 1 - alpha) of `candidate mean - ratio x control mean` over the arms'
    per-step live-group shares: a bound above 0 says the candidate's share is more than `ratio` times the control's.
    Welch's interval for a linear contrast of two means (Welch 1947; the Welch-Satterthwaite degrees of freedom of
    a x mean1 + b x mean2, Satterthwaite 1946), as `learning_signal_bound` for the plain gain. The arm noise scales
    with each arm's share: `arm_sd` is the arm sd of a share at 0.5, and an arm at share p gets `2 * arm_sd *
    sqrt(p (1 - p))` (binomial scaling). Why scaled: at 1% live a constant 0.02 per arm would exceed the shares
    themselves, and the live A/A pairs it was measured on ran at 33-45% live (BENCHMARKS.md, twenty-seventh session),
    where the scaling gives 0.019-0.020, the configured value; a random effect on the logit scale shrinks faster
    still toward 0 (as p (1 - p)), so the square root is the cautious of the two. `earlier`: the same change's
    earlier arm pairs (control, candidate), each from its own start: the contrast is their mean with this pair's,
    its variance the sum of theirs over the count squared, the degrees of freedom Satterthwaite's over every arm's
    steps (one test of all the evidence, as the target's pooled re-test). (nan, nan) with fewer than 2 steps an arm."""
    pairs = [*earlier, (control, candidate)]
    contrasts, parts, arm = [], [], 0.0  # parts: (variance of a term of the contrast, its steps)
    for ctrl, cand in pairs:
        c, x = np.asarray(ctrl, dtype=float), np.asarray(cand, dtype=float)
        if len(c) < 2 or len(x) < 2:
            return float("nan"), float("nan")
        pc, px = float(c.mean()), float(x.mean())
        contrasts.append(px - ratio * pc)
        parts += [(ratio**2 * float(c.var(ddof=1)) / len(c), len(c)), (float(x.var(ddof=1)) / len(x), len(x))]
        arm += (2 * arm_sd) ** 2 * (px * (1 - px) + ratio**2 * pc * (1 - pc))
    contrast = float(np.mean(contrasts))
    return contrast, _welch_lower(contrast, parts, arm, 1 / len(pairs), alpha)


def prior_pairs(earlier: list[Evidence], judge: str) -> tuple[list[Any], list[int], str | None]:
    """(the PairEvidence of earlier inconclusive tests of the same change from the same state, oldest first; the
    positions in `earlier` of the tests they came from; a note). A test recorded under another judge (the run's
    backtest or gate config changed since) is not pooled and the note says so; the tests under this judge still are.
    Why not refuse them all: every re-test lists every earlier test of the change, so one test under an old judge made
    each later re-test a first pair again, its chain never spent (`gate.max_pairs`) and re-tested without end, each
    with a fresh alpha. Dropping the old judge's tests leaves that chain its own alpha and this judge's chain its own."""
    from harness.sequential import PairEvidence

    kept = [i for i, e in enumerate(earlier) if e.judge == judge]
    other = sorted({str(e.judge) for e in earlier if e.judge != judge})
    note = (f"earlier evidence of this change was recorded under another judge ({', '.join(other)}; now {judge}): the "
            "run's backtest or gate config changed, so that evidence is not pooled"
            + (f"; pooled the {len(kept)} earlier test(s) under this judge" if kept else "; judged afresh")
            if other else None)
    return [PairEvidence(judge=judge, diffs=d, slices=s, clusters=c) for e in (earlier[i] for i in kept)
            for d, s, c in [*((p["diffs"], p["slices"], p.get("clusters") or []) for p in e.stage_pairs),
                            (e.diffs, e.slices, e.clusters)] if d], kept, note


def sequential_verdict(cid: str, control: ArmEval, arm: ArmEval, gate: GateConfig, plan: Any, judge: str,
                       prior: list[Any], vetoes: list[str], comparisons: int, samples: int,
                       pooled: list[str] | None = None, looks: list[dict[str, Any]] | None = None,
                       vetoes_void: list[str] | None = None) -> Verdict:
    """One candidate's verdict at this look (`harness.sequential.decide` on its pooled evidence): promoted, rejected
    (refuted: confidently below min_effect, a harmed slice, a veto) or inconclusive (`evidence.next_step` says whether
    the loop may look again now: more_instances; a re-test in a later stage: new_pair; spent: stop)."""
    from harness.sequential import PairEvidence, decide

    ctrl = control.prefix(len(arm.seeds))
    if arm.seeds != ctrl.seeds:
        raise GateError(f"arm {cid} was judged on other instances than the control arm: judge every arm of a "
                        "decision on the same backtest instances, in the same order")
    for name, xs in (("control", ctrl.outcomes), ("candidate", arm.outcomes)):
        if any(not 0.0 <= float(x) <= 1.0 for x in xs):
            raise GateError(f"{name} outcomes must lie in [0, 1] (per-instance {gate.metric} rate)")
    diffs = [float(b - a) for a, b in zip(ctrl.outcomes, arm.outcomes, strict=True)]
    problems = ctrl.problems or arm.problems
    pair = PairEvidence(judge=judge, diffs=diffs, slices=ctrl.slices, clusters=problems)
    look = decide([*prior, pair], plan, vetoes=vetoes, comparisons=comparisons)
    c, k_ = np.asarray(ctrl.outcomes), np.asarray(arm.outcomes)
    by_slice = {key: {**v, "checked": v["checked"]} for key, v in look.by_slice.items()}
    z80 = 0.8416212335729143
    mde = plan.promote_above + (look.z_promote + z80) * look.se if np.isfinite(look.z_promote) else None
    record = [*(looks or []), {"n": look.n, "pairs": look.pairs, "effect": round(look.effect, 5),
                                "lo": round(look.lo, 5), "hi": round(look.hi, 5), "z": round(look.z, 3),
                                "info": round(look.info_fraction, 3), "decision": look.decision,
                                "next_step": look.next_step}]
    evidence = Evidence(metric=gate.metric, n=len(c), control=float(c.mean()), candidate=float(k_.mean()),
                        effect=look.effect, ci_low=look.lo, ci_high=look.hi, by_slice=by_slice, vetoes=list(vetoes),
                        seeds=(min(ctrl.seeds), max(ctrl.seeds)) if ctrl.seeds else None, samples=samples, mde=mde,
                        greedy_control=float(np.mean(ctrl.greedy)) if ctrl.greedy else None,
                        greedy_candidate=float(np.mean(arm.greedy)) if arm.greedy else None, judge=judge,
                        diffs=[round(d, 6) for d in diffs], slices=ctrl.slices, clusters=problems, pairs=look.pairs,
                        pooled=list(pooled or []), looks=record, comparisons=comparisons,
                        vetoes_void=list(vetoes_void or []),
                        next_step=None if look.decision in ("promoted", "refuted") else look.next_step,
                        sign_chance=None if look.sign_chance is None else round(look.sign_chance, 4))
    decision = {"promoted": "promoted", "refuted": "rejected"}.get(look.decision, "inconclusive")
    reason = look.reason
    if vetoes_void:  # by name only: what a veto says quotes held-out rollouts (the evidence keeps its words)
        names = sorted({str(x).split(":", 1)[0].strip() for x in vetoes_void})
        reason += f" (a block by {', '.join(names)} is void: the veto failed its re-check on held-out rollouts)"
    return Verdict(candidate=cid, decision=decision, evidence=evidence, reason=cut(reason))


def verdicts(control: ArmEval | Exception, control_files: dict[str, str],
             candidates: list[tuple[str, dict[str, str], ArmEval | Exception]], gate: GateConfig, *,
             samples: int = 1, plan: Any = None, judge: str = "", prior: dict[str, list[Any]] | None = None,
             pooled: dict[str, list[str]] | None = None, looks: dict[str, list[dict[str, Any]]] | None = None,
             comparisons: int | None = None, at_least: dict[str, int] | None = None,
             veto_stands: Callable[[str, str], str | None] | None = None, **_: Any) -> list[Verdict]:
    """The verdict of every candidate arm against the control arm of one decision, at this look, in order: an arm
    that failed (an exception instead of its outcomes) is rejected with the reason (every arm, when the control arm
    failed); every other one is judged by the sequential procedure (`sequential_verdict`) on its paired outcomes, pooled
    with `prior[cid]` (earlier inconclusive tests of the same change), Bonferroni over the decision's candidates, with
    the vetoes of both trees (`arm_vetoes`; with `veto_stands`, a block whose veto fails its re-check is void and
    recorded as such); `at_least[cid]`: the largest Bonferroni count its pooled evidence was
    judged at before (a re-test in a stage with fewer candidates must not judge the pooled looks at a larger share of
    alpha than they were spent at: a reviewer's simulation read a family error of 0.10 for four candidates re-tested
    alone, against 0.05). `plan` defaults to the gate's plan at the control arm's n. The live loop
    (`harness.graph` node_backtest, once per look) and the calibration benchmark both decide here."""
    if isinstance(control, Exception):  # without a control there is no decision: every candidate fails with the reason
        return [Verdict(candidate=cid, decision="rejected", stage_reached="backtest",
                        reason=cut(f"the control arm failed, so nothing could be compared: "
                                   f"{type(control).__name__}: {control}")) for cid, _, _ in candidates]
    plan = plan if plan is not None else gate.plan(len(control.seeds))
    comparisons = comparisons or len(candidates)
    out: list[Verdict] = []
    for cid, files, arm in candidates:
        if isinstance(arm, Exception):  # a candidate whose arm cannot train or be judged is rejected
            out.append(Verdict(candidate=cid, decision="rejected", stage_reached="backtest",
                               reason=cut(f"its backtest arm failed: {type(arm).__name__}: {arm}")))
            continue
        ctrl = control.prefix(len(arm.seeds))
        void: list[str] = []
        blocks = arm_vetoes(control_files, files, ctrl, arm, veto_stands, void)
        out.append(sequential_verdict(cid, control, arm, gate, plan, judge, (prior or {}).get(cid, []), blocks,
                                      max(comparisons, (at_least or {}).get(cid, 1)), samples,
                                      (pooled or {}).get(cid), (looks or {}).get(cid), void))
    return out


class Regression(BaseModel):
    """A policy after training compared with its start on the same instances: `regressed` when the upper bound of the
    paired change is below zero (training lowered it by more than noise)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    before: float
    after: float
    change: float
    ci_low: float
    ci_high: float

    @property
    def regressed(self) -> bool:
        return self.ci_high < 0


def regression(before: list[float], after: list[float], gate: GateConfig, rng: np.random.Generator,
               clusters: list[str] | None = None) -> Regression:
    """The one regression check (the probe: the stage's training; the start judge: the control arm): a paired
    bootstrap of `after - before` at the gate's confidence, per instance; where some instances are copies of one
    problem (`clusters`, one label per instance: `ArmEval.problems`), the cluster bootstrap over problems
    (`two_way_bootstrap`, as the gate counts them). Without it, 96 copies of 24 problems read "regressed" 23% of the
    time under no change, against a nominal 5% (an outside review, eighty-second session). With every label distinct
    (or none given) the draws are the paired bootstrap's, as before."""
    if clusters is not None and len(clusters) == len(before) and len(set(clusters)) < len(clusters):
        change, lo, hi = two_way_bootstrap([before], [after], gate.n_boot, gate.alpha, rng, clusters=clusters)
    else:
        change, lo, hi = paired_bootstrap(before, after, gate.n_boot, gate.alpha, rng)
    return Regression(before=float(np.mean(before)), after=float(np.mean(after)), change=change, ci_low=lo, ci_high=hi)
