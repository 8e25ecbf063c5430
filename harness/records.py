"""Typed records passed between the loop's nodes: rollouts, findings, the diagnosis, candidates, evidence, verdicts.

Small on purpose: these are what the graph passes around (by id), what run.db stores (as rows / JSON), and what the
engineer reads. Big data (rollouts) lives in `runs/<id>/rollouts/*.jsonl.gz`, one `Rollout` JSON per line; see
`write_rollouts` / `read_rollouts`.
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# --- rollouts ---------------------------------------------------------------------------------------------------------


REASON_CHARS = 500  # rejection reasons and notes are cut to this length


def cut(text: Any, n: int = REASON_CHARS) -> str:
    """`text` as one string of at most `n` characters (longer ones end with '...')."""
    text = str(text)
    return text if len(text) <= n else text[: n - 3] + "..."


RECURRING = ("grpo.policy_regressed",)  # the critical findings whose recurrence escalates (`harness.decisions`)
# and presses a confirmed step further (`harness.engineer.rule.press_on`)


def problem_label(prompt: str) -> str:
    """The problem an instance poses, as a short hash of its prompt: copies of one problem (a level with few distinct
    problems draws one again) share it, so the gate and the carry readings count them once."""
    return hashlib.sha1(prompt.encode()).hexdigest()[:12]


class Rollout(BaseModel):
    """One completion of the policy on one instance, scored. Completions of the same prompt share `group`."""

    model_config = ConfigDict(extra="forbid")
    seed: int
    group: int = Field(..., description="index of the prompt group (GRPO group / repeated samples of one instance)")
    instance: dict[str, Any] = Field(..., description="the instance as JSON (task.spec.instance_model.model_validate)")
    prompt: str
    completion: str
    valid: bool
    optimal: bool
    reward: float
    failure: str | None = None
    where: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    slices: dict[str, str] = Field(default_factory=dict)
    tokens: int = 0


def _write_jsonl(path: Path, rows: list[BaseModel]) -> Path:
    """Write atomically (temp file + rename) so a crash never leaves a half file that looks complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as fh:
        for r in rows:
            fh.write(r.model_dump_json() + "\n")
    tmp.replace(path)
    return path


def write_rollouts(path: Path, rollouts: list[Rollout]) -> Path:
    return _write_jsonl(path, rollouts)


def read_rollouts(path: Path) -> list[Rollout]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [Rollout.model_validate_json(line) for line in fh if line.strip()]


class RewardBatch(BaseModel):
    """One scoring call of a GRPO training run (one generation batch), per completion in the order GRPO scored them
    (a prompt's group is `num_generations` consecutive completions): the instance's seed, its level (the value of the
    task's difficulty slice; for a weighted mixture of keyed entries, the key of the entry that generated it) and its
    shaped reward (before the recipe's `reward_scale`), and whether it was valid (the task's own scorer, unshaped).
    What a curriculum reads back from the training rollouts (`harness.baselines.Bandit`) and what says which groups
    were live on validity (`valid_live_share`); `harness.arms.train_policy` writes one file per training run."""

    model_config = ConfigDict(extra="forbid")
    seeds: list[int]
    levels: list[str]
    rewards: list[float]
    valid: list[bool] = Field(default_factory=list, description="per completion (empty in files written before it)")
    checkable: list[bool] = Field(default_factory=list, description="per completion: an answer the task could check "
                                  "(its failure, if any, is not one of the task's `format_failures`: not empty, "
                                  "unparseable or not a program); empty in files written before it")


def valid_live_share(batch: RewardBatch, group: int) -> float | None:
    """Share of the batch's groups (`group` consecutive completions of one prompt) live on VALIDITY, what the judge
    scores: a valid completion beside an invalid one that the task could CHECK (a wrong answer, not a malformed one;
    `RewardBatch.checkable`; batches written before it count any invalid one). Why not reward spread, the trainer's
    own live share: a shaped reward (partial credit, a format penalty, an optimal bonus) creates spread among answers
    that are all wrong (a held-out code scenario with partial credit 1.0: a hotter sampler's arm had 79% of its
    groups live by reward, 56% on validity, against the control's 25% and 10%). Why not a malformed answer beside a
    valid one: that contrast is the sampler's noise, not the task's, and a hotter sampler makes it at will (a held-out
    code scenario with groups of two: 1.0 -> 1.5 raised the live share from 5% to 21%, 70% of it valid beside
    malformed, and 240 steps at 1.5 then raised nothing while 1.0 gained 8 points; BENCHMARKS.md, sixty-fourth
    session). None when the batch has no validity or does not split into whole groups."""
    n = len(batch.valid)
    if group < 2 or n == 0 or n % group or n != len(batch.rewards):
        return None
    check = batch.checkable if len(batch.checkable) == n else [True] * n
    gs = [(batch.valid[i:i + group], check[i:i + group]) for i in range(0, n, group)]
    return sum(any(v) and any(not ok and c for ok, c in zip(v, cs, strict=True)) for v, cs in gs) / len(gs)


def write_reward_batches(path: Path, batches: list[RewardBatch]) -> Path:
    return _write_jsonl(path, batches)


def read_reward_batches(path: Path) -> list[RewardBatch]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [RewardBatch.model_validate_json(line) for line in fh if line.strip()]


# --- findings and the diagnosis ---------------------------------------------------------------------------------------

Severity = Literal["info", "warn", "critical"]


class Finding(BaseModel):
    """One diagnosed failure pattern. `code` is namespaced: `mapf.hole`, `grpo.dead_groups`, `evolved.<name>.<code>`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    code: str = Field(min_length=1, max_length=200)
    severity: Severity = "warn"
    count: int = Field(0, ge=0, le=2**63 - 1, description="a count SQLite can store")
    rate: float = Field(0.0, ge=-1e6, le=1e6, description="finite: NaN does not round-trip through JSON or SQLite")
    slice: dict[str, str] = Field(default_factory=dict, description="the slice it concerns, e.g. {'size': '5'}; {} = all")
    examples: list[str] = Field(default_factory=list, max_length=3, description="up to 3 abbreviated trajectories")
    knobs: list[Annotated[str, Field(max_length=200)]] = Field(
        default_factory=list, max_length=8, description="up to 8 knob paths it suggests (skills/model.py convention); "
        "bounded as `message` is: a promoted diagnostic's findings reach the engineer's prompt every stage")
    message: str = ""

    @field_validator("slice")
    @classmethod
    def _storable_slice(cls, v: dict[str, str]) -> dict[str, str]:
        """The store keeps a slice as `k=v,k=v` and reads each pair at its first '=': a ',' anywhere, an '=' in a key
        or an empty key could not be read back (an '=' in a value can: `range=<=5`)."""
        for k, x in v.items():
            if not k or "=" in k or any(ch in s for s in (k, x) for ch in ",\n"):
                raise ValueError(f"slice {k!r}={x!r}: a key must be non-empty without '='; neither may hold ',' or a "
                                 "newline (the store writes a slice as k=v,k=v)")
            if any(ord(ch) < 32 or 127 <= ord(ch) < 160 for s in (k, x) for ch in s):
                raise ValueError(f"slice {k!r}={x!r}: no control characters (a slice is shown in reasons, tags and "
                                 "the review)")
        return v


class DiagnosticResult(BaseModel):
    """What one diagnostic returns: findings and metrics (and, for evolved ones, the isolation it ran under)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    findings: list[Finding] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)
    error: str | None = None


class HistoryItem(BaseModel):
    """One past candidate as the engineer sees it: aggregate results only, never held-out instances."""

    model_config = ConfigDict(extra="forbid")
    stage: int
    candidate: str
    knob: str
    change: str
    verdict: str
    effect: float | None = None
    ci: tuple[float, float] | None = None
    reason: str = ""
    key: str = Field("", description="harness.engineer.proposal.change_key(state, change): the same experiment from "
                                     "the same harness state has the same key (the engineer never repeats a rejected one)")
    value: Any = Field(None, description="the change's value as proposed (a mixture's weights, a knob's number)")
    old: Any = Field(None, description="the knob's value before the change (None where not recorded)")
    spent: bool = Field(False, description="its test ended inconclusive with its evidence spent (final from this "
                                           "state): `ci` is what the whole plan could see")


class TargetSlice(BaseModel):
    """One value of the mixture's slice on the target: how the policy does there and how much the training mix and
    the target weigh it (shares normalised to sum 1 over the values)."""

    model_config = ConfigDict(extra="forbid")
    value: str
    n: int = Field(..., description="target rollouts in this slice (instances x samples)")
    instances: int | None = Field(None, description="distinct target instances among them (None in diagnoses "
                                  "written before it)")
    valid: float
    target_share: float = Field(..., description="the judge's share of this slice")
    mix_share: float = Field(..., description="the training mix's share of this slice (0: absent from the mix)")
    previous_valid: float | None = Field(None, description="valid here at the previous stage's target probe")
    entry_diff: dict[str, list[Any]] = Field(default_factory=dict, description="the fields of this slice's entry "
                                             "where the training mix differs from the target: {field: [mix, target]}")


class TargetView(BaseModel):
    """The policy on the TARGET (the judge's distribution, fixed at run start) on probe seeds, next to the training
    mix: the diagnosis' answer to "where does the target fail, and does the training mix cover it"."""

    model_config = ConfigDict(extra="forbid")
    slice_key: str = Field(..., description="the slice the mixture weighs (the task's difficulty slice)")
    overall: dict[str, float] = Field(default_factory=dict, description="valid, optimal, reward, n on the target")
    previous_valid: float | None = Field(None, description="overall target valid at the previous stage")
    train_valid: float | None = Field(None, description="the probe's valid rate on the training mix")
    slices: list[TargetSlice] = Field(default_factory=list, description="along slice_key, in slice order")
    by_slice: dict[str, dict[str, float]] = Field(default_factory=dict, description="every slice key: 'size=5' -> "
                                                  "{valid, n, ...} on the target")
    shares_from: str = Field("config", description="config: shares from the task's Mixture capability; rollouts: "
                             "estimated from the slices the rollouts drew")
    config: dict[str, Any] | None = Field(None, description="the target's generator config (the judge's distribution, "
                                          "as JSON): what `env.target` makes the training env")
    differs: list[str] = Field(default_factory=list, description="the ways the training env differs from the target, "
                               "in words, one per finer change (`harness.tasks.knobs.config_differences`)")
    mix_distance: float | None = Field(None, description="total variation between the mix's and the target's shares "
                                       "over every value of slice_key either has (the mix's weight on values the "
                                       "target lacks included); None in diagnoses written before it")
    mix_only: dict[str, float] = Field(default_factory=dict, description="the mix's shares on values of slice_key "
                                       "the target does not have")
    unmeasured: dict[str, float] = Field(default_factory=dict, description="target values of slice_key the probe "
                                         "drew no instance of, with their target shares (not in slices: nothing "
                                         "measured; an aim keeps their floor)")


class Diagnosis(BaseModel):
    """Everything the engineer gets: raw failure evidence, env stats, history (no round-0 default), bookkeeping."""

    model_config = ConfigDict(extra="forbid")
    task: str
    stage: int = Field(..., description="the round index (bookkeeping helps the engineer, per the paper)")
    state: str = Field("", description="hash of the harness state (its main commit) the diagnosis was made under")
    stages_left: int | None = None
    budget_left_s: float | None = None
    overall: dict[str, float] = Field(default_factory=dict, description="valid, optimal, reward on probe seeds")
    by_slice: dict[str, dict[str, float]] = Field(default_factory=dict, description="'size=5' -> {valid, n, ...}")
    findings: list[Finding] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict, description="diagnostics' metrics (failure rates by slice, "
                                      "dead groups, makespan gap, evolved.<name>.<metric>, ...)")
    diagnostic_errors: dict[str, str] = Field(default_factory=dict, description="diagnostic name -> why it failed")
    env_stats: dict[str, Any] = Field(default_factory=dict)
    env_config: dict[str, Any] = Field(default_factory=dict)
    recipe: dict[str, Any] = Field(default_factory=dict)
    history: list[HistoryItem] = Field(default_factory=list)
    consecutive_rejections: int = 0
    step_scale: float = Field(1.0, description="multiplier on change sizes; shrinks after repeated rejections")
    feedback: list[str] = Field(default_factory=list, description="what a person said at the human gate (revise) in "
                                "earlier stages, oldest first")
    target: TargetView | None = Field(None, description="the policy on the judge's distribution (probe seeds) next to "
                                      "the training mix; None when the stage rolled nothing out on it")
    diagnostics: dict[str, str] = Field(default_factory=dict, description="the harness's diagnostic files (path -> "
                                        "source) the stage ran: what an LLM engineer revises or adds beside")


# --- candidates, evidence, verdicts -----------------------------------------------------------------------------------

ChangeKind = Literal["env", "recipe", "reward", "diagnostic"]


class Change(BaseModel):
    """Exactly one factor. For env/recipe/reward: a knob path and its new value; for diagnostic: one file's source."""

    model_config = ConfigDict(extra="forbid")
    kind: ChangeKind
    knob: str = Field(..., description="env.<list>.<entry key>.<field> (one field of one mixture entry) | "
                      "recipe.temperature | reward.x | diagnostics/<n>.py")
    value: Any = Field(None, description="the new value (not a delta); None for a diagnostic")
    code: str | None = Field(None, description="diagnostic source, kind=diagnostic only")


class Candidate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    stage: int
    change: Change
    old_value: Any = None
    rationale: str
    expected: str = Field("", description="expected effect, one line")
    target_metric: str = "valid"
    skill: str | None = None
    engineer: str = "rule"

    @property
    def summary(self) -> str:
        """The one-line subject of its commit."""
        if self.change.kind == "diagnostic":
            return f"{self.change.knob}: add/revise diagnostic"
        if self.change.knob == "env.target":  # harness.tasks.knobs.TARGET: the value is a whole config
            return f"{self.change.knob}: train on the target's generator config"
        return f"{self.change.knob}: {self.old_value} -> {self.change.value}"


class Evidence(BaseModel):
    """Paired comparison of candidate vs control on the same fresh backtest instances."""

    model_config = ConfigDict(extra="forbid")
    metric: str = "valid"
    n: int
    control: float
    candidate: float
    effect: float
    ci_low: float
    ci_high: float
    by_slice: dict[str, dict[str, float]] = Field(default_factory=dict, description="slice -> effect, ci_low, ci_high, n")
    vetoes: list[str] = Field(default_factory=list)
    vetoes_void: list[str] = Field(default_factory=list, description="blocks that did not count, each with why: the "
                                   "veto failed the diagnostic judge's veto checks run again at the block "
                                   "(`harness.diagjudge.recheck_veto`: it blocks an A/A pair or a planted better arm "
                                   "now)")
    seeds: tuple[int, int] | None = Field(None, description="first and last backtest seed used (aggregate only)")
    samples: int = Field(1, description="completions per instance behind each outcome (k)")
    mde: float | None = Field(None, description="minimum detectable effect: the smallest true effect this decision "
                                                "promotes with 80% power at its n, variance and confidence")
    greedy_control: float | None = Field(None, description="greedy valid rate of the control arm (reported only)")
    greedy_candidate: float | None = Field(None, description="greedy valid rate of the candidate arm (reported only)")
    judge: str | None = Field(None, description="fingerprint of the judge and gate that scored it: evidence is pooled "
                                                "only under the same one")
    diffs: list[float] = Field(default_factory=list, description="this pair's paired differences, in look order "
                                                                 "(kept so a re-test can pool them)")
    slices: list[dict[str, str]] = Field(default_factory=list, description="this pair's instances' slices")
    clusters: list[str] = Field(default_factory=list, description="this pair's instances' problem labels (copies of "
                                "one problem share one: the gate counts problems); empty in evidence recorded before")
    pairs: int = Field(1, description="arm pairs pooled in the decision (1 + earlier inconclusive tests)")
    comparisons: int = Field(1, description="the Bonferroni count the decision was judged at (alpha / comparisons); "
                                            "a re-test pooling it is never judged at a larger share of alpha")
    stage_pairs: list[dict[str, list[Any]]] = Field(
        default_factory=list, description="earlier arm pairs of this same candidate in this same stage (a second pair "
        "for a backed candidate), oldest first, each {diffs, slices, clusters}: pooled like `diffs` by a later "
        "re-test")
    pooled: list[str] = Field(default_factory=list, description="earlier candidates whose evidence was pooled")
    live: dict[str, list[float]] = Field(
        default_factory=dict, description="for a change the learning-signal route reads: this pair's per-step "
        "live-group shares, {control, candidate}; a re-test's ratio reading pools them with its own")
    finished: dict[str, list[float]] = Field(
        default_factory=dict, description="for a longer completion budget the route reads: this pair's per-step "
        "shares of completions that ended within the budget, {control, candidate} (`harness.decisions."
        "finished_reading`); empty where the arms did not record them")
    stage_live: list[dict[str, list[float]]] = Field(
        default_factory=list, description="the live-group shares of this candidate's earlier arm pairs in this same "
        "stage (as `stage_pairs` for the target), oldest first: the ratio reading pools them, here and in a re-test")
    looks: list[dict[str, Any]] = Field(default_factory=list, description="every look: n, effect, bounds, decision")
    next_step: str | None = Field(None, description="where more evidence would come from (more_instances, new_pair, "
                                                    "stop: spent)")
    sign_chance: float | None = Field(None, description="at a futility stop: the chance the pooled estimate ends at or "
                                      "above 0 by the plan's end at the current estimate (`harness.sequential."
                                      "sign_chance`); a change whose learning signal is shown is not stopped while "
                                      "it is at least gate.futility (`harness.decisions.signal_lift`)")

    @property
    def pooled_n(self) -> int:
        """The instances behind `effect` and its interval: every pair and re-test pooled (the last look's n). `n`
        is this pair's alone (what `control`, `candidate` and `diffs` are of)."""
        return evidence_n(self.model_dump(include={"n", "looks"}))


def evidence_n(evidence: dict[str, Any]) -> int | None:
    """`Evidence.pooled_n` of an evidence dict (as stored): its last look's n, else its `n`. Every view that shows an
    effect with its interval shows this n beside it (an outside review, seventy-ninth session: the pair's n beside a
    pooled interval read up to 5x too small)."""
    looks = evidence.get("looks") or []
    last = looks[-1] if looks and isinstance(looks[-1], dict) else {}
    n = last.get("n", evidence.get("n"))
    return int(n) if isinstance(n, int | float) and not isinstance(n, bool) else None


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    candidate: str
    decision: Literal["promoted", "rejected", "inconclusive"]
    reason: str
    evidence: Evidence | None = None
    stage_reached: Literal["vet", "offline", "backtest"] = "backtest"
