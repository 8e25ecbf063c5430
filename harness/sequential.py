"""Sequential decisions that accumulate evidence: promote, refute or stay inconclusive, at any look, pooled across re-tests.

A candidate is judged by paired per-instance differences d_i = candidate_i - control_i (per-instance rates in [0, 1],
each from `samples` completions) on fresh held-out instances. This module turns a list of arm PAIRS (the first test and
each re-test of the same change from the same harness state, each with the differences seen so far) into one answer:

    promoted      the effect is above `promote_above` (default 0: better than the control) with confidence (the
                  statistic crossed the upper boundary), no checked slice is possibly harmed beyond
                  `slice_tolerance`, and no veto fired
    refuted       the effect is below `min_effect` with confidence (it crossed the lower boundary), or a checked
                  slice is confidently harmed beyond `slice_tolerance`; never re-proposed from that state
    inconclusive  the planned evidence is spent (`max_pairs` pairs of `max_n` instances) without either
    continue      evaluate more: `next_step` says whether more instances on this pair or a new arm pair (a re-test,
                  pooled onto this evidence) buys more; the loop records a stage that ends here as inconclusive and
                  keeps the evidence

    from harness.sequential import Plan, PairEvidence, decide
    plan = Plan(alpha=0.05, min_effect=0.02, promote_above=0.0, slice_tolerance=0.1, arm_noise_sd=0.012, max_n=160,
                max_pairs=3)
    look = decide([PairEvidence(judge="j1", diffs=d, slices=s)], plan)
    look.decision, look.lo, look.hi, look.reason

**The procedure: a group-sequential test with error spending.** Two one-sided claims, each at level alpha (promote
at alpha / comparisons when one decision judges several candidates against one control: Bonferroni): promote rejects
theta <= `promote_above` (H0: the change is no better than the control), refute rejects theta >= `min_effect` (H1: the
change is as good as the smallest effect worth having). This is the one-sided test with early stopping to accept
either hypothesis of Jennison and Turnbull (2000, ch. 4), with `min_effect` the alternative the plan is sized for;
each side's boundaries are computed alone, with the other side's stops treated as non-binding (they only remove
crossings, so each error stays within its alpha whatever the other side does). An effect between the two (positive,
not yet shown, or shown positive but not shown below `min_effect`) ends inconclusive when the evidence is spent. With
`promote_above = min_effect` both claims test the one point theta = min_effect and the boundaries are solved jointly
(the stricter gate of earlier versions: a promotion had to show the effect above min_effect, which put a real +0.05
mixture fix three pairs in at [+0.018, +0.086] and called it inconclusive). A promotion also needs the exact sign test
on the nonzero differences at its level (`_few_discordant`): the normal bound is weakest when few instances differ.

- *The model.* Pair j's differences share one random arm offset b_j ~ N(0, arm_noise_sd^2) (the two arms differ in
  training randomness; no number of instances averages it away) plus independent instance noise of variance s^2. Pair
  j's mean has variance arm_noise_sd^2 + s^2 / n_j; the pooled estimate is the inverse-variance weighted mean of the
  pairs' means (the GLS estimate of this random-effects model), with information I = sum_j 1 / (arm_noise_sd^2 + s^2 /
  n_j). The estimates at successive looks (more instances on the last pair, or a new pair) then have the canonical
  joint distribution of Jennison and Turnbull, "Group Sequential Methods with Applications to Clinical Trials" (2000),
  Theorem 3.1 (Cov(theta_j, theta_k) = Var(theta_k) for j < k): Z_k = (theta_k - min_effect) sqrt(I_k) behaves like
  Brownian motion in information time, so a second arm pair is simply more information, and so is a re-test.
- *Error spending.* Lan and DeMets, "Discrete sequential boundaries for clinical trials" (Biometrika 1983): a look at
  information fraction t = I / I_max (I_max: `max_pairs` full pairs at the plug-in s) may spend alpha(t) - alpha(t_prev)
  of each side's error. Promote spends with the Hwang-Shih-DeCani family (`promote_gamma`, default -2: between
  O'Brien-Fleming, which keeps nearly the fixed-sample power at the end but almost never decides on the first pair,
  and Pocock, which decides early and loses power at the end; simulated at this gate's sizes in BENCHMARKS.md);
  refute with the Pocock-type alpha ln(1 + (e - 1) t), so a clear loser stops at an early look. The boundaries of every look so far are solved jointly by the
  recursive numerical integration of Armitage, McPherson and Rowe (JRSS A 1969), as in Jennison and Turnbull ch. 19:
  the density of the score S = Z sqrt(I) on the continuation region, carried from look to look on a grid. Looks are
  taken at `min_n`, then every `batch` instances, per pair; when the observed information passes I_max, the rest of
  alpha is spent.
- *What it assumes.* Instances within a pair are independent, except copies of one problem: fresh seeds give
  independent draws, but a generator with few distinct problems in a level (one-digit sums: 56 in the math test set
  of 336 instances) draws the same problem again, and two copies of one problem are scored alike by the same arms.
  `PairEvidence.clusters` labels each instance by its problem; the within-pair variance is then the cluster-robust
  (sandwich) one of Liang and Zeger ("Longitudinal data analysis using generalized linear models", Biometrika 1986),
  with the G / (G - 1) small-sample factor of Cameron and Miller ("A practitioner's guide to cluster-robust
  inference", J. Human Resources 2015, sec. VI.B), never below the plain variance, on G - 1 degrees of freedom; the
  sign test counts problems, not copies. Without labels, or with every label distinct, nothing changes. The arm-noise sd is
  known (measured by `evotrainer bench calibration --mode aa`); s^2 is the pooled within-pair sample variance observed
  so far, plugged into the estimate's standard error and into every look's information fraction (the boundaries of
  earlier looks are recomputed with it, its sd rounded to 0.01 so they can be cached: a decision is a function of the
  recorded evidence alone, the usual information-based design, asymptotic in n); slices are checked with the current look's
  boundary each, without a correction for their number (as the fixed-size gate did). `tests/test_sequential.py` checks
  the error rates by simulation at this gate's sizes, including pooled re-tests.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable
from statistics import NormalDist
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

Decision = Literal["promoted", "refuted", "inconclusive", "continue"]
_N = NormalDist()


class SequentialError(ValueError):
    """Evidence that cannot be pooled or judged (different judges, unpaired outcomes, bad ranges)."""


class Plan(BaseModel):
    """What a decision may spend and the error it may make. Fixed by the run's gate config; never evolved."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    alpha: float = Field(0.05, gt=0.0, lt=0.5, description="error of each one-sided claim (promote, refute), all looks")
    min_effect: float = Field(0.02, ge=0.0, le=1.0, description="the smallest effect worth having: refute an effect "
                              "confidently below it; the alternative the plan is sized to detect")
    promote_above: float = Field(0.0, ge=0.0, le=1.0, description="promote an effect confidently above this (0: better "
                                 "than the control; min_effect: better by min_effect, the stricter earlier gate)")
    slice_tolerance: float = Field(0.05, ge=0.0, le=1.0, description="a slice confidently below -this is harmed")
    min_slice_n: int = Field(20, ge=1, description="slices with fewer instances are reported but not checked")
    arm_noise_sd: float = Field(0.0, ge=0.0, le=1.0, description="sd of the effect between arms differing only in "
                                                                  "training randomness")
    max_n: int = Field(160, ge=2, description="instances one arm pair may be evaluated on")
    min_n: int = Field(40, ge=2, description="instances before the first look (the plug-in variance needs some)")
    batch: int = Field(40, ge=1, description="instances added between looks")
    max_pairs: int = Field(3, ge=1, le=20, description="arm pairs (the first test and its re-tests) a decision may pool")
    promote_gamma: float = Field(-2.0, ge=-10.0, le=5.0, description="Hwang-Shih-DeCani gamma of the promotion "
                                 "side's error spending: -4 is close to O'Brien-Fleming (most power at the end), "
                                 "1 to Pocock (most early decisions)")
    futility: float = Field(0.0, ge=0.0, lt=1.0, description="stop before a new arm pair when the conditional "
                            "power of promoting by the end, under the current estimate, is below this (0 = never)")
    sd_guess: float = Field(0.35, gt=0.0, le=1.0, description="sd of a paired difference assumed before any is seen "
                                                             "(the start-up warning only)")

    @model_validator(mode="after")
    def _check(self) -> Plan:
        if self.promote_above > self.min_effect:
            raise ValueError(f"promote_above ({self.promote_above}) exceeds min_effect ({self.min_effect}): a change "
                             "could then be both promoted and refuted; set promote_above <= min_effect")
        if self.min_n > self.max_n:
            raise ValueError(f"min_n ({self.min_n}) exceeds max_n ({self.max_n}): lower min_n or raise max_n")
        return self

    def schedule(self) -> list[int]:
        """Instances of one pair at its looks: min_n, then every batch, ending at max_n."""
        out = list(range(self.min_n, self.max_n, self.batch))
        return [*out, self.max_n] if not out or out[-1] != self.max_n else out

    def info(self, ns: list[int], s2: float) -> float:
        """Information of pairs with `ns` instances each (s2: the per-instance variance of a difference)."""
        return sum(1.0 / (self.arm_noise_sd**2 + s2 / n) for n in ns if n > 0)

    def info_max(self, s2: float) -> float:
        return self.info([self.max_n] * self.max_pairs, s2)


class PairEvidence(BaseModel):
    """One control/candidate arm pair's paired differences so far, in the order they were evaluated."""

    model_config = ConfigDict(extra="forbid")
    judge: str = Field(..., description="fingerprint of the judge that scored them (distribution, samples, "
                                        "temperature, scorer): evidence from different judges is never pooled")
    diffs: list[float] = Field(default_factory=list, description="candidate - control per instance, each in [-1, 1]")
    slices: list[dict[str, str]] = Field(default_factory=list, description="one slice dict per instance")
    clusters: list[str] = Field(default_factory=list, description="one problem label per instance (copies of one "
                                "problem share it: the variance and the sign test count problems); empty: every "
                                "instance its own problem")

    @model_validator(mode="after")
    def _check(self) -> PairEvidence:
        if self.slices and len(self.slices) != len(self.diffs):
            raise ValueError(f"{len(self.slices)} slice labels for {len(self.diffs)} differences: one per instance")
        if self.clusters and len(self.clusters) != len(self.diffs):
            raise ValueError(f"{len(self.clusters)} cluster labels for {len(self.diffs)} differences: one per "
                             "instance")
        if any(not -1.0 <= d <= 1.0 for d in self.diffs):
            raise ValueError("paired differences must lie in [-1, 1] (differences of per-instance rates)")
        return self


class Look(BaseModel):
    """One look at the pooled evidence: the estimate, its bounds at this look's boundaries, the answer and why."""

    model_config = ConfigDict(extra="forbid")
    decision: Decision
    reason: str
    n: int = Field(..., description="instances pooled over all pairs")
    pairs: int
    effect: float = Field(..., description="the pooled (inverse-variance weighted) effect")
    lo: float = Field(..., description="lower bound: effect - promote boundary x se (promote when > promote_above)")
    hi: float = Field(..., description="upper bound: effect + refute boundary x se (refute when < min_effect)")
    se: float = 0.0
    z: float = Field(0.0, description="(effect - promote_above) / se")
    z_promote: float = Field(math.inf, description="this look's promotion boundary on z")
    z_refute: float = Field(math.inf, description="this look's refutation boundary on (min_effect - effect) / se")
    info_fraction: float = 0.0
    looks: int = Field(0, description="looks taken so far by this decision, this one included")
    by_slice: dict[str, dict[str, float]] = Field(default_factory=dict)
    next_step: Literal["more_instances", "new_pair", "stop"] = "stop"
    sign_chance: float | None = Field(None, description="at a futility stop: the chance the pooled estimate ends at "
                                      "or above 0 by the plan's end at the current estimate (`sign_chance`), what a "
                                      "second route that needs only its sign weighs (`harness.decisions.signal_lift`)")


# --- error spending and boundaries ----------------------------------------------------------------------------------------


def obf_spend(t: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending: 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t)), equal to alpha at t = 1."""
    if t <= 0:
        return 0.0
    t = min(t, 1.0)
    return 2.0 - 2.0 * _N.cdf(_N.inv_cdf(1 - alpha / 2) / math.sqrt(t))


def hsd_spend(gamma: float) -> Callable[[float, float], float]:
    """Hwang, Shih and DeCani (Stat. Med. 1990) spending: alpha (1 - e^{-gamma t}) / (1 - e^{-gamma}); gamma = -4 is
    close to O'Brien-Fleming, gamma = 1 to Pocock, gamma = 0 spends linearly in information."""

    def spend(t: float, alpha: float) -> float:
        t = min(max(t, 0.0), 1.0)
        if abs(gamma) < 1e-9:
            return alpha * t
        return alpha * (1 - math.exp(-gamma * t)) / (1 - math.exp(-gamma))

    return spend


def pocock_spend(t: float, alpha: float) -> float:
    """Lan-DeMets Pocock-type spending: alpha ln(1 + (e - 1) t)."""
    return alpha * math.log(1 + (math.e - 1) * min(max(t, 0.0), 1.0))


_GRID = 201


def _cdf(x: np.ndarray) -> np.ndarray:
    """The standard normal cdf, vectorised: Phi(x) = erfc(-x / sqrt 2) / 2 with the Chebyshev-fitted erfc of Press et
    al., "Numerical Recipes" (3rd ed., 2007, section 6.2, `erfccheb`'s predecessor `erfcc`: fractional error < 1.2e-7)."""
    z = np.abs(x) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = (-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
    erfc = t * np.exp(poly)  # erfc(|x| / sqrt 2)
    return np.where(x >= 0, 1.0 - erfc / 2, erfc / 2)


def boundaries(infos: list[float], info_max: float, alpha_up: float, alpha_down: float,
               spend_up: Callable[[float, float], float] = obf_spend,
               spend_down: Callable[[float, float], float] = pocock_spend) -> list[tuple[float, float]]:
    """(upper, lower) z boundaries of each look at the increasing information levels `infos`: the first exit through
    the upper boundary at look k has probability spend_up(t_k) - spend_up(t_{k-1}) under theta = min_effect, and
    likewise below (recursive numerical integration, Armitage-McPherson-Rowe; Jennison and Turnbull ch. 19). The last
    look at or past `info_max` spends what is left of each side."""
    out: list[tuple[float, float]] = []
    xs = w = f = None  # the score's sub-density on the continuation region of the previous look
    prev_i, prev_u, prev_d = 0.0, 0.0, 0.0
    for k, info in enumerate(infos):
        t = info / info_max if info_max > 0 else 1.0
        last = t >= 1.0 - 1e-9
        tu = alpha_up if last else spend_up(t, alpha_up)
        td = alpha_down if last else spend_down(t, alpha_down)
        du, dd = max(tu - prev_u, 0.0), max(td - prev_d, 0.0)
        sq = math.sqrt(info)
        if k == 0:
            u = _N.inv_cdf(1 - du) if du > 0 else math.inf
            d = _N.inv_cdf(1 - dd) if dd > 0 else math.inf
        else:
            step = math.sqrt(max(info - prev_i, 1e-12))
            mass = w * f

            def up_prob(z: float, mass=mass, sq=sq, xs=xs, step=step) -> float:
                return float(np.sum(mass * (1 - _cdf((z * sq - xs) / step))))

            def down_prob(z: float, mass=mass, sq=sq, xs=xs, step=step) -> float:
                return float(np.sum(mass * _cdf((-z * sq - xs) / step)))

            u = _solve(up_prob, du)
            d = _solve(down_prob, dd)
        out.append((u, d))
        # carry the density to this look's continuation region (-d sqrt(I), u sqrt(I))
        hi = (u if math.isfinite(u) else 9.0) * sq
        lo = -(d if math.isfinite(d) else 9.0) * sq
        ys = np.linspace(lo, hi, _GRID) if hi > lo else np.array([0.0])
        wy = np.full(len(ys), (hi - lo) / max(len(ys) - 1, 1))
        wy[0] = wy[-1] = wy[0] / 2
        if k == 0:
            fy = np.exp(-ys**2 / (2 * info)) / math.sqrt(2 * math.pi * info)
        else:
            step = math.sqrt(max(info - prev_i, 1e-12))
            kern = np.exp(-((ys[:, None] - xs[None, :]) / step) ** 2 / 2) / (step * math.sqrt(2 * math.pi))
            fy = kern @ (w * f)
        xs, w, f = ys, wy, fy
        prev_i, prev_u, prev_d = info, max(tu, prev_u), max(td, prev_d)
    return out


def _solve(prob: Callable[[float], float], target: float) -> float:
    """The z where the decreasing crossing probability `prob(z)` equals `target` (inf when nothing may be spent)."""
    if target <= 1e-12:
        return math.inf
    lo, hi = -8.0, 12.0
    if prob(hi) > target:
        return hi
    if prob(lo) < target:
        return lo
    for _ in range(36):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if prob(mid) > target else (lo, mid)
    return hi


def t_cdf(t: float, dof: int) -> float:
    """P(T <= t) for Student's t with a whole number of degrees of freedom, exactly, by the finite series of
    Abramowitz and Stegun 26.7.3 (odd dof) and 26.7.4 (even dof) for A(t | dof) = P(|T| <= |t|)."""
    if dof < 1:
        return _N.cdf(t)
    theta = math.atan(abs(t) / math.sqrt(dof))
    c2, sn = math.cos(theta) ** 2, math.sin(theta)
    if dof % 2:
        term, acc = 1.0, 1.0 if dof > 1 else 0.0
        for k in range(1, (dof - 1) // 2):  # 1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ... up to cos^(dof-3)
            term *= c2 * (2 * k) / (2 * k + 1)
            acc += term
        a = 2.0 / math.pi * (theta + (sn * math.cos(theta) * acc if dof > 1 else 0.0))
    else:
        term = acc = 1.0
        for k in range(1, dof // 2):  # 1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ... up to cos^(dof-2)
            term *= c2 * (2 * k - 1) / (2 * k)
            acc += term
        a = sn * acc
    return 0.5 + (a if t >= 0 else -a) / 2.0


def t_quantile(dof: float, alpha: float) -> float:
    """Student's t_{dof, 1-alpha}: exact (bisection on `t_cdf`) for a whole dof up to 30, where the Cornish-Fisher
    expansion around the normal quantile (Abramowitz and Stegun 26.7.5), used above that, is poor (dof 1: 4.59 for
    6.31; a reviewer's check, fifty-second session); the normal quantile when dof <= 0."""
    z = _N.inv_cdf(1 - alpha)
    if dof <= 0:
        return z
    if dof <= 30 and float(dof).is_integer():
        lo, hi = z, max(z, 1.0) * 1e4
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if t_cdf(mid, int(dof)) < 1 - alpha else (lo, mid)
            if hi - lo < 1e-10 * hi:
                break
        return (lo + hi) / 2
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def _t_inflation(dof: int, alpha: float) -> float:
    """(t_{dof, 1-alpha} / z_{1-alpha})^2: the plug-in variance widened so a normal boundary acts like Student's t at
    `dof` degrees of freedom (the small-sample correction of the significance-level approach, Jennison and Turnbull
    2000, sec. 14.2; `t_quantile`)."""
    return (t_quantile(dof, alpha) / _N.inv_cdf(1 - alpha)) ** 2


# --- the pooled estimate ----------------------------------------------------------------------------------------------------


def _ss_dof(d: np.ndarray, labels: list[str] | None) -> tuple[float, int]:
    """(sum of squares, degrees of freedom) of one pair's differences about their mean, such that ss / dof estimates
    n Var(mean): the plain n - 1 one, or with labels that repeat, the cluster-robust one (module docstring): G / (G -
    1) x sum over problems of (their summed deviations)^2 / n, scaled to G - 1 degrees of freedom and never below the
    plain variance (copies of one problem can only be scored alike in expectation; the floor drops the estimator's
    own noise downward)."""
    r = d - d.mean()
    ss, dof = float((r**2).sum()), len(d) - 1
    if not labels or len(set(labels)) == len(labels):
        return ss, dof
    sums: dict[str, float] = defaultdict(float)
    for lab, x in zip(labels, r, strict=True):
        sums[lab] += float(x)
    g = len(sums)
    if g < 2:
        return ss, dof
    robust = g / (g - 1) * sum(v * v for v in sums.values()) / len(d)
    return max(ss / dof, robust) * (g - 1), g - 1


def _pooled_var(pairs: list[np.ndarray], clusters: list[list[str] | None] | None = None) -> tuple[float, int]:
    """Within-pair sample variance of the differences (each pair's own mean removed: the arm offset is not noise),
    never below its value with Agresti and Min's pseudo-counts (Statistics in Medicine 2005, "Simple improved
    confidence intervals for comparing matched proportions": half an instance added to each cell of the paired
    table, i.e. one difference of +1 and one of -1 at half weight each, and one tie): when nearly every instance is
    tied (a ceiling or floor task) the plug-in variance is near zero and a real effect living on the few untied
    instances was refuted in 17-28% of decisions at min_effect (a reviewer's simulation, issue 32); the floor costs
    a plug-in variance of a typical 0.1-0.3 about 1-5% at 40-160 instances. `clusters` (one label list per pair, or
    None): copies of one problem counted once (`_ss_dof`). Returns (the variance, its degrees of freedom)."""
    labs = clusters or [None] * len(pairs)
    parts = [_ss_dof(p, lab) for p, lab in zip(pairs, labs, strict=True) if len(p) > 1]
    ss, dof = sum(x for x, _ in parts), sum(m for _, m in parts)
    return (max(ss / dof, (ss + 1.0) / (dof + 2.0), 1e-4) if dof > 0 else math.inf), dof


def estimate(pairs: list[np.ndarray], plan: Plan, s2: float) -> tuple[float, float]:
    """(pooled effect, its standard error): the inverse-variance weighted mean of the pairs' means, each pair's
    variance its instances' (`s2 / n`) plus the configured arm noise. (A DerSimonian-Laird estimate of the
    between-pair variance from two or three pairs' means was tried in the fifty-second session: it recovered little
    of the error of an arm noise configured too small, 12% -> 10% false promotions, and cost 5 points of power at
    +0.05 when the configured value was right; `arm_noise_warning` says when it is unmeasured instead.)"""
    ws = [1.0 / (plan.arm_noise_sd**2 + s2 / len(p)) for p in pairs if len(p)]
    ms = [float(p.mean()) for p in pairs if len(p)]
    if not ws:
        return 0.0, math.inf
    return float(np.dot(ws, ms) / sum(ws)), 1.0 / math.sqrt(sum(ws))


def look_infos(ns: list[int], plan: Plan, s2: float) -> list[float]:
    """Information at every look so far: each earlier pair's looks (full at its recorded n), then the last pair's."""
    infos: list[float] = []
    done: list[int] = []
    for n in ns:
        for m in plan.schedule():
            if m >= n:
                break
            infos.append(plan.info([*done, m], s2))
        infos.append(plan.info([*done, n], s2))
        done.append(n)
    return infos


def _labels(pairs: list[PairEvidence]) -> list[list[str] | None]:
    """Each pair's problem labels where they group anything (two or more problems, not all distinct), else None."""
    return [p.clusters if p.clusters and 2 <= len(set(p.clusters)) < len(p.clusters) else None for p in pairs]


def _weighed(arrs: list[np.ndarray], plan: Plan, clusters: list[list[str] | None] | None = None
             ) -> tuple[float, float, float, float]:
    """(variance of a difference, pooled effect, its standard error, the boundaries' sd) of a change's pairs: the
    pooled variance inflated for its degrees of freedom, the pairs weighed by `estimate`, and the sd on a 0.01 grid so
    the boundaries can be cached. How `decide` and `promise` read the same evidence. `clusters`: `_pooled_var`'s."""
    var, dof = _pooled_var(arrs, clusters)
    s2 = var * _t_inflation(dof, plan.alpha)
    effect, se = estimate(arrs, plan, s2)
    return s2, effect, se, round(max(math.sqrt(s2), 0.01), 2)


# --- the decision ---------------------------------------------------------------------------------------------------------


def decide(pairs: list[PairEvidence], plan: Plan, vetoes: list[str] | None = None, comparisons: int = 1) -> Look:
    """Judge all the evidence of one change so far. Raises `SequentialError` for evidence from different judges."""
    if not pairs:
        raise SequentialError("no evidence: evaluate at least one arm pair")
    judges = {p.judge for p in pairs}
    if len(judges) > 1:
        raise SequentialError(f"refusing to pool evidence recorded under different judges ({sorted(judges)}): the "
                              "run's backtest config changed since the earlier test; re-test from scratch instead")
    if len(pairs) > plan.max_pairs:
        raise SequentialError(f"{len(pairs)} arm pairs exceed the plan's max_pairs {plan.max_pairs}")
    if comparisons < 1:
        raise SequentialError(f"comparisons must be >= 1, got {comparisons}")
    arrs = [np.asarray(p.diffs, dtype=np.float64) for p in pairs]
    ns = [len(a) for a in arrs]
    n, last = sum(ns), ns[-1]
    spent = last >= plan.max_n and len(pairs) >= plan.max_pairs
    if last < plan.min_n and not spent or any(m < 2 for m in ns):
        return Look(decision="continue", reason=f"first look after {plan.min_n} instances ({last} so far)", n=n,
                    pairs=len(pairs), effect=float(np.concatenate(arrs).mean()) if n else 0.0, lo=-1.0, hi=1.0,
                    next_step="more_instances")
    s2, effect, se, sd = _weighed(arrs, plan, _labels(pairs))
    infos = look_infos(ns, plan, sd * sd)
    imax = plan.info_max(sd * sd)
    z_up, z_down = _boundaries_at(plan, tuple(ns), comparisons, sd)
    lo, hi = effect - z_up * se, effect + z_down * se
    z = (effect - plan.promote_above) / se
    base = {"n": n, "pairs": len(pairs), "effect": effect, "lo": lo, "hi": hi, "se": se, "z": z,
            "z_promote": z_up, "z_refute": z_down, "info_fraction": min(infos[-1] / imax, 1.0), "looks": len(infos)}
    by_slice, harmed, unsure = _slices(pairs, plan, s2, z_up, z_down)
    base["by_slice"] = by_slice
    nums = (f"effect {effect:+.3f} [{lo:+.3f}, {hi:+.3f}], n={n} over {len(pairs)} arm pair(s), look {len(infos)}, "
            f"information {100 * base['info_fraction']:.0f}%")
    if vetoes:
        return Look(decision="refuted", reason=f"veto: {'; '.join(vetoes)}", **base)
    if harmed:
        return Look(decision="refuted", reason="harms what works: " + "; ".join(harmed) + f" ({nums})", **base)
    if hi < plan.min_effect:
        return Look(decision="refuted", reason=f"refuted: upper bound {hi:+.3f} < min effect {plan.min_effect:.3f} "
                                               f"({nums})", **base)
    bar = _bar(plan)
    few = _few_discordant(arrs, plan.alpha / comparisons, _labels(pairs)) if lo > plan.promote_above else None
    if few:
        unsure = [*unsure, few]
    if lo > plan.promote_above and not unsure:
        return Look(decision="promoted", reason=f"promoted: lower bound {lo:+.3f} > {bar} ({nums}); no slice below "
                                                f"-{plan.slice_tolerance:.3f}", **base)
    why = (f"not yet clear: {'; '.join(unsure)}" if lo > plan.promote_above else
           f"lower bound {lo:+.3f} <= {bar}, upper bound {hi:+.3f} >= min effect {plan.min_effect:.3f}")
    step = next_step(ns, plan, s2)
    if step == "new_pair" and plan.futility > 0:
        cp = conditional_power(effect, se, plan, sd, comparisons)
        if cp < plan.futility:
            return Look(decision="inconclusive", reason=f"inconclusive, stopped for futility: {why}; the chance of a "
                        f"promotion by the plan's end at the current estimate is {cp:.3f} < gate.futility "
                        f"{plan.futility:.3f} ({nums})", next_step="stop",
                        sign_chance=sign_chance(effect, se, plan, sd), **base)
    if step == "stop":
        return Look(decision="inconclusive", reason=f"inconclusive, evidence spent: {why} ({nums})", next_step="stop",
                    **base)
    return Look(decision="continue", reason=f"{why} ({nums})", next_step=step, **base)


def _few_discordant(arrs: list[np.ndarray], alpha: float, clusters: list[list[str] | None] | None = None
                    ) -> str | None:
    """A guard on the normal bound where it is weakest: when only a handful of instances differ at all (two
    near-identical arms, 4 of 64 flipping the same way), the plug-in variance is tiny and the bound can clear 0 on
    chance alone. A promotion also needs the exact one-sided sign test on the nonzero differences (Dixon and Mood,
    "The statistical sign test", JASA 1946) at level alpha; it only removes promotions, so the error bound stands.
    Returns the reason it blocks, or None. With `clusters`, the test counts problems: a pair's copies of one problem
    are summed into one difference (two copies of a problem that flipped are one piece of evidence, not two)."""
    if clusters and any(lab is not None for lab in clusters):
        sums = []
        for a, lab in zip(arrs, clusters, strict=True):
            by: dict[str, float] = defaultdict(float)
            for i, x in enumerate(a):
                by[lab[i] if lab else str(i)] += float(x)
            sums.extend(by.values())
        d = np.asarray(sums)
    else:
        d = np.concatenate(arrs)
    pos, m = int((d > 0).sum()), int((d != 0).sum())
    if m == 0:
        return "no instance differs between the arms"
    p = sum(math.comb(m, k) for k in range(pos, m + 1)) / 2.0**m
    if p <= alpha:
        return None
    return (f"too few instances differ to promote: {pos} of {m} nonzero differences favour the candidate (sign test "
            f"p {p:.3f} > {alpha:.3f})")


def _bar(plan: Plan) -> str:
    """How the promotion claim reads in a reason: the control (promote_above 0) or the margin."""
    if plan.promote_above == plan.min_effect:
        return f"min effect {plan.min_effect:.3f}"
    return "0 (the control)" if plan.promote_above == 0 else f"promote_above {plan.promote_above:.3f}"


def promise(pairs: list[PairEvidence], plan: Plan, comparisons: int = 1) -> float:
    """How promising a re-test of an inconclusive change is: the conditional power of its test at the current
    estimate (`conditional_power`, Jennison and Turnbull 2000 sec. 10.2; the "promising zone" of Mehta and Pocock,
    "Adaptive increase in sample size when interim results are promising", Stat Med 2011, ranks continuations the
    same way), from all the evidence pooled so far, as `decide` weighs it: the chance that its remaining arm pairs end
    in a promotion if its estimate is the truth. 0 when its plan has no pair left. Why not the lower bound: a change
    tested on more pairs has a narrower interval, so its lower bound climbs toward a small estimate, and a re-test
    ranked by it goes to the change that has already had most of its evidence and has least left to show (a
    code-family run re-tested groups of 16 at +0.009 on two pairs a third time, not a temperature at +0.039 on one)."""
    kept = [p for p in pairs if len(p.diffs) >= 2]
    arrs = [np.asarray(p.diffs, dtype=np.float64) for p in kept]
    if not arrs or len(pairs) >= plan.max_pairs:
        return 0.0
    _, effect, se, sd = _weighed(arrs, plan, _labels(kept))
    if not math.isfinite(se) or se <= 0:
        return 0.0
    return conditional_power(effect, se, plan, sd, comparisons)


def conditional_power(effect: float, se: float, plan: Plan, sd: float, comparisons: int = 1) -> float:
    """The chance that the score, continued to the plan's full information with `effect` as the true effect (the
    "current trend"), ends above the final promotion boundary: conditional power, Jennison and Turnbull (2000) sec.
    10.2, on the Brownian-motion scale of the pooled estimate (information 1 / se^2 now, `info_max` at the end). A
    non-binding futility rule built on it only removes promotions, so the error stays within alpha."""
    info, info_max = 1.0 / se**2, plan.info_max(sd * sd)
    left = info_max - info
    if left <= 0:
        return 0.0
    c_end = _boundaries_at(plan, (plan.max_n,) * plan.max_pairs, comparisons, sd)[0]
    drift = effect - plan.promote_above
    return _N.cdf((drift * info + drift * left - c_end * math.sqrt(info_max)) / math.sqrt(left))


def sign_chance(effect: float, se: float, plan: Plan, sd: float) -> float:
    """The chance that the pooled estimate, continued to the plan's full information with `effect` as the true
    effect, ends at or above 0: `conditional_power`'s current-trend reading (Jennison and Turnbull 2000, sec. 10.2)
    for a claim with no boundary but its sign. On the score scale S(I) = effect x I + W(I), S(I_max) is normal with
    mean effect x I_max and variance I_max - I, so the chance is Phi(effect x I_max / sqrt(I_max - I)). What the
    learning-signal route needs of the target once its own reading is shown (`harness.decisions.signal_verdict`:
    an estimate not below the control's), so what a futility stop weighs for such a change."""
    info, info_max = 1.0 / se**2, plan.info_max(sd * sd)
    left = info_max - info
    if left <= 0:
        return float(effect >= 0)
    return _N.cdf(effect * info_max / math.sqrt(left))


@functools.lru_cache(maxsize=4096)
def _boundaries_at(plan: Plan, ns: tuple[int, ...], comparisons: int, sd: float) -> tuple[float, float]:
    """This look's (promote, refute) z boundaries: a function of the plan, how many instances each pair has and the
    spread `sd` of a difference (the looks' information fractions), so cached. Solved jointly when both claims test
    one point (promote_above = min_effect); else each side alone, the other's stops non-binding."""
    s2 = sd * sd
    infos, imax = look_infos(list(ns), plan, s2), plan.info_max(s2)
    up, down = hsd_spend(plan.promote_gamma), pocock_spend
    if plan.promote_above == plan.min_effect:
        return boundaries(infos, imax, plan.alpha / comparisons, plan.alpha, up, down)[-1]
    return (boundaries(infos, imax, plan.alpha / comparisons, 0.0, up, down)[-1][0],
            boundaries(infos, imax, 0.0, plan.alpha, up, down)[-1][1])


def _slices(pairs: list[PairEvidence], plan: Plan, s2: float, z_up: float, z_down: float
            ) -> tuple[dict[str, dict[str, float]], list[str], list[str]]:
    """Per-slice pooled effects with this look's boundaries: harmed when the slice's upper bound is below
    -slice_tolerance, unsure (blocks a promotion) when its lower bound is. A slice's variance is its own when larger
    than the pooled one (`s2`): a noisy slice beside tied ones was judged with the ties' small variance, and a good
    change whose noisy slice sat at -slice_tolerance was refuted as harming it in 7.9% of decisions (a reviewer's
    simulation, fifty-second session; 2.6% without the tied slice)."""
    groups: dict[str, list[list[float]]] = defaultdict(lambda: [[] for _ in pairs])
    labels: dict[str, list[list[str]]] = defaultdict(lambda: [[] for _ in pairs])
    for j, p in enumerate(pairs):
        for i, (x, s) in enumerate(zip(p.diffs, p.slices, strict=False)):
            for k, v in sorted(s.items()):
                groups[f"{k}={v}"][j].append(x)
                labels[f"{k}={v}"][j].append(p.clusters[i] if p.clusters else f"#{i}")
    out: dict[str, dict[str, float]] = {}
    harmed: list[str] = []
    unsure: list[str] = []
    for key in sorted(groups):
        arrs = [np.asarray(x) for x in groups[key] if x]
        labs: list[list[str] | None] = [lab for x, lab in zip(groups[key], labels[key], strict=True) if x]
        m = sum(len(a) for a in arrs)
        var, dof = _pooled_var(arrs, labs)
        own = var * _t_inflation(dof, plan.alpha) if dof > 0 else s2
        eff, se = estimate(arrs, plan, max(s2, own))
        lo = eff - (z_up if math.isfinite(z_up) else 8.0) * se
        hi = eff + (z_down if math.isfinite(z_down) else 8.0) * se
        checked = m >= plan.min_slice_n
        out[key] = {"effect": eff, "ci_low": lo, "ci_high": hi, "n": float(m), "checked": float(checked)}
        if not checked:
            continue
        if hi < -plan.slice_tolerance:
            harmed.append(f"slice {key} effect {eff:+.3f}, upper bound {hi:+.3f} < -{plan.slice_tolerance:.3f}")
        elif lo < -plan.slice_tolerance:
            unsure.append(f"slice {key} lower bound {lo:+.3f} < -{plan.slice_tolerance:.3f}")
    return out, harmed, unsure


def next_step(ns: list[int], plan: Plan, s2: float, pair_cost: float | None = None,
              instance_cost: float = 1.0) -> Literal["more_instances", "new_pair", "stop"]:
    """Where the next evidence comes from, by information bought per unit of cost: another batch of instances on the
    current pair (costs `batch * instance_cost`) or a new arm pair (costs `pair_cost`, default: training two arms at
    the price of `max_n` instances, plus its first `min_n` instances). More instances saturate at 1 / arm_noise_sd^2
    per pair; a new pair does not. Stop when neither is left."""
    room = ns[-1] < plan.max_n
    pairs_left = len(ns) < plan.max_pairs
    if not room and not pairs_left:
        return "stop"
    if not pairs_left:
        return "more_instances"
    if not room:
        return "new_pair"
    now = plan.info(ns, s2)
    more = plan.info([*ns[:-1], min(ns[-1] + plan.batch, plan.max_n)], s2) - now
    pair = plan.info([*ns, plan.min_n], s2) - now
    cost_more = plan.batch * instance_cost
    cost_pair = (plan.max_n if pair_cost is None else pair_cost) + plan.min_n * instance_cost
    return "more_instances" if more / cost_more >= pair / cost_pair else "new_pair"


def full_power(plan: Plan, effect: float, sd: float | None = None, comparisons: int = 1) -> float:
    """Approximate probability of promoting a true `effect` by the end of the plan (fixed-sample normal power at the
    full information, with the O'Brien-Fleming-type final boundary approximated by the fixed-sample quantile)."""
    sd = plan.sd_guess if sd is None else sd
    se = 1.0 / math.sqrt(plan.info_max(sd * sd))
    return _N.cdf((effect - plan.promote_above) / se - _N.inv_cdf(1 - plan.alpha / comparisons))


def arm_noise_warning(plan: Plan) -> str | None:
    """A one-line warning when the plan pools arm pairs but assumes arms that train without noise: the pooled looks
    then read the evidence as more precise than it is (a reviewer's simulation, true arm sd 0.025: 10-12% false
    promotions over three pairs against the 5% claimed)."""
    if plan.max_pairs < 2 or plan.arm_noise_sd > 0:
        return None
    return ("gate.arm_noise_sd is 0 while re-tests pool up to "
            f"{plan.max_pairs} arm pairs: two arms trained from one checkpoint differ by chance (0.025-0.031 on the "
            "reference testbed), and a gate that assumes they do not promotes null changes more often than gate.alpha "
            "says; measure it (`evotrainer bench calibration --mode aa`) and set gate.arm_noise_sd, or set "
            "gate.max_pairs: 1")


def max_evidence_warning(plan: Plan, sd: float | None = None, comparisons: int = 1) -> str | None:
    """A one-line warning when even the full evidence (max_pairs pairs of max_n instances) promotes an effect
    `min_effect` beyond the promotion bar (`promote_above + min_effect`: min_effect itself at the default bar 0)
    less than half the time, naming the max_n that would."""
    sd = plan.sd_guess if sd is None else sd
    target = plan.promote_above + plan.min_effect
    if plan.min_effect <= 0 or full_power(plan, target, sd, comparisons) >= 0.5:
        return None
    se = 1.0 / math.sqrt(plan.info_max(sd * sd))
    head = (f"the gate cannot detect min_effect {plan.min_effect:.3f}: at most {plan.max_n * plan.max_pairs} "
            f"instances ({plan.max_pairs} arm pairs of {plan.max_n}) give a standard error of {se:.3f} (sd {sd:.2f}); ")
    big = plan.model_copy(update={"max_n": 10**7})
    if full_power(big, target, sd, comparisons) < 0.5:
        return head + (f"the arms' training noise alone (arm_noise_sd {plan.arm_noise_sd:.3f}) keeps it wider at any "
                       "n: raise gate.min_effect, allow more re-tests, or lengthen the arms so effects grow")
    lo, hi = plan.max_n, 10**7
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok = full_power(plan.model_copy(update={"max_n": mid}), target, sd, comparisons) >= 0.5
        lo, hi = (lo, mid) if ok else (mid, hi)
    return head + f"raise backtest.n to about {hi}, or raise gate.min_effect to the smallest effect you care about"
