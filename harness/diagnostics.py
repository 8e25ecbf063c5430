"""Diagnostics: plain functions over a stage's rollouts that return findings and metrics, and the Diagnosis bundle.

A diagnostic is `fn(rollouts: list[Rollout], ...) -> DiagnosticResult`. Built-ins cover any task family through what
its Task declares (failure breakdown by type along its difficulty slice with its failure -> knob hints, near misses,
the gap to optimal, the competence frontier) and GRPO health (dead groups,
exploration collapse, length collapse/explosion, reward hacking). Evolved diagnostics are files of the run's harness
repo (`diagnostics/<name>.py`, passed as a {path: source} dict); they run only in the sandbox runner, on rollouts as
JSON, and a broken one yields a `DiagnosticResult` with `error` instead of raising. An evolved file may define

    def diagnose(rollouts: list[dict]) -> {"findings": [{"code", "severity", "count", "rate", "slice", ...}],
                                           "metrics": {name: float}}
    def veto(control: dict, candidate: dict) -> str | None     # optional; a string blocks a promotion

Vetoes only ADD blocks (`run_vetoes`): nothing evolved can relax the gate.

    from harness.diagnostics import build_diagnosis, diagnosis_text
    d = build_diagnosis(task, stage, probe_rollouts, env_config, recipe, history, stages_left=3, budget_left_s=900)
    print(diagnosis_text(d))

Held-out hygiene: `build_diagnosis` accepts PROBE rollouts only and raises `SplitError` otherwise; examples carry
their seed (`seed=N`) and are re-checked before the bundle is returned.
"""

from __future__ import annotations

import ast
import json
import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

from harness.records import Diagnosis, DiagnosticResult, Finding, HistoryItem, Rollout, TargetSlice, TargetView, cut
from harness.seeds import SplitError, check_split, split_of
from harness.tasks.base import EnvStats, Instance, Mixture, TaskSpec
from harness.tasks.knobs import ENTRY, TARGET, config_differences, entry_diff_text, entry_differences
from sandbox.runner import Limits, RunResult, SandboxUnavailable, run_function

# --- thresholds -------------------------------------------------------------------------------------------------------

MASTERED = 0.9  # valid rate at or above which a difficulty slice counts as mastered
TOO_HARD = 0.05  # valid rate at or below which a difficulty slice counts as out of reach for now
MIN_SLICE_N = 4  # fewer rollouts, or distinct instances, than this in a slice: no verdict on its rate (samples of one
# instance move together: four of one problem are one draw of the slice, as `_fell` counts them)
MIN_FAILURE_RATE = 0.1  # a failure type below this share of its slice is not reported
MIN_FAILURE_COUNT = 2  # nor one seen fewer times than this (a single failure in a small slice is noise)
EXAMPLE_CHARS = 220  # abbreviated trajectory length
TARGET_FAILS = 0.5  # a target slice below this valid rate fails (finding target.slice_fails)
UNDER_WEIGHTED = 0.5  # a target slice the mix gives less than this fraction of its target share is under-weighted
ALL_FAIL = 0.95  # this share of the probe's groups failing every sample: the training mix is too hard
MIX_FAR = 0.3  # total variation distance between the mix's and the target's slice shares at which the mix misses it
FALL_Z = 2.0  # a target slice falls when its drop exceeds this many standard errors (instances, not samples) ...
FALL_MIN = 0.05  # ... and this much

DEAD_GROUP_KNOBS = ["recipe.temperature", "recipe.num_generations"]
COLLAPSE_KNOBS = ["recipe.temperature"]
# findings that blame the sampler's randomness (withheld when completions are cut off: cutting makes those symptoms)
SAMPLER_CODES = ("grpo.dead_identical", "grpo.exploration_collapse", "grpo.malformed")
MALFORMED = 0.2  # this share of answers that cannot be checked at all (the task's format failures): grpo.malformed
LENGTH_KNOBS = ["recipe.max_completion_length", "recipe.temperature"]


class DiagnosticError(ValueError):
    """Bad input to a diagnostic (not a failing evolved diagnostic: those give a DiagnosticResult with `error`)."""


# --- small helpers ----------------------------------------------------------------------------------------------------


def _task_of(rollouts: list[Rollout]) -> str:
    names = {r.instance.get("task", "") for r in rollouts}
    return names.pop() if len(names) == 1 else "task"


def _spec(rollouts: list[Rollout]) -> TaskSpec:
    """The registered task's spec of these rollouts (its slices, failure -> knob hints, near-miss rule); for a task that
    is not registered (evolved tests, foreign rollouts), a spec that knows nothing: no slices, no hints, no near miss."""
    from harness.tasks import get_task, known_task

    name = _task_of(rollouts)
    return get_task(name).spec if known_task(name) else TaskSpec(config_model=BaseModel, shaping_model=BaseModel,
                                                              instance_model=Instance, styles=(), alphabet="",
                                                              round0_env="")


def slice_keys_of(rollouts: list[Rollout]) -> tuple[str, ...]:
    """The task's slice keys, else every slice key the rollouts carry."""
    keys = tuple(_spec(rollouts).slice_keys)
    return keys or tuple(dict.fromkeys(k for r in rollouts for k in r.slices))


def _knobs(templates: Iterable[str], sl: dict[str, str]) -> list[str]:
    """Knob templates filled from a slice (`harness.tasks.knobs.fill`); a template that needs a slice key the finding
    does not have is skipped."""
    from harness.tasks.knobs import fill

    return [k for k in (fill(t, sl)[0] for t in templates) if k is not None]


def _rate(k: int, n: int) -> float:
    return round(k / n, 4) if n else 0.0


def _severity(rate: float, warn: float = 0.2, critical: float = 0.5) -> str:
    return "critical" if rate >= critical else "warn" if rate >= warn else "info"


def _order_key(value: str) -> tuple[int, str]:
    """Slice values in numeric order where they are numbers (3 < 10), else after them by name."""
    return (int(value), value) if value.isdigit() else (10**9, value)


def example(r: Rollout, chars: int = EXAMPLE_CHARS) -> str:
    """One abbreviated trajectory: seed, slices, failure and where, then the completion's start (one line)."""
    sl = " ".join(f"{k}={v}" for k, v in r.slices.items())
    where = " ".join(f"{k}={v}" for k, v in r.where.items())
    head = f"seed={r.seed} {sl} " + (f"failure={r.failure} {where}".strip() if r.failure else "valid")
    body = " ".join(r.completion.split())
    text = f"{head} | {body}"
    return text if len(text) <= chars else text[: chars - 3] + "..."


def _examples(rollouts: list[Rollout]) -> list[str]:
    return [example(r) for r in rollouts[:3]]


def groups(rollouts: list[Rollout]) -> dict[int, list[Rollout]]:
    out: dict[int, list[Rollout]] = defaultdict(list)
    for r in rollouts:
        out[r.group].append(r)
    return dict(out)


def slice_stats(rollouts: list[Rollout], key: str) -> dict[str, dict[str, float]]:
    """'<key>=<value>' -> {n, valid, optimal, reward} for each value of slice `key`."""
    by: dict[str, list[Rollout]] = defaultdict(list)
    for r in rollouts:
        if key in r.slices:
            by[r.slices[key]].append(r)
    out = {}
    for v in sorted(by, key=_order_key):
        rs = by[v]
        out[f"{key}={v}"] = {
            "n": float(len(rs)),
            "instances": float(len({r.seed for r in rs})),
            "valid": _rate(sum(r.valid for r in rs), len(rs)),
            "optimal": _rate(sum(r.optimal for r in rs), len(rs)),
            "reward": round(statistics.fmean(r.reward for r in rs), 4),
        }
    return out


def overall_stats(rollouts: list[Rollout]) -> dict[str, float]:
    if not rollouts:
        return {"n": 0.0}
    n = len(rollouts)
    return {
        "n": float(n),
        "valid": _rate(sum(r.valid for r in rollouts), n),
        "optimal": _rate(sum(r.optimal for r in rollouts), n),
        "reward": round(statistics.fmean(r.reward for r in rollouts), 4),
    }


def arm_metrics(rollouts: list[Rollout], slice_keys: Iterable[str] | None = None) -> dict[str, Any]:
    """Aggregate metrics of one arm (what vetoes see): overall valid/optimal/reward/n and `by_slice` (the task's
    slice keys by default)."""
    out: dict[str, Any] = overall_stats(rollouts)
    by: dict[str, dict[str, float]] = {}
    for k in (slice_keys if slice_keys is not None else slice_keys_of(rollouts)):
        by.update(slice_stats(rollouts, k))
    out["by_slice"] = by
    return out


# --- built-ins: task failures -----------------------------------------------------------------------------------------


def failure_breakdown(rollouts: list[Rollout], slice_key: str | None = None, min_rate: float = MIN_FAILURE_RATE,
                      min_count: int = MIN_FAILURE_COUNT) -> DiagnosticResult:
    """Failures by type within each slice of the difficulty slice (the task's): finding `<task>.<failure>` per slice
    with its rate, examples and the knobs the task's `failure_knobs` suggest."""
    task, t = _task_of(rollouts), _spec(rollouts)
    table = t.failure_knobs
    slice_key = slice_key or t.difficulty_slice or "all"
    by: dict[str, list[Rollout]] = defaultdict(list)
    for r in rollouts:
        by[r.slices.get(slice_key, "all")].append(r)
    findings, metrics = [], {}
    total = Counter(r.failure for r in rollouts if r.failure)
    for f, c in total.items():
        metrics[f"failure.{f}"] = _rate(c, len(rollouts))
    for v in sorted(by, key=_order_key):
        rs = by[v]
        fails: dict[str, list[Rollout]] = defaultdict(list)
        for r in rs:
            if r.failure:
                fails[r.failure].append(r)
        for f, bad in sorted(fails.items(), key=lambda kv: -len(kv[1])):
            rate = _rate(len(bad), len(rs))
            metrics[f"failure.{f}.{slice_key}={v}"] = rate
            if rate < min_rate or len(bad) < min_count:
                continue
            sl = {slice_key: v} if v != "all" else {}
            findings.append(Finding(
                code=f"{task}.{f}", severity=_severity(rate), count=len(bad), rate=rate, slice=sl,
                examples=_examples(bad), knobs=_knobs(table.get(f, []), sl),
                message=f"{len(bad)}/{len(rs)} rollouts fail with {f}",
            ))
    return DiagnosticResult(name="failure_breakdown", findings=findings, metrics=metrics)


def near_misses(rollouts: list[Rollout], slice_key: str | None = None) -> DiagnosticResult:
    """Almost solved (the task's `near_miss` rule on an invalid answer's metrics), or valid but not optimal. Findings
    `<task>.near_miss` and `<task>.suboptimal` (info) per slice: signal that is close to reward."""
    task = _task_of(rollouts)
    t = _spec(rollouts)
    slice_key = slice_key or t.difficulty_slice or "all"
    miss: dict[str, list[Rollout]] = defaultdict(list)
    subopt: dict[str, list[Rollout]] = defaultdict(list)
    n_by: Counter[str] = Counter()
    for r in rollouts:
        v = r.slices.get(slice_key, "all")
        n_by[v] += 1
        if not r.valid and t.near_miss(r.metrics):
            miss[v].append(r)
        if r.valid and not r.optimal:
            subopt[v].append(r)
    findings = []
    for code, table in (("near_miss", miss), ("suboptimal", subopt)):
        for v in sorted(table, key=_order_key):
            bad = table[v]
            sl = {slice_key: v} if v != "all" else {}
            findings.append(Finding(
                code=f"{task}.{code}", severity="info", count=len(bad), rate=_rate(len(bad), n_by[v]), slice=sl,
                examples=_examples(bad), knobs=[],
                message=t.near_miss_text if code == "near_miss" else t.suboptimal_text,
            ))
    metrics = {
        "near_miss": _rate(sum(map(len, miss.values())), len(rollouts)),
        "suboptimal": _rate(sum(map(len, subopt.values())), len(rollouts)),
    }
    return DiagnosticResult(name="near_misses", findings=findings, metrics=metrics)


def quality_gap(rollouts: list[Rollout], slice_key: str | None = None) -> DiagnosticResult:
    """Mean gap to optimal over valid answers (the task's `gap_metric` in `Outcome.metrics`, e.g. a plan's length
    gap), overall and per slice. Metrics only: the gap is what the `optimal` rate measures in aggregate. A task
    without a gap metric gets an empty result."""
    t = _spec(rollouts)
    name = t.gap_metric
    if not name:
        return DiagnosticResult(name="quality_gap")
    slice_key = slice_key or t.difficulty_slice or "all"
    gaps: dict[str, list[float]] = defaultdict(list)
    for r in rollouts:
        if r.valid and name in r.metrics:
            gaps[r.slices.get(slice_key, "all")].append(float(r.metrics[name]))
    metrics = {f"{name}.{slice_key}={v}": round(statistics.fmean(g), 4) for v, g in gaps.items()}
    allg = [g for gs in gaps.values() for g in gs]
    if allg:
        metrics[name] = round(statistics.fmean(allg), 4)
    return DiagnosticResult(name=name, metrics=metrics)


def competence_frontier(rollouts: list[Rollout], slice_key: str | None = None, mastered: float = MASTERED,
                        too_hard: float = TOO_HARD, min_n: int = MIN_SLICE_N) -> DiagnosticResult:
    """Valid rate per value of the difficulty slice: `<task>.mastered` (>= mastered), `<task>.too_hard` (<= too_hard)
    and `<task>.frontier` (between), with the task's `frontier_knob`. The first frontier value is the difficulty to
    train on next (metric `frontier_<slice>`)."""
    task = _task_of(rollouts)
    t = _spec(rollouts)
    slice_key = slice_key or t.difficulty_slice
    if not slice_key:
        return DiagnosticResult(name="competence_frontier")
    stats = slice_stats(rollouts, slice_key)
    findings, metrics = [], {}
    frontier_values = []
    for key, s in stats.items():
        v = key.split("=", 1)[1]
        metrics[f"valid.{key}"] = s["valid"]
        if min(s["n"], s["instances"]) < min_n:
            continue
        if s["valid"] >= mastered:
            code, sev, msg = "mastered", "info", "mastered: lower its share of the training mix, keep it above zero"
        elif s["valid"] <= too_hard:
            code, sev, msg = "too_hard", "info", "out of reach for now: little learning signal"
        else:
            code, sev, msg = "frontier", "warn", "at the competence frontier: most learning signal"
            frontier_values.append(v)
        sl = {slice_key: v}
        findings.append(Finding(code=f"{task}.{code}", severity=sev, count=int(s["n"]), rate=s["valid"], slice=sl,
                                knobs=_knobs([t.frontier_knob] if t.frontier_knob else [], sl),
                                message=f"valid {s['valid']:.2f}: {msg}"))
    if frontier_values:
        first = min(frontier_values, key=_order_key)
        if first.isdigit():
            metrics[f"frontier_{slice_key}"] = float(first)
    return DiagnosticResult(name="competence_frontier", findings=findings, metrics=metrics)


# --- built-ins: GRPO health -------------------------------------------------------------------------------------------


def dead_groups(rollouts: list[Rollout], train_metrics: list[dict[str, float]] | None = None,
                min_rate: float = 0.25) -> DiagnosticResult:
    """Groups (>= 2 samples of one prompt) with zero reward spread give GRPO no advantage: `grpo.dead_groups`; those
    whose samples are mostly one completion repeated (a sampler that does not explore) also `grpo.dead_identical`,
    the only dead groups a higher temperature revives. Probe rollouts with one sample per prompt have no groups; then
    the trainer's `dead_group_share` series is used."""
    gs = [g for g in groups(rollouts).values() if len(g) >= 2]
    dead = [g for g in gs if max(r.reward for r in g) - min(r.reward for r in g) <= 1e-9]
    all_valid = sum(all(r.valid for r in g) for g in dead)
    all_invalid = sum(not any(r.valid for r in g) for g in dead)
    identical = [g for g in dead if _duplicates(g) >= 0.5]
    rate = _rate(len(dead), len(gs))
    metrics = {"dead_groups": rate, "dead_all_valid": _rate(all_valid, len(gs)),
               "dead_all_invalid": _rate(all_invalid, len(gs)), "dead_identical": _rate(len(identical), len(gs)),
               "groups": float(len(gs))}
    findings = []
    train_share = _series(train_metrics, ("dead_group_share",))
    if train_share:
        metrics["train_dead_groups"] = round(statistics.fmean(train_share), 4)
    if not gs and train_share and metrics["train_dead_groups"] >= min_rate:
        share = metrics["train_dead_groups"]
        findings.append(Finding(
            code="grpo.dead_groups", severity=_severity(share, 0.25, 0.6), count=len(train_share), rate=share,
            knobs=list(DEAD_GROUP_KNOBS), message=f"{share:.0%} of training groups had zero reward spread",
        ))
    if gs and rate >= min_rate:
        # the temperature is a remedy only where the sampler repeats itself; diverse completions that all fail (a
        # sampler already too hot, or instances too hard) are not helped by more randomness
        sampler = 2 * len(identical) >= len(dead)
        findings.append(Finding(
            code="grpo.dead_groups", severity=_severity(rate, 0.25, 0.6), count=len(dead), rate=rate,
            examples=[example(g[0]) for g in dead[:3]],
            knobs=list(DEAD_GROUP_KNOBS) if sampler else [k for k in DEAD_GROUP_KNOBS if k not in COLLAPSE_KNOBS],
            message=f"{len(dead)}/{len(gs)} groups have zero reward spread "
                    f"({all_valid} all valid, {all_invalid} all invalid; {len(identical)} of them with mostly "
                    "identical completions)",
        ))
    share = _rate(len(identical), len(gs))
    if gs and share >= min_rate:
        findings.append(Finding(
            code="grpo.dead_identical", severity=_severity(share, 0.25, 0.6), count=len(identical), rate=share,
            examples=[example(g[0]) for g in identical[:3]], knobs=list(COLLAPSE_KNOBS),
            message=f"{len(identical)}/{len(gs)} groups are dead because their samples are (mostly) one completion "
                    "repeated: the sampler does not explore",
        ))
    return DiagnosticResult(name="dead_groups", findings=findings, metrics=metrics)


def malformed_answers(rollouts: list[Rollout], start: list[Rollout] | None = None,
                      min_rate: float = MALFORMED) -> DiagnosticResult:
    """Answers that cannot be checked at all (the task's `format_failures`: empty, unparseable, not a program) are a
    sampler drawing far into the tail: `grpo.malformed`, knob the temperature, a root cause for the engineer (every
    all-fail group and failing slice after it is its symptom). Family-neutral: the task names its format failures.

    With `start` (the stage's START policy on the same probe seeds at the same temperature) the rate is the lower of
    the two policies': a stage whose training broke the format (a collapsing learning rate) makes the trained policy's
    answers malformed but not the start's, and that is the regression finding's to say, not the sampler's."""
    fmt = set(_spec(rollouts).format_failures)
    if not rollouts or not fmt:
        return DiagnosticResult(name="malformed_answers", findings=[], metrics={})
    bad = [r for r in rollouts if r.failure in fmt]
    rate = _rate(len(bad), len(rollouts))
    metrics = {"malformed": rate}
    if start:
        metrics["malformed_start"] = _rate(sum(r.failure in fmt for r in start), len(start))
        rate = min(rate, metrics["malformed_start"])
    findings = []
    if rate >= min_rate:
        kinds = Counter(r.failure for r in bad)
        findings.append(Finding(
            code="grpo.malformed", severity=_severity(rate, min_rate, 0.5), count=len(bad), rate=rate,
            examples=_examples(bad), knobs=list(COLLAPSE_KNOBS),
            message=f"{len(bad)}/{len(rollouts)} answers cannot be checked at all ("
                    + ", ".join(f"{k} {c}" for k, c in kinds.most_common())
                    + (f"; {metrics['malformed_start']:.0%} of the stage's start policy's too" if start else "")
                    + "): the sampler draws far into the tail; every all-fail group it makes is a symptom"))
    return DiagnosticResult(name="malformed_answers", findings=findings, metrics=metrics)


def _duplicates(g: list[Rollout]) -> float:
    """Share of a group's completions that repeat another one (whitespace-normalised): 0 all distinct, 1 - 1/n all
    the same."""
    return 1 - len({" ".join(r.completion.split()) for r in g}) / len(g)


def exploration_collapse(rollouts: list[Rollout], min_rate: float = 0.3) -> DiagnosticResult:
    """Duplicate completions within a group (1 - unique/count, averaged over groups): `grpo.exploration_collapse`."""
    gs = [g for g in groups(rollouts).values() if len(g) >= 2]
    dup = [_duplicates(g) for g in gs]
    rate = round(statistics.fmean(dup), 4) if dup else 0.0
    findings = []
    if gs and rate >= min_rate:
        worst = sorted(zip(dup, range(len(gs))), reverse=True)[:3]
        findings.append(Finding(
            code="grpo.exploration_collapse", severity=_severity(rate, 0.3, 0.6), count=sum(d > 0 for d in dup),
            rate=rate, examples=[example(gs[i][0]) for _, i in worst], knobs=list(COLLAPSE_KNOBS),
            message=f"on average {rate:.0%} of a group's completions are duplicates",
        ))
    return DiagnosticResult(name="exploration_collapse", findings=findings, metrics={"duplicate_rate": rate})


LENGTH_KEYS = ("completion_length", "completions/mean_length", "mean_length")
CLIP_KEYS = ("completions/clipped_ratio", "clipped_ratio")
REWARD_KEYS = ("reward_mean", "reward", "rewards/mean")
VALID_KEYS = ("valid", "rewards/valid/mean")


def _series(history: list[dict[str, float]] | None, keys: Iterable[str]) -> list[float]:
    keys = tuple(keys)
    out = []
    for row in history or []:
        for k in keys:
            if k in row and row[k] is not None and not math.isnan(float(row[k])):
                out.append(float(row[k]))
                break
    return out


def _ends(xs: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last third of a series (robust to single noisy steps)."""
    k = max(1, len(xs) // 3)
    return statistics.fmean(xs[:k]), statistics.fmean(xs[-k:])


def length_health(rollouts: list[Rollout], train_metrics: list[dict[str, float]] | None = None,
                  collapse: float = 0.5, explosion: float = 2.0, clipped: float = 0.3) -> DiagnosticResult:
    """Length collapse (mean completion length falls below `collapse` x its start), explosion (above `explosion` x)
    and truncation: at least `clipped` of the stage's completions hit the completion budget before their end (the
    training metrics' clipped ratio, mean of the last third of the steps) while their length did not explode, so the
    budget is too short for what the policy writes rather than the policy rambling. Codes
    `grpo.length_collapse|length_explosion|truncated`. A completion that ends but is too long for the task (a
    task's own failure type, such as a plan over the step cap) is the task's finding, not this one."""
    metrics: dict[str, float] = {}
    findings = []
    if rollouts:
        metrics["mean_tokens"] = round(statistics.fmean(r.tokens for r in rollouts), 2)
    lengths = _series(train_metrics, LENGTH_KEYS)
    clip = _series(train_metrics, CLIP_KEYS)
    if len(lengths) >= 3:
        first, last = _ends(lengths)
        ratio = last / first if first > 0 else 1.0
        metrics["length_ratio"] = round(ratio, 4)
        if ratio <= collapse:
            findings.append(Finding(code="grpo.length_collapse", severity="warn", count=len(lengths),
                                    rate=round(ratio, 4), knobs=list(LENGTH_KNOBS),
                                    message=f"mean completion length fell from {first:.1f} to {last:.1f} tokens"))
        elif ratio >= explosion:
            findings.append(Finding(code="grpo.length_explosion", severity="warn", count=len(lengths),
                                    rate=round(ratio, 4), knobs=list(LENGTH_KNOBS),
                                    message=f"mean completion length rose from {first:.1f} to {last:.1f} tokens"))
    if clip:
        clip_rate = _ends(clip)[1] if len(clip) >= 3 else statistics.fmean(clip)
        metrics["clipped_ratio"] = round(clip_rate, 4)
        if clip_rate >= clipped and not any(f.code == "grpo.length_explosion" for f in findings):
            findings.append(Finding(
                code="grpo.truncated", severity="critical", count=len(clip),
                rate=round(clip_rate, 4), knobs=["recipe.max_completion_length"],
                message=f"{clip_rate:.0%} of the stage's completions hit the completion budget before their end "
                        "(truncated, scored as unfinished) while their length did not grow: the budget is shorter "
                        "than what the policy writes"))
    return DiagnosticResult(name="length_health", findings=findings, metrics=metrics)


def reward_is_validity(rollouts: list[Rollout]) -> bool:
    """Whether the scored rollouts' reward is a function of validity alone (one reward for every valid rollout, another
    for every invalid one): then reward and validity cannot diverge, and "reward up, validity down" is no hacking."""
    by_valid: dict[bool, set[float]] = defaultdict(set)
    for r in rollouts:
        by_valid[r.valid].add(round(float(r.reward), 9))
    return bool(rollouts) and all(len(v) == 1 for v in by_valid.values())


MISALIGNED_MIN = 4  # valid and invalid rollouts each, before their rewards are compared


def reward_misaligned(rollouts: list[Rollout], share: float = 0.1) -> DiagnosticResult:
    """The reward pays invalid completions at least as well as valid ones: `grpo.reward_misaligned` (critical), one
    stage's scored rollouts, no time series needed. Its rate is the share of invalid rollouts whose reward reaches the
    valid ones' mean; it fires when that share is at least `share` (with at least MISALIGNED_MIN of each). GRPO then
    raises the probability of those invalid completions inside their groups, so training on this reward moves the
    policy away from the goal however the mix or recipe is set: a root cause, fixed in the reward itself."""
    valid = [float(r.reward) for r in rollouts if r.valid]
    invalid = [float(r.reward) for r in rollouts if not r.valid]
    if len(valid) < MISALIGNED_MIN or len(invalid) < MISALIGNED_MIN:
        return DiagnosticResult(name="reward_misaligned", metrics={})
    bar = sum(valid) / len(valid)
    over = sum(1 for x in invalid if x >= bar - 1e-9)
    rate = over / len(invalid)
    metrics = {"valid_reward_mean": round(bar, 4), "invalid_reward_mean": round(sum(invalid) / len(invalid), 4),
               "invalid_outearning": round(rate, 4)}
    findings = []
    if bar > 0 and rate >= share:
        findings.append(Finding(
            code="grpo.reward_misaligned", severity="critical", count=over, rate=round(rate, 4),
            knobs=["reward.partial_credit", "reward.valid_reward"],
            message=f"{over} of {len(invalid)} invalid rollouts earn at least the valid ones' mean reward "
                    f"({bar:.3f}): training on this reward rewards invalid answers; pay partial credit below a "
                    "valid answer's reward, or none"))
    return DiagnosticResult(name="reward_misaligned", findings=findings, metrics=metrics)


DILUTED = 0.5  # partial credit's share of GRPO's within-group reward spread at which it drowns validity's
MIN_LIVE_GROUPS = 8  # live probe groups, before that share is read


def reward_diluted(rollouts: list[Rollout], share: float = DILUTED) -> DiagnosticResult:
    """Partial credit, not validity, makes most of GRPO's signal: `grpo.reward_diluted` (critical, a root cause).

    GRPO scales each group's advantages by the group's own reward spread, so every live group weighs alike, however
    small its spread. Within each live probe group the spread splits into the part validity explains (valid against
    invalid answers' means: the judge's own contrast) and the spread among CHECKABLE wrong answers (not the task's
    format failures: a format penalty is its own knob), which only partial credit creates. The rate is the second
    part's share, averaged over live groups; it fires at `share` or more (with MIN_LIVE_GROUPS live groups). Then the
    policy mostly learns to be wrong better, which a reward where wrong answers never out-earn right ones
    (`reward_misaligned` silent) still does: a held-out math scenario paying full partial credit lost 8.8
    points [+6.3, +11.5] to the binary reward over 3 seeds with no finding at all (its probes: 0.56-0.62; the same
    partial credit on code, no gap: 0.21-0.28). Never fires on a binary reward (no spread among wrong answers) or on
    spread among valid answers (a quality bonus)."""
    fmt = set(_spec(rollouts).format_failures)
    shares = []
    for g in groups(rollouts).values():
        if len(g) < 2:
            continue
        mean = statistics.fmean(float(r.reward) for r in g)
        between = sum(len(p) * (statistics.fmean(float(r.reward) for r in p) - mean) ** 2
                      for p in ([r for r in g if r.valid], [r for r in g if not r.valid]) if p)
        checkable = [float(r.reward) for r in g if not r.valid and r.failure not in fmt]
        wrong = sum((x - statistics.fmean(checkable)) ** 2 for x in checkable) if len(checkable) >= 2 else 0.0
        if between + wrong > 1e-12:
            shares.append(wrong / (between + wrong))
    if not shares:
        return DiagnosticResult(name="reward_diluted", metrics={})
    rate = statistics.fmean(shares)
    metrics = {"partial_credit_signal": round(rate, 4), "live_groups_scored": float(len(shares))}
    findings = []
    if rate >= share and len(shares) >= MIN_LIVE_GROUPS:
        findings.append(Finding(
            code="grpo.reward_diluted", severity="critical", count=len(shares), rate=round(rate, 4),
            knobs=["reward.partial_credit"],
            message=f"in {len(shares)} live groups, {rate:.0%} of the reward's spread is among wrong answers (partial "
                    f"credit) and {1 - rate:.0%} between right and wrong ones: GRPO mostly teaches being wrong "
                    "better; pay less partial credit, or none"))
    return DiagnosticResult(name="reward_diluted", findings=findings, metrics=metrics)


def reward_hacking(train_metrics: list[dict[str, float]] | None, valid_history: list[float] | None = None,
                   rise: float = 0.05, flat: float = 0.01, rollouts: list[Rollout] | None = None) -> DiagnosticResult:
    """Shaped reward rising while the valid rate stays flat or falls: `grpo.reward_hacking` (critical).

    The reward series is the per-step training reward (`reward` or TRL's `rewards/mean`); the valid series is the
    per-step valid rate of the same completions when the steps carry it (`valid`: `harness.backtest.train_arm` sets it
    from the reward's own scoring calls since the seventy-ninth session), else `valid_history` (past probe valid
    rates: other instances and samples than the reward's, whose noise between stages made an honestly improving
    policy look like a hacked reward in 36% of simulated stages; BENCHMARKS.md, seventy-eighth session). Given the
    stage's scored `rollouts`, it never fires when their reward is validity itself (`reward_is_validity`): a rising
    training reward with flat held-out validity then says the training mix is not the target, not that the reward
    pays for something else (the metric `reward_is_validity` says so)."""
    if rollouts is not None and reward_is_validity(rollouts):
        return DiagnosticResult(name="reward_hacking", metrics={"reward_is_validity": 1.0})
    rewards = _series(train_metrics, REWARD_KEYS)
    valid = _series(train_metrics, VALID_KEYS) or list(valid_history or [])
    if len(rewards) < 3 or len(valid) < 2:
        return DiagnosticResult(name="reward_hacking", metrics={})
    r0, r1 = _ends(rewards)
    v0, v1 = _ends(valid) if len(valid) >= 3 else (valid[0], valid[-1])
    metrics = {"reward_rise": round(r1 - r0, 4), "valid_rise": round(v1 - v0, 4)}
    findings = []
    if r1 - r0 >= rise and v1 - v0 <= flat:
        findings.append(Finding(
            code="grpo.reward_hacking", severity="critical", count=len(rewards), rate=round(r1 - r0, 4), knobs=[],
            message=f"reward rose {r0:.3f} -> {r1:.3f} while valid went {v0:.3f} -> {v1:.3f}: "
                    "the reward pays for something other than solving; revert or tighten the shaping",
        ))
    return DiagnosticResult(name="reward_hacking", findings=findings, metrics=metrics)


def builtin_codes(task: str, failure_types: Iterable[str]) -> set[str]:
    """Every finding code the built-ins can emit for a task (seed skills' triggers must use these)."""
    own = {f"{task}.{f}" for f in failure_types} | {f"{task}.{c}" for c in
                                                    ("near_miss", "suboptimal", "mastered", "frontier", "too_hard")}
    grpo = {"grpo.dead_groups", "grpo.dead_identical", "grpo.exploration_collapse", "grpo.length_collapse",
            "grpo.length_explosion", "grpo.truncated", "grpo.malformed", "grpo.reward_hacking", "grpo.reward_misaligned",
            "grpo.reward_diluted",
            "grpo.policy_regressed"}  # emitted by the loop's probe (harness/graph.py::node_probe), not a built-in
    return own | grpo | set(TARGET_CODES)


def builtin_diagnostics(rollouts: list[Rollout], train_metrics: list[dict[str, float]] | None = None,
                        valid_history: list[float] | None = None,
                        start: list[Rollout] | None = None) -> list[DiagnosticResult]:
    """All built-ins on one stage's rollouts; the task-aware ones read what the rollouts' Task declares. When the
    stage's completions are cut off (`grpo.truncated`), repeated completions are what cutting makes (a confident
    policy's first tokens agree), and answers cut short do not parse, not a sampler that does not explore or one too
    hot: the sampler findings (`grpo.dead_identical`, `grpo.exploration_collapse`, `grpo.malformed`) and the family's
    own format failures (its `format_failures`, as `<family>.<failure>`) are withheld (metric `sampler_findings_masked`), so the temperature
    is not moved against a budget defect (a held-out code scenario at 6 tokens promoted 1.0 -> 1.5 before its
    budget)."""
    out = [failure_breakdown(rollouts), near_misses(rollouts), quality_gap(rollouts), competence_frontier(rollouts),
           dead_groups(rollouts, train_metrics), exploration_collapse(rollouts), length_health(rollouts, train_metrics),
           malformed_answers(rollouts, start)]
    out.append(reward_hacking(train_metrics, valid_history, rollouts=rollouts))
    out.append(reward_misaligned(rollouts))
    out.append(reward_diluted(rollouts))
    # ... and the family's own format failures (`<family>.<a format failure>`): an answer cut short does not
    # parse either, and those codes trigger the same temperature cut (`lower-temperature-on-parse-errors`)
    fmt = [f"{_task_of(rollouts)}.{x}" for x in _spec(rollouts).format_failures] if rollouts else []
    withhold_under_cut_off(out, (*SAMPLER_CODES, *fmt), "sampler_findings_masked")
    return out


def withhold_under_cut_off(results: list[DiagnosticResult], codes: Iterable[str], metric: str) -> None:
    """When the stage's completions are cut off (`grpo.truncated` among `results`' findings), drop the findings of
    `codes` (symptoms the cut-off makes) from every result, marking each result that lost one with `metric`."""
    if not any(f.code == "grpo.truncated" for r in results for f in r.findings):
        return
    codes = set(codes)
    for r in results:
        kept = [f for f in r.findings if f.code not in codes]
        if len(kept) != len(r.findings):
            r.findings = kept
            r.metrics[metric] = 1.0


# --- the target: the judge's distribution next to the training mix ---------------------------------------------------

TARGET_CODES = ("target.slice_fails", "target.uncovered", "target.underweighted", "target.mastered", "target.falling",
                "target.mix_all_fail", "target.mix_far", "target.entry_differs", "target.differs")


def _shares(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {k: (v / total if total > 0 else 0.0) for k, v in weights.items()}


def _instance_shares(rollouts: list[Rollout], key: str) -> dict[str, float]:
    """Each value's share of the distinct instances (seeds) the rollouts drew."""
    seen = {r.seed: r.slices.get(key) for r in rollouts if key in r.slices}
    return _shares(dict(Counter(v for v in seen.values() if v is not None)))


def _instances(rollouts: list[Rollout]) -> int:
    return len({r.seed for r in rollouts})


def target_view(task: Any, target: list[Rollout], target_config: Any, train_config: Any,
                previous: list[Rollout] | None = None, train_valid: float | None = None) -> TargetView:
    """The policy on the target, per slice, next to the training mix. Shares come from the task's `Mixture`
    capability (the configs' weights along its difficulty slice); without it they are estimated from the slices of the
    instances drawn (the target's from `target`, the training mix's are then unknown and taken as the target's)."""
    key = task.spec.difficulty_slice or (task.spec.slice_keys[0] if task.spec.slice_keys else "")
    diffs: dict[str, dict[str, list[Any]]] = {}
    if isinstance(task, Mixture):
        tshare, mshare, src = _shares(task.mixture(target_config)), _shares(task.mixture(train_config)), "config"
        if task.spec.entry_key:
            diffs = entry_differences(train_config, target_config, task.spec.entry_key)
    else:
        tshare = _instance_shares(target, key) if key else {}
        mshare, src = dict(tshare), "rollouts"
    stats = slice_stats(target, key) if key else {}
    prev = slice_stats(previous, key) if key and previous else {}
    values = sorted({*tshare, *(k.split("=", 1)[1] for k in stats)}, key=_order_key)
    slices, unmeasured = [], {}
    for v in values:
        st = stats.get(f"{key}={v}")
        if st is None:  # a target value the rollouts did not draw (a small share): nothing measured, its share kept
            if tshare.get(v, 0.0) > 0:
                unmeasured[v] = round(tshare[v], 4)
            continue
        p = prev.get(f"{key}={v}")
        slices.append(TargetSlice(value=v, n=int(st["n"]), instances=int(st["instances"]), valid=st["valid"],
                                  target_share=round(tshare.get(v, 0.0), 4),
                                  mix_share=round(mshare.get(v, 0.0), 4), previous_valid=p["valid"] if p else None,
                                  entry_diff=diffs.get(v, {})))
    by_slice: dict[str, dict[str, float]] = {}
    for k in slice_keys_of(target):
        by_slice.update(slice_stats(target, k))
    every = {*tshare, *mshare}  # a mix value the target lacks is weight spent off the target: it counts too
    distance = 0.5 * sum(abs(mshare.get(v, 0.0) - tshare.get(v, 0.0)) for v in every)
    mix_only = {v: round(w, 4) for v, w in sorted(mshare.items(), key=lambda x: _order_key(x[0]))
                if v not in tshare and w > 0}
    return TargetView(slice_key=key, overall=overall_stats(target), slices=slices, by_slice=by_slice,
                      previous_valid=overall_stats(previous)["valid"] if previous else None, train_valid=train_valid,
                      shares_from=src, config=target_config.model_dump(mode="json"),
                      differs=config_differences(train_config, target_config, task.spec.entry_key),
                      mix_distance=round(distance, 4), mix_only=mix_only, unmeasured=unmeasured)


def _fell(now: float, n_now: int, before: float, n_before: int) -> bool:
    """A drop from `before` to `now` beyond FALL_Z standard errors of two independent proportions (counted over
    instances, the conservative unit when each instance has several correlated samples) and at least FALL_MIN."""
    se = math.sqrt(now * (1 - now) / max(1, n_now) + before * (1 - before) / max(1, n_before))
    return before - now >= FALL_MIN and before - now > FALL_Z * max(se, 1e-9)


def _target_where(view: TargetView) -> str:
    return ", ".join(f"{view.slice_key}={s.value} {s.valid:.2f}" for s in view.slices) or "nothing measured"


def target_findings(view: TargetView | None, probe: list[Rollout], previous: list[Rollout] | None = None,
                    target: list[Rollout] | None = None, train_metrics: list[dict[str, float]] | None = None,
                    min_n: int = MIN_SLICE_N) -> DiagnosticResult:
    """Where the target fails and whether the training mix covers it (codes `target.*`, slices along the mixture's
    slice): `slice_fails` (valid below TARGET_FAILS; rate = 1 - valid), `uncovered` (the mix gives it no weight),
    `underweighted` (less than UNDER_WEIGHTED of its target share, and not mastered), `mastered` (valid >= MASTERED
    while the mix still trains on it; rate = valid), `falling` (valid fell since the previous stage's target probe
    beyond noise while the training reward rose; rate = the drop), `entry_differs` (the mix's entry for a target slice
    the policy has not mastered is made differently from the target's: other field values, listed; rate = 1 - valid),
    `differs` (the training env is not the target's generator config: critical when it differs in two or more ways,
    `harness.tasks.knobs.config_differences`, so no finer knob reaches it; rate = 1 - valid on the target),
    and `mix_all_fail` from the training mix's probe:
    ALL_FAIL of its groups fail every sample (the mix is too hard: no learning signal; rate = that share)."""
    findings: list[Finding] = []
    metrics: dict[str, float] = {}
    gs = [g for g in groups(probe).values() if len(g) >= 2]
    all_fail = _rate(sum(not any(r.valid for r in g) for g in gs), len(gs))
    metrics["train_all_fail_groups"] = all_fail
    if gs and all_fail >= ALL_FAIL:
        where = f"; on the target: {_target_where(view)}" if view is not None else ""
        findings.append(Finding(
            code="target.mix_all_fail", severity="critical", count=len(gs), rate=all_fail,
            examples=_examples([g[0] for g in gs[:3]]),
            message=f"the training mix is too hard: {all_fail:.0%} of {len(gs)} probe groups fail every sample "
                    f"(probe valid {overall_stats(probe)['valid']:.3f}), so GRPO gets no signal{where}"))
    if view is None:
        return DiagnosticResult(name="target", findings=findings, metrics=metrics)
    metrics["target_valid"] = view.overall.get("valid", 0.0)
    rewards = _series(train_metrics, REWARD_KEYS)
    rise = _ends(rewards)[1] - _ends(rewards)[0] if len(rewards) >= 3 else None
    by_value = defaultdict(list)
    for r in target or []:
        by_value[r.slices.get(view.slice_key)].append(r)
    prev_by = defaultdict(list)
    for r in previous or []:
        prev_by[r.slices.get(view.slice_key)].append(r)
    k = view.slice_key
    tv = view.mix_distance if view.mix_distance is not None else \
        0.5 * sum(abs(s.mix_share - s.target_share) for s in view.slices)
    metrics["target_mix_distance"] = round(tv, 4)
    target_valid = view.overall.get("valid", 0.0)
    if tv >= MIX_FAR and target_valid < MASTERED:
        shares = ", ".join([f"{k}={s.value} {s.mix_share:.2f} vs {s.target_share:.2f}" for s in view.slices]
                           + [f"{k}={v} {w:.2f} vs 0.00 (not in the target)" for v, w in view.mix_only.items()])
        findings.append(Finding(
            code="target.mix_far", severity="critical", count=sum(s.n for s in view.slices), rate=round(tv, 4),
            knobs=["env.mixture"],
            message=f"the training mix is far from the target: total variation {tv:.2f} between their {k} shares "
                    f"(mix vs target: {shares}) while the target's valid is {target_valid:.2f}: the policy learns a "
                    "distribution it is not judged on; re-weight the mix before tuning GRPO on it"))
    if view.differs and view.config is not None and target_valid < MASTERED:
        # the training env is not the judge's distribution in more than one way: no single finer change (the weights,
        # one entry, one field) reaches it, and the one change that does, train on the target, is the first
        # experiment a careful person runs (critical: the finer findings are then its parts); one way only: that
        # finer change is this one already (warn)
        findings.append(Finding(
            code="target.differs", severity="critical" if len(view.differs) >= 2 else "warn",
            count=sum(s.n for s in view.slices), rate=round(1 - target_valid, 4), knobs=[TARGET],
            message=f"the training env is not the target in {len(view.differs)} way(s): {'; '.join(view.differs)}; "
                    f"the target's valid is {target_valid:.2f}. {TARGET} trains on the target itself (every "
                    "difference at once)"))
    for s in view.slices:
        metrics[f"target.valid.{k}={s.value}"] = s.valid
        if min(s.n, s.instances if s.instances is not None else s.n) < min_n:
            continue
        sl = {k: s.value}
        cover = (f"the training mix gives it {s.mix_share:.2f} of its weight (the target {s.target_share:.2f})"
                 if s.mix_share > 0 else f"the training mix does NOT cover it (target share {s.target_share:.2f})")
        what = f"target {k}={s.value}: valid {s.valid:.2f} over {s.n} rollouts; {cover}"
        ex = _examples([r for r in by_value.get(s.value, []) if not r.valid])
        if s.valid < TARGET_FAILS:
            findings.append(Finding(code="target.slice_fails", severity="critical" if s.valid <= TOO_HARD else "warn",
                                    count=s.n, rate=round(1 - s.valid, 4), slice=sl, examples=ex,
                                    knobs=["env.mixture"], message=what))
        if s.target_share > 0 and s.mix_share == 0:
            findings.append(Finding(code="target.uncovered", severity="critical" if s.valid < TARGET_FAILS else "warn",
                                    count=s.n, rate=round(1 - s.valid, 4), slice=sl, examples=ex,
                                    knobs=["env.mixture"], message=what))
        elif s.mix_share < UNDER_WEIGHTED * s.target_share and s.valid < MASTERED:
            findings.append(Finding(code="target.underweighted", severity="warn", count=s.n,
                                    rate=round(1 - s.valid, 4), slice=sl, examples=ex, knobs=["env.mixture"],
                                    message=what))
        if s.entry_diff and s.mix_share > 0 and s.valid < MASTERED:
            made = entry_diff_text(s.entry_diff)
            findings.append(Finding(
                code="target.entry_differs", severity="critical" if s.valid < TARGET_FAILS else "warn", count=s.n,
                rate=round(1 - s.valid, 4), slice=sl, examples=ex, knobs=[ENTRY],
                message=f"{what}; the mix's {k}={s.value} instances are not the target's: {made}. Re-weighting cannot "
                        f"fix that; {ENTRY} makes this entry the target's (its weight kept)"))
        if s.valid >= MASTERED and s.mix_share > 0:
            findings.append(Finding(code="target.mastered", severity="info", count=s.n, rate=s.valid, slice=sl,
                                    knobs=["env.mixture"], message=what + ": mastered, the mix can train elsewhere"))
        if s.previous_valid is not None and rise is not None and rise > 0 and _fell(
                s.valid, _instances(by_value.get(s.value, [])), s.previous_valid,
                _instances(prev_by.get(s.value, []))):
            findings.append(Finding(
                code="target.falling", severity="critical", count=s.n, rate=round(s.previous_valid - s.valid, 4),
                slice=sl, examples=ex, knobs=["env.mixture"],
                message=f"target {k}={s.value} fell from {s.previous_valid:.2f} to {s.valid:.2f} since the last stage "
                        f"while the training reward rose {rise:+.3f}: the mix trains away from the target; {cover}"))
    return DiagnosticResult(name="target", findings=findings, metrics=metrics)


# --- evolved diagnostics (sandboxed) ----------------------------------------------------------------------------------

# Evolved code runs under bubblewrap only, unless the run config says otherwise in so many words
# (`sandbox.allow_unisolated_diagnostics`, applied by the loop at run start with `allow_unisolated`).
_REQUIRE_BWRAP = [True]


def allow_unisolated(allowed: bool) -> None:
    """Let evolved diagnostics fall back to a plain subprocess when bubblewrap is missing (default: refuse)."""
    _REQUIRE_BWRAP[0] = not allowed


def _sandboxed(source: str, function: str, args: list[Any], limits: Limits):
    """run_function under the loop's isolation policy; a missing bubblewrap is a failed run of the code, not a crash."""
    try:
        return run_function(source, function, args=args, limits=limits, require_bwrap=_REQUIRE_BWRAP[0])
    except SandboxUnavailable as exc:
        return RunResult(status="error", isolation="process", error=f"refused: {exc}")


DIAGNOSTIC_LIMITS = Limits(cpu_s=5, wall_s=10.0, memory_mb=512, processes=4, output_bytes=200_000)

# Appended to an evolved file's source and called in the same sandbox job (one process per file and use). It only
# shapes the call; the file can redefine these names, which gains it nothing: its vetoes can only block.
_DRIVER = '''

def __evotrainer_diagnose__(rollouts):
    return diagnose(rollouts)


def __evotrainer_veto__(control_rollouts, candidate_rollouts, control, candidate):
    fn = globals().get("veto")
    if not callable(fn):
        return {"has_veto": False, "reason": None}
    if callable(globals().get("diagnose")):
        control = dict(control, diagnostic=diagnose(control_rollouts).get("metrics", {}))
        candidate = dict(candidate, diagnostic=diagnose(candidate_rollouts).get("metrics", {}))
    return {"has_veto": True, "reason": fn(control, candidate)}
'''


def diagnostic_name(path: str) -> str:
    """`diagnostics/reward_hacking.py` -> `reward_hacking` (raises for anything that is not such a path)."""
    m = re.fullmatch(r"diagnostics/([a-z_][a-z0-9_]*)\.py", path)
    if not m:
        raise DiagnosticError(f"evolved diagnostic path {path!r} must look like diagnostics/<snake_case_name>.py")
    return m.group(1)


def _rollout_json(rollouts: list[Rollout]) -> list[dict[str, Any]]:
    return [r.model_dump(mode="json") for r in rollouts]


_CODE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_METRIC = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=-]{0,63}")  # a finding code's characters, and `=` (`<slice>=<value>_fail`)
MAX_EVOLVED_FINDINGS, MAX_EVOLVED_METRICS = 64, 64  # what one evolved diagnostic may report a run
MESSAGE_CHARS = 500  # a finding's message as the engineer reads it, every stage: long enough to say why, no longer
SLICE_CHARS = 60  # a slice's key and value together: a category of instances, never an instance's text


def _parse_result(name: str, value: Any) -> DiagnosticResult:
    """Validate an evolved diagnostic's JSON answer; codes are namespaced `evolved.<name>.<code>`. Anything the loop
    could not store, re-read or show (a non-list `findings`, a non-dict `metrics`, a code that is not an identifier,
    a count past 64 bits, a NaN rate, a slice the store cannot key) is a DiagnosticError naming it: the diagnostic's
    fault, never the loop's crash. (Examples are checked for held-out instances where they reach the engineer,
    `build_diagnosis`: the diagnostic judge runs it on held-out rollouts on purpose.)"""
    if not isinstance(value, dict) or not set(value) <= {"findings", "metrics"}:
        raise DiagnosticError('diagnose() must return {"findings": [...], "metrics": {...}}, got '
                              f"{type(value).__name__} {str(value)[:120]}")
    raw_findings, raw_metrics = value.get("findings") or [], value.get("metrics") or {}
    if not isinstance(raw_findings, list):
        raise DiagnosticError(f"`findings` must be a list, got {type(raw_findings).__name__}")
    if not isinstance(raw_metrics, dict):
        raise DiagnosticError(f"`metrics` must be an object (name -> number), got {type(raw_metrics).__name__}")
    if len(raw_findings) > MAX_EVOLVED_FINDINGS or len(raw_metrics) > MAX_EVOLVED_METRICS:
        raise DiagnosticError(f"{len(raw_findings)} findings and {len(raw_metrics)} metrics: at most "
                              f"{MAX_EVOLVED_FINDINGS} findings and {MAX_EVOLVED_METRICS} metrics a run (each is a row "
                              "of the run's store and a line of the engineer's prompt, every stage)")
    findings = []
    for f in raw_findings:
        if not isinstance(f, dict) or not f.get("code"):
            raise DiagnosticError(f"each finding must be a dict with a `code`, got {str(f)[:120]}")
        if not isinstance(f["code"], str) or not _CODE.fullmatch(f["code"]):
            raise DiagnosticError(f"finding code {str(f['code'])[:80]!r} must be an identifier (letters, numbers, "
                                  "'_', '.', '-'; at most 64 characters)")
        examples = f.get("examples") or []
        if not isinstance(examples, list):
            raise DiagnosticError(f"finding {f['code']}: `examples` must be a list of strings, got "
                                  f"{type(examples).__name__}")
        f = dict(f)
        f["code"] = f"evolved.{name}.{f['code']}"
        f["examples"] = [str(e)[:EXAMPLE_CHARS] for e in examples][:3]
        if isinstance(f.get("message"), str):
            f["message"] = f["message"][:MESSAGE_CHARS]
        if isinstance(f.get("slice"), dict) and any(len(str(k)) + len(str(v)) > SLICE_CHARS
                                                    for k, v in f["slice"].items()):
            raise DiagnosticError(f"finding {f['code']}: a slice key and value of at most {SLICE_CHARS} characters "
                                  "(a slice names a category of instances, never one instance's text)")
        if isinstance(f.get("count"), bool):
            raise DiagnosticError(f"finding {f['code']}: `count` must be a whole number, got {f['count']!r}")
        try:
            finding = Finding.model_validate(f)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise DiagnosticError(f"finding {f['code']}: {where}: {first['msg']}") from None
        if finding.severity != "info" and finding.count <= 0 and finding.rate <= 0:
            # it says nothing fired: the diagnostic judge does not test such a finding, so it must not lead the
            # engineer's list as a warning either
            finding = finding.model_copy(update={"severity": "info"})
        findings.append(finding)
    metrics = {}
    for k, v in raw_metrics.items():
        if not isinstance(k, str) or not _METRIC.fullmatch(k):  # printed into the engineer's prompt as it is
            raise DiagnosticError(f"metric name {str(k)[:80]!r} must be an identifier (letters, numbers, '_', '.', "
                                  "'-', '='; at most 64 characters)")
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise DiagnosticError(f"metric {str(k)[:80]!r} must be a finite number, got {str(v)[:80]!r}")
        metrics[k] = float(v)
    return DiagnosticResult(name=f"evolved.{name}", findings=findings, metrics=metrics)


def borne_out(f: Finding, rollouts: list[Rollout]) -> Finding:
    """An evolved finding as the engineer may see it live: a warning on a slice that fails no more often than the rest
    in the very rollouts it read (one per instance) is shown as info, marked so. The diagnostic judge tested the
    file's findings on held-out data; this stops a file that stayed silent there and says something else live (it can
    tell a replay from the live probe) from leading the engineer with a claim its own input contradicts."""
    if f.severity == "info" or not f.slice:
        return f
    units: dict[int, Rollout] = {}
    for r in rollouts:
        units.setdefault(r.seed, r)
    inside = [r for r in units.values() if all(r.slices.get(k) == v for k, v in f.slice.items())]
    rest = [r for r in units.values() if r not in inside]
    if not inside or not rest:
        return f
    fail_in = sum(not r.valid for r in inside) / len(inside)
    fail_rest = sum(not r.valid for r in rest) / len(rest)
    if fail_in > fail_rest:
        return f
    return f.model_copy(update={"severity": "info", "message": cut(
        f"NOT BORNE OUT by the rollouts it read (this slice fails {fail_in:.2f}, the rest {fail_rest:.2f}): "
        + f.message, MESSAGE_CHARS)})


def run_evolved(path: str, source: str, rollouts: list[Rollout], limits: Limits | None = None) -> DiagnosticResult:
    """Run one evolved diagnostic in the sandbox runner on `rollouts`. Never raises for the diagnostic's own faults
    (exception, loop, memory, bad output): those come back as `DiagnosticResult(error=...)`."""
    name = diagnostic_name(path)
    res = _sandboxed(source + _DRIVER, "__evotrainer_diagnose__", [_rollout_json(rollouts)],
                     limits or DIAGNOSTIC_LIMITS)
    if res.status != "ok":
        return DiagnosticResult(name=f"evolved.{name}", error=f"{res.status}: {res.error} ({res.isolation})")
    try:
        return _parse_result(name, res.value)
    except (DiagnosticError, ValueError, TypeError, AttributeError) as exc:  # belt and braces: never the loop's crash
        return DiagnosticResult(name=f"evolved.{name}", error=f"bad output: {exc}")


def run_evolved_all(files: dict[str, str] | None, rollouts: list[Rollout],
                    limits: Limits | None = None) -> list[DiagnosticResult]:
    """Every `diagnostics/*.py` in `files` (other paths are ignored), in path order."""
    return [run_evolved(p, src, rollouts, limits) for p, src in sorted((files or {}).items())
            if p.startswith("diagnostics/") and p.endswith(".py")]


def _defines(source: str, fn: str) -> bool:
    """Whether `source` defines a top-level function `fn`. Unparseable source counts as defining it, so it still goes
    to the sandbox, fails there and blocks."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return True
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == fn:
            return True
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(isinstance(t, ast.Name) and t.id == fn for tg in targets for t in ast.walk(tg)):
                return True
        if isinstance(n, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == fn for a in n.names):
            return True
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign,
                              ast.AugAssign, ast.Import, ast.ImportFrom, ast.Expr)):
            return True  # top-level control flow (if/try/for/...) could bind it: run it to find out
    return False


def veto_one(path: str, source: str, control_rollouts: list[Rollout], candidate_rollouts: list[Rollout],
             control_metrics: dict[str, Any], candidate_metrics: dict[str, Any],
             limits: Limits | None = None) -> str | None:
    """One file's veto, in the sandbox: None (no veto defined, or it lets the candidate through) or a block reason.
    A veto that fails to run BLOCKS (`<name>: veto failed: ...`): a check that cannot run cannot vouch for a
    candidate; the vet step already ran it on cached rollouts, so this only happens on new trouble."""
    name = diagnostic_name(path)
    if not _defines(source, "veto"):  # nothing to run (parsing does not execute the code)
        return None
    res = _sandboxed(source + _DRIVER, "__evotrainer_veto__",
                     [_rollout_json(control_rollouts), _rollout_json(candidate_rollouts), control_metrics,
                      candidate_metrics], limits or DIAGNOSTIC_LIMITS)
    if res.status != "ok":
        return f"{name}: veto failed: {res.status}: {res.error}"
    if not isinstance(res.value, dict) or "reason" not in res.value:  # the driver's shape, unless the code replaced it
        return f"{name}: veto failed: bad output: expected the veto driver's {{'reason': ...}}, got " \
               f"{type(res.value).__name__}"
    reason = res.value["reason"]
    if reason is None:
        return None
    return f"{name}: {' '.join(str(reason).split())[:300]}"


def run_vetoes(files: dict[str, str] | None, control_rollouts: list[Rollout], candidate_rollouts: list[Rollout],
               control_metrics: dict[str, Any], candidate_metrics: dict[str, Any],
               limits: Limits | None = None) -> list[str]:
    """Block reasons from every evolved diagnostic that defines `veto` (the gate adds them; they can only block).
    Metric dicts are `arm_metrics(...)`-shaped; each file's own `diagnose` metrics are added as `diagnostic`."""
    out = []
    for path, src in sorted((files or {}).items()):
        if path.startswith("diagnostics/") and path.endswith(".py"):
            reason = veto_one(path, src, control_rollouts, candidate_rollouts, control_metrics, candidate_metrics,
                              limits)
            if reason:
                out.append(reason)
    return out


# --- the Diagnosis bundle ---------------------------------------------------------------------------------------------

ROUND0 = ("default", "round-0", "round0")  # history entries naming the round-0 default are dropped
_SEED_RE = re.compile(r"seed=(\d+)")


def _dump(x: Any) -> dict[str, Any]:
    """A model or dict as plain JSON data (int dict keys become strings), so the Diagnosis round-trips exactly."""
    return json.loads(x.model_dump_json() if isinstance(x, BaseModel) else json.dumps(dict(x or {}), default=str))


def check_examples(findings: list[Finding]) -> None:
    """Held-out hygiene: no example may show a backtest or test instance (examples carry `seed=N`)."""
    for f in findings:
        for e in f.examples:
            for s in _SEED_RE.findall(e):
                if split_of(int(s)) in ("backtest", "test"):
                    raise SplitError(f"finding {f.code} shows a {split_of(int(s))} instance (seed {s}): held-out "
                                     "hygiene violated; diagnose on probe rollouts only")


def _consecutive_rejections(history: list[HistoryItem]) -> int:
    n = 0
    for h in reversed(history):
        if h.verdict != "rejected":
            break
        n += 1
    return n


def build_diagnosis(task: Any, stage: int, rollouts: list[Rollout], env_config: Any, recipe: Any,
                    history: list[HistoryItem], stages_left: int | None, budget_left_s: float | None,
                    train_metrics: list[dict[str, float]] | None = None,
                    diagnostics_files: dict[str, str] | None = None, valid_history: list[float] | None = None,
                    shaping: Any = None, state: str = "", env_stats_n: int = 64,
                    env_stats: dict[str, Any] | None = None, rejections_before_fallback: int = 3,
                    step_shrink: float = 0.5, target: list[Rollout] | None = None, target_config: Any = None,
                    previous_target: list[Rollout] | None = None,
                    start_rollouts: list[Rollout] | None = None, fallbacks: int | None = None) -> Diagnosis:
    """Everything the engineer sees, built from PROBE rollouts only (raises `SplitError` otherwise).

    `task` is the Task object (its `env_stats(config, n)` when it has that capability, `EnvStats`); `env_config` and `recipe`
    are models or dicts (recipe.yaml's `reward:` section, or `shaping`, becomes `recipe["reward"]`); `history` is past
    candidates (round-0 default entries are dropped); `valid_history` is the past stages' held-out valid rates
    (aggregate only) for the reward-hacking check; `state` is the harness state hash (Diagnosis.state).

    `target` are rollouts of the same policy on the judge's distribution `target_config` (probe seeds too), and
    `previous_target` the previous stage's: the diagnosis then shows the target per slice next to the training mix
    (`Diagnosis.target`) and reports where it fails and whether the mix covers it (`target_findings`).
    `start_rollouts` are the stage's start policy on the probe seeds (the probe's comparison): `grpo.malformed` asks
    both policies, so a format the stage's training broke is not blamed on the sampler."""
    if not rollouts:
        raise DiagnosticError("build_diagnosis needs probe rollouts; got none (run the probe node first)")
    check_split([r.seed for r in rollouts], "probe")
    cfg = env_config if isinstance(env_config, BaseModel) else task.spec.config_model.model_validate(env_config)
    view = None
    if target:
        check_split([r.seed for r in target] + [r.seed for r in previous_target or []], "probe")
        tcfg = target_config if isinstance(target_config, BaseModel) or target_config is None else \
            task.spec.config_model.model_validate(target_config)
        view = target_view(task, target, tcfg if tcfg is not None else cfg, cfg, previous_target,
                           overall_stats(rollouts)["valid"])
    if start_rollouts:
        check_split([r.seed for r in start_rollouts], "probe")
    results = builtin_diagnostics(rollouts, train_metrics, valid_history, start_rollouts)
    results.append(target_findings(view, rollouts, previous_target, target, train_metrics))
    # the probe decodes under the same cut-off budget, so its all-fail groups say the budget, not the mix; a mix still
    # too hard shows again once the budget is raised (as the sampler findings in `builtin_diagnostics`)
    withhold_under_cut_off(results, ["target.mix_all_fail"], "mix_all_fail_masked")
    for res in run_evolved_all(diagnostics_files, rollouts):
        try:
            check_examples(res.findings)
        except SplitError as exc:  # the file's fault (its text names a held-out seed): its result is an error
            res = DiagnosticResult(name=res.name, error=f"bad output: {exc}")
        results.append(res.model_copy(update={"findings": [borne_out(f, rollouts) for f in res.findings]}))
    findings = [f for res in results for f in res.findings]
    sev = {"critical": 0, "warn": 1, "info": 2}
    findings.sort(key=lambda f: (sev[f.severity], -f.rate))
    check_examples(findings)
    by_slice: dict[str, dict[str, float]] = {}
    for key in slice_keys_of(rollouts):
        by_slice.update(slice_stats(rollouts, key))
    metrics: dict[str, float] = {}
    for res in results:
        for k, v in res.metrics.items():
            metrics.setdefault(f"{res.name}.{k}" if res.name.startswith("evolved.") else k, v)
    rec = _dump(recipe)
    if shaping is not None:
        rec["reward"] = _dump(shaping)
    hist = [h for h in history if h.candidate not in ROUND0 and h.verdict not in ROUND0]
    c = _consecutive_rejections(hist)
    return Diagnosis(
        task=task.name, stage=stage, state=state, stages_left=stages_left, budget_left_s=budget_left_s,
        overall=overall_stats(rollouts), by_slice=by_slice, findings=findings, metrics=metrics,
        diagnostic_errors={res.name: res.error for res in results if res.error},
        env_stats=env_stats if env_stats is not None else
        _dump(task.env_stats(cfg, env_stats_n)) if isinstance(task, EnvStats) else {},
        env_config=_dump(cfg), recipe=rec,
        # each fallback shrinks the engineer's steps: the loop's count (`fallbacks`: stages without a winner, an
        # inconclusive one too, every `rejections_before_fallback` of them, since the last promotion); without it,
        # every that many rejected verdicts in a row (a stage's two candidates counted twice, an inconclusive one
        # breaking the run: an outside review found the two counts apart, the log saying "smaller changes next"
        # while the steps stayed whole)
        history=hist, consecutive_rejections=c,
        step_scale=step_shrink ** (fallbacks if fallbacks is not None else c // max(1, rejections_before_fallback)),
        target=view, diagnostics=dict(sorted((diagnostics_files or {}).items())),
    )


def _num(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def _compact(d: dict[str, Any]) -> str:
    return json.dumps(d, separators=(",", ":"), sort_keys=True, default=str)


def target_text(t: TargetView) -> list[str]:
    """The target block of the diagnosis text: overall, then one row per value of the mixture's slice (the target's
    share, the training mix's share, valid, rollouts, valid at the previous stage), then the target's other slices."""
    o = t.overall
    prev = f" (previous stage {t.previous_valid:.3f})" if t.previous_valid is not None else ""
    train = f"; the training mix's probe: valid={t.train_valid:.3f}" if t.train_valid is not None else ""
    lines = [(f"target (the judge's distribution, probe seeds): valid={_num(o.get('valid', 0.0))}{prev} "
              f"n={int(o.get('n', 0))}{train}"),
             f"  {t.slice_key:>8}  target  mix    valid  n     prev" + ("  (shares estimated from the rollouts)"
                                                                        if t.shares_from == "rollouts" else "")]
    for s in t.slices:
        pv = f"{s.previous_valid:.2f}" if s.previous_valid is not None else "-"
        lines.append(f"  {s.value:>8}  {s.target_share:.2f}    {s.mix_share:.2f}   {s.valid:.2f}   {s.n:<5} {pv}"
                     + ("  NOT IN THE MIX" if s.mix_share == 0 and s.target_share > 0 else ""))
    others = [f"{k}: valid={_num(v['valid'])} n={int(v['n'])}" for k, v in t.by_slice.items()
              if not k.startswith(f"{t.slice_key}=")]
    if others:
        lines.append("  target by other slices: " + "; ".join(others))
    return lines


def diagnosis_text(d: Diagnosis, max_findings: int = 12) -> str:
    """The diagnosis as a compact text block for an LLM engineer: raw failure evidence, env config and stats, history,
    bookkeeping. No free-text self-summary (it crowds out raw evidence, per the paper)."""
    o = d.overall
    budget = _num(d.budget_left_s) if d.budget_left_s is not None else None
    lines = [f"task: {d.task}  round: {d.stage}  stages_left: {d.stages_left}  budget_left_s: {budget}",
             "overall (probe): " + " ".join(f"{k}={_num(o[k])}" for k in ("valid", "optimal", "reward", "n") if k in o)]
    if d.by_slice:
        lines.append("by slice:")
        for k, s in d.by_slice.items():
            lines.append(f"  {k}: valid={_num(s['valid'])} optimal={_num(s['optimal'])} n={int(s['n'])}")
    if d.target is not None:
        lines += target_text(d.target)
    lines.append(f"findings ({len(d.findings)}):" if d.findings else "findings: none")
    for f in d.findings[:max_findings]:
        sl = " ".join(f"{k}={v}" for k, v in f.slice.items()) or "all"
        knobs = f" knobs: {', '.join(f.knobs)}" if f.knobs else ""
        lines.append(f"- [{f.severity}] {f.code} ({sl}): count={f.count} rate={_num(f.rate)}{knobs}"
                     + (f"  {f.message}" if f.message else ""))
        for e in f.examples[:2]:
            lines.append(f"    e.g. {e}")
    if len(d.findings) > max_findings:
        lines.append(f"  (+{len(d.findings) - max_findings} more findings)")
    overall_metrics = {k: v for k, v in d.metrics.items() if "=" not in k}  # per-slice ones are in the findings
    if overall_metrics:
        lines.append("metrics: " + " ".join(f"{k}={_num(v)}" for k, v in sorted(overall_metrics.items())))
    for name, why in d.diagnostic_errors.items():
        lines.append(f"diagnostic error: {name}: {why}")
    lines.append("env config:")
    for k, v in d.env_config.items():
        if isinstance(v, list) and all(isinstance(e, dict) for e in v):  # e.g. one line per keyed entry
            lines += [f"  {k}: " + " ".join(f"{a}={_compact(b) if isinstance(b, list | dict) else b}"
                                              for a, b in e.items()) for e in v]
        else:
            lines.append(f"  {k}: {_compact(v) if isinstance(v, list | dict) else v}")
    if d.env_stats:
        lines.append("env stats: " + _compact(d.env_stats))
    lines.append("recipe: " + _compact(d.recipe))
    lines.append(f"history ({len(d.history)} past candidates):" if d.history else "history: none yet")
    for h in d.history:
        eff = f" effect={h.effect:+.3f}" if h.effect is not None else ""
        ci = f" ci=[{h.ci[0]:+.3f},{h.ci[1]:+.3f}]" if h.ci else ""
        lines.append(f"- round {h.stage} {h.candidate}: {h.knob} {h.change} -> {h.verdict}{eff}{ci}"
                     + (f" ({h.reason})" if h.reason else ""))
    for fb in d.feedback:
        lines.append(f"human reviewer feedback ({fb.split(':', 1)[0]}): {fb.split(':', 1)[-1].strip()}")
    lines.append(f"bookkeeping: round={d.stage} stages_left={d.stages_left} consecutive_rejections="
                 f"{d.consecutive_rejections} step_scale={_num(d.step_scale)}")
    return "\n".join(lines)
