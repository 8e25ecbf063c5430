"""The stage's typed hand-offs (`harness.results`): rows written before the node results were typed still read back
(a run interrupted by an older version resumes), what the typed models write has the same keys (the report's page and
older readers use them), and `continues_from`, the one rule for which checkpoint continues.

    .venv/bin/pytest tests/test_results.py -q
"""

from __future__ import annotations

import json

from harness.records import Verdict
from harness.results import (
    ArmRecord,
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
    assert all(v in ([], {}, None) for v in extra.values()), extra
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
    # a run recorded before the stage's start was judged (its start judge holds the arms' start): that continues
    old = _bt(False, change=-0.02)
    old.start.checkpoint = "trained"
    assert continues_from("start", "trained", False, old) == "trained"
