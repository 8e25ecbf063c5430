"""What each node of the stage hands the next: one small pydantic model per node result, stored in run.db's `nodes`
table (as JSON, the same keys the stage always wrote, so a run interrupted before this module existed still resumes)
and read back typed through `RunStore.result` / `Run.result`.

    run.save_result(k, Probed(rollouts=..., valid=0.4, ...))     # the node's row: its result + timing
    probe = run.result(k, Probed)                                # None until the probe node finished
    arm = run.result(k, ArmRecord, node="arm:control")           # node names that carry an id

`continues_from` is the one place that decides which checkpoint the next stage (and this stage's arms) start from.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from harness.records import Verdict


class NodeResult(BaseModel):
    """A node's stored result. `NODE` is its row name in run.db's `nodes` table; unknown keys (the timing fields
    `_wall_s`, `_started`, `_ended`, `_pid` that every row carries) are ignored on reading."""

    model_config = ConfigDict(extra="ignore")
    NODE: ClassVar[str] = ""


class NodeTiming(NodeResult):
    """When a node ran and in which process (every node row has these; `graph._finish` writes them)."""

    wall_s: float = Field(0.0, alias="_wall_s")
    started: float | None = Field(None, alias="_started")
    ended: float | None = Field(None, alias="_ended")
    pid: int | None = Field(None, alias="_pid")


class SetUp(NodeResult):
    NODE: ClassVar[str] = "setup"
    policy: str = Field(..., description="the warm-started checkpoint stage 1 trains from")


class Trained(NodeResult):
    NODE: ClassVar[str] = "train"
    checkpoint: str
    steps: list[dict[str, Any]] = Field(default_factory=list, description="per-step GRPO metrics")
    seconds: float = 0.0
    tokens: int = 0
    rewards: str | None = Field(None, description="the training rollouts' rewards, one `harness.records.RewardBatch` "
                                "per GRPO scoring call (JSONL): per completion its instance's seed, level and reward")
    exploits: str | None = Field(None, description="what this stage exploits: the promoted candidate (`stage."
                                 "exploit_after_promotion`), or harness@main (`stage.exploit_after_gain`, "
                                 "`stage.explore_backoff`); it trained for its arms' compute too and proposes nothing")
    backoff: list[int] | None = Field(None, description="when it exploits because exploring kept finding nothing "
                                      "(`stage.explore_backoff`): the exploring stages in a row that found nothing, "
                                      "the exploit stages since them before this one, and how many exploit stages "
                                      "this streak allows")


class Probed(NodeResult):
    """What the probe found: the trained policy's probe rollouts, and its change from the stage's start policy."""

    NODE: ClassVar[str] = "probe"
    rollouts: str = Field(..., description="the cached probe rollouts (the diagnosis and vet read them)")
    valid: float
    start_valid: float
    change: float
    change_ci: list[float]
    regressed: bool
    carried: str | None = Field(None, description="the checkpoint the arms start from (`continues_from`)")
    start_rollouts: str | None = Field(None, description="the stage's start policy on the same probe seeds (cached; "
                                       "absent in runs recorded before it was kept)")


class Diagnosed(NodeResult):
    NODE: ClassVar[str] = "diagnose"
    diagnosis: str = Field(..., description="path of the stage's Diagnosis JSON")
    findings: int = 0


class Asked(NodeResult):
    """What the engineer answered at this stage, recorded (with the candidates' rows) before any of them is
    committed: a propose node re-entered after a kill commits these and does not ask again."""

    NODE: ClassVar[str] = "propose:asked"
    candidates: list[str] = Field(default_factory=list, description="the candidate ids, in the order proposed")
    engineer: str = Field(..., description="the engineer that answered (`ProposalResult.engineer_used`)")


class Proposed(NodeResult):
    NODE: ClassVar[str] = "propose"
    candidates: list[str] = Field(default_factory=list)
    engineer: str = ""


class Vetted(NodeResult):
    NODE: ClassVar[str] = "vet"
    vetted: list[str] = Field(default_factory=list)


class ArmRecord(NodeResult):
    """One finished backtest arm (row `arm:<name>`): its checkpoint, cost, backtest rollouts and training curve."""

    NODE: ClassVar[str] = "arm"
    checkpoint: str
    seconds: float = 0.0
    tokens: int = 0
    rollouts: str
    valid: float
    greedy: list[float] = Field(default_factory=list)
    steps: int = 0
    curve: list[dict[str, Any]] = Field(default_factory=list, description="per-step training metrics (the report)")


class ArmLook(NodeResult):
    """A later look's batch of one arm (row `arm:<name>:look<j>`): its backtest rollouts on the next instances."""

    NODE: ClassVar[str] = "arm-look"
    rollouts: str
    greedy: list[float] = Field(default_factory=list)
    n: int = 0


class StartJudged(NodeResult):
    """The stage's start policy (what the stage began from: its training and the control arm's steps are what it is
    compared for) judged on the backtest instances, and the control arm compared with it. Runs recorded before
    this judged the arms' start instead; `checkpoint` says which was judged, and it is what continues when the
    decided arm does not (`continues_from`)."""

    NODE: ClassVar[str] = "judge:start"
    checkpoint: str
    n: int
    valid: float
    control_valid: float
    change: float
    change_ci: list[float]
    control_regressed: bool
    outcomes: list[float] = Field(default_factory=list, description="the start's per-instance outcomes on those "
                                                                       "instances (a promoted arm is compared too)")
    greedy: list[float] = Field(default_factory=list, description="the start's per-instance greedy outcomes on "
                                "those instances (empty when the judge does not decode greedily)")
    greedy_rule: bool = Field(False, description="the greedy estimate also decides what continues "
                              "(`backtest.carry_greedy` at the time this was judged; a resume reads the same rule)")
    control_greedy_change: float | None = Field(None, description="control arm minus start, greedy, same instances")

    @property
    def control_below(self) -> bool:
        """The control arm's estimate is below the start's (sampled, or greedy under `greedy_rule`): it is not
        carried (`continues_from`)."""
        return self.change < 0 or (self.greedy_rule and self.control_greedy_change is not None
                                   and self.control_greedy_change < 0)

    def greedy_below(self, greedy: list[float]) -> bool:
        """Is an arm's greedy estimate below the start's on the instances it was judged on? False when the rule is
        off or either side was not decoded greedily."""
        if not (self.greedy_rule and greedy and len(self.greedy) >= len(greedy)):
            return False
        return sum(greedy) / len(greedy) < sum(self.greedy[: len(greedy)]) / len(greedy)


class ArmVsStart(BaseModel):
    """A candidate arm that was not promoted, compared with the stage's judged start on the same target instances
    (`harness.backtest.regression`, the gate's confidence)."""

    candidate: str
    checkpoint: str
    change: float
    change_ci: list[float]
    greedy_below: bool = Field(False, description="its greedy estimate is below the start's (`backtest.carry_greedy`)")

    @property
    def above(self) -> bool:
        """Confidently above the start (and, under `backtest.carry_greedy`, not below it greedily): its checkpoint
        may continue (`continues_from`), its harness is not promoted."""
        return self.change_ci[0] > 0 and not self.greedy_below


class Backtested(NodeResult):
    """What the backtest decided: one verdict per vetted candidate, the control arm's checkpoint, the start judged."""

    NODE: ClassVar[str] = "backtest"
    verdicts: list[Verdict] = Field(default_factory=list)
    control: str | None = None
    start: StartJudged | None = None
    regressed_arms: list[str] = Field(default_factory=list, description="checkpoints of promoted arms whose estimate "
                                      "on the target is below the judged start's: their harness is promoted, their "
                                      "checkpoint not carried")
    arms_vs_start: list[ArmVsStart] = Field(default_factory=list, description="the candidate arms not promoted, each "
                                            "compared with the judged start on the target (one confidently above it "
                                            "and above the control arm's estimate continues: `continues_from`)")

    def best_arm_above_start(self, control_carriable: bool) -> ArmVsStart | None:
        """The non-promoted candidate arm whose checkpoint continues when no candidate wins (`continues_from`):
        confidently above the stage's start on the target, and above the control arm's estimate when the control arm
        could be carried. None when there is none."""
        above = [a for a in self.arms_vs_start if a.above]
        if not above or self.start is None:
            return None
        best = max(above, key=lambda a: a.change)
        return best if not control_carriable or best.change > self.start.change else None


class CarryBatch(NodeResult):
    """One batch of a carry confirmation (row `carry:<name>:b<j>`): a checkpoint decoded greedily on the next batch of
    the stage's confirmation instances (`harness.decisions.confirm_carry`)."""

    NODE: ClassVar[str] = "carry"
    checkpoint: str
    greedy: list[float] = Field(default_factory=list)


class CarryChecked(BaseModel):
    """What the carry confirmation read: the chosen checkpoint against the stage's start (or, under
    `stage.keep_training`, the run's anchor: its best confirmed checkpoint), greedy, on fresh instances."""

    chosen: str
    start: str = Field(..., description="what it was compared with: the stage's start, or the anchor")
    n: int = Field(..., description="confirmation instances judged (both checkpoints, paired)")
    chosen_valid: float
    start_valid: float
    change: float = Field(..., description="chosen minus start, greedy valid, paired over the n instances")
    se: float
    confirmed: bool = Field(..., description="the chosen checkpoint continues (change >= backtest.carry_margin x se); "
                            "else the start does. Under `stage.keep_training`: it becomes the anchor")
    against_anchor: bool = Field(False, description="compared with the anchor (`stage.keep_training`)")
    kept: bool = Field(False, description="under `stage.keep_training`, not confirmed but not below the anchor by "
                       "more than `carry_margin` se either: its lineage trains on, the anchor stays")


class FinalPicked(NodeResult):
    """The last stage's pick between the lineage and the anchor (`harness.decisions.final_pick`)."""

    NODE: ClassVar[str] = "final"
    picked: str = Field(..., description="what the run delivers: the lineage or the anchor")
    check: CarryChecked


class GateAnswer(NodeResult):
    NODE: ClassVar[str] = "gate"
    action: str = Field(..., description="auto (no gate), approve, revise or abort")
    feedback: str = ""


class Decided(NodeResult):
    """Which candidate won (if any), which checkpoint the next stage trains from, and the run's anchor."""

    NODE: ClassVar[str] = "decide"
    winner: str | None = None
    next_policy: str = Field(..., description="the checkpoint the next stage trains from (its lineage)")
    anchor: str | None = Field(None, description="the run's best confirmed checkpoint after this stage, what its "
                               "report scores and a run delivers (`stage.keep_training`); None: `next_policy`")
    decided: int = 0
    carry_check: CarryChecked | None = Field(None, description="the carry confirmation, when a trained checkpoint "
                                             "was chosen to continue (`backtest.carry_confirm`)")


def carried_flags(start: str | None, decided: list[Decided | None]) -> list[bool | None]:
    """Per stage (1, 2, ...), whether it carried a trained checkpoint: the next stage trains from one the run did
    not hold before (`Decided.next_policy` is not the run's start, an earlier stage's lineage or an anchor; under
    `stage.keep_training` a lineage sent back to the anchor carried nothing); None for a stage not decided, and for
    every stage after it. One rule for escalation (`harness.decisions.carried_nothing`) and the review."""
    seen, out, gap = {start}, [], False
    for d in decided:
        gap = gap or d is None
        out.append(None if gap else d.next_policy not in seen)
        if not gap:
            seen |= {d.next_policy, d.anchor}
    return out


class StopChecked(NodeResult):
    """Whether the run stops after this stage (`harness.stagebook.stop_reason`), decided once when the remember node
    is first entered: a re-entered node reads it back instead of deciding again on a ledger and clock its own first
    attempt has since moved (a budget edited before a resume, or the time a machine was down, counts from the next
    stage on)."""

    NODE: ClassVar[str] = "stop"
    reason: str | None = Field(None, description="why the run stops after this stage; None: it goes on")


class Remembered(NodeResult):
    NODE: ClassVar[str] = "remember"


def continues_from(start: str, trained: str, probe_regressed: bool, backtest: Backtested | None = None,
                   winner: ArmRecord | None = None, keep_training: bool = False) -> str:
    """The checkpoint the next step starts from. Without a backtest (the arms' start): the stage's trained checkpoint,
    unless the probe saw training lower the policy (then the stage's `start`). After the backtest (the next stage),
    one rule: the decided arm (the winner's, else the control arm) is carried only when its estimate on the backtest
    instances (the TARGET) is not below the judged start's (`backtest.start`, the stage's start), else that start
    continues. Those estimates read every instance of the stage's plan (`backtest.carry_on: plan`,
    `harness.decisions.judge_whole_plan`), not only the looks a verdict needed; "not below" holds for the greedy
    estimate on the same instances too (`backtest.carry_greedy`, the default: the test suite is greedy, and on the
    demo's seeds arms whose sampled estimate held lost 2-6 points on the greedy test suite). A probe that regressed also keeps the
    start. Why the point estimate and not "beyond noise": the probe watches the training MIX, so when the mix is wrong
    for the target a stage can lower the target a little at a time (too little for one stage's n to call), and
    carrying by default compounds it stage after stage; choosing the better of two estimates loses little when
    training helps (a small gain is sometimes left behind) and stops the slide when it does not.

    With no winner, a candidate arm that is confidently above the stage's start on the target (its paired interval
    against the start above 0) and above the control arm's estimate continues instead (`Backtested.
    best_arm_above_start`): its harness is NOT promoted (it did not beat the control with confidence), but its
    checkpoint is the best policy the judge has seen, measured where it matters. This is model selection on the
    backtest split (never the test suite), like early stopping on a validation set: when the incumbent harness is
    wrong for the target its own arm falls and nothing would be carried, so a stage whose right fix is still
    inconclusive against the control no longer throws away the training that fix did.

    What this chooses over the start is then confirmed on fresh instances before it continues
    (`harness.decisions.confirm_carry`, `backtest.carry_confirm`): the estimates above were read on the instances the
    choice was made on.

    `keep_training` (`stage.keep_training`): the point-estimate filters above are left to that confirmation, which
    then reads the decided arm against the run's best confirmed checkpoint (the anchor) instead of the stage's start:
    the winner's arm, else the best arm above the start, else the control arm continues its lineage unless the stage
    collapsed the policy beyond noise (the probe regressed, or the control arm is confidently below the start)."""
    arms_start = start if probe_regressed else trained
    ref = backtest.start.checkpoint if backtest is not None and backtest.start is not None else arms_start
    if winner is not None:  # the winner's arm, unless its estimate fell below the start (a collapse is never carried)
        return ref if backtest is not None and winner.checkpoint in backtest.regressed_arms and not keep_training \
            else winner.checkpoint
    if backtest is None or backtest.control is None or backtest.start is None:
        return arms_start
    control_ok = not (probe_regressed or backtest.start.control_regressed
                      or (backtest.start.control_below and not keep_training))
    if (arm := backtest.best_arm_above_start(control_ok)) is not None:
        return arm.checkpoint
    return backtest.control if control_ok else ref
