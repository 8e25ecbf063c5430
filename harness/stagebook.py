"""A stage's bookkeeping: its wall time and compute at the end (`stage_metrics`, stored with the stage row) and
whether the run stops after it (`stop_reason`: a person's abort, the stage / wall-clock / compute budgets, a plateau).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from harness.config import BudgetConfig
from harness.results import GateAnswer, NodeTiming
from harness.run import Run
from harness.store import RunStore

STAGE_NODES = ("train", "probe", "diagnose", "propose", "vet", "backtest", "gate", "decide")


def stage_metrics(run: Run, k: int, remember_s: float) -> dict[str, float]:
    """Held-out metrics plus the framework overhead: stage wall time not spent in training/eval compute. Wall time
    runs from the end of the previous stage (or of setup) to now, everything included (nodes, LangGraph checkpoints,
    routing); a stage that a crash interrupted (its nodes ran in different processes) reports the sum of its node
    times instead, so the downtime is not counted."""
    nodes = [run.result(k, NodeTiming, node=n) or NodeTiming() for n in STAGE_NODES]
    prev = run.result(k - 1, NodeTiming, node="remember") if k > 1 else run.result(0, NodeTiming, node="setup")
    wall = remember_s + sum(r.wall_s for r in nodes)
    if prev is not None and prev.ended is not None and {r.pid for r in [*nodes, prev]} == {os.getpid()}:
        wall = time.time() - prev.ended
    compute = run.store.seconds_spent(run.id, stage=k)
    test = [e for e in run.store.evaluations(run.id, stage=k, arm="policy") if e["split"] == "test"
            and not e["slice_key"]]
    out = {"wall_s": wall, "compute_s": compute, "overhead_share": max(0.0, wall - compute) / wall if wall else 0.0}
    if test:
        out.update(valid=test[0]["valid"], optimal=test[0]["optimal"])
    return out


def stop_reason(run: Run, k: int, stages_without_promotion: int) -> str | None:
    """Why the run stops after stage k, or None to go on."""
    if (g := run.result(k, GateAnswer)) is not None and g.action == "abort":
        return f"aborted by a human at the gate (stage {k})"
    return budget_stop(run.config.budget, k, time.time() - run.store_started(),
                       lambda: run.store.seconds_spent(run.id), stages_without_promotion)


def budget_stop(b: BudgetConfig, k: int, elapsed_s: float, spent_s: Callable[[], float],
                stages_without_promotion: int) -> str | None:
    """Which part of the budget `b` is spent after stage k, or None: the stage count, the wall clock since the run
    started (`elapsed_s`), the compute ledger's seconds (`spent_s`, read only when a compute budget is set), the
    plateau of stages without a promotion. Also what `evotrainer resume RUN --stages N` checks before it reopens a
    finished run."""
    if k >= b.stages:
        return f"stage budget reached ({b.stages} stages)"
    wall = b.wall_clock_s
    if wall is not None and elapsed_s >= wall:
        return f"wall-clock budget reached ({b.wall_clock})"
    if b.compute_s is not None and spent_s() >= b.compute_s:
        return f"compute budget reached ({b.compute_s:.0f} s)"
    if b.plateau and stages_without_promotion >= b.plateau:
        return f"plateau: {b.plateau} stages without a promotion"
    return None


def step_equivalents(store: RunStore, run_id: str, before: int | None = None) -> dict[str, Any]:
    """A run's compute from its ledger in GRPO step-equivalents (the experiment's unit): every GRPO step (the policy's
    and every backtest arm's) plus every token generated to judge or steer (probes, backtest evaluations, a baseline's
    level probes) at the run's training tokens per step. The SFT warm start and the held-out report (label `test`)
    are left out: every arm pays them alike. `before`: only stages below it (what a stage has spent before it)."""
    rows = [r for r in store.ledger(run_id) if before is None or r["stage"] < before]
    steps = sum(r["steps"] for r in rows if r["kind"] == "grpo")
    train_tok = sum(r["tokens"] for r in rows if r["kind"] == "grpo")
    tps = train_tok / max(1, steps)
    by_stage: dict[int, float] = {}
    judge_tok = 0
    for r in rows:
        if r["kind"] == "sft" or r["label"] == "test":
            continue
        judge = r["kind"] != "grpo"
        judge_tok += r["tokens"] if judge else 0
        by_stage[r["stage"]] = by_stage.get(r["stage"], 0.0) + (r["tokens"] / tps if judge and tps else
                                                                  0.0 if judge else r["steps"])
    return {"steps": steps, "train_tokens": train_tok, "judge_tokens": judge_tok, "tokens_per_step": tps,
            "compute": steps + (judge_tok / tps if tps else 0.0), "by_stage": by_stage}
