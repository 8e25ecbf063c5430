"""The sequential decision procedure's error and power, simulated at a gate's sizes (`harness.sequential`).

    python -m harness.benchmarks.sequential --decisions 1000            # the table in BENCHMARKS.md

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


def pair_diffs(rng: np.random.Generator, effect: float, n: int, plan: Plan, samples: int = 4) -> np.ndarray:
    q = rng.uniform(0.1, 0.6, n)
    pk = np.clip(q + effect + rng.normal(0.0, plan.arm_noise_sd), 0.0, 1.0)
    return (rng.binomial(samples, pk) - rng.binomial(samples, q)) / samples


def one_decision(rng: np.random.Generator, effect: float, plan: Plan, comparisons: int = 1,
                 judge: Callable[..., Any] = decide) -> tuple[str, int, int]:
    """(decision, instances used, pairs used) of one change judged from its first test to its end; `judge` (default
    `harness.sequential.decide`) lets a test drive another procedure over the same data stream."""
    pairs: list[PairEvidence] = []
    while True:
        pool = pair_diffs(rng, effect, plan.max_n, plan)
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
    a = ap.parse_args(argv)
    plan = Plan(alpha=0.05, min_effect=0.02, slice_tolerance=0.1, arm_noise_sd=0.012, max_n=a.max_n, min_n=a.first,
                batch=a.first, max_pairs=a.pairs, promote_gamma=a.gamma)
    print(f"plan: {plan.max_pairs} pairs x {plan.max_n} instances, looks every {plan.batch}, gamma {plan.promote_gamma}"
          f", {a.comparisons} comparison(s), {a.decisions} decisions per effect, seed 0")
    print("| true effect | promoted [95% Wilson] | by pair 1 / 2 / 3 | refuted | inconclusive | mean instances |")
    print("|---|---|---|---|---|---|")
    for eff in a.effects:
        rng = np.random.default_rng(0)
        out = [one_decision(rng, eff, plan, a.comparisons) for _ in range(a.decisions)]
        k = sum(d == "promoted" for d, _, _ in out)
        lo, hi = wilson(k, a.decisions)
        by = " / ".join(f"{sum(d == 'promoted' and p <= j for d, _, p in out) / a.decisions:.3f}"
                        for j in range(1, plan.max_pairs + 1))
        ref = sum(d == "refuted" for d, _, _ in out) / a.decisions
        inc = sum(d == "inconclusive" for d, _, _ in out) / a.decisions
        print(f"| {eff:+.2f} | {k / a.decisions:.3f} [{lo:.3f}, {hi:.3f}] | {by} | {ref:.3f} | {inc:.3f} | "
              f"{np.mean([n for _, n, _ in out]):.0f} |", flush=True)


if __name__ == "__main__":
    main()
