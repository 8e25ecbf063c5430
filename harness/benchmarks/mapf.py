"""Benchmark of the MAPF-FrozenLake testbed: batched plan validation, CBS on the hardest paper setting, generator speed.

    evotrainer bench mapf                      # or: .venv/bin/python -m harness.benchmarks.mapf
    evotrainer bench mapf --plans 2000 --cbs 60

What is measured (all in one run, on this machine):
- validator: `validate_arrays` on B random plans over 16x16 lakes (20% holes) with 16 agents, each agent a random walk
  of `steps` moves over ice (so failures are mostly conflicts). agent-steps = B x 16 x steps. The reference is the
  per-step Python simulation `simulate` (the scorer's own), run on a subset of the same plans; both must agree on
  validity, failure type, agent and step for every plan of the subset.
- CBS: `solve` (optimal makespan + the needs-wait check) on the generator's raw draws for 10x10, 5 agents, 50% holes
  (every draw, including unsolvable ones and ones that hit the node budget, so the median is not flattered).
- generator: instances/s drawing the `small` suite (the demo's configs, round robin) and the default config.
Prints grep-able `key: value` lines; returns them as a dict.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from harness.tasks.mapf import TASK, _draw_layout, hole_count
from harness.tasks.mapf_cbs import SolverBudgetExceeded, solve
from harness.tasks.mapf_validate import CODES, DELTA, FAILURES, simulate, validate_arrays
from harness.tasks.suites import draw_suite

# --- validator -------------------------------------------------------------------------------------------------------


def random_batch(rng: np.random.Generator, B: int, n: int = 16, k: int = 16, steps: int = 48, holes: float = 0.2):
    """B lakes with k agents and random-walk plans over ice: (free, starts, goals, moves, grids, plans)."""
    free = np.ones((B, n, n), dtype=bool)
    starts = np.zeros((B, k, 2), dtype=np.int64)
    goals = np.zeros((B, k, 2), dtype=np.int64)
    moves = np.full((B, k, steps), 4, dtype=np.int8)
    grids, plans = [], []
    for b in range(B):
        flat = free[b].reshape(-1)
        flat[rng.choice(n * n, hole_count(n, holes), replace=False)] = False
        cells = np.flatnonzero(flat)
        s = rng.choice(cells, k, replace=False)
        g = rng.choice(cells, k, replace=False)
        starts[b] = np.stack(np.divmod(s, n), axis=1)
        goals[b] = np.stack(np.divmod(g, n), axis=1)
        plan = []
        for a in range(k):
            r, c = starts[b, a]
            walk = []
            for t in range(steps):
                options = [m for m in "UDLRW" if 0 <= r + DELTA[m][0] < n and 0 <= c + DELTA[m][1] < n
                           and free[b, r + DELTA[m][0], c + DELTA[m][1]]]
                m = options[int(rng.integers(len(options)))]
                r, c = r + DELTA[m][0], c + DELTA[m][1]
                walk.append(m)
                moves[b, a, t] = CODES.index(m)
            plan.append("".join(walk))
        plans.append(plan)
        grids.append(["".join("." if free[b, r, c] else "#" for c in range(n)) for r in range(n)])
    return free, starts, goals, moves, grids, plans


def bench_validator(plans: int = 2000, reference_plans: int = 200, steps: int = 48, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    free, starts, goals, moves, grids, texts = random_batch(rng, plans, steps=steps)
    k = starts.shape[1]
    validate_arrays(free[:8], starts[:8], goals[:8], moves[:8])  # warm up
    times = []
    for _ in range(3):
        t = time.perf_counter()
        res = validate_arrays(free, starts, goals, moves)
        times.append(time.perf_counter() - t)
    kernel = min(times)
    t = time.perf_counter()
    sims = [simulate(16, grids[b], starts[b].tolist(), goals[b].tolist(), texts[b]) for b in range(reference_plans)]
    ref = time.perf_counter() - t
    agree = 0
    for b, sim in enumerate(sims):
        got = None if res["valid"][b] else FAILURES[int(res["failure"][b])]
        same = got == sim.failure and (got is None or (int(res["agent"][b]) == sim.agent and int(res["step"][b]) == sim.step))
        agree += same
    kernel_rate = plans * k * steps / kernel
    ref_rate = reference_plans * k * steps / ref
    failures = {f: int((res["failure"] == i).sum()) for i, f in enumerate(FAILURES)}
    return {"validator_plans": plans, "validator_agents": k, "validator_steps": steps,
            "validator_seconds": round(kernel, 4), "agent_steps_per_s": round(kernel_rate),
            "reference_agent_steps_per_s": round(ref_rate), "speedup_vs_reference": round(kernel_rate / ref_rate, 1),
            "validator_agreement": round(agree / reference_plans, 4),
            "validator_failure_mix": ", ".join(f"{f}={c}" for f, c in failures.items() if c)}


# --- CBS -------------------------------------------------------------------------------------------------------------


def bench_cbs(draws: int = 60, n: int = 10, k: int = 5, holes: float = 0.5, seed: int = 1) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    times, outcomes = [], {"solved": 0, "unsolvable": 0, "over_budget": 0, "needs_wait": 0}
    while len(times) < draws:
        layout = _draw_layout(rng, n, hole_count(n, holes), k, 1, cross=bool(rng.random() < 0.5))
        if layout is None:
            continue
        free, s, g = layout
        t = time.perf_counter()
        try:
            sol = solve(n, free, s, g)
            key = "solved" if sol is not None else "unsolvable"
            if sol is not None and sol.needs_wait:
                outcomes["needs_wait"] += 1
        except SolverBudgetExceeded:
            key = "over_budget"
        times.append(time.perf_counter() - t)
        outcomes[key] += 1
    ms = sorted(1000 * x for x in times)
    return {"cbs_setting": f"{n}x{n}, {k} agents, {int(holes * 100)}% holes, {draws} generator draws",
            "cbs_median_ms_hardest": round(statistics.median(ms), 2), "cbs_p90_ms_hardest": round(ms[int(0.9 * len(ms))], 1),
            "cbs_max_ms_hardest": round(ms[-1], 1), **{f"cbs_{key}": v for key, v in outcomes.items()}}


# --- generator -------------------------------------------------------------------------------------------------------


def bench_generator(n: int = 200) -> dict[str, float]:
    """Instances/s for the demo's configs (the `small` suite, up to n instances) and for the default config."""
    blocks = len(TASK.suite("small"))
    t = time.perf_counter()
    drawn = draw_suite(TASK, "small", per_entry=-(-n // blocks))
    small = time.perf_counter() - t
    config = TASK.default_config()
    t = time.perf_counter()
    insts = [TASK.generate(config, s) for s in range(n)]
    default = time.perf_counter() - t
    return {"generator_demo_instances": len(drawn),
            "generator_instances_per_s_demo": round(len(drawn) / small, 1),
            "generator_instances_per_s_default": round(len(insts) / default, 1),
            "generator_attempts_mean_demo": round(float(np.mean([i.attempts for _, i in drawn])), 2)}


def run(plans: int = 2000, reference_plans: int = 200, cbs_draws: int = 60, generator_n: int = 200) -> dict[str, float]:
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    for part in (bench_validator(plans, reference_plans), bench_cbs(cbs_draws), bench_generator(generator_n)):
        for key, value in part.items():
            print(f"{key}: {value}", flush=True)
        out.update(part)
    print(f"bench_seconds: {time.perf_counter() - t0:.1f}")
    return out


if __name__ == "__main__":
    run()
