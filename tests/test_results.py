"""The stage's typed hand-offs (`harness.results`): rows written before the node results were typed still read back
(a run interrupted by an older version resumes), what the typed models write has the same keys (the report's page and
older readers use them), and `continues_from`, the one rule for which checkpoint continues.

    .venv/bin/pytest tests/test_results.py -q
"""

from __future__ import annotations

import json

import numpy as np

from harness.records import Verdict
from harness.results import (
    ArmRecord,
    ArmVsStart,
    Backtested,
    Decided,
    GateAnswer,
    NodeTiming,
    Probed,
    StartJudged,
    continues_from,
)
from harness.store import RunStore

TIMING = {"_wall_s": 2.5, "_started": 100.0, "_ended": 102.5, "_pid": 42}
# node rows exactly as the untyped stage wrote them (cb04df9)
OLD = {
    "probe": {"rollouts": "runs/x/rollouts/s1-probe.jsonl.gz", "valid": 0.1, "start_valid": 0.6, "change": -0.5,
              "change_ci": [-0.6, -0.4], "regressed": True, "carried": "runs/x/checkpoints/warmstart", **TIMING},
    "backtest": {"verdicts": [{"candidate": "s1c1", "decision": "rejected", "reason": "not significant",
                               "evidence": None, "stage_reached": "backtest"}],
                 "control": "runs/x/checkpoints/s1-control",
                 "start": {"checkpoint": "runs/x/checkpoints/warmstart", "n": 24, "valid": 0.5, "control_valid": 0.1,
                           "change": -0.4, "change_ci": [-0.5, -0.3], "control_regressed": True}, **TIMING},
    "decide": {"winner": None, "next_policy": "runs/x/checkpoints/warmstart", "decided": 1, **TIMING},
    "arm:s1c1": {"checkpoint": "runs/x/checkpoints/s1-s1c1", "seconds": 1.0, "tokens": 10, "rollouts": "r.jsonl.gz",
                 "valid": 0.2, "greedy": [0.0, 1.0], "steps": 1, "curve": [{"step": 1, "reward_mean": 0.1}]},
    "gate": {"action": "auto", **TIMING},
}


def _old_keys(got, old):
    """`got` restricted to the keys of `old` (recursively), after checking every other key holds an empty default."""
    if not isinstance(got, dict) or not isinstance(old, dict):
        return got
    extra = {k: v for k, v in got.items() if k not in old}
    assert all(v in ([], {}, None) or v is False for v in extra.values()), extra
    return {k: _old_keys(got[k], old[k]) for k in old if k in got}


def test_rows_of_the_untyped_stage_read_back_typed_and_write_back_the_same_keys(tmp_path):
    store = RunStore.open(tmp_path / "run.db")
    store.create_run("x", {})
    for node, row in OLD.items():
        store.mark_node_done("x", 1, node, row)
    probe = store.result("x", 1, Probed)
    assert probe.regressed and probe.carried.endswith("warmstart") and probe.change_ci == [-0.6, -0.4]
    bt = store.result("x", 1, Backtested)
    assert bt.start.control_regressed and bt.verdicts[0].candidate == "s1c1" and bt.control.endswith("s1-control")
    assert store.result("x", 1, Decided).next_policy.endswith("warmstart")
    assert store.result("x", 1, ArmRecord, node="arm:s1c1").greedy == [0.0, 1.0]
    assert store.result("x", 1, GateAnswer).action == "auto"
    t = store.result("x", 1, NodeTiming, node="probe")
    assert (t.wall_s, t.ended, t.pid) == (2.5, 102.5, 42)
    assert store.result("x", 2, Probed) is None  # not finished yet
    # an older probe row without `carried`, and a backtest with nothing to decide, still read
    store.mark_node_done("x", 2, "probe", {k: v for k, v in OLD["probe"].items() if k != "carried"})
    store.mark_node_done("x", 2, "backtest", {"verdicts": []})
    assert store.result("x", 2, Probed).carried is None and store.result("x", 2, Backtested).start is None
    # written back typed: the same keys and values as before
    for node, model in (("probe", Probed), ("backtest", Backtested), ("decide", Decided)):
        store.save_result("x", 3, store.result("x", 1, model), timing=TIMING)
        got = json.loads(json.dumps(store.node_result("x", 3, node)))
        assert _old_keys(got, OLD[node]) == OLD[node], node  # fields added since write only their empty default
    store.close()


def _bt(control_regressed: bool, change: float = -0.1) -> Backtested:
    start = StartJudged(checkpoint="start", n=8, valid=0.5, control_valid=0.5 + change, change=change,
                        change_ci=[change - 0.1, change + 0.09], control_regressed=control_regressed)
    return Backtested(verdicts=[Verdict(candidate="c", decision="rejected", reason="r")], control="control",
                      start=start)


def test_one_rule_decides_which_checkpoint_continues():
    win = ArmRecord(checkpoint="winner-arm", rollouts="r", valid=0.9)
    # the arms' start (no backtest yet): the trained checkpoint unless the probe saw training lower the policy
    assert continues_from("start", "trained", probe_regressed=False) == "trained"
    assert continues_from("start", "trained", probe_regressed=True) == "start"
    # the next stage: the control arm when its estimate on the target is not below the stage's start ...
    assert continues_from("start", "trained", False, _bt(False, change=+0.05)) == "control"
    assert continues_from("start", "trained", False, _bt(False, change=0.0)) == "control"
    # ... else the judged start: below it within noise (a mix wrong for the target sliding it a little per stage)
    # or beyond noise, or the probe regressed
    assert continues_from("start", "trained", False, _bt(False, change=-0.01)) == "start"
    assert continues_from("start", "trained", False, _bt(True)) == "start"
    assert continues_from("start", "trained", True, _bt(False, change=+0.05)) == "start"
    # a winner's arm always, unless its estimate fell below the start (then the start; its harness is still promoted)
    assert continues_from("start", "trained", True, _bt(True), win) == "winner-arm"
    assert continues_from("start", "trained", False, Backtested()) == "trained"  # nothing was backtested
    fell = _bt(True).model_copy(update={"regressed_arms": ["winner-arm"]})
    assert continues_from("start", "trained", False, fell, win) == "start"
    assert continues_from("start", "trained", True, fell, win) == "start"
    # no winner, but a candidate arm confidently above the start (its harness not promoted): its checkpoint continues
    # when the control arm cannot be carried, or when it is above the control arm's estimate too
    def above(change, lo, cand="c"):
        return ArmVsStart(candidate=cand, checkpoint=f"{cand}-arm", change=change, change_ci=[lo, change + 0.05])

    with_arm = _bt(False, change=-0.01).model_copy(update={"arms_vs_start": [above(0.05, 0.003)]})
    assert continues_from("start", "trained", False, with_arm) == "c-arm"
    assert continues_from("start", "trained", True, with_arm) == "c-arm"  # the probe regressed: arms began at start
    both = _bt(False, change=+0.06).model_copy(update={"arms_vs_start": [above(0.05, 0.003)]})
    assert continues_from("start", "trained", False, both) == "control"  # the control arm is better still
    both.arms_vs_start.append(above(0.08, 0.01, "d"))
    assert continues_from("start", "trained", False, both) == "d-arm"  # the best of those confidently above
    unsure = _bt(False, change=-0.01).model_copy(update={"arms_vs_start": [above(0.05, -0.001)]})
    assert continues_from("start", "trained", False, unsure) == "start"  # above only on its point estimate: no
    assert continues_from("start", "trained", False, with_arm, win) == "winner-arm"  # a winner comes first
    # a run recorded before the stage's start was judged (its start judge holds the arms' start): that continues
    old = _bt(False, change=-0.02)
    old.start.checkpoint = "trained"
    assert continues_from("start", "trained", False, old) == "trained"


def test_each_unpromoted_arm_is_compared_with_the_start_on_the_instances_it_was_judged_on():
    """`decisions.arms_vs_start`: a candidate arm clearly above the start is `above`, one level with it is not, a promoted
    arm or one with no evidence is not listed, and an arm judged on fewer instances is compared on that prefix.
    Would catch the comparison made against the control instead of the start, or on misaligned instances."""
    from types import SimpleNamespace

    from harness.backtest import ArmEval
    from harness.config import GateConfig
    from harness.decisions import arms_vs_start
    from harness.records import Evidence

    rng = np.random.default_rng(0)
    start_out = list(rng.choice([0.0, 0.25, 0.5], size=96))
    start = StartJudged(checkpoint="start", n=96, valid=float(np.mean(start_out)), control_valid=0.3, change=0.0,
                        change_ci=[-0.05, 0.05], control_regressed=False, outcomes=start_out)
    better = [min(1.0, x + 0.25) for x in start_out]  # every instance a little better: confidently above
    level = [x for x in start_out[:48]]  # stopped at look 2, same outcomes as the start there
    ev = Evidence(n=96, control=0.3, candidate=0.4, effect=0.1, ci_low=-0.01, ci_high=0.2)

    def arm(out):
        return ArmEval(seeds=list(range(len(out))), outcomes=out, slices=[{}] * len(out))

    verdicts = [Verdict(candidate="up", decision="inconclusive", reason="r", evidence=ev),
                Verdict(candidate="flat", decision="inconclusive", reason="r", evidence=ev),
                Verdict(candidate="won", decision="promoted", reason="r", evidence=ev),
                Verdict(candidate="failed", decision="rejected", reason="arm failed")]
    arms = {c: SimpleNamespace(checkpoint=f"{c}-ckpt") for c in ("up", "flat", "won", "failed")}
    evals = {"up": arm(better), "flat": arm(level), "won": arm(better), "failed": RuntimeError("boom")}
    run = SimpleNamespace(config=SimpleNamespace(gate=GateConfig(), seed=0))
    got = {a.candidate: a for a in arms_vs_start(run, 1, start, verdicts, arms, evals)}
    assert set(got) == {"up", "flat"}
    assert got["up"].above and got["up"].checkpoint == "up-ckpt" and got["up"].change > 0.15
    assert not got["flat"].above and got["flat"].change == 0.0


def test_a_checkpoint_whose_greedy_estimate_fell_is_not_carried_under_carry_greedy():
    """`backtest.carry_greedy`: the control arm, a promoted arm and a confidently-above arm each continue only when their
    greedy estimate on the stage's instances is not below the start's as well; with the rule off (or a judge that
    decodes no greedy) the sampled estimate decides alone, as before. Would catch the greedy outcomes recorded but
    not read, compared on misaligned instances, or read when the rule was off when the start was judged (a resume
    must apply the rule the stage was judged under)."""
    from harness.backtest import ArmEval
    from harness.decisions import fell_below_start

    def start(rule, control_greedy_change):
        return StartJudged(checkpoint="start", n=4, valid=0.5, control_valid=0.5, change=0.0, change_ci=[-0.1, 0.1],
                           control_regressed=False, outcomes=[0.5] * 4, greedy=[1.0, 1.0, 0.0, 0.0],
                           greedy_rule=rule, control_greedy_change=control_greedy_change)

    bt = Backtested(verdicts=[], control="control", start=start(True, -0.25))
    assert bt.start.control_below and continues_from("start", "trained", False, bt) == "start"
    assert continues_from("start", "trained", False, bt.model_copy(update={"start": start(True, 0.0)})) == "control"
    assert continues_from("start", "trained", False, bt.model_copy(update={"start": start(False, None)})) == "control"
    # a promoted arm: sampled level with the start, greedy below it on the instances it was judged on
    arm = ArmEval(seeds=[0, 1], outcomes=[0.5, 0.5], slices=[{}, {}], greedy=[1.0, 0.0])
    assert fell_below_start(start(True, 0.0), arm) and not fell_below_start(start(False, None), arm)
    assert not fell_below_start(start(True, 0.0), arm.model_copy(update={"greedy": [1.0, 1.0]}))
    assert not fell_below_start(start(True, 0.0), arm.model_copy(update={"greedy": []}))  # not decoded: sampled only
    # a candidate arm confidently above the start on the sampled estimate, but below it greedily: not `above`
    up = ArmVsStart(candidate="c", checkpoint="c-arm", change=0.1, change_ci=[0.02, 0.2], greedy_below=True)
    assert not up.above and up.model_copy(update={"greedy_below": False}).above
    assert start(True, 0.0).greedy_below([0.0]) and not start(True, 0.0).greedy_below([1.0, 1.0, 0.0])
