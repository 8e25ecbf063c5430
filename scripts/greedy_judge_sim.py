"""The loop's sequential procedure (`harness.sequential.decide`, driven as `harness.benchmarks.sequential` drives it)
on two data models: today's sampled judge (per-instance differences of success rates, 160 instances a pair) and a
greedy judge at equal decoding (differences of one greedy decode each, -1, 0 or +1, 800 instances a pair), from the
variance components `scripts/judge_statistics.py` reads off recorded decisions (MAPF: per-instance variance 0.100
sampled and 0.209 greedy, the greedy effect 1.09 times the sampled one, arm noise 0.019 sampled as the fifty-seventh
session's live A/A read it, and greedy at two readings of its ratio to it). A planning aid, not a measurement: the
decision is measured live with `evotrainer bench calibration --config examples/mapf_backtest_greedy.yaml`.

    python scripts/greedy_judge_sim.py [DECISIONS] [FUTILITY ...]      # e.g. 400 0 0.1 0.2

The sampled model is a clipped normal (its differences lie in [-1, 1] as the gate requires), the greedy one a
trinomial with P(+1) - P(-1) the pair's mean and P(+1) + P(-1) the per-instance variance (the arms disagree). Seconds
are the thirty-fourth session's split of a pair (22.9 s training, 4.0 s judging all its instances), the same for both
judges at equal decoding. Intervals: Wilson at 95%.
"""

from __future__ import annotations

import sys

import numpy as np

import harness.benchmarks.sequential as S
from harness.sequential import Plan


def model(v_inst: float, arm_sd: float, scale: float, greedy: bool):
    def pair_diffs(rng, effect, n, plan, samples=4, arm_sd=None, _sd=arm_sd):  # S.pair_diffs. signature
        m = scale * effect + rng.normal(0.0, _sd * np.sqrt(2))  # the pair's two arms' offsets
        if greedy:
            u = rng.uniform(size=n)
            return np.where(u < (v_inst + m) / 2, 1.0, np.where(u < v_inst, -1.0, 0.0))
        return np.clip(rng.normal(m, np.sqrt(v_inst), n), -1, 1)
    return pair_diffs


def run(name: str, n: int, v_inst: float, arm_sd: float, scale: float, effects: list[float], decisions: int,
        futility: float, assumed: float = 0.025, train: float = 22.9, judge: float = 4.0) -> None:
    S.pair_diffs = model(v_inst, arm_sd, scale, name.startswith("greedy"))
    first = max(20, n // 4)
    plan = Plan(alpha=0.05, min_effect=0.02, promote_above=0.0, slice_tolerance=0.1, arm_noise_sd=assumed,
                max_n=n, min_n=first, batch=first, max_pairs=3, promote_gamma=-2.0, futility=futility)
    for eff in effects:
        rng = np.random.default_rng(0)
        out = [S.one_decision(rng, eff, plan, 1) for _ in range(decisions)]
        k = sum(d == "promoted" for d, _, _ in out)
        lo, hi = S.wilson(k, decisions)
        pairs = np.mean([p for _, _, p in out])
        secs = np.mean([p * train + m / n * judge for _, m, p in out])
        refuted = sum(d == "refuted" for d, _, _ in out) / decisions
        print(f"| {name}, futility {futility} | {eff:+.2f} | {k / decisions:.3f} [{lo:.3f}, {hi:.3f}] | {refuted:.3f} "
              f"| {pairs:.2f} | {secs:.0f} |", flush=True)


def main(argv: list[str]) -> int:
    decisions = int(argv[0]) if argv else 400
    effects = [0.0, 0.02, 0.07, 0.12]
    print("| judge | true effect (sampled units) | promoted [95% Wilson] | refuted | mean pairs | CPU-s |")
    print("|---|---|---|---|---|---|")
    for f in map(float, argv[1:] or ["0"]):
        run("sampled, n 160", 160, 0.100, 0.019, 1.0, effects, decisions, f)
        for sd in (0.017, 0.024):
            run(f"greedy, n 800, arm sd {sd}", 800, 0.209, sd, 1.09, effects, decisions, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
