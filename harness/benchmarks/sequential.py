"""The sequential decision procedure's error and power, simulated at a gate's sizes (`harness.sequential`).

    python -m harness.benchmarks.sequential --decisions 1000            # the table in BENCHMARKS.md
    python -m harness.benchmarks.sequential --fixed-pairs 1 2 3 --pair-seconds 80 20    # fixed designs, cost

Each decision is driven as the loop drives it: looks every `batch` instances on an arm pair, a stage that ends
undecided is a new pair pooled onto the evidence (a re-test), until promoted, refuted or spent. Per-instance outcomes
are rates over `samples` completions with a per-instance difficulty shared by both arms and one arm offset (sd
`arm_noise_sd`) per pair. Intervals: Wilson score intervals (Wilson 1927) at 95%.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from harness.sequential import PairEvidence, Plan, decide


def pair_diffs(rng: np.random.Generator, effect: float, n: int, plan: Plan, samples: int = 4,
               arm_sd: float | None = None) -> np.ndarray:
    """One arm pair's paired differences: the pair's arm offset has sd `arm_sd` (default: what the plan assumes)."""
    q = rng.uniform(0.1, 0.6, n)
    pk = np.clip(q + effect + rng.normal(0.0, plan.arm_noise_sd if arm_sd is None else arm_sd), 0.0, 1.0)
    return (rng.binomial(samples, pk) - rng.binomial(samples, q)) / samples


def one_decision(rng: np.random.Generator, effect: float, plan: Plan, comparisons: int = 1,
                 judge: Callable[..., Any] = decide, arm_sd: float | None = None) -> tuple[str, int, int]:
    """(decision, instances used, pairs used) of one change judged from its first test to its end; `judge` (default
    `harness.sequential.decide`) lets a test drive another procedure over the same data stream."""
    pairs: list[PairEvidence] = []
    while True:
        pool = pair_diffs(rng, effect, plan.max_n, plan, arm_sd=arm_sd)
        pairs.append(PairEvidence(judge="j", diffs=[]))
        while True:
            have = len(pairs[-1].diffs)
            pairs[-1] = PairEvidence(judge="j", diffs=list(pool[: min(plan.max_n, have + (plan.min_n if have == 0
                                                                                            else plan.batch))]))
            look = judge(pairs, plan, comparisons=comparisons)
            if look.decision != "continue":
                return look.decision, look.n, len(pairs)
            if look.next_step == "new_pair":
                break


def fixed_decision(rng: np.random.Generator, effect: float, plan: Plan, pairs: int, comparisons: int = 1,
                   arm_sd: float | None = None) -> str:
    """A fixed design on the same data model: `pairs` arm pairs of `plan.max_n` instances each, judged once, all
    together (one look at full information: the whole alpha on each side), by `harness.sequential.decide`."""
    fixed = Plan(**{**plan.model_dump(), "max_pairs": pairs, "min_n": plan.max_n, "batch": plan.max_n})
    evidence = [PairEvidence(judge="j", diffs=list(pair_diffs(rng, effect, plan.max_n, plan, arm_sd=arm_sd)))
                for _ in range(pairs)]
    return decide(evidence, fixed, comparisons=comparisons).decision


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--decisions", type=int, default=1000)
    ap.add_argument("--effects", type=float, nargs="+", default=[0.0, 0.02, 0.07, 0.12, -0.10])
    ap.add_argument("--max-n", type=int, default=160)
    ap.add_argument("--first", type=int, default=40)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--gamma", type=float, default=-2.0)
    ap.add_argument("--comparisons", type=int, default=1)
    ap.add_argument("--fixed-pairs", type=int, nargs="*", default=[],
                    help="also the fixed design with this many pairs judged at once (power at the same data model)")
    ap.add_argument("--pair-seconds", type=float, nargs=2, default=None, metavar=("TRAIN", "JUDGE"),
                    help="CPU-seconds of one arm pair's training and of judging it on max_n instances (measured by "
                         "`bench calibration`): prints each design's mean CPU-seconds per decision")
    ap.add_argument("--futility", type=float, default=0.0,
                    help="gate.futility: stop before a new pair when the conditional power under the current estimate "
                         "is below this (0: never, the default)")
    ap.add_argument("--arm-sd", type=float, default=0.012, help="gate.arm_noise_sd the plan assumes")
    ap.add_argument("--min-effect", type=float, default=0.02,
                    help="gate.min_effect: a refutation shows the effect below it")
    ap.add_argument("--promote-above", type=float, default=0.0,
                    help="gate.promote_above: a promotion shows the effect above it (0: the control; --min-effect's "
                         "value: the stricter earlier gate)")
    ap.add_argument("--data-arm-sd", type=float, default=None,
                    help="the arm noise the simulated arms really have (default: --arm-sd): a miscalibrated gate")
    a = ap.parse_args(argv)
    plan = Plan(alpha=0.05, min_effect=a.min_effect, promote_above=a.promote_above, slice_tolerance=0.1,
                arm_noise_sd=a.arm_sd, max_n=a.max_n, min_n=a.first, batch=a.first, max_pairs=a.pairs,
                promote_gamma=a.gamma, futility=a.futility)
    print(f"plan: {plan.max_pairs} pairs x {plan.max_n} instances, looks every {plan.batch}, gamma {plan.promote_gamma}"
          f", futility {plan.futility}, min effect {plan.min_effect}, promote above {plan.promote_above}"
          f", arm sd assumed {plan.arm_noise_sd} / real "
          f"{plan.arm_noise_sd if a.data_arm_sd is None else a.data_arm_sd}"
          f", {a.comparisons} comparison(s), {a.decisions} decisions per effect, seed 0")
    print("| true effect | promoted [95% Wilson] | by pair 1 / 2 / 3 | refuted | inconclusive | mean instances | "
          "mean pairs" + (" | CPU-s per decision" if a.pair_seconds else "") + " |")
    print("|---|---|---|---|---|---|---|" + ("---|" if a.pair_seconds else ""))
    for eff in a.effects:
        rng = np.random.default_rng(0)
        out = [one_decision(rng, eff, plan, a.comparisons, arm_sd=a.data_arm_sd) for _ in range(a.decisions)]
        k = sum(d == "promoted" for d, _, _ in out)
        lo, hi = wilson(k, a.decisions)
        by = " / ".join(f"{sum(d == 'promoted' and p <= j for d, _, p in out) / a.decisions:.3f}"
                        for j in range(1, plan.max_pairs + 1))
        ref = sum(d == "refuted" for d, _, _ in out) / a.decisions
        inc = sum(d == "inconclusive" for d, _, _ in out) / a.decisions
        cost = ""
        if a.pair_seconds:
            train, judge = a.pair_seconds
            cost = (f" | {np.mean([p * train + n / plan.max_n * judge for _, n, p in out]):.0f} s; fixed: "
                    + ", ".join(f"{k_} pair(s) {k_ * (train + judge):.0f} s" for k_ in a.fixed_pairs))
        print(f"| {eff:+.2f} | {k / a.decisions:.3f} [{lo:.3f}, {hi:.3f}] | {by} | {ref:.3f} | {inc:.3f} | "
              f"{np.mean([n for _, n, _ in out]):.0f} | {np.mean([p for _, _, p in out]):.2f}{cost} |", flush=True)
        for k_ in a.fixed_pairs:
            rng = np.random.default_rng(1)
            fx = [fixed_decision(rng, eff, plan, k_, a.comparisons, a.data_arm_sd) for _ in range(a.decisions)]
            kp = sum(d == "promoted" for d in fx)
            flo, fhi = wilson(kp, a.decisions)
            print(f"|   fixed, {k_} pair(s) at once | {kp / a.decisions:.3f} [{flo:.3f}, {fhi:.3f}] | - | "
                  f"{sum(d == 'refuted' for d in fx) / a.decisions:.3f} | "
                  f"{sum(d == 'inconclusive' for d in fx) / a.decisions:.3f} | {k_ * plan.max_n} | {k_} |", flush=True)


if __name__ == "__main__":
    main()
