"""Copies of one problem across pooled arm pairs: does the gate's interval stay wide enough? (issue 32)

    python -m harness.benchmarks.cross_pair --seed 0        # the table in BENCHMARKS.md (6 s)

Copies of one problem in different arm pairs share the change's own effect on that problem (e_p), while the gate
groups copies only within a pair (`harness.sequential._labels`). Simulated with the gate's own estimator
(`harness.sequential._weighed`): G distinct problems drawn with replacement (fresh seeds), per-problem control rate
q_p, change effect e_p (heterogeneous), an arm-pair x problem interaction for each arm (shared by the copies within a
pair only), a pair offset (arm noise), 4 samples per instance. Target: delta = mean of e_p over the generator's
problems. Reports the coverage of the 95% interval (effect +- 1.96 se) and the ratio of the estimator's true sd to
its mean reported se, with the gate's within-pair labels, with none, and with one label set across pairs."""

from __future__ import annotations

import argparse

import numpy as np

from harness.sequential import Plan, _weighed

ROWS = ((37, 0.10, 0.05), (56, 0.10, 0.05), (37, 0.15, 0.0), (200, 0.10, 0.05), (12, 0.15, 0.05))


def row(rng: np.random.Generator, g: int, tau: float, sigma_u: float, sims: int, pairs: int = 3, n: int = 96,
        samples: int = 4, arm_sd: float = 0.012) -> dict[str, tuple[float, float]]:
    """{variant: (coverage of effect +- 1.96 se, the estimate's sd over its mean se)} for one setting."""
    plan = Plan(alpha=0.05, min_effect=0.02, slice_tolerance=0.1, arm_noise_sd=arm_sd, max_n=n, min_n=24, batch=24)
    q = rng.uniform(0.3, 0.7, g)
    e = np.clip(rng.normal(0.05, tau, g), -0.2, 0.2)  # the change's effect on each problem: a property of the change
    out: dict[str, list[tuple[float, float]]] = {"within": [], "none": [], "across": []}
    for _ in range(sims):
        arrs, labs = [], []
        for _ in range(pairs):
            p = rng.integers(0, g, n)  # fresh instances: problems drawn with replacement
            u = np.clip(rng.normal(0, sigma_u, g), -0.1, 0.1)  # this pair's candidate arm x problem interaction
            v = np.clip(rng.normal(0, sigma_u, g), -0.1, 0.1)  # this pair's control arm x problem interaction
            a = rng.normal(0, arm_sd)  # the pair's arm noise
            ctrl = rng.binomial(samples, q[p] + v[p]) / samples
            cand = rng.binomial(samples, np.clip(q[p] + e[p] + u[p] + a, 0, 1)) / samples
            arrs.append(cand - ctrl)
            labs.append([f"p{x}" for x in p])
        for k, cl in (("within", labs), ("none", None)):
            out[k].append(_weighed(arrs, plan, cl)[1:3])
        out["across"].append(_weighed([np.concatenate(arrs)], plan, [[x for lab in labs for x in lab]])[1:3])
    res = {}
    for k, v in out.items():
        x = np.array(v)
        res[k] = (float(np.mean(np.abs(x[:, 0] - e.mean()) <= 1.96 * x[:, 1])), float(x[:, 0].std() / x[:, 1].mean()))
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m harness.benchmarks.cross_pair", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sims", type=int, default=3000, help="simulated decisions per row")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print("| G problems, tau, sigma_u | within-pair labels (the gate): coverage, sd/se | no labels | one label set "
          "across pairs |\n|---|---|---|---|")
    for g, tau, su in ROWS:
        r = row(rng, g, tau, su, args.sims)
        print(f"| {g}, {tau:.2f}, {su:g} | " + " | ".join(f"{100 * c:.1f}%, {s:.2f}" for c, s in r.values()) + " |",
              flush=True)


if __name__ == "__main__":
    main()
