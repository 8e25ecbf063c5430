"""A stage's bookkeeping: its wall time and compute at the end (`stage_metrics`, stored with the stage row) and
whether the run stops after it (`stop_reason`: a person's abort, the stage / wall-clock / compute budgets, a plateau).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
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


JUDGING_PARTS = ("probes", "arm evaluations", "carry readings", "other judging")


def _judging_part(kind: str, label: str) -> str:
    """Which `JUDGING_PARTS` a ledger row of generated tokens belongs to."""
    if kind == "rollout":  # the stage's probes on the mix and the target, a baseline's level probes, PBT's fitness
        return "probes"
    if label.startswith("backtest"):
        return "arm evaluations"
    if label.startswith("carry"):
        return "carry readings"
    return "other judging"


def step_equivalents(store: RunStore, run_id: str, before: int | None = None) -> dict[str, Any]:
    """A run's compute from its ledger in GRPO step-equivalents (the experiment's unit): every GRPO step (the policy's
    and every backtest arm's) plus every token generated to judge or steer (probes, backtest evaluations, a baseline's
    level probes) at the run's training tokens per step. The SFT warm start and the held-out report (label `test`)
    are left out: every arm pays them alike. An LLM engineer's calls (kind `engineer`: another model, whose tokens
    are not the policy's) are reported apart, `engineer_tokens` and `engineer_seconds`, never converted into the
    policy's step-equivalents. `before`: only stages below it (what a stage has spent before it)."""
    rows = [r for r in store.ledger(run_id) if before is None or r["stage"] < before]
    engineer = [r for r in rows if r["kind"] == "engineer"]  # another model's tokens: reported, not converted
    rows = [r for r in rows if r["kind"] != "engineer"]
    steps = sum(r["steps"] for r in rows if r["kind"] == "grpo")
    train_tok = sum(r["tokens"] for r in rows if r["kind"] == "grpo")
    tps = train_tok / max(1, steps)
    by_stage: dict[int, float] = {}
    judge_tok = 0
    judge_by_part = dict.fromkeys(JUDGING_PARTS, 0)  # `compute_shares`' split of the same tokens
    for r in rows:
        if r["kind"] == "sft" or r["label"] == "test":
            continue
        judge = r["kind"] != "grpo"
        judge_tok += r["tokens"] if judge else 0
        if judge:
            judge_by_part[_judging_part(r["kind"], r["label"])] += r["tokens"] or 0
        by_stage[r["stage"]] = by_stage.get(r["stage"], 0.0) + (r["tokens"] / tps if judge and tps else
                                                                  0.0 if judge else r["steps"])
    return {"steps": steps, "train_tokens": train_tok, "judge_tokens": judge_tok, "tokens_per_step": tps,
            "compute": steps + (judge_tok / tps if tps else 0.0), "by_stage": by_stage, "judge_by_part": judge_by_part,
            "engineer_tokens": sum(r["tokens"] for r in engineer),
            "engineer_seconds": round(sum(r["seconds"] for r in engineer), 3)}


def compute_shares(store: RunStore, run_id: str) -> dict[str, Any] | None:
    """Where a run's compute went, in `step_equivalents`' unit: the GRPO steps on the lineage of the policy the run
    delivers (its last stage's checkpoint, what the held-out report scored), the GRPO steps of everything else it
    trained (backtest arms and stages whose checkpoints did not continue), and the judging, by part (probes, arm
    evaluations, carry readings, other). The price of judging in one line: a fixed harness at the same compute trains
    its one policy for all of it. The lineage is walked back through the stages' records (a stage's training starts
    from the previous stage's `Decided.next_policy`, its arms from `Probed.carried`, a PBT member from the checkpoint
    it continued: `harness.pbt.MemberStage`); a delivered checkpoint that no record made leaves `lineage` None.
    `pipelined`: the share of its GRPO steps whose rollouts were generated while the step before trained
    (`recipe.pipeline`, on under `auto` where the process's cores leave a spare one: a one-step off-policy GRPO, so
    runs that differ in it trained differently; None when no step recorded it). None for a run with no finished
    stage."""
    from harness.results import ArmRecord, Decided, Probed, SetUp, Trained

    done = [s for s in store.stages(run_id) if s["stage"] and s.get("checkpoint")]
    if not done:
        return None
    comp = step_equivalents(store, run_id)
    tps = comp["tokens_per_step"]
    judging = {part: (tok / tps if tps else 0.0) for part, tok in comp["judge_by_part"].items()}
    steps_of: dict[tuple[int, str], int] = {}
    for r in store.ledger(run_id):
        if r["kind"] == "grpo":
            steps_of[(r["stage"], r["arm"])] = steps_of.get((r["stage"], r["arm"]), 0) + (r["steps"] or 0)
    made: dict[str, tuple[int, str | None]] = {}  # checkpoint -> (its GRPO steps, what it was trained from)
    curves: list[list[dict[str, Any]]] = []  # every GRPO call's per-step metrics
    setup = store.result(run_id, 0, SetUp)
    start = setup.policy if setup is not None else None
    for k in sorted({s["stage"] for s in store.stages(run_id) if s["stage"]}):
        t = store.result(run_id, k, Trained)
        if t is not None:
            made[t.checkpoint] = (steps_of.get((k, "policy"), len(t.steps)), start)
            curves.append(t.steps)
        p = store.result(run_id, k, Probed)
        arms_from = p.carried if p is not None and p.carried else (t.checkpoint if t is not None else start)
        for name in store.arm_nodes(run_id, k):
            if ":" in name:  # a sequential look's record (`arm:<name>:look<i>`), not an arm
                continue
            if (a := store.result(run_id, k, ArmRecord, node=f"arm:{name}")) is not None:
                made[a.checkpoint] = (steps_of.get((k, name), a.steps), arms_from)
                curves.append(a.curve)
        for ms in (store.node_result(run_id, k, "pbt") or {}).get("trained", []):  # `harness.pbt.MemberStage`
            made[ms["checkpoint"]] = (ms["steps"], ms["start"])
            if (mt := store.result(run_id, k, Trained, node=f"pbt:m{ms['member']}:train")) is not None:
                curves.append(mt.steps)
        d = store.result(run_id, k, Decided)
        start = d.next_policy if d is not None else (t.checkpoint if t is not None else start)
    delivered = done[-1]["checkpoint"]
    lineage: int | None = 0
    ckpt, seen = delivered, set()
    while ckpt is not None and ckpt != (setup.policy if setup is not None else None) and ckpt not in seen:
        seen.add(ckpt)
        if ckpt not in made:
            lineage = None
            break
        n, ckpt = made[ckpt]
        lineage += n
    said = [x.get("pipelined") for c in curves for x in c if "pipelined" in x]
    return {"delivered": delivered, "compute": comp["compute"], "steps": comp["steps"], "lineage": lineage,
            "other_training": None if lineage is None else comp["steps"] - lineage, "judging": judging,
            "pipelined": sum(1 for x in said if x) / len(said) if said else None,
            "engineer_tokens": comp["engineer_tokens"], "engineer_seconds": comp["engineer_seconds"]}


def shares_line(s: dict[str, Any]) -> str:
    """`compute_shares` in one sentence for the report."""
    total = s["compute"] or 1.0
    judged = sum(s["judging"].values())
    parts = ", ".join(f"{name} {v:.0f}" for name, v in s["judging"].items() if v >= 0.5)
    trained = ("the delivered policy's lineage: unknown" if s["lineage"] is None else
               f"{s['lineage']} ({100 * s['lineage'] / total:.0f}%) trained the delivered policy "
               f"({Path(s['delivered']).name}), {s['other_training']} ({100 * s['other_training'] / total:.0f}%) "
               "trained arms and stages that did not continue")
    eng = (f"; the LLM engineer read and wrote {s['engineer_tokens']:,} tokens in {s['engineer_seconds']:.0f} s (another "
           "model's: not in the step-equivalents)") if s.get("engineer_tokens") or s.get("engineer_seconds") else ""
    return (f"{s['compute']:.0f} GRPO step-equivalents: {trained}; {judged:.0f} ({100 * judged / total:.0f}%) judged"
            + (f" ({parts})" if parts else "") + eng)
