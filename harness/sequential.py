"""Sequential decisions that accumulate evidence: promote, refute or stay inconclusive, at any look, pooled across re-tests.

A candidate is judged by paired per-instance differences d_i = candidate_i - control_i (per-instance rates in [0, 1],
each from `samples` completions) on fresh held-out instances. This module turns a list of arm PAIRS (one per test or
re-test of the same change from the same state, each with the differences seen so far) into one of four answers:

    promoted      the effect's lower bound exceeds `min_effect`, no checked slice is confidently harmed beyond
                  `slice_tolerance` (its lower bound >= -tolerance), and no veto fired
    refuted       the effect's upper bound is below `min_effect` (it does not help enough, with confidence), or a checked
                  slice's upper bound is below -tolerance (it harms what works, with confidence); never re-proposed
    inconclusive  the evidence is spent (`max_n` instances in the last pair and `max_pairs` pairs) without either;
                  the evidence is kept, and a re-test pools new evidence with it
    continue      not yet spent: evaluate the next batch (`next_step` says whether more instances or a new arm pair
                  buys more)

    from harness.sequential import Plan, PairEvidence, decide
    plan = Plan(alpha=0.05, min_effect=0.02, slice_tolerance=0.1, arm_noise_sd=0.012, max_n=160, max_pairs=3)
    look = decide([PairEvidence(judge="j1", diffs=d, slices=s)], plan)
    look.decision, look.lo, look.hi, look.reason

**The procedure and its guarantee.** Two error sources are bounded separately and added (a union bound, so the total
error of each one-sided claim is at most `alpha`):

1. *Instance noise*, with a time-uniform confidence sequence: the one-sided normal-mixture boundary of Howard, Ramdas,
   McAuliffe and Sekhon, "Time-uniform, nonparametric, nonasymptotic confidence sequences" (Ann. Statist. 2021,
   Prop. 6: the half-normal mixture, solved exactly; eq. (14) is its closed-form upper bound) for the centred sum with
   variance process V = t s^2, used with the empirical variance s^2 as in the asymptotic confidence sequences of Waudby-Smith,
   Arbour, Sinha, Kennedy and Ramdas, "Time-uniform central limit theory and asymptotic confidence sequences"
   (Ann. Statist. 2024). A bound that holds uniformly over time holds at every look, however many looks are taken and
   whenever the procedure stops, so looking after every batch, and pooling a re-test onto the same sequence, costs
   nothing in error rate: that is what lets an inconclusive change keep its evidence. `rho` is fixed in advance
   (tuned for the variance at `max_n` instances of an assumed spread `sd_guess`); it moves where the boundary is
   tightest, never its validity. The guarantee is asymptotic in t (the plug-in variance); the first look waits for
   `min_n` instances, and `tests/test_sequential.py` checks the error rates by simulation at this gate's sizes.
2. *Arm noise*: two arms that differ only in training randomness differ by a random offset (sd `arm_noise_sd`) that
   no number of instances averages away. Within one pair the offset is one draw, so a bound on it holds at every look of
   that pair at once; the pooled estimate's offset is the instance-weighted mean of the pairs' offsets, with sd
   `arm_noise_sd * sqrt(sum w_j^2)`, bounded by a normal quantile at `alpha_arm / max_pairs` (a union over the at most
   `max_pairs` pair sets a decision can see).

`alpha` is split between the two (`alpha_inst = alpha_arm = alpha / 2` when `arm_noise_sd > 0`, else all of it to
instances). What it does NOT guarantee: independence of instances within a pair is assumed (fresh seeds per decision
give it); the arm-noise sd is taken as known (measured by `evotrainer bench calibration --mode aa`); slices are
checked with the same boundary each, without a correction for their number (as the fixed-size gate did).
"""

from __future__ import annotations

import math
from collections import defaultdict
from statistics import NormalDist
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

Decision = Literal["promoted", "refuted", "inconclusive", "continue"]


class SequentialError(ValueError):
    """Evidence that cannot be pooled or judged (different judges, unpaired outcomes, bad ranges)."""


class Plan(BaseModel):
    """What a decision may spend and the error it may make. Fixed by the run's gate config; never evolved."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    alpha: float = Field(0.05, gt=0.0, lt=0.5, description="error of each one-sided claim (promote, refute), all looks")
    min_effect: float = Field(0.02, ge=0.0, le=1.0, description="promote only if the effect's lower bound exceeds this")
    slice_tolerance: float = Field(0.05, ge=0.0, le=1.0, description="a slice confidently below -this is harmed")
    min_slice_n: int = Field(20, ge=1, description="slices with fewer instances are reported but not checked")
    arm_noise_sd: float = Field(0.0, ge=0.0, le=1.0, description="sd of the effect between arms differing only in "
                                                                  "training randomness")
    max_n: int = Field(160, ge=2, description="instances one arm pair may be evaluated on")
    min_n: int = Field(40, ge=2, description="instances before the first look (the plug-in variance needs some)")
    batch: int = Field(40, ge=1, description="instances added between looks")
    max_pairs: int = Field(3, ge=1, le=20, description="arm pairs (the first test and its re-tests) a decision may pool")
    sd_guess: float = Field(0.35, gt=0.0, le=1.0, description="assumed sd of a paired difference, to place the "
                                                             "boundary's tightest point at max_n (not a validity input)")

    @model_validator(mode="after")
    def _check(self) -> Plan:
        if self.min_n > self.max_n:
            raise ValueError(f"min_n ({self.min_n}) exceeds max_n ({self.max_n}): lower min_n or raise max_n")
        return self

    @property
    def alpha_inst(self) -> float:
        return self.alpha / 2 if self.arm_noise_sd > 0 else self.alpha

    @property
    def alpha_arm(self) -> float:
        return self.alpha / 2 if self.arm_noise_sd > 0 else 0.0

    @property
    def rho(self) -> float:
        """The mixture's scale: the boundary is tightest where the variance process reaches max_n * sd_guess^2."""
        a = 2 * self.alpha_inst
        return max(self.max_n * self.sd_guess**2 / (-2 * math.log(a) + math.log(-2 * math.log(a) + 1)), 1e-9)


class PairEvidence(BaseModel):
    """One control/candidate arm pair's paired differences so far, in the order they were evaluated."""

    model_config = ConfigDict(extra="forbid")
    judge: str = Field(..., description="fingerprint of the judge that scored them (distribution, samples, "
                                        "temperature, scorer): evidence from different judges is never pooled")
    diffs: list[float] = Field(default_factory=list, description="candidate - control per instance, each in [-1, 1]")
    slices: list[dict[str, str]] = Field(default_factory=list, description="one slice dict per instance")

    @model_validator(mode="after")
    def _check(self) -> PairEvidence:
        if self.slices and len(self.slices) != len(self.diffs):
            raise ValueError(f"{len(self.slices)} slice labels for {len(self.diffs)} differences: one per instance")
        if any(not -1.0 <= d <= 1.0 for d in self.diffs):
            raise ValueError("paired differences must lie in [-1, 1] (differences of per-instance rates)")
        return self


class Look(BaseModel):
    """One look at the pooled evidence: the bounds, the answer and why. Every look of a decision is kept."""

    model_config = ConfigDict(extra="forbid")
    decision: Decision
    reason: str
    n: int = Field(..., description="instances pooled over all pairs")
    pairs: int
    effect: float
    lo: float
    hi: float
    radius_instances: float
    radius_arms: float
    by_slice: dict[str, dict[str, float]] = Field(default_factory=dict)
    next_step: Literal["more_instances", "new_pair", "stop"] = "stop"


# --- bounds ---------------------------------------------------------------------------------------------------------------


def mixture_boundary(v: float, alpha: float, rho: float) -> float:
    """The one-sided normal-mixture uniform boundary u(v): the s >= 0 where the mixture supermartingale
    log M(s, v) = 1/2 log(4 rho / (v + rho)) + s^2 / (2 (v + rho)) + log Phi(s / sqrt(v + rho)) reaches log(1 / alpha)
    (Howard et al. 2021, Prop. 6, the half-normal mixture; solved by bisection as the confseq library does). By Ville's
    inequality a centred sum with variance process v crosses it with probability at most alpha, at any time."""
    target = math.log(1 / alpha)
    w = v + rho

    def log_m(s: float) -> float:
        phi = 0.5 * math.erfc(-s / math.sqrt(2 * w))
        return 0.5 * math.log(4 * rho / w) + s * s / (2 * w) + math.log(max(phi, 1e-300))

    lo, hi = 0.0, max(math.sqrt(w), 1e-6)
    while log_m(hi) < target:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if log_m(mid) < target else (lo, mid)
    return hi


def closed_form_boundary(v: float, alpha: float, rho: float) -> float:
    """Howard et al. 2021, eq. (14): sqrt(2 (v + rho) log(sqrt((v + rho) / rho) / (2 alpha) + 1)), a closed-form
    upper bound of `mixture_boundary` (kept as a cross-check in the tests)."""
    return math.sqrt(2 * (v + rho) * math.log(math.sqrt((v + rho) / rho) / (2 * alpha) + 1))


def cs_radius(n: int, sd: float, alpha: float, rho: float) -> float:
    """Radius around the mean of n observations with sd `sd` of a one-sided time-uniform bound at `alpha`:
    u(V) / n with V = n sd^2."""
    if n < 2:
        return math.inf
    return mixture_boundary(n * max(sd, 1e-12) ** 2, alpha, rho) / n


def arm_radius(weights: list[float], plan: Plan) -> float:
    """Bound on the pooled arm offset: z_{1 - alpha_arm / max_pairs} * arm_noise_sd * sqrt(sum w_j^2)."""
    if plan.arm_noise_sd <= 0:
        return 0.0
    z = NormalDist().inv_cdf(1 - plan.alpha_arm / plan.max_pairs)
    return z * plan.arm_noise_sd * math.sqrt(sum(w * w for w in weights))


def bounds(diffs: np.ndarray, weights: list[float], plan: Plan) -> tuple[float, float, float, float, float]:
    """(effect, lower, upper, instance radius, arm radius) of pooled differences."""
    n = len(diffs)
    effect = float(diffs.mean()) if n else 0.0
    sd = float(diffs.std(ddof=1)) if n >= 2 else math.inf
    r_i = cs_radius(n, sd, plan.alpha_inst, plan.rho)
    r_a = arm_radius(weights, plan)
    return effect, effect - r_i - r_a, effect + r_i + r_a, r_i, r_a


# --- the decision ---------------------------------------------------------------------------------------------------------


def decide(pairs: list[PairEvidence], plan: Plan, vetoes: list[str] | None = None) -> Look:
    """Judge all the evidence of one change so far. Raises `SequentialError` for evidence from different judges."""
    if not pairs:
        raise SequentialError("no evidence: evaluate at least one arm pair")
    judges = {p.judge for p in pairs}
    if len(judges) > 1:
        raise SequentialError(f"refusing to pool evidence recorded under different judges ({sorted(judges)}): the "
                              "run's backtest config changed since the earlier test; re-test from scratch instead")
    if len(pairs) > plan.max_pairs:
        raise SequentialError(f"{len(pairs)} arm pairs exceed the plan's max_pairs {plan.max_pairs}")
    d = np.concatenate([np.asarray(p.diffs, dtype=np.float64) for p in pairs])
    n = len(d)
    weights = [len(p.diffs) / n for p in pairs] if n else []
    effect, lo, hi, r_i, r_a = bounds(d, weights, plan)
    last = len(pairs[-1].diffs)
    spent = last >= plan.max_n and len(pairs) >= plan.max_pairs
    base = {"n": n, "pairs": len(pairs), "effect": effect, "lo": lo, "hi": hi, "radius_instances": r_i,
            "radius_arms": r_a}
    if last < plan.min_n and not spent:
        return Look(decision="continue", reason=f"first look after {plan.min_n} instances ({last} so far)",
                    next_step="more_instances", **base)

    by_slice, harmed, unsure = _slices(pairs, weights, plan)
    base["by_slice"] = by_slice
    nums = f"effect {effect:+.3f} [{lo:+.3f}, {hi:+.3f}], n={n} over {len(pairs)} arm pair(s)"
    if vetoes:
        return Look(decision="refuted", reason=f"veto: {'; '.join(vetoes)}", **base)
    if harmed:
        return Look(decision="refuted", reason="harms what works: " + "; ".join(harmed) + f" ({nums})", **base)
    if hi < plan.min_effect:
        return Look(decision="refuted", reason=f"refuted: upper bound {hi:+.3f} < min effect {plan.min_effect:.3f} "
                                               f"({nums})", **base)
    if lo > plan.min_effect and not unsure:
        return Look(decision="promoted", reason=f"promoted: lower bound {lo:+.3f} > min effect {plan.min_effect:.3f} "
                                                f"({nums}); no slice below -{plan.slice_tolerance:.3f}", **base)
    step = next_step(pairs, plan, r_i, r_a)
    why = (f"slice(s) not yet clear: {'; '.join(unsure)}" if lo > plan.min_effect else
           f"lower bound {lo:+.3f} <= min effect {plan.min_effect:.3f} < upper bound {hi:+.3f}")
    if step == "stop":
        return Look(decision="inconclusive", reason=f"inconclusive, evidence spent: {why} ({nums}); kept for a "
                                                    "pooled re-test", next_step="stop", **base)
    return Look(decision="continue", reason=f"{why} ({nums})", next_step=step, **base)


def _slices(pairs: list[PairEvidence], weights: list[float], plan: Plan
            ) -> tuple[dict[str, dict[str, float]], list[str], list[str]]:
    groups: dict[str, list[float]] = defaultdict(list)
    for p in pairs:
        for x, s in zip(p.diffs, p.slices, strict=False):
            for k, v in sorted(s.items()):
                groups[f"{k}={v}"].append(x)
    out: dict[str, dict[str, float]] = {}
    harmed: list[str] = []
    unsure: list[str] = []
    for key in sorted(groups):
        xs = np.asarray(groups[key])
        eff, lo, hi, _, _ = bounds(xs, weights, plan)
        checked = len(xs) >= plan.min_slice_n
        out[key] = {"effect": eff, "ci_low": lo, "ci_high": hi, "n": float(len(xs)), "checked": float(checked)}
        if not checked:
            continue
        if hi < -plan.slice_tolerance:
            harmed.append(f"slice {key} effect {eff:+.3f}, upper bound {hi:+.3f} < -{plan.slice_tolerance:.3f}")
        elif lo < -plan.slice_tolerance:
            unsure.append(f"slice {key} lower bound {lo:+.3f} < -{plan.slice_tolerance:.3f}")
    return out, harmed, unsure


def next_step(pairs: list[PairEvidence], plan: Plan, r_inst: float, r_arm: float) -> Literal[
        "more_instances", "new_pair", "stop"]:
    """Where the next evidence comes from: more instances on the current pair while it has room and its instance
    noise is the larger part of the bound; a new arm pair (a re-test) when the arm noise dominates or the pair is full
    and pairs are left; stop when neither is left."""
    room = len(pairs[-1].diffs) < plan.max_n
    pairs_left = len(pairs) < plan.max_pairs
    if room and (r_inst >= r_arm or not pairs_left):
        return "more_instances"
    if pairs_left:
        return "new_pair"
    return "more_instances" if room else "stop"


def _full_width(plan: Plan, sd: float) -> float:
    """Half-width of the bound when every pair is full: max_pairs pairs of max_n instances."""
    return (cs_radius(plan.max_n * plan.max_pairs, sd, plan.alpha_inst, plan.rho)
            + arm_radius([1 / plan.max_pairs] * plan.max_pairs, plan))


def max_evidence_warning(plan: Plan, sd: float | None = None) -> str | None:
    """A one-line warning when even the full evidence (max_pairs pairs of max_n instances) cannot detect an effect of
    twice `min_effect` (the bound's half-width at full evidence exceeds `min_effect`), naming the max_n that would."""
    sd = plan.sd_guess if sd is None else sd
    width = _full_width(plan, sd)
    if width <= plan.min_effect:
        return None
    head = (f"the gate cannot detect min_effect {plan.min_effect:.3f}: at most {plan.max_n * plan.max_pairs} "
            f"instances ({plan.max_pairs} arm pairs of {plan.max_n}) give a bound of +-{width:.3f} (sd {sd:.2f}); ")
    hi = 10**7
    if _full_width(plan.model_copy(update={"max_n": hi}), sd) > plan.min_effect:
        return head + (f"the arms' training noise alone (arm_noise_sd {plan.arm_noise_sd:.3f}) keeps it wider at any "
                       "n: raise gate.min_effect, allow more re-tests, or lengthen the arms so effects grow")
    lo = plan.max_n  # width(lo) > min_effect >= width(hi): bisect on max_n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _full_width(plan.model_copy(update={"max_n": mid}), sd) > plan.min_effect else (lo, mid)
    return head + f"raise backtest.n to about {hi}, or raise gate.min_effect to the smallest effect you care about"
