"""The judge: paired statistics, the promotion gate, and the online A/B backtest of a candidate against the control.

Everything here lives OUTSIDE the sandbox: nothing a run evolves can relax `GateConfig`, the paired bootstrap or how the
held-out instances are scored. Evolved diagnostics may only add vetoes (`decide(..., vetoes=[...])`).

    from harness.backtest import GateConfig, decide, paired_bootstrap
    effect, lo, hi = paired_bootstrap(control, candidate, n_boot=2000, alpha=0.05, rng=np.random.default_rng(0))
    verdict = decide(control, candidate, slices, GateConfig(), vetoes=[], candidate_id="s1.env-sizes-5-hole_ratio.ab12cd")

Online backtest (needs the policy layer): `backtest(...)` trains a short control arm and a short candidate arm from the
same start checkpoint with the same budget and the same training seeds, evaluates both on the same FRESH backtest seeds
(drawn by the caller for every decision), and returns the verdict plus each arm's compute. Tests: tests/test_gate.py,
tests/test_backtest.py.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.records import Evidence, Verdict
from harness.seeds import check_split

# --- the gate's configuration -----------------------------------------------------------------------------------------


class GateConfig(BaseModel):
    """The promotion rule. Fixed by the run's config; never part of the evolvable harness."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    min_effect: float = Field(0.0, ge=0.0, le=1.0,
                              description="the one-sided lower bound of the main-metric effect must EXCEED this")
    slice_tolerance: float = Field(0.05, ge=0.0, le=1.0,
                                   description="no slice's lower bound may fall below minus this (preserve what works)")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="one-sided confidence of the lower bounds")
    n_boot: int = Field(2000, ge=100, le=200_000, description="bootstrap resamples per comparison")
    min_slice_n: int = Field(20, ge=1, description="slices with fewer paired instances are reported but not checked")
    metric: str = Field("valid", description="the main metric the outcomes measure (for the record)")

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence


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
    if c.size == 0:
        raise GateError("no paired outcomes: evaluate both arms on at least one backtest instance")
    if not 0.0 < alpha < 0.5:
        raise GateError(f"alpha must be in (0, 0.5), got {alpha}")
    d = k - c
    effect = float(d.mean())
    if np.all(d == d[0]):  # no variation: the bootstrap distribution is a point
        return effect, effect, effect
    idx = rng.integers(0, d.size, size=(n_boot, d.size))
    means = d[idx].mean(axis=1)
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return effect, float(lo), float(hi)


def slice_keys(slices: dict[str, str]) -> list[str]:
    """'size=5' style keys of one instance's slices, each dimension separately."""
    return [f"{k}={v}" for k, v in sorted(slices.items())]


# --- the decision -----------------------------------------------------------------------------------------------------


def decide(control_outcomes: list[float], candidate_outcomes: list[float], slices: list[dict[str, str]],
           gate: GateConfig, vetoes: list[str] | None = None, candidate_id: str = "candidate",
           rng: np.random.Generator | None = None, comparisons: int = 1,
           seeds: list[int] | None = None) -> Verdict:
    """Promote only if (1) the overall lower bound exceeds `gate.min_effect`, (2) no checked slice's lower bound is
    below `-gate.slice_tolerance`, (3) no veto fires. `comparisons` > 1 (several candidates judged in one stage)
    divides alpha (Bonferroni) so picking the best of many does not inflate false promotions. The reason names the
    first failed condition with its numbers; every condition is still computed for the record."""
    if len(slices) != len(control_outcomes):
        raise GateError(f"{len(slices)} slice labels for {len(control_outcomes)} outcomes: pass one dict per instance")
    for name, xs in (("control", control_outcomes), ("candidate", candidate_outcomes)):
        if any(not 0.0 <= float(x) <= 1.0 for x in xs):
            raise GateError(f"{name} outcomes must lie in [0, 1] (per-instance {gate.metric} rate)")
    if comparisons < 1:
        raise GateError(f"comparisons must be >= 1, got {comparisons}")
    rng = rng if rng is not None else np.random.default_rng(0)
    alpha = gate.alpha / comparisons
    c = np.asarray(control_outcomes, dtype=np.float64)
    k = np.asarray(candidate_outcomes, dtype=np.float64)
    effect, lo, hi = paired_bootstrap(c, k, gate.n_boot, alpha, rng)

    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(slices):
        for key in slice_keys(s):
            groups[key].append(i)
    by_slice: dict[str, dict[str, float]] = {}
    regressions: list[str] = []
    for key in sorted(groups):
        ix = np.asarray(groups[key])
        s_eff, s_lo, s_hi = paired_bootstrap(c[ix], k[ix], gate.n_boot, alpha, rng)
        checked = ix.size >= gate.min_slice_n
        by_slice[key] = {"effect": s_eff, "ci_low": s_lo, "ci_high": s_hi, "n": float(ix.size),
                         "control": float(c[ix].mean()), "candidate": float(k[ix].mean()), "checked": float(checked)}
        if checked and s_lo < -gate.slice_tolerance:
            regressions.append(f"slice {key} regressed: effect {s_eff:+.3f}, lower bound {s_lo:+.3f} < "
                               f"-{gate.slice_tolerance:.3f} (n={ix.size}, control {c[ix].mean():.3f} -> candidate "
                               f"{k[ix].mean():.3f})")
    vetoes = list(vetoes or [])
    evidence = Evidence(metric=gate.metric, n=int(c.size), control=float(c.mean()), candidate=float(k.mean()),
                        effect=effect, ci_low=lo, ci_high=hi, by_slice=by_slice, vetoes=vetoes,
                        seeds=(min(seeds), max(seeds)) if seeds else None)
    conf = f"{100 * (1 - alpha):.1f}%"
    if vetoes:
        return Verdict(candidate=candidate_id, decision="rejected", evidence=evidence,
                       reason=f"veto: {'; '.join(vetoes)}")
    if not lo > gate.min_effect:
        return Verdict(candidate=candidate_id, decision="rejected", evidence=evidence,
                       reason=(f"not significant: effect {effect:+.3f}, {conf} lower bound {lo:+.3f} <= min effect "
                               f"{gate.min_effect:.3f} (n={c.size}, control {c.mean():.3f} -> candidate {k.mean():.3f})"))
    if regressions:
        return Verdict(candidate=candidate_id, decision="rejected", evidence=evidence, reason="; ".join(regressions))
    return Verdict(candidate=candidate_id, decision="promoted", evidence=evidence,
                   reason=(f"promoted: effect {effect:+.3f}, {conf} lower bound {lo:+.3f} > min effect "
                           f"{gate.min_effect:.3f} (n={c.size}); no slice below -{gate.slice_tolerance:.3f}; no veto"))


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


class ArmBudget(BaseModel):
    """What one arm may spend. Control and candidate arms get the same budget."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    steps: int = Field(4, ge=1, description="GRPO optimizer steps per arm")
    max_seconds: float | None = Field(None, gt=0, description="wall-clock cap per arm (None: steps only)")


class ArmResult(BaseModel):
    """One trained arm and what it cost."""

    model_config = ConfigDict(extra="forbid")
    name: str
    checkpoint: str
    seconds: float = Field(..., description="wall-clock training seconds")
    tokens: int = Field(0, description="tokens generated and trained on")
    steps: int = 0
    metrics: dict[str, float] = Field(default_factory=dict)


class ArmEval(BaseModel):
    """Per-instance outcomes of one arm on the backtest seeds (aligned with `seeds`)."""

    model_config = ConfigDict(extra="forbid")
    seeds: list[int]
    outcomes: list[float] = Field(..., description="per-instance mean of the main metric over samples")
    slices: list[dict[str, str]]
    seconds: float = 0.0
    tokens: int = 0

    @model_validator(mode="after")
    def _aligned(self) -> ArmEval:
        if not len(self.seeds) == len(self.outcomes) == len(self.slices):
            raise ValueError("seeds, outcomes and slices must have the same length")
        return self


class BacktestResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    verdict: Verdict
    control: ArmResult
    candidate: ArmResult
    control_eval: ArmEval
    candidate_eval: ArmEval

    @property
    def compute(self) -> dict[str, float]:
        """Everything this decision spent (both arms' training and evaluation), for the run's totals."""
        arms = (self.control, self.candidate)
        evals = (self.control_eval, self.candidate_eval)
        return {"seconds": sum(a.seconds for a in arms) + sum(e.seconds for e in evals),
                "tokens": float(sum(a.tokens for a in arms) + sum(e.tokens for e in evals)),
                "steps": float(sum(a.steps for a in arms))}


def run_arm(start_ckpt: Path, harness_files: Path, task: Any, budget: ArmBudget, train_seeds: list[int],
            out_dir: Path, name: str = "arm", sampling_seed: int = 0) -> ArmResult:
    """Train a short GRPO arm from `start_ckpt` under the harness in `harness_files` (env config + recipe as found
    there), on `train_seeds` only. `sampling_seed` varies the arm's training randomness (A/A calibration)."""
    from harness import policy_glue  # the policy layer: lazy (torch, trl)

    check_split(list(train_seeds), "train")
    t0 = time.perf_counter()
    res = policy_glue.train_arm(Path(start_ckpt), Path(harness_files), task, steps=budget.steps,
                                train_seeds=list(train_seeds), out_dir=Path(out_dir), seed=sampling_seed,
                                max_seconds=budget.max_seconds)
    return ArmResult(name=name, checkpoint=str(res["checkpoint"]), seconds=time.perf_counter() - t0,
                     tokens=int(res.get("tokens", 0)), steps=int(res.get("steps", budget.steps)),
                     metrics={k: float(v) for k, v in res.get("metrics", {}).items()})
