"""The rule engineer (the default; no LLM): findings -> applicable skills -> concrete single-factor changes.

For each finding, a skill applies when the finding's code is among its trigger codes and its condition holds. The
condition is a tiny expression over the finding's `rate`, `count` and `severity` (`rate >= 0.2 and count > 3`,
`severity == 'critical'`), evaluated by `skills.library.condition_holds`, which walks its syntax tree (comparisons,
and/or/not, constants; typed and bounded by `check_condition`); nothing is ever `eval`-ed. A skill that fails
anywhere in here (a condition an older library stored, a template that breaks) is skipped with a note naming it: one
skill costs itself, never the proposal.

The skill's intervention template (`env.<list>.{<slice>}.<field>`, op add/mul/set, value)
becomes a concrete Change: `{<slice>}` from the finding's slice, the step scaled by the diagnosis' `step_scale`, the new
value clamped to the knob's range. A whole-mixture skill (`env.mixture`, op `mix`, value the aim) becomes the training
mix re-weighted from the diagnosis' target view (`mixture_toward`), moved `step_scale` of the way. A whole-entry
skill (`env.entry`, op `adopt`) makes the finding's slice's entry the target's; a whole-target skill (`env.target`, op
`adopt`, value `target` or `frontier`) makes the training env the target's generator config (`target_toward`).

Choice: Thompson sampling over each skill's promotion record, Beta(1 + promotions, 1 + tries - promotions), one draw
per skill from the caller's seeded rng; in-family skills (domains include the task, or no domains) rank before any
other family's, which only fill slots left when in-family options are exhausted. A change already rejected from the
same harness state (same state + knob + value) is never proposed again.

    from harness.engineer.rule import propose_rule
    cands, notes = propose_rule(diagnosis, hits.in_family, hits.fallback, max_candidates=2, rng=np.random.default_rng(0), space=space)
"""

from __future__ import annotations

import fnmatch
from typing import Any

import numpy as np

from harness.engineer.aims import AIMS, FLOOR, TARGET_AIMS, _goal, target_change, target_toward  # noqa: F401 - re-exported
from harness.engineer.proposal import Knob, change_key, current_mixture, make_candidate, refuted_same_intent, vet_error
from harness.records import RECURRING, Candidate, Change, Diagnosis, Finding
from harness.tasks.knobs import ENTRY, MIXTURE, TARGET, canonical_mixture, fill
from skills.library import SkillError, condition_holds
from skills.model import SEVERITY_MAX, Skill

# --- matching ---------------------------------------------------------------------------------------------------------


def matches(skill: Skill, finding: Finding, borrowed: bool) -> bool:
    """The skill's trigger fires on this finding: its code matches a trigger (fnmatch wildcards allowed; a borrowed
    skill also matches by the failure kind after the family prefix, as `SkillLibrary.applicable` does) and the
    trigger condition holds on the finding's rate/count/severity (`skills.library.condition_holds`: an AST walk over
    comparisons, never eval)."""
    kind = finding.code.split(".", 1)[-1]
    hit = any(fnmatch.fnmatchcase(finding.code, t) or (borrowed and t.split(".", 1)[-1] == kind)
              for t in skill.trigger.findings)
    return hit and condition_holds(skill.trigger.condition,
                                   {"rate": finding.rate, "count": finding.count, "severity": finding.severity})


# --- templates -> concrete changes ------------------------------------------------------------------------------------


# Family-neutral knobs a skill may name (skills.model): resolved through the run's Task.
SYMBOLIC_KNOBS = {"@frontier": "frontier_knob"}


def resolve_knob(template: str, task: str | None) -> str | None:
    """A skill's knob template for this task: `@frontier` becomes the task's frontier knob template (None when the
    task has none); any other template is returned as it is."""
    if template not in SYMBOLIC_KNOBS:
        return template
    from harness.tasks import get_task, known_task

    if task is None or not known_task(task):
        return None
    return getattr(get_task(task).spec, SYMBOLIC_KNOBS[template])  # a TaskSpec field


# --- the whole mixture: where to move it ------------------------------------------------------------------------------

def mixture_toward(diagnosis: Diagnosis, aim: str, step_scale: float = 1.0) -> tuple[dict[str, float], Any] | str:
    """The training mix moved toward `aim` (AIMS), `step_scale` of the way from the current weights (1: all the way),
    as a canonical mixture ({slice value: weight}, sum 1), with the current weights; or why it cannot. Needs the
    diagnosis' target view and a task with the `Mixture` capability."""
    cur_raw = current_mixture(diagnosis)
    if cur_raw is None:
        return f"task {diagnosis.task} has no weighted mixture"
    view = diagnosis.target
    if view is None or not view.slices:
        return "the diagnosis has no target rollouts per slice"
    cur = canonical_mixture(cur_raw)
    goal = _goal(view, cur, aim)
    if isinstance(goal, str):
        return goal
    g = canonical_mixture(goal) if sum(goal.values()) > 0 else None
    if g is None:
        return "the target view gives no slice any weight"
    s = min(max(step_scale, 0.0), 1.0)
    new = canonical_mixture({v: (1 - s) * cur.get(v, 0.0) + s * g.get(v, 0.0) for v in {*cur, *g}})
    if new == cur:
        return f"the mix already is {new}"
    return new, cur_raw


def adopt_entry(name: str, knob: str, finding: Finding, diagnosis: Diagnosis | None) -> tuple[Change, Any] | str:
    """The finding's slice made the target's (`env.entry`): every field of its entry where the training mix differs
    from the target set to the target's value, its weight kept; or why it cannot."""
    if knob != ENTRY or diagnosis is None or diagnosis.target is None:
        return f"{name}: op adopt takes knob {ENTRY} and a diagnosis with a target view"
    value = finding.slice.get(diagnosis.target.slice_key)
    hit = [s for s in diagnosis.target.slices if s.value == value]
    if value is None or not hit or not hit[0].entry_diff:
        return f"{name}: the target's {diagnosis.target.slice_key}={value} entry is the mix's already"
    diff = hit[0].entry_diff
    return (Change(kind="env", knob=ENTRY, value={value: {f: t for f, (_, t) in diff.items()}}),
            {value: {f: m for f, (m, _) in diff.items()}})


def adopt_target(name: str, aim: Any, diagnosis: Diagnosis | None) -> tuple[Change, Any] | str:
    """The training env made the target's generator config as a whole (`env.target`, `target_toward`); or why it
    cannot."""
    made = target_change(diagnosis, aim)
    return f"{name}: {made}" if isinstance(made, str) else made


def _rounded(new: float, k: Knob) -> float | int:
    """A knob's new value as proposed: whole for an integer knob, else six significant figures (a learning rate of
    6.25e-5 stays 6.25e-5; six decimals made it 6.3e-5 and a rate below 5e-7 zero)."""
    return round(new) if k.integer else float(f"{new:.6g}")


def severity(skill: Skill, finding: Finding) -> float:
    """How many times its own step a skill takes for this finding (`Intervention.scale_with_rate`): the finding's
    rate over the skill's reference rate, between 1 and SEVERITY_MAX; 1 for a skill without one or a rate that is not
    a positive number."""
    ref = skill.intervention.scale_with_rate
    rate = finding.rate
    if ref is None or not isinstance(rate, (int, float)) or not rate > 0:
        return 1.0
    return float(min(SEVERITY_MAX, max(1.0, rate / ref)))


def instantiate(skill: Skill, finding: Finding, space: dict[str, Knob], step_scale: float, task: str | None = None,
                diagnosis: Diagnosis | None = None) -> tuple[Change, Any] | str:
    """The concrete change a skill makes for a finding, with the old value; or a string saying why it cannot. A
    whole-mixture skill (op `mix`) needs the `diagnosis` (its target view and env config)."""
    iv = skill.intervention
    if iv.op == "adopt":
        if iv.knob == TARGET:
            return adopt_target(skill.name, iv.value, diagnosis)
        return adopt_entry(skill.name, iv.knob, finding, diagnosis)
    if iv.op == "mix":
        if iv.knob != MIXTURE or diagnosis is None:
            return f"{skill.name}: op mix takes knob {MIXTURE} and a diagnosis"
        made = mixture_toward(diagnosis, str(iv.value), step_scale)
        if isinstance(made, str):
            return f"{skill.name}: {MIXTURE} toward {iv.value}: {made}"
        return Change(kind="env", knob=MIXTURE, value=made[0]), made[1]
    template = resolve_knob(iv.knob, task)
    if template is None:
        return f"{skill.name}: task {task} has no knob for {iv.knob}"
    knob, missing = fill(template, finding.slice)
    if knob is None:
        return f"{skill.name}: knob {template} needs slice key(s) {missing} the finding {finding.code} lacks"
    if skill.kind == "diagnostic" or iv.op == "code":
        if not iv.code:
            return f"{skill.name}: diagnostic skill without code"
        if diagnosis is not None and (done := next((h for h in diagnosis.history if h.verdict == "promoted"
                                                    and h.knob == knob), None)) is not None:
            # merged already: proposing it again only fails the vet ("unchanged") and takes a slot every stage
            return f"{skill.name}: {knob} is already in the harness (promoted at stage {done.stage})"
        return Change(kind="diagnostic", knob=knob, code=iv.code), None
    if knob not in space:
        return f"{skill.name}: knob {knob} is not in this harness' knob space"
    k = space[knob]
    if not isinstance(iv.value, (int, float)):
        return f"{skill.name}: intervention value {iv.value!r} is not a number"
    cur = float(k.current)
    scale = step_scale * severity(skill, finding)
    if iv.op == "add":
        new = cur + float(iv.value) * scale
    elif iv.op == "mul":
        v = float(iv.value)
        # a growth by v takes 1 + (v - 1) x scale; a shrink is its mirror, a division by 1 + (1 / v - 1) x scale
        # (a halving at twice the reference rate divides by 3, at SEVERITY_MAX by 4), so no scale drives a positive
        # knob to zero or below, as the growth's formula applied to a factor under 1 would (0.5 at scale 2: x0)
        new = cur * (1.0 + (v - 1.0) * scale) if v >= 1.0 or v <= 0.0 else cur / (1.0 + (1.0 / v - 1.0) * scale)
    else:  # set
        new = float(iv.value)
    if iv.stop_at is not None and new != cur:
        stop = float(iv.stop_at)
        if new < cur <= stop or new > cur >= stop:
            return f"{skill.name}: {knob} is {k.current:g}, already at or past the skill's stop ({stop:g})"
        new = max(new, stop) if new < cur else min(new, stop)
    new = min(max(new, k.lo), k.hi)
    value = _rounded(new, k)
    if value == k.current:
        return f"{skill.name}: {knob} stays {k.current:g} (at its bound or step too small)"
    return Change(kind=k.kind, knob=knob, value=value), k.current


# --- a step too small for the gate ------------------------------------------------------------------------------------

MAX_EXTENSIONS = 3  # at most 2**3 = 8 times a skill's own step


def extend_spent(diagnosis: Diagnosis, skill: Skill, change: Change, old: Any, space: dict[str, Knob],
                 rejected: set[str]) -> tuple[Change, str] | None:
    """The same skill's change with its step doubled, when the change it makes now already had its test from this
    state end spent with a positive lower bound: better than the control with the gate's confidence, but not
    promoted (a gate with `promote_above` = min_effect, a slice not yet clear, or too few instances differing). A
    careful experimenter reads that as "right direction, step too small for the effect to show in one arm's
    training" (a sampling temperature raised from 0.05 to 0.25 on collapsed groups: +0.048 [+0.004, +0.091] over three
    pairs, under the earlier bar) and tries a larger step, not the same one again (which the history forbids)
    nor nothing (the knob stays broken for the rest of the run). The doubled step is a new change with a test of its
    own, so the gate's error control is untouched. Doubling is in the skill's own space: the offset for `add`, the
    factor (a power of it) for `mul`; clipped to the knob's range; repeated while the doubled change was itself spent
    positive, at most MAX_EXTENSIONS times. None when the earlier test was not spent positive (refuted, a harmed slice
    or vetoed, or a negative estimate), the knob is not numeric, or the step reaches a bound or a refuted change."""
    if change.kind == "diagnostic" or change.knob not in space or skill.intervention.op not in ("add", "mul"):
        return None
    k = space[change.knob]
    if not isinstance(old, (int, float)) or not isinstance(change.value, (int, float)):
        return None
    cur, value = float(old), float(change.value)
    spent = {h.key: h for h in diagnosis.history if h.spent and h.ci is not None and h.ci[0] > 0}
    why = spent.get(change_key(diagnosis.state, change))
    if why is None:
        return None
    for times in range(1, MAX_EXTENSIONS + 1):
        nv = _larger(skill.intervention.op, cur, value, times, k, skill.intervention.stop_at)
        if nv is None:
            return None
        bigger = Change(kind=change.kind, knob=change.knob, value=nv)
        key = change_key(diagnosis.state, bigger)
        if key in spent:
            why = spent[key]
            continue
        if key in rejected:
            return None
        return bigger, (f"{why.candidate}'s {why.change} ended spent at {why.effect:+.3f} "
                        f"[{why.ci[0]:+.3f}, {why.ci[1]:+.3f}] (better than the control, not promoted): "
                        f"the step x{2 ** times}")
    return None


def _larger(op: str, cur: float, value: float, times: int, k: Knob, stop: float | None = None) -> float | int | None:
    """The step from `cur` to `value` made 2**times as large in the skill's own space (the offset for add, the factor
    for mul), clipped to the skill's `stop_at` (`stop`, as `instantiate` clips its own step: a raised temperature
    never past 1.5) and to the knob's range, rounded as proposed; None where a factor is undefined or the result is no
    new value (a bound or the stop reached)."""
    if op == "add":
        new = cur + (value - cur) * 2 ** times
    elif cur > 0 and value > 0:
        new = cur * (value / cur) ** (2 ** times)
    else:
        return None
    if stop is not None:
        new = min(new, float(stop)) if value > cur else max(new, float(stop)) if value < cur else new
    nv = _rounded(min(max(new, k.lo), k.hi), k)
    return None if nv in (k.current, value) else nv


def press_on(diagnosis: Diagnosis, skill: Skill, finding: Finding, change: Change, old: Any,
             space: dict[str, Knob], rejected: set[str]) -> tuple[Change, str] | None:
    """The same skill's change with its step doubled once for each promotion that already moved this knob the same
    way in this run, when the recurring critical finding that calls for it (`harness.records.RECURRING`: the
    stage's training lowered the policy again) is back. A careful experimenter who halved a collapsing learning rate,
    saw the half win its test and then saw training at the half collapse the policy again, cuts harder next rather
    than by the same half once a stage (from 1e-3 the 1e-4 that trains is 3.3 halvings away: one stage each at best,
    and no trained checkpoint is kept until then; BENCHMARKS.md, "A third family: code scenarios"). Like
    `extend_spent`, a line search that grows its step while the direction keeps being confirmed; the larger step is a
    new change with its own test, so the gate's error control is untouched. Counted: the run's promoted changes of
    the knob, newest first, while each ends at the value the next one started from and moved the same way as this
    change (so a promotion the other way, or a value set by hand in between, ends the count); doubled at most
    MAX_EXTENSIONS times, clipped to the knob's range. None when nothing qualifies, the knob is not numeric, or the
    larger step reaches a bound or a change already rejected from this state."""
    op = skill.intervention.op
    if finding.code not in RECURRING or change.kind == "diagnostic" or op not in ("add", "mul"):
        return None
    if change.knob not in space or not isinstance(old, (int, float)) or not isinstance(change.value, (int, float)):
        return None
    k = space[change.knob]
    cur, value = float(old), float(change.value)
    way = (value > cur) - (value < cur)
    promoted = sorted((h for h in diagnosis.history if h.verdict == "promoted" and h.knob == change.knob
                       and isinstance(h.value, (int, float)) and isinstance(h.old, (int, float))),
                      key=lambda h: h.stage, reverse=True)
    times, at = 0, cur
    for h in promoted:
        if not np.isclose(float(h.value), at, rtol=1e-6, atol=0.0) or ((h.value > h.old) - (h.value < h.old)) != way:
            break
        times, at = times + 1, float(h.old)
    if times == 0 or way == 0:
        return None
    times = min(times, MAX_EXTENSIONS)
    nv = _larger(op, cur, value, times, k, skill.intervention.stop_at)
    if nv is None:
        return None
    bigger = Change(kind=change.kind, knob=change.knob, value=nv)
    if change_key(diagnosis.state, bigger) in rejected or vet_error(diagnosis, bigger):
        return None
    return bigger, (f"{change.knob} was moved this way and promoted {times} time(s) in this run and {finding.code} "
                    f"is back: the step x{2 ** times}")


# --- choosing ---------------------------------------------------------------------------------------------------------

_SEV = {"critical": 0, "warn": 1, "info": 2}


def thompson_scores(skills: list[Skill], rng: np.random.Generator) -> dict[str, float]:
    """One Beta(1 + promotions, 1 + tries - promotions) draw per skill; the skills imported from other libraries and
    not yet tried in this one share ONE Beta(1, 1) draw (ties among them broken by a small draw of their own): what
    they claim never ranks, and together they are one untried hypothesis, not thirty (thirty untried catch-all
    imports, each with a draw of its own, took the first slot from a seed with 5 of 5 promotions in 85% of stages;
    an outside review, eighty-second session). Without such imports the draws are as before."""
    out, shared = {}, None
    for s in skills:
        if untried_import(s):
            if shared is None:
                shared = float(rng.beta(1, 1))
            out[s.name] = shared + 1e-6 * float(rng.random())
            continue
        p, t = s.evidence.promotions, max(s.evidence.tries, s.evidence.promotions)
        out[s.name] = float(rng.beta(1 + p, 1 + t - p))
    return out


def untried_import(skill: Skill) -> bool:
    """A skill imported from a file that this library has no try of yet: stamped `import`, or carrying another
    library's claim (an exported run-born skill keeps its provenance `run` when imported elsewhere)."""
    return (skill.provenance.source == "import" or skill.imported is not None) and skill.evidence.tries == 0


# root causes come first: the stage's own training lowered the probe; the reward pays invalid answers as well as valid
# ones, or spreads wrong ones more than it separates right from wrong; the sampler writes answers that cannot be
# checked at all, or the completion budget cuts answers off before their end while their length did not grow (the
# all-fail groups follow either way: the diagnosis already withholds the sampler findings under a cut-off budget); the
# training mix is too hard to learn from at all, far from the target, or its entries are not the target's (its GRPO
# health findings are then symptoms of training on the wrong reward or distribution)
ROOT_CAUSES = ("grpo.policy_regressed", "grpo.reward_misaligned", "grpo.reward_diluted", "grpo.malformed",
               "grpo.truncated", "target.mix_all_fail", "target.mix_far", "target.entry_differs")
# ranked before every other root cause when critical: the training env is not the target in two or more ways, so the
# finer changes (the weights, one entry) each fix a part, and the one that fixes them all (train on the target) is the
# reference point the parts are measured against; tested first, a finer change beside it in a two-candidate stage.
# A warning (one way only: the finer change is this one already) ranks as any warning, after the root causes
WHOLE_FIRST = ("target.differs",)


def _options_of(skill: Skill, borrowed: bool, findings: list[Finding], diagnosis: Diagnosis, space: dict[str, Knob],
                theta: dict[str, float], notes: list[str]) -> list[tuple[tuple, Skill, Finding, Change, Any]]:
    """The changes one skill offers for these findings (ranked by the sort key), with notes on what it cannot do."""
    out = []
    for fi, f in enumerate(findings):
        if not matches(skill, f, borrowed):
            continue
        made = instantiate(skill, f, space, diagnosis.step_scale, diagnosis.task, diagnosis)
        if isinstance(made, str):
            # said once per skill, and not at all for another family's skill that does not fit this one (its knob
            # template names slice keys this family does not have): that is no news to the person reading the run
            if not borrowed and made not in notes:
                notes.append(made)
            continue
        change, old = made
        why = vet_error(diagnosis, change)
        if why:
            notes.append(f"{skill.name}: {change.knob} -> {change.value} refused by the vet step: {why}")
            continue
        # a root cause (the other findings are then its symptoms) comes first, then critical findings, then the rest; among skills for findings of one rank, Thompson sampling
        # explores
        crit = -1 if f.code in WHOLE_FIRST and f.severity == "critical" else 0 if f.code in ROOT_CAUSES else \
            1 if f.severity == "critical" else 2
        out.append(((int(borrowed), crit, -theta[skill.name], fi, skill.name), skill, f, change, old))
    return out


def spread_parts(options: list[tuple[tuple, Skill, Finding, Change, Any]]
                 ) -> list[tuple[tuple, Skill, Finding, Change, Any]]:
    """Sorted options with the root causes' (in-family, ranked at or above a root cause) spread over the parts of the
    harness they change (`Change.kind`: env, recipe, reward, diagnostic): the first option of each part, in rank
    order, before the second of any part. A stage's slots then test distinct hypotheses side by side (the mix AND the
    learning rate) rather than two variants of one (train on the target, and its one differing entry) while another
    root cause waits: on a held-out harness with a too-hard mix and a collapsing rate, `grpo.policy_regressed` fired
    at two stages and its fix was never proposed (BENCHMARKS.md, seventieth session). Options ranked below the root
    causes keep their order."""
    head = [o for o in options if o[0][0] == 0 and o[0][1] <= 0]  # in-family root causes: a prefix of the sort
    seen: dict[str, int] = {}
    ranked = []
    for i, o in enumerate(head):
        ranked.append((seen.get(o[3].kind, 0), i, o))
        seen[o[3].kind] = seen.get(o[3].kind, 0) + 1
    return [o for *_, o in sorted(ranked, key=lambda r: r[:2])] + options[len(head):]


def _first_knobs(options: list[tuple[tuple, Skill, Finding, Change, Any]], n: int) -> list[str]:
    """The knobs of the first `n` options on distinct knobs (what fills the slots when nothing is skipped)."""
    out: list[str] = []
    for o in options:
        if len(out) >= n:
            break
        if o[3].knob not in out:
            out.append(o[3].knob)
    return out


def propose_rule(diagnosis: Diagnosis, in_family: list[Skill], fallback: list[Skill], max_candidates: int,
                 rng: np.random.Generator, space: dict[str, Knob], rejected_keys: set[str] | None = None,
                 spread: bool = True) -> tuple[list[Candidate], list[str]]:
    """Up to `max_candidates` single-factor candidates (distinct knobs) and notes on what was skipped and why.
    `fallback` skills (other families) are used only for slots the in-family skills cannot fill; `spread`: the root
    causes' slots go to distinct parts of the harness first (`spread_parts`)."""
    rejected = rejected_keys or set()
    findings = sorted(diagnosis.findings, key=lambda f: (_SEV.get(f.severity, 3), -f.rate, -f.count, f.code))
    pools = [sorted(in_family, key=lambda s: s.name), sorted(fallback, key=lambda s: s.name)]
    theta = thompson_scores(pools[0] + pools[1], rng)  # one draw per skill, in a listing-independent order
    notes: list[str] = []
    options: list[tuple[tuple, Skill, Finding, Change, Any]] = []
    for borrowed, pool in enumerate(pools):
        for skill in pool:
            try:
                options += _options_of(skill, bool(borrowed), findings, diagnosis, space, theta, notes)
            except Exception as exc:  # noqa: BLE001 - one bad skill (a condition that fails, a template that breaks)
                # costs itself, never the run: the library may hold skills an older version or a hand edit wrote
                notes.append(f"skill {skill.name} skipped: {type(exc).__name__}: {str(exc)[:300]}"
                             if not isinstance(exc, SkillError) else f"skill {skill.name} skipped: {exc}")
    options.sort(key=lambda o: o[0])
    if spread:
        ranked, options = options, spread_parts(options)
        before, after = _first_knobs(ranked, max_candidates), _first_knobs(options, max_candidates)
        if before != after:
            notes.append(f"rule engineer: root-cause slots spread over harness parts: {', '.join(after)} (by rank "
                         f"alone: {', '.join(before)})")
    out: list[Candidate] = []
    knobs: set[str] = set()
    for (borrowed, *_), skill, f, change, old in options:
        if len(out) >= max_candidates:
            break
        if change.knob in knobs:
            continue
        extended = ""
        pressed = press_on(diagnosis, skill, f, change, old, space, rejected)
        if pressed is None and change_key(diagnosis.state, change) not in rejected \
                and (was := refuted_same_intent(diagnosis, change, old, rejected)) is not None:
            notes.append(f"{skill.name}: {change.knob} -> {change.value} is the intent of {was} rejected from this "
                         "state (a step sized to another rate): going on from that")
            change = change.model_copy(update={"value": was})
        if pressed is not None:
            change, extended = pressed[0], f" ({pressed[1]})"
            notes.append(f"{skill.name}: {change.knob} -> {change.value}{extended}")
        elif change_key(diagnosis.state, change) in rejected:
            bigger = extend_spent(diagnosis, skill, change, old, space, rejected)
            if bigger is None or vet_error(diagnosis, bigger[0]):
                notes.append(f"{skill.name}: {change.knob} -> {change.value} already rejected from this state; skipped")
                continue
            change, extended = bigger[0], f" ({bigger[1]})"
            notes.append(f"{skill.name}: {change.knob} -> {change.value}{extended}")
        knobs.add(change.knob)
        where = ", ".join(f"{k}={v}" for k, v in f.slice.items()) or "all"
        fam = f" (borrowed from {', '.join(skill.domains)})" if borrowed else ""
        fam += " (imported, untried here)" if untried_import(skill) else ""
        new = "new file" if change.kind == "diagnostic" else "-> the target's generator config" \
            if change.knob == TARGET else f"{old} -> {change.value}"
        rationale = (f"{f.code} on {where}: rate {f.rate:.2f}, count {f.count} ({f.severity}); skill {skill.name}{fam}"
                     f" [{skill.evidence.promotions}/{skill.evidence.tries} promoted, "
                     f"theta={theta[skill.name]:.2f}]: "
                     f"{change.knob} {new}{extended}"
                     + (f". {f.message}" if change.knob in (MIXTURE, TARGET) and f.message else ""))
        out.append(make_candidate(diagnosis, change, old, rationale, skill.expected, skill.validation, "rule",
                                  skill=skill.name))
    if not out:
        notes.append("rule engineer: no applicable skill yields a new change for these findings")
    return out, notes
