"""What a stage reads from earlier stages and leaves for later ones: the engineer's history of decided candidates,
a person's feedback at the gate, a regression carried over from the previous stage, and the skills written from
this stage's verdicts.

    history(run)                        # HistoryItem per decided candidate (the engineer never repeats a refuted one)
    human_feedback(run, before=k)       # `revise` feedback of stages before k
    regression_findings(run, k, probe)  # grpo.policy_regressed: this stage's training, the last control arm or the
                                        # last stage's exploit training fell
    remember_skills(run, k)             # skill evidence for tried skills; a new skill for an invented change that won
"""

from __future__ import annotations

import hashlib
from typing import Any

from harness.records import Candidate, Change, Finding, HistoryItem
from harness.results import Backtested, Decided, GateAnswer, Probed, Trained
from harness.run import Run


def candidate_from_row(row: dict[str, Any]) -> Candidate:
    """A candidate as the store's `candidates` row holds it."""
    return Candidate(id=row["id"], stage=row["stage"], change=Change.model_validate(row["patch"]),
                     old_value=row["old_value"], rationale=row["rationale"] or "", expected=row["expected"] or "",
                     skill=row["skill"], engineer=row["engineer"] or "rule")


def engineer_reason(row: dict) -> str:
    """A decided candidate's reason as the engineer may read it. A veto is code that ran on the BACKTEST arms' rollouts,
    and what it says is free text (it may quote a held-out board, problem or program), so the engineer is told which
    veto blocked the change, never its words; the run's records and the review keep them whole."""
    vetoes = (row.get("evidence") or {}).get("vetoes") or []
    if not vetoes:
        return row.get("reason") or ""
    names = sorted({str(v).split(":", 1)[0].strip() for v in vetoes})
    return (f"veto: blocked by {', '.join(names)} (what a veto says stays in the run's records: it saw held-out "
            "rollouts)")


def history(run: Run) -> list[HistoryItem]:
    """Every decided candidate of the run, keyed by the harness state it started from (`change_key`). `verdict` says
    what may follow: inconclusive (re-testable, its evidence pooled) or final (promoted, rejected)."""
    from harness.engineer.proposal import change_key

    parents = {r.id: r.parent for r in run.workspace().history()}  # the harness state each candidate started from
    out = []
    for c in run.store.candidates(run.id):
        if c["status"] not in ("promoted", "rejected", "rejected_vet", "inconclusive"):
            continue
        lo, hi = c.get("ci_low"), c.get("ci_high")
        key = change_key(parents[c["id"]], Change.model_validate(c["patch"])) if c["id"] in parents else ""
        verdict = "promoted" if c["status"] == "promoted" else "rejected"
        spent = c["status"] == "inconclusive" and (c.get("evidence") or {}).get("next_step") == "stop"
        if c["status"] == "inconclusive":  # kept for a pooled re-test, unless its evidence is spent (then final)
            verdict = "rejected" if spent else "inconclusive"
        out.append(HistoryItem(stage=c["stage"], candidate=c["id"], knob=c["knob"],
                               change=f"{c['knob']} -> {(c['patch'] or {}).get('value')}",
                               verdict=verdict,
                               effect=c.get("effect"), ci=(lo, hi) if lo is not None and hi is not None else None,
                               reason=engineer_reason(c), key=key, value=(c["patch"] or {}).get("value"),
                               old=c.get("old_value"), spent=spent))
    # a change is final from a state once any test of it there was (spent, refuted, promoted): its earlier
    # inconclusive tests hold only part of that evidence and are final too, so no one (engineer, escalation, a
    # continued mixture) re-tests them and restarts a finished test
    final = {h.key for h in out if h.verdict != "inconclusive" and h.key}
    return [h.model_copy(update={"verdict": "rejected"}) if h.verdict == "inconclusive" and h.key in final else h
            for h in out]


def human_feedback(run: Run, before: int) -> list[str]:
    """Feedback a person gave at the gate (`revise`) in stages before `before`, oldest first."""
    out = []
    for j in range(1, before):
        r = run.result(j, GateAnswer)
        if r is not None and r.action == "revise" and r.feedback:
            out.append(f"stage {j}: {r.feedback}")
    return out


def carried_regression(k: int, prev_backtest: Backtested | None, prev_decide: Decided | None,
                       arm_steps: int) -> Finding | None:
    """`grpo.policy_regressed` for stage k when stage k-1's control arm fell below the stage's start on the backtest
    (`harness.arms.judge_start`) and nothing was promoted there, so the harness that lowered the policy is still the
    incumbent."""
    start = prev_backtest.start if prev_backtest is not None else None
    if start is None or not start.control_regressed or (prev_decide is not None and prev_decide.winner):
        return None
    return Finding(
        code="grpo.policy_regressed", severity="critical", count=start.n, rate=round(-start.change, 4),
        knobs=["recipe.learning_rate"],
        message=(f"stage {k - 1}'s training and its control arm ({arm_steps} more GRPO steps under this harness) "
                 f"lowered backtest valid {start.valid:.3f} -> {start.control_valid:.3f} (upper bound "
                 f"{start.change_ci[1]:+.3f}); it was not carried forward"))


def exploit_regression(k: int, prev_trained: Trained | None, prev_probe: Probed | None,
                       probe_n: int) -> Finding | None:
    """`grpo.policy_regressed` for stage k when stage k-1 exploited a promoted change (`stage.exploit_after_promotion`)
    and its training lowered the probe beyond noise. An exploit stage proposes nothing, so its own engineer never acts
    on the finding; the harness that lowered the policy is still the incumbent, and without this the next stage's
    engineer, whose own shorter training may fall within noise, never hears of it (a run promoted an unrelated
    recipe change at stage 1, its 130-step exploit stage fell 0.285 -> 0.086, and stage 3 proposed an env knob)."""
    if prev_trained is None or not prev_trained.exploits or prev_probe is None or not prev_probe.regressed:
        return None
    return Finding(
        code="grpo.policy_regressed", severity="critical", count=probe_n, rate=round(-prev_probe.change, 4),
        knobs=["recipe.learning_rate"],
        message=(f"stage {k - 1} exploited {prev_trained.exploits} and its training lowered probe valid "
                 f"{prev_probe.start_valid:.3f} -> {prev_probe.valid:.3f} (upper bound {prev_probe.change_ci[1]:+.3f}) "
                 "under the harness this stage trains under; it was not carried forward"))


def regression_findings(run: Run, k: int, probe: Probed) -> list[Finding]:
    """`grpo.policy_regressed` when this stage's training lowered the probe (the checkpoint was discarded), else when
    the previous stage's control arm fell below its start and nothing was promoted (`carried_regression`), else when
    the previous stage exploited a promotion and its training fell (`exploit_regression`)."""
    if probe.regressed:
        return [Finding(
            code="grpo.policy_regressed", severity="critical", count=run.config.stage.probe_n,
            rate=round(-probe.change, 4), knobs=["recipe.learning_rate"],
            message=(f"this stage's GRPO lowered probe valid {probe.start_valid:.3f} -> {probe.valid:.3f} "
                     f"(upper bound {probe.change_ci[1]:+.3f}); the trained checkpoint was discarded"))]
    found = (carried_regression(k, run.result(k - 1, Backtested), run.result(k - 1, Decided),
                                run.config.backtest.arm_steps)
             or exploit_regression(k, run.result(k - 1, Trained), run.result(k - 1, Probed), run.config.stage.probe_n)
             ) if k > 1 else None
    return [found] if found else []


def passed_gate(row: dict[str, Any]) -> bool:
    """Did this candidate's own sequential decision promote it (its last recorded look), whatever the stage made of
    it? True only for a change that passed the gate and was beaten by another one of the same stage
    (`harness.backtest.choose_winner` records it as rejected, "beaten by ...": one change a stage is promoted); not
    for one a person rejected at the human gate."""
    looks = (row.get("evidence") or {}).get("looks") or []
    return (row.get("status") == "rejected" and str(row.get("reason") or "").startswith("beaten by ")
            and bool(looks) and looks[-1].get("decision") == "promoted")


def remember_skills(run: Run, k: int) -> None:
    """Record each decided candidate's try on its skill; file an engineer-invented change that won as a new skill. A
    decision is a try when it has ended: promoted, refuted (or beaten, a success), or inconclusive with its evidence
    spent (`next_step` stop: never re-proposed from that state; not promoted). An inconclusive test with a pair left
    is not one yet: its re-test pools it, and the re-test's own verdict is the try (so a skill is never charged twice
    for one decision, and a skill whose tests always end undecided no longer ranks as untried) - until a promotion
    moves the harness state, after which no re-test can pool it: then it is a try, not promoted."""
    from harness.tasks.knobs import ENTRY, MIXTURE, TARGET
    from skills.library import UnknownSkillError
    from skills.model import MAX_NAME, Intervention, Provenance, Skill, Trigger
    from skills.model import Evidence as SkillEvidence

    lib = run.skills()
    rows = run.store.candidates(run.id, stage=k)
    by_id = {c["id"]: c for c in run.store.candidates(run.id)}
    if any(c["status"] == "promoted" for c in rows):
        # a promotion moves the harness state, and a re-test pools only tests from the state it is proposed from
        # (`change_key`): an open test of any stage so far (inconclusive with a pair left, pooled by no later test)
        # can no longer end, so it ends here, a try that was not promoted; else its skill was never charged for it
        everything = run.store.candidates(run.id)
        pooled = {p for c in everything for p in (c.get("evidence") or {}).get("pooled") or []}
        rows = rows + [c for c in everything if c["stage"] <= k and c["status"] == "inconclusive"
                       and (c.get("evidence") or {}).get("next_step") != "stop" and c["id"] not in pooled
                       and c not in rows]
    try:
        for c in rows:
            spent = c["status"] == "inconclusive" and (c.get("evidence") or {}).get("next_step") == "stop"
            orphan = c["status"] == "inconclusive" and not spent and any(x["status"] == "promoted" for x in rows)
            if c["status"] not in ("promoted", "rejected") and not spent and not orphan:
                continue
            cand = candidate_from_row(c)
            promoted = c["status"] == "promoted"
            interval = (c["ci_low"], c["ci_high"]) if c.get("ci_low") is not None else None
            # the tests this one's evidence pooled (re-tests of one change, `harness.decisions`) were proposed by
            # their own skills: the pooled verdict is each one's try too (only the last proposer's was charged)
            tested = [(cand.skill, cand.id)] + [
                (s, p) for p in (c.get("evidence") or {}).get("pooled") or [] if p in by_id
                for s in [candidate_from_row(by_id[p]).skill] if s and s != cand.skill]
            for skill, cid in dict.fromkeys(t for t in tested if t[0]):  # a change that passed the gate and lost
                try:  # to a better one worked: a success for its skill
                    lib.record_try(skill, promoted=promoted or passed_gate(c), effect=c.get("effect") or 0.0,
                                   interval=interval, family=run.config.task, run=run.uid, candidate=cid,
                                   commit=c.get("commit_sha"))
                except UnknownSkillError:  # removed, or the run resumed under another home: the run goes on
                    run.event(k, "remember", "warning",
                              f"candidate {cid}'s skill {skill!r} is no longer in the skill library "
                              f"({lib.path}: removed or replaced since it was proposed, or the run resumed under "
                              "another EVOTRAINER_HOME): its try is not recorded", key=f"{k}/orphan-try/{cid}")
            if not cand.skill and promoted:  # an engineer-invented change that worked becomes a skill
                # triggered by what it answered: the findings its rationale names, else those that name its knob,
                # else (as before) the stage's first three (the first three alone filed a rate cut under a slice's
                # finding, and it fired on that finding in every later run of the family)
                found = run.store.findings(run.id, stage=k)
                named = [f.code for f in found if f.code in (cand.rationale or "")]
                knobbed = [f.code for f in found if cand.change.knob in (f.knobs or [])]
                codes = list(dict.fromkeys(named or knobbed or [f.code for f in found]))[:3]
                uid = hashlib.sha256(run.uid.encode()).hexdigest()[:6]  # ids repeat across folders; the uid does not
                knob = cand.change.knob.replace("/", "-").replace("_", "-")
                tail = f"-{uid}-{cand.id}"  # what keeps it unique; the rest cut to fit a skill's name (MAX_NAME)
                name = f"{run.config.task}-{knob}-{run.id}"[: max(8, MAX_NAME - len(tail))] + tail
                name = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in name.lower())
                # a whole-mixture change is filed as what it did, re-weight the mix toward the target: its weights
                # belong to this run's target, the aim carries to the next
                # (and a whole-entry change as: make the failing slice's entry the target's; a whole-target change
                # as: train on the target's learnable part, which is the target itself where every slice is)
                iv = Intervention(knob=MIXTURE, op="mix", value="target") if cand.change.knob == MIXTURE else \
                    Intervention(knob=ENTRY, op="adopt") if cand.change.knob == ENTRY else \
                    Intervention(knob=TARGET, op="adopt", value="frontier") if cand.change.knob == TARGET else \
                    Intervention(knob=cand.change.knob, op="code" if cand.change.code else "set",
                                 value=cand.change.value, code=cand.change.code)
                # what it is expected to do is what it was measured to do, in the loop's words: the engineer's
                # own `expected` (free text from an endpoint) would be printed into every later run's prompt, on
                # every family that shares the library; its rationale is kept as the description, for people
                eff = c.get("effect") or 0.0
                measured = f"valid {eff:+.3f}" + (f" [{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else "")
                lib.add(Skill(
                    name=name, kind=cand.change.kind, trigger=Trigger(findings=codes), intervention=iv,
                    expected=f"{measured} against its control when promoted ({run.config.task}, stage {k})",
                    validation="valid",
                    domains=[run.config.task],
                    evidence=SkillEvidence(tries=1, promotions=1, mean_effect=c.get("effect") or 0.0,
                                           last_interval=interval, families=[run.config.task]),
                    provenance=Provenance(source="run", run=run.uid, commit=c.get("commit_sha")),
                    description=cand.rationale), replace=True)
    finally:
        lib.close()
