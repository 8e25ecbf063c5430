"""Decisions that accumulate evidence: the looks of one stage's backtest, and the evidence kept between stages.

    vs, control = look_until_decided(run, k, arms, main_files, cand_files)   # batches of instances until decided
    prior, pooled, note = pooled_evidence(run, cid)                          # earlier inconclusive tests of a change
    more = second_pairs(run, k, vs)                                          # clear effect, unsure slice: a 2nd pair now
    more |= signal_pairs(run, k, vs, skip=set(more))                         # promising learning signal: a 2nd pair too
    cands = signal_retest(run, k, diagnosis, cands, slots)                   # and its re-test first in the next stage
    retest = most_promising_inconclusive(run, state, causes)                 # what escalation re-tests
    cands = runners_up(run, k, diagnosis, cands, slots)                      # last stage's beaten gate-passers

A stage's arms are trained once (`harness.arms.run_arms`, judged on the first look's instances); then, while a
candidate's sequential look (`harness.backtest.verdicts` -> `harness.sequential.decide`) says `more_instances`, the
control arm and every such candidate are judged on the next batch of the stage's backtest instances
(`harness.arms.judge_more`, recorded per look, so a resume does not judge twice). A candidate that stops looking is
compared on the instances it saw. What ends the stage undecided is `inconclusive`: its paired differences stay in
its verdict's evidence, and when the same change is proposed again from the same harness state (the engineer may: only
a refuted change is never re-proposed; or the loop re-tests it on purpose when a failure recurs), the new pair is
pooled with them under the same judge fingerprint, the error still controlled across every look. With
`backtest.second_pair: backed` (off by default), a BACKED candidate (its skill was promoted in another run) that ends
its first pair inconclusive with a positive estimate gets a second arm pair in the same stage (`second_pairs`), pooled
the same way: evidence from elsewhere buys evidence now, never a lower bar. And (`backtest.settle_pair`, on by
default) a candidate whose main effect already clears the bar but whose first pair ends "not yet clear" (a slice's
bound, too few differing instances) gets its next pair in the same stage too: the plan would pool that pair a stage
later anyway, and a clear effect settled now saves the run a stage without its fix. So (`backtest.signal_pair`, on by
default) does a change the learning-signal route reads (`on_learning_signal`) whose first pair's signal is promising
but not shown with confidence (`signal_pairs`): the route pools the two pairs' live shares as the target test pools
their differences, each pair one look at alpha / `gate.max_pairs`. A futility stop (`gate.futility`) weighs that
route too: a change whose signal is shown needs only a pooled target estimate not below the control's, so it keeps
its next pair while the chance of that is at least the setting (`signal_lift`); so does one whose signal is promising
while its estimate is not below the control's (the pair `signal_pairs` asks for).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from harness.arms import arm_eval, arm_name, backtest_seeds, judge_more
from harness.backtest import ArmEval, finished_shares, judge_fingerprint, prior_pairs, regression, verdicts
from harness.diagjudge import veto_stands
from harness.records import RECURRING, Evidence, Verdict, cut, evidence_n, problem_label
from harness.results import ArmVsStart, Backtested, CarryChecked, Decided, GateAnswer, Probed, Trained
from harness.run import Run


def fingerprint(run: Run) -> str:
    return judge_fingerprint(run.judge, run.config.gate, run.task.name)


def _key_of(run: Run, cid: str) -> str:
    from harness.engineer.proposal import change_key
    from harness.records import Change

    parents = {r.id: r.parent for r in run.workspace().history()}
    row = run.store.candidate(cid)
    return change_key(parents[cid], Change.model_validate(row["patch"])) if cid in parents else ""


def pooled_evidence(run: Run, cid: str) -> tuple[list[Any], list[str], str | None]:
    """(earlier pairs, their candidate ids, a note) for candidate `cid`: every earlier INCONCLUSIVE test of the same
    change from the same harness state (`change_key`), oldest first; those recorded under another judge are left out,
    and the note says so (`harness.backtest.prior_pairs`)."""
    from harness.memory import history

    key = _key_of(run, cid)
    if not key:
        return [], [], None
    earlier = [h for h in history(run) if h.key == key and h.candidate != cid]
    if any(h.verdict != "inconclusive" for h in earlier):
        # a final test of this change from this state (spent or refuted): what is judged now is judged afresh, not
        # pooled with part of a finished test (the engineer and escalation never re-propose it; a person may)
        return [], [], "an earlier test of this change from this state was final (spent or refuted): judged afresh"
    evs: list[Evidence] = []
    ids: list[str] = []
    for h in sorted(earlier, key=lambda h: h.stage):
        ev = run.store.candidate(h.candidate).get("evidence")
        if ev:
            evs.append(Evidence.model_validate(ev))
            ids.append(h.candidate)
    pairs, kept, note = prior_pairs(evs, fingerprint(run))
    return pairs, ([ids[i] for i in kept] if pairs else []), note


def look_until_decided(run: Run, k: int, arms: dict[str, Any], main_files: dict[str, str],
                       cand_files: dict[str, dict[str, str]], pair: int = 1,
                       earlier: dict[str, Verdict] | None = None, comparisons: int | None = None
                       ) -> tuple[list[Verdict], ArmEval | Exception, dict[str, ArmEval | Exception]]:
    """Every vetted candidate's verdict after as many looks as it needs (at most the stage's backtest.n instances), the
    control arm's outcomes on all the instances judged, and each candidate arm's on the instances it saw.

    `pair` > 1 judges the stage's `pair`-th arm pair (arms named by `arm_name`) of the candidates in `cand_files`,
    each pooled with its own earlier verdict of this stage (`earlier`: its pairs, its looks) on top of the evidence
    of earlier stages; `comparisons` keeps the first pair's Bonferroni count."""
    cfg, samples = run.config, run.judge.per_instance
    plan = cfg.gate.plan(cfg.backtest.n)
    fp = fingerprint(run)
    earlier = earlier or {}
    control = arms[arm_name("control", pair)]
    c_eval: ArmEval | Exception = control if isinstance(control, Exception) else arm_eval(control, samples)
    evals: dict[str, ArmEval | Exception] = {
        cid: a if isinstance(a := arms[arm_name(cid, pair)], Exception) else arm_eval(a, samples) for cid in cand_files}
    prior: dict[str, list[Any]] = {}
    pooled: dict[str, list[str]] = {}
    looks: dict[str, list[dict[str, Any]]] = {cid: [] for cid in cand_files}
    at_least: dict[str, int] = {}  # the largest Bonferroni count each one's pooled evidence was judged at
    for cid in cand_files:
        prior[cid], pooled[cid], note = pooled_evidence(run, cid)
        at_least[cid] = max([1, *(int((run.store.candidate(e).get("evidence") or {}).get("comparisons") or 1)
                                  for e in pooled[cid])])
        if (before := earlier.get(cid)) is not None and before.evidence is not None:
            prior[cid] = [*prior[cid], *stage_pairs(before.evidence, fp)]
            looks[cid] = list(before.evidence.looks)
            at_least[cid] = max(at_least[cid], before.evidence.comparisons)
            run.event(k, "backtest", "second_pair", f"{cid}: arm pair {pair} of this stage, pooled with the "
                      f"{len(before.evidence.diffs)} paired instances of its pair {pair - 1}", key=f"{k}/pair{pair}/{cid}")
        elif note:
            run.event(k, "backtest", "not_pooled", f"{cid}: {note}", key=f"{k}/notpooled/{cid}")
        elif pooled[cid]:
            run.event(k, "backtest", "pooled", f"{cid}: re-test of {', '.join(pooled[cid])} (inconclusive): its "
                      f"{sum(len(p.diffs) for p in prior[cid])} paired instances are pooled with this pair's",
                      key=f"{k}/pooled/{cid}")
    seeds = backtest_seeds(run, k, pair)
    stands = veto_stands(run, k, pair)  # a veto's block counts only if the veto still passes its checks now
    look = 0
    while True:
        t_gate, rechecked = time.perf_counter(), stands.spent[0]
        vs = verdicts(c_eval, main_files, [(cid, cand_files[cid], evals[cid]) for cid in cand_files], cfg.gate,
                      samples=samples, plan=plan, judge=fp, prior=prior, pooled=pooled, looks=looks,
                      comparisons=comparisons or len(cand_files), at_least=at_least, veto_stands=stands)
        # the gate's reading and its evolved vetoes (sandbox runs): this machine's compute; a veto's re-check is
        # charged by itself (`veto-recheck`), so it is left out here
        took = time.perf_counter() - t_gate - (stands.spent[0] - rechecked)
        run.charge(k, arm_name("gate", pair), "eval", seconds=max(0.0, took), label=f"verdicts look {look}")
        for v in vs:
            if v.evidence is not None:
                looks[v.candidate] = v.evidence.looks
        more = [v.candidate for v in vs if v.decision == "inconclusive" and v.evidence is not None
                and v.evidence.next_step == "more_instances"]
        if isinstance(c_eval, Exception) or not more:
            break
        have = len(c_eval.seeds)
        batch = seeds[have: have + plan.batch]
        if not batch:
            break
        look += 1
        # the control arm is judged on every batch any candidate still needs; each candidate only while it looks
        c_eval = c_eval.extend(judge_more(run, k, arm_name("control", pair), arms[arm_name("control", pair)].checkpoint,
                                          batch, look, pair))
        for cid in more:
            ev = evals[cid]
            if isinstance(ev, ArmEval) and len(ev.seeds) == have:
                evals[cid] = ev.extend(judge_more(run, k, arm_name(cid, pair), arms[arm_name(cid, pair)].checkpoint,
                                                  batch, look, pair))
        run.event(k, "backtest", "look", f"look {look + 1}{f' of pair {pair}' if pair > 1 else ''}: {len(more)} "
                  "candidate(s) undecided ("
                  + "; ".join(f"{v.candidate} effect {v.evidence.effect:+.3f} [{v.evidence.ci_low:+.3f}, "
                              f"{v.evidence.ci_high:+.3f}]" for v in vs if v.candidate in more and v.evidence)
                  + f"): judging {len(batch)} more instances", key=f"{k}/look/{look}" + (f"/p{pair}" if pair > 1 else ""))
    out = []
    for v in vs:  # a look that still wanted instances when the stage's ran out is inconclusive for this stage
        if v.decision == "inconclusive" and v.evidence is not None and v.evidence.next_step == "more_instances":
            v = v.model_copy(update={"evidence": v.evidence.model_copy(update={"next_step": "new_pair"})})
        if v.evidence is not None and (before := earlier.get(v.candidate)) is not None and before.evidence is not None:
            b = before.evidence  # this stage's earlier pairs travel with the verdict, so a later re-test pools them
            v = v.model_copy(update={"evidence": v.evidence.model_copy(update={
                "stage_pairs": [*b.stage_pairs, {"diffs": b.diffs, "slices": b.slices, "clusters": b.clusters}],
                "stage_live": [*b.stage_live, *([b.live] if b.live else [])]})})
        if v.decision == "inconclusive":
            spent = v.evidence is not None and v.evidence.next_step == "stop"
            v = v.model_copy(update={"reason": v.reason + ("; evidence spent: never re-proposed from this state"
                                                           if spent else "; kept: a re-test pools with it")})
        out.append(v)
    return out, c_eval, evals


def judge_whole_plan(run: Run, k: int, arms: dict[str, Any], c_eval: ArmEval | Exception,
                     evals: dict[str, ArmEval | Exception]) -> tuple[ArmEval | Exception, dict[str, ArmEval | Exception]]:
    """The control arm and every judged candidate arm of the stage's first pair, extended to all of the stage's
    backtest instances (`backtest.carry_on: plan`): the sequential looks stop as soon as a VERDICT is clear, but which
    checkpoint continues (`continues_from`, via `judge_start`, `fell_below_start`, `arms_vs_start`) is a different
    question, the arm against the stage's start, and a winner stopped at the first look was carried on a quarter of
    the instances the run is configured to spend (seen in the demo's seeds: winners carried on 40 instances with an
    estimate level with the start's, whose greedy test valid then fell 5-7 points). The verdicts are not revisited.
    The extra batches are the looks the loop would have taken (`judge_more`: the same look numbers, instances and
    sampling seeds for every arm, so the pairs stay paired; recorded, charged, read back on a resume)."""
    if isinstance(c_eval, Exception) or run.config.backtest.carry_on != "plan":
        return c_eval, evals
    plan = run.config.gate.plan(run.config.backtest.n)
    seeds = backtest_seeds(run, k)

    def whole(name: str, ev: ArmEval) -> ArmEval:
        while len(ev.seeds) < len(seeds) and (len(ev.seeds) - plan.min_n) % plan.batch == 0 \
                and ev.seeds == seeds[: len(ev.seeds)]:
            have = len(ev.seeds)
            ev = ev.extend(judge_more(run, k, name, arms[name].checkpoint, seeds[have: have + plan.batch],
                                      (have - plan.min_n) // plan.batch + 1))
        return ev

    short = {name: len(ev.seeds) for name, ev in (("control", c_eval), *evals.items())
             if isinstance(ev, ArmEval) and len(ev.seeds) < len(seeds)}
    if not short:
        return c_eval, evals
    run.event(k, "backtest", "carry_looks", f"which checkpoint continues is decided on all {len(seeds)} backtest "
              "instances: " + ", ".join(f"{name} (judged on {n})" for name, n in short.items())
              + " judged on the rest; the verdicts stand", key=f"{k}/carry-looks")
    return whole("control", c_eval), {cid: whole(cid, ev) if isinstance(ev, ArmEval) else ev
                                      for cid, ev in evals.items()}


def stage_pairs(ev: Evidence, judge: str) -> list[Any]:
    """The PairEvidence of one recorded verdict: this stage's earlier pairs of it, then its own."""
    return prior_pairs([ev], judge)[0]


def backed(run: Run, cid: str) -> str | None:
    """Why candidate `cid` is BACKED, or None: its skill was promoted in another run (the library's record of tries,
    `skills.library.SkillLibrary.tries`). Evidence from elsewhere never lowers the gate's bar here; it buys the
    candidate a second arm pair in the same stage (`second_pairs`), so a change that worked before is decided in one
    stage instead of two or three."""
    skill = run.store.candidate(cid).get("skill")
    if not skill:
        return None
    try:
        with run.skills() as lib:
            tries, born = lib.tries(skill), lib.get(skill).provenance
    except Exception:  # noqa: BLE001 - a skill missing from the library backs nothing
        return None
    won = {t["run"] for t in tries if t["promoted"]} | ({born.run} if born.source == "run" and born.run else set())
    won.discard(run.uid)
    return f"its skill {skill} was promoted in {len(won)} other run(s)" if won else None


SIGNAL_KNOBS = ("recipe.temperature",)  # recipe knobs that choose which completions a group holds (see below)
RISING_SIGNAL_KNOBS = ("recipe.max_completion_length",)  # ... and those that do so when raised only
FINISHED_KNOBS = ("recipe.max_completion_length",)  # ... and whose rise the route also reads as answers that end


def finished_reading(knob: str, control: list[float], candidate: list[float]
                     ) -> tuple[list[float], list[float]] | None:
    """The finished-share reading's data for a change of `knob` (`signal_verdict`'s `finished`): the two arms'
    per-step shares of completions that ended within the budget (`harness.backtest.finished_shares` of their
    curves), or None where the reading is off: a knob not in `FINISHED_KNOBS`, or arms that did not record the share
    on at least 2 steps a side (a backend or an older run without `clipped_ratio`). None takes no part of the route's
    alpha, so a reading that cannot be made does not narrow the others'. The loop and both of the calibration's
    replays (an arm pair's curves, a recorded decision's `Evidence.finished`) call this one function."""
    if knob not in FINISHED_KNOBS or min(len(control), len(candidate)) < 2:
        return None
    return list(control), list(candidate)


def takes_signal_route(kind: str, knob: str, old: Any = None, new: Any = None) -> bool:
    """May a change of this kind and knob (from `old` to `new`) be decided on learning signal (`signal_verdict`)? The
    changes that choose what a GRPO group is made of: an ENV change (which prompts), the sampling temperature (which
    completions) and a LONGER completion budget (whether they finish). Why the temperature and no other recipe knob:
    the live-group share is not monotone in it, so a rise is evidence that the groups moved toward contrast rather
    than a by-product of the knob. Too cold, a group's completions are identical and it is dead by identity (the
    cold-temperature scenarios: 64 of 64 groups at 0.1); too hot, the completions stop parsing and groups die
    all-invalid; between the two the share peaks. A longer budget changes a group only where answers were cut off
    (the same seeds draw the same tokens, so with nothing truncated the arms are identical and the share cannot move);
    a shorter one can make a group "live" by cutting some answers, so only a rise qualifies (the truncation scenario:
    live 26-35% against 7-9% at 24-48 tokens from 12). For a longer budget the route reads what it is for as well: the
    share of the arm's completions that END within it (`finished`, `signal_shown`). A learning rate, a group size or
    a schedule changes the share as a side effect (more completions per group make one live by count), so those keep
    the target A/B alone. The guard is the same for all: the target estimate not below the control's."""
    if kind == "env" or knob in SIGNAL_KNOBS:
        return True
    if knob in RISING_SIGNAL_KNOBS:
        try:
            return float(new) > float(old)
        except (TypeError, ValueError):
            return False
    return False


def on_learning_signal(run: Run, k: int, vs: list[Verdict], arms: dict[str, Any], comparisons: int, pair: int = 1,
                       hold: set[str] | frozenset[str] = frozenset()) -> list[Verdict]:
    """The gate's second route for a change of what a group is made of (`gate.learning_signal`, `signal_verdict`,
    `takes_signal_route`), applied to a stage's verdicts of its `pair`-th arm pair (arms named by `arm_name`): the
    candidates' kinds and knobs come from run.db, the per-step live shares from the arms' training curves, pooled
    with the earlier pairs' (`earlier_live`). Returns the verdicts, converted ones replaced; each conversion is an
    event. Those in `hold` only get their shares recorded (they are read after their next pair of this stage)."""
    from harness.backtest import has_valid_live, live_shares

    gate = run.config.gate
    control = arms.get(arm_name("control", pair))
    if gate.learning_signal is None or control is None or isinstance(control, Exception):
        return vs
    out = []
    for v in vs:
        arm, row = arms.get(arm_name(v.candidate, pair)), run.store.candidate(v.candidate)
        got = None
        if (arm is not None and not isinstance(arm, Exception) and row is not None
                and takes_signal_route(row["kind"], row.get("knob", ""), row.get("old_value"),
                                       (row.get("patch") or {}).get("value"))):
            both = has_valid_live(control.curve) and has_valid_live(arm.curve)  # one count for both arms
            kl, cl = live_shares(control.curve, both), live_shares(arm.curve, both)
            done = finished_reading(row.get("knob", ""), finished_shares(control.curve), finished_shares(arm.curve))
            if v.evidence is not None:  # kept with the evidence: a pooled re-test's ratio reading reads them
                v = v.model_copy(update={"evidence": v.evidence.model_copy(update={
                    "live": {"control": kl, "candidate": cl},
                    "finished": {"control": done[0], "candidate": done[1]} if done is not None else {}})})
            if v.candidate not in hold:
                earlier = earlier_live(run, v)
                got = signal_verdict(v, kl, cl, gate, comparisons, earlier=earlier, finished=done)
                if got is None and (got := signal_lift(v, kl, cl, gate, comparisons, earlier=earlier,
                                                       finished=done)) is not None:
                    run.event(k, "backtest", "futility_lifted", f"{v.candidate}: {got.reason}",
                              key=f"{k}/lift/{v.candidate}" + (f"/p{pair}" if pair > 1 else ""))
                    out.append(got)
                    continue
        if got is not None:
            run.event(k, "backtest", "learning_signal", f"{v.candidate}: {got.reason}",
                      key=f"{k}/signal/{v.candidate}" + (f"/p{pair}" if pair > 1 else ""))
        out.append(got or v)
    return out


def earlier_live(run: Run, v: Verdict) -> list[tuple[list[float], list[float]]]:
    """The per-step live shares (control, candidate) of the earlier arm pairs a verdict pools, oldest first: those of
    the earlier tests it pooled (`Evidence.pooled`: each one's `stage_live` and `live`), then its own earlier pairs of
    this stage (`Evidence.stage_live`), each that recorded them; the ratio reading pools them with the verdict's own
    pair."""
    from harness.store import StoreError

    ev = v.evidence
    pooled: list[dict[str, Any]] = []
    for pid in (ev.pooled if ev is not None else []):
        try:
            row = run.store.candidate(pid)
        except StoreError:  # a test not on record pools nothing here (the target's pooling decided it)
            row = None
        pooled.append((row or {}).get("evidence") or {})
    return live_of(pooled, list(ev.stage_live) if ev is not None else [])


def live_of(pooled: list[dict[str, Any]], stage_live: list[dict[str, list[float]]]
            ) -> list[tuple[list[float], list[float]]]:
    """`earlier_live` on records: the (control, candidate) live shares of the pooled tests' evidence (each one's
    `stage_live`, then its `live`), then of this test's own earlier pairs of its stage, each that recorded at least 2
    steps a side."""
    found = [x for old in pooled for x in [*(old.get("stage_live") or []), old.get("live") or {}]] + list(stage_live)
    # a pair with fewer than 2 steps a side has no variance to pool: kept, it made every later ratio reading nan
    return [(list(x["control"]), list(x["candidate"])) for x in found
            if len(x.get("control") or []) >= 2 and len(x.get("candidate") or []) >= 2]


def signal_verdict(v: Verdict, control_live: list[float], candidate_live: list[float], gate: Any, comparisons: int,
                   earlier: list[tuple[list[float], list[float]]] = (),
                   finished: tuple[list[float], list[float]] | None = None) -> Verdict | None:
    """The gate's second route for an ENV change or a sampling temperature (`gate.learning_signal`,
    `takes_signal_route`): an inconclusive candidate of that kind whose arm
    trained on a larger share of live GRPO groups than the control arm, by at least `learning_signal` with confidence
    (`harness.backtest.learning_signal_bound`, at the gate's alpha split over the comparisons, Bonferroni as the
    target test, and over `gate.max_pairs`: a change re-tested on new pairs is tested here again each time, and
    uncorrected k looks at alpha pass a change at the threshold up to k x alpha of the time), or by more than
    `learning_signal_ratio` times the control's share with confidence (`learning_signal_ratio_bound`: the same
    reading for a policy that rarely meets a live group, where a tenfold rise stays below an absolute margin; the
    two readings split the alpha, Bonferroni; the ratio reading pools the `earlier` pairs of a re-test, as its target
    evidence is pooled, each look still at alpha / max_pairs), whose target estimate is not below the control's and which no veto
    held back (it is inconclusive,
    so no slice was harmed beyond tolerance and it was not refuted), is promoted: the promoted verdict, else None. Why:
    a 30-step arm on the right mix moves the target by a few points at most, below what one pair of arms resolves,
    while the mix it corrects leaves most groups dead (no gradient at all); the target test still guards against
    harm. The caller passes only the changes `takes_signal_route` admits; `finished`, for a longer completion budget,
    the arms' per-step shares of completions that ended within it (`signal_shown`'s third reading)."""
    ev = v.evidence
    if gate.learning_signal is None or v.decision != "inconclusive" or ev is None or ev.effect < 0 or ev.vetoes:
        return None
    # a re-test is never judged at a larger share of alpha than the evidence it pools was (`Evidence.comparisons`,
    # as the target test keeps it): a change tested beside three others, re-tested alone, stays at alpha / 4
    comparisons = max(comparisons, ev.comparisons)
    if (how := signal_shown(control_live, candidate_live, gate, comparisons, earlier, finished)) is None:
        return None
    reason = (f"promoted on learning signal: {how}, target not below the control (effect {ev.effect:+.3f} "
              f"[{ev.ci_low:+.3f}, {ev.ci_high:+.3f}], n={ev.pooled_n}); was: {v.reason}")
    return v.model_copy(update={"decision": "promoted", "reason": cut(reason, 1200)})  # the reading and what it was


def signal_lift(v: Verdict, control_live: list[float], candidate_live: list[float], gate: Any, comparisons: int,
                earlier: list[tuple[list[float], list[float]]] = (),
                finished: tuple[list[float], list[float]] | None = None) -> Verdict | None:
    """A futility stop that weighs the route the change is on: an inconclusive verdict the futility rule stopped
    (`harness.sequential.decide`: the chance of promotion ON THE TARGET by the plan's end below `gate.futility`),
    whose change the learning-signal route reads and whose signal is SHOWN with confidence (`signal_shown`, the
    route's own test at its alpha), needs only a pooled target estimate not below the control's to be promoted by
    that route (`signal_verdict`). Its chance is `Evidence.sign_chance` (the pooled estimate ending at or above 0 by
    the plan's end, at the current estimate); while that is at least `gate.futility` the stop is lifted: the verdict
    asks for a new pair again, so the loop gives it one (`signal_pairs`) and a re-test pools it. The verdict so
    lifted, else None. Why: with the greedy judge on 30-step arms (`gate.futility` 0.2), 3 of 20 planted environment
    fixes whose live groups rose from ~1% to ~40% of the arm's training were stopped after one pair on target
    estimates of -0.008 to -0.030 (BENCHMARKS.md, seventy-second session), evidence spent and never re-tested from
    that state. The error is unchanged: a pair is one more look of each route at the alpha it already spends
    (`gate.max_pairs` in the route's Bonferroni, the target's spending function), and a null change (no signal)
    is stopped as before.

    A signal that is only PROMISING (`signal_hint`: the route's margin or ratio passed as point estimates, what
    `backtest.signal_pair` gives a second pair for) lifts the stop too when the target estimate is not below the
    control's: the futility rule would otherwise cut off the second pair that the route asks for. Why: with the greedy
    judge on code's cold temperature (groups of eight programs nearly all alike at 0.1), the fix 0.1 -> 0.7 trained
    on 8% live groups against the control's 0.8% and read +0.010 on the target after one pair; the sampled judge's
    runs promote it on a second pair pooled by the ratio reading, the greedy judge's stopped it for futility at a
    third of its information in each stage it was proposed (BENCHMARKS.md, seventy-fourth session)."""
    ev = v.evidence
    if (gate.futility <= 0 or v.decision != "inconclusive" or ev is None or ev.next_step != "stop"
            or ev.sign_chance is None or ev.sign_chance < gate.futility or ev.vetoes):
        return None
    comparisons = max(comparisons, ev.comparisons)  # as `signal_verdict`: a re-test keeps its evidence's count
    if (how := signal_shown(control_live, candidate_live, gate, comparisons, earlier, finished)) is not None:
        why = f"its learning signal is shown ({how})"
    elif ev.effect >= 0 and (hint := signal_hint(control_live, candidate_live, gate, earlier)) is not None:
        why = f"its learning signal is promising ({hint}; target estimate {ev.effect:+.3f} not below the control's)"
    else:
        return None
    spent = "; evidence spent: never re-proposed from this state"
    reason = (f"{v.reason.removesuffix(spent)}; futility stop lifted: {why}, and "
              f"the chance its pooled target estimate ends not below the control's is {ev.sign_chance:.3f} >= "
              f"gate.futility {gate.futility:.3f}: a new pair pools with it")
    return v.model_copy(update={"reason": cut(reason), "evidence": ev.model_copy(update={"next_step": "new_pair"})})


def signal_shown(control_live: list[float], candidate_live: list[float], gate: Any, comparisons: int,
                 earlier: list[tuple[list[float], list[float]]] = (),
                 finished: tuple[list[float], list[float]] | None = None) -> str | None:
    """The learning-signal route's own test (`signal_verdict`): how the candidate arm's share of live GRPO groups
    is above the control's with confidence, or None when it is not shown.

    `finished` (control, candidate), given for a longer completion budget only (`on_learning_signal`): the arms'
    per-step shares of completions that ended within the budget (`harness.backtest.finished_shares`), a third
    reading: the candidate's share above the control's by at least `gate.learning_signal`, with confidence (the same
    Welch bound and arm noise as the live share's). Why: a completion cut off by the budget is scored as unfinished,
    so the reward trains the policy on the budget rather than the task, and the judge decodes with its own; a budget
    that lets the answers end removes that at once, while its 30-step effect on the target is about 0 and the live
    share it moves is small at 8 groups a step (a held-out code scenario at 6 tokens: 65-75% of the control's
    training completions cut off against none at 19-20 tokens, live 7.9-10.4% against 2.1-3.3%, never shown over
    three pairs; the fix never promoted in three seeds, BENCHMARKS.md, seventy-sixth session). A budget nothing hit
    cannot move this share, so it takes this reading only where answers were cut off."""
    from harness.backtest import learning_signal_bound, learning_signal_ratio_bound

    # a change may take this route at each of its arm pairs (a second pair, a pooled re-test): one test per pair, so
    # Bonferroni over the pairs one change may be judged on as well as over the stage's comparisons; the readings
    # (absolute, ratio, finished) split that alpha between those that are on (Bonferroni again)
    readings = (2 if gate.learning_signal_ratio is not None else 1) + (finished is not None)
    alpha = gate.alpha / (max(1, comparisons) * gate.max_pairs * readings)
    gain, low = learning_signal_bound(control_live, candidate_live, alpha, gate.learning_signal_arm_sd)
    shares = (f"live GRPO groups {np.mean(candidate_live):.1%} of the arm's training against the control's "
              f"{np.mean(control_live):.1%}" if len(candidate_live) and len(control_live) else "")
    if low >= gate.learning_signal:  # nan (too few steps) is not a route
        return (f"{shares} (gain {gain:+.2f}, lower bound {low:+.2f} >= {gate.learning_signal:.2f}; Welch over "
                f"{len(candidate_live)} + {len(control_live)} steps at alpha {alpha:.3g}, arm noise "
                f"{gate.learning_signal_arm_sd:g})")
    if gate.learning_signal_ratio is not None and (ratio := learning_signal_ratio_bound(
            control_live, candidate_live, gate.learning_signal_ratio, alpha, gate.learning_signal_arm_sd,
            earlier))[1] > 0:
        over = f", pooled over {len(earlier) + 1} arm pairs" if earlier else ""
        return (f"{shares}, more than {gate.learning_signal_ratio:g} times as many (candidate - "
                f"{gate.learning_signal_ratio:g} x control {ratio[0]:+.3f}{over}, lower bound {ratio[1]:+.3f} > 0; "
                f"Welch over steps at alpha {alpha:.3g}, arm noise {gate.learning_signal_arm_sd:g} at a share of 0.5, "
                "scaled to each arm's)")
    if finished is not None:
        fc, fx = finished
        gain, low = learning_signal_bound(fc, fx, alpha, gate.learning_signal_arm_sd)
        if low >= gate.learning_signal:
            return (f"completions that end within the budget {np.mean(fx):.1%} of the arm's training against the "
                    f"control's {np.mean(fc):.1%} (gain {gain:+.2f}, lower bound {low:+.2f} >= "
                    f"{gate.learning_signal:.2f}; Welch over {len(fx)} + {len(fc)} steps at alpha {alpha:.3g}, arm "
                    f"noise {gate.learning_signal_arm_sd:g}){'; ' + shares if shares else ''}")
    return None


def second_pairs(run: Run, k: int, vs: list[Verdict]) -> dict[str, str]:
    """Candidates of stage k's first arm pair that get a second pair now, each inconclusive and asking for a new pair
    (its plan has one left): SETTLED (`backtest.settle_pair`, on by default) when the main effect already clears the
    promotion bar and only a check that more evidence settles held it back (a slice's lower bound past the slice
    tolerance, too few instances differing: `harness.sequential.decide`'s "not yet clear"); BACKED
    (`backtest.second_pair: backed`) when its estimate is positive and its skill was promoted in another run
    (`backed`). Either way the pair is pooled under the same sequential plan, so the error bound is the one a re-test
    a stage later would have. candidate -> why."""
    bt, bar = run.config.backtest, run.config.gate.promote_above
    out = {}
    for v in vs:
        ev = v.evidence
        if v.decision != "inconclusive" or ev is None or ev.next_step != "new_pair":
            continue
        if bt.settle_pair and ev.ci_low > bar:
            out[v.candidate] = (f"its effect is clear (lower bound {ev.ci_low:+.3f} > {bar:.3f}) and only "
                                f"{_unsure(v.reason)} held it back (backtest.settle_pair)")
        elif bt.second_pair == "backed" and ev.effect > 0 and (why := backed(run, v.candidate)) is not None:
            out[v.candidate] = f"it is backed ({why}) and its first pair was inconclusive with a positive estimate"
    return out


def signal_pairs(run: Run, k: int, vs: list[Verdict], skip: set[str] | frozenset[str] = frozenset()
                 ) -> dict[str, str]:
    """Candidates of stage k's first arm pair (not in `skip`: those already getting one) that get a second pair now
    on their learning signal (`backtest.signal_pair`, on by default): the route read their pair (`on_learning_signal`
    recorded its shares, `Evidence.live`), the verdict is still inconclusive with a pair left in its plan, its target
    estimate is not below the control's, no veto, and the signal is PROMISING: the candidate's live share at least
    `gate.learning_signal` above the control's, or the ratio contrast `candidate - learning_signal_ratio x control`
    above 0 (pooled with the earlier pairs it pools), as point estimates. The second pair is pooled by both the target
    test and the route, each pair one look at the plan's alpha, so the error bound is the one a re-test a stage later
    would have; what changes is that a change whose groups came alive is settled before its stage ends. candidate ->
    why."""
    if not run.config.backtest.signal_pair:
        return {}
    out = {}
    for v in vs:
        if v.candidate not in skip and (why := signal_promising(run, v)) is not None:
            out[v.candidate] = f"{why} (backtest.signal_pair)"
    return out


def signal_promising(run: Run, v: Verdict) -> str | None:
    """Why an inconclusive verdict's learning signal is promising but not yet shown (`signal_pairs`,
    `signal_retest`), else None: the route read it (its evidence keeps the live shares, `Evidence.live`), a pair is
    left in its plan, its target estimate is not below the control's, no veto, and the candidate's live share is at
    least `gate.learning_signal` above the control's, or the ratio contrast `candidate - learning_signal_ratio x
    control`, pooled with every earlier pair it pools (`earlier_live`), is above 0, as point estimates."""

    gate, ev = run.config.gate, v.evidence
    lifted = ev is not None and ev.sign_chance is not None and 0 < gate.futility <= ev.sign_chance  # `signal_lift`
    if (gate.learning_signal is None or v.decision != "inconclusive" or ev is None or ev.next_step != "new_pair"
            or (ev.effect < 0 and not lifted) or ev.vetoes or not ev.live.get("control")
            or not ev.live.get("candidate")):
        return None
    if (why := signal_hint(ev.live["control"], ev.live["candidate"], gate, earlier_live(run, v))) is None:
        return None
    if ev.effect < 0:  # lifted from a futility stop: shown, and its estimate may still end not below the control's
        return (f"its learning signal is shown ({why}) and its target estimate {ev.effect:+.3f} may still end not "
                f"below the control's (chance {ev.sign_chance:.3f} >= gate.futility {gate.futility:.3f})")
    return f"its learning signal is promising but not yet shown ({why}; target estimate {ev.effect:+.3f} not below " \
           "the control's)"


def signal_hint(control_live: list[float], candidate_live: list[float], gate: Any,
                earlier: list[tuple[list[float], list[float]]] = ()) -> str | None:
    """The learning-signal route's readings as point estimates (`signal_promising`, `signal_lift`): how the candidate
    arm's share of live GRPO groups is at least `gate.learning_signal` above the control's, or the ratio contrast
    `candidate - learning_signal_ratio x control` (pooled with the `earlier` pairs, as the route's test pools them)
    is above 0; else None."""
    from harness.backtest import learning_signal_ratio_bound

    if gate.learning_signal is None or not len(control_live) or not len(candidate_live):
        return None
    gain = float(np.mean(candidate_live) - np.mean(control_live))
    if gain >= gate.learning_signal:
        return f"live share +{gain:.2f} above the control's, at least the route's margin {gate.learning_signal:.2f}"
    if gate.learning_signal_ratio is not None and (c := learning_signal_ratio_bound(
            control_live, candidate_live, gate.learning_signal_ratio, 0.5, gate.learning_signal_arm_sd,
            earlier)[0]) > 0:
        over = f" over {len(earlier) + 1} arm pairs" if earlier else ""
        return (f"live share {np.mean(candidate_live):.1%} against the control's {np.mean(control_live):.1%}, more "
                f"than {gate.learning_signal_ratio:g} times as many (contrast {c:+.3f}{over})")
    return None


def signal_retest(run: Run, k: int, diagnosis: Any, candidates: list[Any], slots: int) -> list[Any]:
    """A change from this harness state whose latest test ended inconclusive with its learning signal promising
    (`signal_promising`: the groups came alive, not yet with confidence, its target estimate not below the control's,
    a pair left) is re-tested first (`backtest.signal_pair`), the most pairs' evidence first, ahead of the engineer's
    own candidates (which fill the other slots, none on its knob); a runner-up and escalation's re-test, when the
    stage escalates, still come before it (they run after). Its new pair is pooled with all its evidence, one look of
    the route at alpha / `gate.max_pairs` as every pair's. Why: code's cold temperature read 6.2% and 7.5% live
    against 0.8% and 1.7% over two pairs of its first stage (pooled contrast +0.044, lower bound below 0), and the
    engineer, ranking the training's regression as the root cause, never proposed it again (BENCHMARKS.md,
    sixty-third session). Returns the candidates to commit."""
    from harness.engineer.proposal import change_key
    from harness.memory import candidate_from_row

    if k <= 1 or not run.config.backtest.signal_pair:
        return candidates
    found = []
    for row in _latest_inconclusive(run, diagnosis.state):
        if not row.get("evidence"):
            continue
        v = Verdict(candidate=row["id"], decision="inconclusive", reason=row.get("reason") or "",
                    evidence=Evidence.model_validate(row["evidence"]))
        if (why := signal_promising(run, v)) is not None:
            found.append((v.evidence.pairs, row, why))
    if not found:
        return candidates
    _, row, why = max(found, key=lambda f: (f[0], f[1]["id"]))
    old = candidate_from_row(row)
    if any(change_key(diagnosis.state, c.change) == change_key(diagnosis.state, old.change) for c in candidates):
        return candidates  # the engineer proposed it again itself: its pair pools all the same
    said = f"{row['id']} ({old.change.knob} -> {old.change.value}): {why}: re-tested first, pooled with its evidence"
    run.event(k, "propose", "signal_retest", said, key=f"{k}/signal-retest/{row['id']}")
    retest = old.model_copy(update={"rationale": cut(f"signal re-test: {said}. Was: {old.rationale}", 2000)})
    rest = [c for c in candidates if c.change.knob != old.change.knob]
    return [retest, *rest][:max(slots, 1)]


def _latest_inconclusive(run: Run, state: str) -> list[dict[str, Any]]:
    """Each change's latest test from harness state `state` (which pooled the earlier ones), where it ended
    inconclusive with its evidence left (what escalation and `signal_retest` may re-test): their candidate rows."""
    from harness.memory import history

    latest: dict[str, Any] = {}
    for h in history(run):  # a change with a final test from this state is final in the history (never re-tested)
        if h.key.startswith(f"{state}|") and (h.key not in latest or h.stage >= latest[h.key].stage):
            latest[h.key] = h
    return [run.store.candidate(h.candidate) for h in latest.values() if h.verdict == "inconclusive"]


def _unsure(reason: str) -> str:
    """What a "not yet clear" verdict's reason says is unsettled, without its numbers' parenthesis."""
    head = reason.split(" (effect ", 1)[0]
    return head.removeprefix("not yet clear: ") or "a check"


CONFIRM_Z = 2.5  # a carry confirmation stops before its last batch once |mean / se| of the paired differences is this


def _mean_se(diffs: list[float], problems: list[str] | None = None) -> tuple[float, float]:
    """Mean of paired differences and its standard error (0 with fewer than two). `problems` (one label per
    difference): copies of one problem, which greedy decoding scores identically, are counted once: the
    cluster-robust standard error (`harness.sequential._ss_dof`), never below the plain one."""
    d = np.asarray(diffs, dtype=float)
    if len(d) < 2:
        return float(d.mean()) if len(d) else 0.0, 0.0
    if problems:
        from harness.sequential import _ss_dof

        ss, dof = _ss_dof(d, list(problems))
        return float(d.mean()), float(np.sqrt(ss / dof / len(d))) if dof > 0 else 0.0
    return float(d.mean()), float(d.std(ddof=1)) / np.sqrt(len(d))


def confirm_clear(diffs: list[float]) -> bool:
    """Is the sign of a carry confirmation's paired greedy differences clear (so no further batch is judged)? |z| >=
    CONFIRM_Z on the normal approximation; all differences equal and non-zero is clear, all zero is not."""
    if len(diffs) < 2:
        return False
    mean, se = _mean_se(diffs)
    return mean != 0.0 if se == 0.0 else abs(mean) / se >= CONFIRM_Z


def confirm_batches(judge: Callable[[int, int, int], list[float]], planned: int, most: int,
                    size: int, extends: Callable[[list[float]], bool] | None = None) -> list[float]:
    """The paired differences (chosen minus start) a carry confirmation judges: batch j (from 1) holds the instances
    at indices [at, end) (batches of `size`, the planned instances' last one cut at `planned`), `judge(j, at, end)`
    returns their differences; it stops once the sign is clear (`confirm_clear`), past the `planned` instances unless
    `extends` (default `confirm_extends`), and at `most`."""
    extends = confirm_extends if extends is None else extends
    starts = [*range(0, planned, size), *range(planned, most, size)]
    diffs: list[float] = []
    for j, (at, end) in enumerate(zip(starts, [*starts[1:], most], strict=True), 1):
        if at >= planned and not extends(diffs):
            break
        diffs += judge(j, at, end)
        if confirm_clear(diffs):
            break
    return diffs


def confirm_extends(diffs: list[float]) -> bool:
    """Does a carry confirmation that has judged its planned `backtest.carry_confirm` instances judge another batch
    (up to `backtest.carry_confirm_max`)? When the chosen checkpoint reads above the start but its sign is not clear
    yet (0 < z < CONFIRM_Z): the reading a real gain of one stage most often gives at the planned size, and the one
    whose decision more evidence can change. A reading at or below the start stops (more instances would rarely lift
    it over the margin), and a clear one has stopped already. A selection rule with a stop on |z| at every batch and
    the margin at the last, not a test: repeated looks make a nominal rate meaningless (Armitage, McPherson & Rowe,
    "Repeated significance tests on accumulating data", JRSS A 1969), so what bounds a false carry is measured, by
    simulation in `tests/test_decisions.py`."""
    if len(diffs) < 2:
        return False
    mean, se = _mean_se(diffs)
    return mean > 0.0 and se > 0.0 and mean / se < CONFIRM_Z


def anchor_extends(margin: float) -> Callable[[list[float]], bool]:
    """`confirm_extends` for a reading against the anchor (`stage.keep_training`): judge on past the planned instances
    only while the reading would make the checkpoint the new anchor without a clear sign (`margin` <= z < CONFIRM_Z),
    the one outcome more instances can still take back. Below the margin and above its mirror the lineage trains on
    and the anchor stays whatever a longer reading says (`carry_reading`: kept), so instances read there decide
    nothing. Simulated over six stages at the spread of the too-hard mix's confirmations (1,000 runs a row,
    `tests/test_decisions.py`, BENCHMARKS.md forty-seventh session): the anchor ends where `confirm_extends` leaves it
    under steady gains (+1.0 a stage: +5.56 against +5.53 points) and no lower under steady harm (-1.5 a stage: -0.10
    against -0.11), on 26-31% fewer confirmation instances under gains (9% under harm, whose readings stop either
    way)."""

    def extends(diffs: list[float]) -> bool:
        if len(diffs) < 2:
            return False
        mean, se = _mean_se(diffs)
        return mean > 0.0 and se > 0.0 and margin <= mean / se < CONFIRM_Z

    return extends


def carry_reading(change: float, se: float, margin: float, against_anchor: bool) -> tuple[bool, bool]:
    """(confirmed, kept) for a carry confirmation's paired greedy reading `change` (standard error `se`): confirmed
    when it reads at least `margin` standard errors above what it was compared with (and, against the anchor, above it
    at all: a level reading never replaces the anchor); kept (against the anchor only, `stage.keep_training`) when
    not confirmed but not below it by `margin` standard errors either: the lineage trains on."""
    confirmed = change >= margin * se and (not against_anchor or change > 0)
    return confirmed, against_anchor and not confirmed and change >= -margin * se


def read_pair(run: Run, k: int, key: str, chosen: tuple[str, str], ref: tuple[str, str],
              extends: Callable[[list[float]], bool] | None = None) -> tuple[list[float], list[float], float, float]:
    """Two checkpoints, `chosen` and `ref` ((node name, path) each), decoded greedily on stage k's fresh backtest
    instances in batches (`confirm_batches`: `backtest.carry_confirm` planned under key `s{k}/<key>`, up to
    `backtest.carry_confirm_max` while `extends`, those drawn under `s{k}/<key>-more` only when it judges on; each
    batch recorded by `harness.arms.judge_carry_batch`; a reading that does not extend moves the forward-only
    backtest cursor only by its planned instances). Returns (chosen's outcomes, ref's, mean paired difference, its
    standard error)."""
    from harness.arms import judge_carry_batch

    cfg = run.config.backtest
    most = cfg.confirm_most
    seeds = run.draw_seeds("backtest", cfg.carry_confirm, key=f"s{k}/{key}")
    mine: list[float] = []
    theirs: list[float] = []

    def judge(j: int, at: int, end: int) -> list[float]:
        if end > len(seeds):
            seeds.extend(run.draw_seeds("backtest", most - cfg.carry_confirm, key=f"s{k}/{key}-more"))
        part = seeds[at: end]
        a, b = judge_carry_batch(run, k, chosen[0], chosen[1], part, j), judge_carry_batch(run, k, ref[0], ref[1],
                                                                                             part, j)
        mine.extend(a)
        theirs.extend(b)
        return [x - y for x, y in zip(a, b, strict=True)]

    diffs = confirm_batches(judge, cfg.carry_confirm, most, max(1, min(cfg.n, cfg.carry_confirm)), extends=extends)
    change, se = _mean_se(diffs, problems(run, seeds[: len(diffs)]))
    return mine, theirs, change, se


def problems(run: Run, seeds: list[int]) -> list[str]:
    """One label per backtest seed of the judge's distribution: a short hash of its prompt, shared by copies of one
    problem (`harness.records.problem_label`, as `harness.backtest.ArmEval.problems`)."""
    insts = run.instances(run.judge.config(run.task), list(seeds))
    return [problem_label(run.task.prompt(i, run.style)) for i in insts]


def confirm_carry(run: Run, k: int, chosen: str, bt: Backtested, start: str | None = None,
                  margin: float | None = None, anchor: str | None = None) -> tuple[str, CarryChecked | None]:
    """(the checkpoint that continues, what the confirmation read or None): a trained checkpoint that
    `harness.results.continues_from` chose over the stage's start must confirm it on FRESH backtest instances
    (`backtest.carry_confirm` of them, drawn under their own key): both decoded greedily, in batches of `backtest.n`,
    stopping early once the sign is clear (`confirm_clear`), and going on past the planned size up to
    `backtest.carry_confirm_max` while it reads above the start without a clear sign (`confirm_extends`, the extra
    instances drawn under their own key); the chosen one continues only when its greedy estimate there is above the
    start's by at least `backtest.carry_margin` standard errors of the paired difference, else the start continues:
    the one-standard-error rule (Breiman, Friedman, Olshen & Stone, "Classification and Regression
    Trees", 1984, section 3.4.3; Hastie, Tibshirani & Friedman, "The Elements of Statistical Learning", section 7.10),
    with the start as the simpler model. The harness decision is untouched (a promoted change stays promoted); only
    which weights continue is checked.

    Why fresh instances: the arm was chosen (as winner, as control level with the start, or as the best arm) on the
    instances that also estimate it, and an estimate read on the instances a choice was made on is biased upward
    (selection bias: Cawley & Talbot, "On over-fitting in model selection and subsequent selection bias in
    performance evaluation", JMLR 2010; the holdout re-estimate is the standard remedy). At n=96 a paired greedy
    difference has a standard error near 5 points, so "not below the start" passes a checkpoint 4-8 points worse
    often enough that a three-stage run carries one: on the too-hard-mix scenario of the reference family all three
    seeds did, reading level or above on their 96 instances (one +10.4) and -3 to -9 on 384 fresh ones. And why a
    margin: with "not below" (`carry_margin: 0`) the three confirmations there read +0.000, +0.000 and +0.014 (se
    0.025-0.029) for checkpoints 2-5 points below the start on 1,920 instances; a 288-instance confirmation passes a
    true change of 0 about half the time and of -3 points about one time in seven, while with one standard error
    (about 2.7 points) those fall to about 16% and 2%, and a true +5 still passes about 80%. A selection rule, not a
    test.

    `start`: the stage's start checkpoint when the stage judged no arm (`bt.start` is None: an exploit stage, or a
    stage with nothing to backtest), so its trained checkpoint confirms against it all the same. `margin`: the
    standard errors it must read above the start (default `backtest.carry_margin`; an exploit stage's is
    `backtest.exploit_margin`; not against the anchor, where `carry_margin` decides).

    `anchor` (`stage.keep_training`: the run's best confirmed checkpoint): the chosen checkpoint is read against it
    instead of the stage's start, with three outcomes: above it by the margin, it continues and becomes the anchor
    (`confirmed`); not below it by the margin either, it continues and the anchor stays (`kept`: the lineage keeps
    training); below, the anchor continues. Past its planned instances that reading judges on only while the anchor's
    replacement is at stake (`anchor_extends`). A checkpoint that is the stage's start, or the anchor, is not read
    again.
    Keep the best, as early stopping keeps the best validation checkpoint while training goes on (Prechelt, "Early
    Stopping - But When?", 1998), with the one-standard-error rule deciding what counts as better or worse."""
    cfg = run.config.backtest
    ref = anchor if anchor is not None else bt.start.checkpoint if bt.start is not None else start
    # against the anchor every reading obeys `carry_margin` (an exploit stage's own margin would decide who becomes
    # the anchor and who goes back as well: `backtest.exploit_margin`'s help)
    m = cfg.carry_margin if margin is None or anchor is not None else margin
    stage_start = bt.start.checkpoint if bt.start is not None else start
    if cfg.carry_confirm == 0 or ref is None or chosen == ref or (anchor is not None and chosen == stage_start):
        return chosen, None
    most = cfg.confirm_most
    base = Path(chosen).name
    mine, theirs, change, se = read_pair(run, k, "carry", (base.removeprefix(f"s{k}-"), chosen),
                                         ("start" if anchor is None else "anchor", ref),
                                         extends=None if anchor is None else anchor_extends(m))
    confirmed, kept = carry_reading(change, se, m, against_anchor=anchor is not None)
    check = CarryChecked(chosen=chosen, start=ref, n=len(mine), chosen_valid=float(np.mean(mine)),
                         start_valid=float(np.mean(theirs)), change=change, se=se, confirmed=confirmed,
                         against_anchor=anchor is not None, kept=kept)
    said = (f"{base} against {'the anchor' if anchor is not None else 'the stage' + chr(39) + 's start'} "
            f"{Path(ref).name}, greedy on {check.n} fresh backtest "
            f"instances ({cfg.carry_confirm} planned, at most {most}): {check.chosen_valid:.3f} vs "
            f"{check.start_valid:.3f} (change {check.change:+.3f}, se {check.se:.3f}; "
            + (f"it must read at least {m:g} se above)" if m else "it must not read below)"))
    if check.confirmed:
        run.event(k, "decide", "carry_confirmed", f"{said}: it continues"
                  + (" and becomes the anchor (the run's best confirmed checkpoint)" if anchor is not None else ""),
                  key=f"{k}/carry-confirm")
        return chosen, check
    if check.kept:
        run.event(k, "decide", "lineage_kept", f"{said}: not above the anchor by its noise, nor below it by as "
                  f"much, so the next stage trains on from {base} and the anchor stays {Path(ref).name} "
                  "(stage.keep_training)", key=f"{k}/carry-confirm")
        return chosen, check
    run.event(k, "decide", "not_carried", f"{said}: " + (
        f"below the anchor by more than its noise, so the next stage starts from the anchor {Path(ref).name} "
        "(stage.keep_training)" if anchor is not None else
        f"not above the start by its noise on instances it was not chosen on, so the next stage starts from "
        f"{Path(ref).name} (backtest.carry_confirm)"), key=f"{k}/carry-confirm")
    return ref, check


def pick_extends(diffs: list[float]) -> bool:
    """Does the final pick (`final_pick`) judge on past its planned instances? While the sign is not clear, unless
    every difference so far is zero (two checkpoints that decode alike: more instances would read the same)."""
    return not confirm_clear(diffs) and any(diffs)


def final_pick(run: Run, k: int, lineage: str, anchor: str) -> str:
    """What a run under `stage.keep_training` delivers when it stops after stage k with its lineage apart from its
    anchor: the two read greedily on `backtest.carry_confirm` fresh backtest instances (their own draw, batches of
    `backtest.n`, stopping once the sign is clear) and on up to `backtest.carry_confirm_max` while it is not
    (`pick_extends`), and the lineage is delivered unless it reads below the anchor. No status-quo margin here: both
    are candidates for one delivery, the lineage was never below the anchor by its noise at any stage, and it has
    trained more; a real gain too slow for any one stage's reading to confirm (the lineage drifting up by a point over
    several stages) is what the margin kept out of the anchor. Simulated over
    six stages (`tests/test_decisions.py`) it keeps +0.2 to +0.5 points more of a steady gain and costs under 0.2 of a
    steady harm. Recorded (node `final`) and read back on a resume."""
    from harness.results import FinalPicked

    if (r := run.result(k, FinalPicked)) is not None:
        return r.picked
    cfg = run.config.backtest
    if cfg.carry_confirm == 0 or lineage == anchor:
        return anchor
    mine, theirs, change, se = read_pair(run, k, "final", ("final-lineage", lineage), ("final-anchor", anchor),
                                         extends=pick_extends)
    picked = lineage if change >= 0 else anchor
    check = CarryChecked(chosen=lineage, start=anchor, n=len(mine), chosen_valid=float(np.mean(mine)),
                         start_valid=float(np.mean(theirs)), change=change, se=se, confirmed=picked == lineage,
                         against_anchor=True)
    run.event(k, "remember", "final_pick", f"the run stops: its lineage {Path(lineage).name} against its anchor "
              f"{Path(anchor).name}, greedy on {check.n} fresh backtest instances: {check.chosen_valid:.3f} vs "
              f"{check.start_valid:.3f} (change {change:+.3f}, se {se:.3f}): the run delivers "
              f"{Path(picked).name} (" + ("the lineage: not below the anchor" if picked == lineage
                                          else "the anchor: the lineage reads below it") + ")", key=f"{k}/final-pick")
    run.save_result(k, FinalPicked(picked=picked, check=check))
    return picked


def anchor_at(run: Run, k: int) -> str | None:
    """The run's anchor when stage k starts (`stage.keep_training`): the last decided stage's (`Decided.anchor`, or its
    `next_policy` in a stage recorded without one; a stage the run stopped after delivers its `final_pick`, which a run
    resumed with a larger budget goes on from), else the warm start; None before setup."""
    from harness.results import FinalPicked, SetUp, StopChecked

    for j in range(k - 1, 0, -1):
        stopped = run.result(j, StopChecked)
        # a pick counts only where the run did stop after stage j: a kill between the pick and the stage's end, then
        # a resume with a larger budget, re-decides that stage's stop, and its pick was never the delivery
        if (f := run.result(j, FinalPicked)) is not None and stopped is not None and stopped.reason:
            return f.picked
        if (d := run.result(j, Decided)) is not None:
            return d.anchor or d.next_policy
    setup = run.result(0, SetUp)
    return setup.policy if setup is not None else None


def fell_below_start(start: Any, arm: ArmEval) -> bool:
    """Is this (promoted) arm's estimate below the judged start's (the stage's start), on the instances it was judged
    on? A change can beat a collapsing control and still lower the policy: its harness is promoted, its checkpoint
    is not carried (`harness.results.continues_from`, whose rule this is: the point estimate, not "beyond noise";
    sampled, and greedy too under `backtest.carry_greedy`)."""
    import numpy as np

    if start is None or len(start.outcomes) < len(arm.outcomes) or not arm.outcomes:
        return False
    return float(np.mean(arm.outcomes)) < float(np.mean(start.outcomes[: len(arm.outcomes)])) \
        or start.greedy_below(arm.greedy)


def arms_vs_start(run: Run, k: int, start: Any, verdicts: list[Verdict], arms: dict[str, Any],
                  evals: dict[str, Any]) -> list[ArmVsStart]:
    """Each judged candidate arm the gate did not promote, compared with the stage's judged start on the instances it
    was judged on (the first pair's arm; `harness.backtest.regression` at the gate's confidence). One confidently above
    the start (and above the control arm) is the checkpoint that continues if no candidate wins (`continues_from`)."""
    out = []
    for v in verdicts:
        ev = evals.get(v.candidate)
        arm = arms.get(v.candidate)
        if v.decision == "promoted" or v.evidence is None or isinstance(ev, Exception) or ev is None \
                or isinstance(arm, Exception) or arm is None or not ev.outcomes \
                or len(start.outcomes) < len(ev.outcomes):
            continue
        reg = regression(start.outcomes[: len(ev.outcomes)], ev.outcomes, run.config.gate,
                         np.random.default_rng([run.config.seed, k, 11]), clusters=ev.problems or None)
        out.append(ArmVsStart(candidate=v.candidate, checkpoint=arm.checkpoint, change=reg.change,
                              change_ci=[reg.ci_low, reg.ci_high], greedy_below=start.greedy_below(ev.greedy)))
    return out


def most_promising_inconclusive(run: Run, state: str, causes: set[str] | frozenset[str] = frozenset()
                                ) -> dict[str, Any] | None:
    """The inconclusive candidate from harness state `state` with evidence left and a positive estimate that the loop
    re-tests when a failure recurs: one proposed for a finding in `causes` (`addresses`) first, then the most
    promising (`harness.sequential.promise`: the chance its remaining pairs, pooled with all its evidence so far, end
    in a promotion), then the highest lower bound. Each change is read at its latest test (which pooled the earlier
    ones). None when there is none."""
    from harness.sequential import promise

    cfg = run.config
    plan = cfg.gate.plan(cfg.backtest.n)
    best, best_key = None, None
    for row in _latest_inconclusive(run, state):
        if row.get("effect") is None or row["effect"] <= 0:
            continue
        earlier, _, _ = pooled_evidence(run, row["id"])  # what a re-test of it would pool: every test of it so far
        pairs = earlier + prior_pairs([Evidence.model_validate(row["evidence"])], fingerprint(run))[0] \
            if row.get("evidence") else earlier
        chance = promise(pairs, plan, int((row.get("evidence") or {}).get("comparisons") or 1))
        lo = row.get("ci_low") if row.get("ci_low") is not None and row.get("ci_high") is not None else -1
        key = (int(bool(causes) and addresses(run, row, causes)), round(chance, 6), lo)
        if best_key is None or key > best_key:
            best, best_key = row, key
    return best


def addresses(run: Run, row: dict[str, Any], codes: set[str] | frozenset[str]) -> bool:
    """Was this candidate proposed for one of these finding codes? Its skill's trigger names one (fnmatch, as the rule
    engineer matches), or, for a change no skill made (an LLM engineer's), its rationale names one."""
    import fnmatch

    name = row.get("skill")
    if name:
        lib = run.skills()
        try:
            triggers = lib.get(name).trigger.findings
        except Exception:  # noqa: BLE001 - a skill the library no longer holds: fall back to the rationale
            triggers = []
        finally:
            lib.close()
        if any(fnmatch.fnmatchcase(c, t) for c in codes for t in triggers):
            return True
    return any(c in (row.get("rationale") or "") for c in codes)


def carried_nothing(run: Run, k: int) -> list[int]:
    """The stages just before stage k, latest first and in an unbroken run, that carried no trained checkpoint: each
    ended with the next stage starting from a checkpoint the run held before it (`Decided.next_policy`: its own
    start, or under `stage.keep_training` the anchor a lineage was sent back to)."""
    from harness.results import SetUp, carried_flags

    setup = run.result(0, SetUp)
    flags = carried_flags(setup.policy if setup is not None else None, [run.result(j, Decided) for j in range(1, k)])
    out = []
    for j in range(k - 1, 0, -1):
        if flags[j - 1] is not False:  # carried, or not decided
            break
        out.append(j)
    return out


IDLE_STAGES = 2  # after this many stages in a row that carried no trained checkpoint, the next stage escalates


INCUMBENT = "harness@main"  # what a stage exploits after a confirmed gain of its lineage, or while backing off


def exploiting(run: Run, k: int) -> str | None:
    """The promoted candidate stage k exploits (`stage.exploit_after_promotion`), `INCUMBENT` when it exploits the
    harness that just trained the policy up (`stage.exploit_after_gain`), or None when stage k explores.
    After a promotion the next stage exploits it, and so does each stage after an exploit stage whose checkpoint
    continued (it confirmed against its start: training under the promoted harness still pays), up to
    `exploit_after_promotion` stages in a row; an exploit stage whose checkpoint did not continue (training under
    that harness stopped paying, or lowered the policy) hands the next stage back to exploring, and so does the cap
    (a long run still looks for the next change). An exploit stage trains under harness@main for the compute its
    arms would have used and proposes nothing; its checkpoint continues only when it confirms (`confirm_carry`).
    The explore/exploit rhythm of population-based training (Jaderberg et al., "Population Based Training of Neural
    Networks", 2017: a member trains under what won until it is ready for the next change), with "ready" read from
    the policy rather than a fixed interval. A human-revised or aborted stage promotes nothing, so it starts no
    exploitation, and a person's revision at an exploit stage ends the streak (the next stage's engineer acts on it).

    The same rhythm without a promotion: an exploring stage that promoted nothing but whose own lineage (its training
    and control arm under harness@main, not a candidate's arm) confirmed a gain on fresh target instances
    (`Decided.carry_check` confirmed: above the anchor, or the stage's start, by the carry margin) is evidence that the
    incumbent harness trains the policy; the next `exploit_after_gain` stages in a row exploit it while their
    checkpoints continue. Why: on a harness that needs no fix every exploring stage spends about two thirds of its
    compute on arms and judging that are thrown away (an evolved arm that promoted nothing trained its lineage at
    most 180 GRPO steps where the fixed arm at its compute trained 505-613, and ended 5 points below it). Measured
    at three stages (BENCHMARKS.md, sixty-sixth session) it bought +0.3 points there, within noise: one of its two
    exploit stages read below the anchor and was discarded; on the four full-size MAPF scenarios with no gap it fired
    in 3 of 12 seed runs and changed what was delivered in one, by +0.5 (sixty-seventh). A harness that does not
    train the policy (a stall, a collapse, a mix that misses the target) confirms no gain and keeps exploring: the
    cold-temperature code scenario's three seeds were identical to the digit. Nor does a harness with a known root
    cause: when a diagnosis since that exploring stage named one (`known_causes`: the mix misses the target, the
    reward pays invalid answers, ...), a gain under it does not say that the fix is not needed, so the loop keeps
    exploring (`exploit_held`)."""
    return _exploit(run, k)[0]


def exploit_held(run: Run, k: int) -> list[str]:
    """The critical root causes that kept stage k exploring although the exploring stage before it confirmed a gain of
    its own lineage (`exploiting`, `stage.exploit_after_gain`); empty when nothing was held back."""
    return _exploit(run, k)[1]


def backing_off(run: Run, k: int) -> tuple[int, int, int] | None:
    """(exploring stages in a row that found nothing, exploit stages since the last of them, exploit stages this wait
    allows) when stage k exploits harness@main because exploring keeps finding nothing (`stage.explore_backoff`); None
    when stage k explores.

    An exploring stage found nothing (`found_nothing`) when it promoted nothing, carried no candidate's arm, confirmed
    no gain of its lineage (else `stage.exploit_after_gain` applies) and its own lineage under harness@main trained
    on (its training or control arm continued: the harness did not lower the policy). After `explore_backoff` such
    stages in a row, the loop exploits for 1 stage, after one more for 3, then 7: 2^(m+1) - 1 exploit stages after
    the explore_backoff + m-th, walking back over exploit stages whose checkpoints continued (one that did not, a
    promotion, or an exploring stage that found something ends the streak). Decaying exploration, as epsilon-greedy
    with epsilon_t ~ 1/t (Auer, Cesa-Bianchi & Fischer, "Finite-time analysis of the multiarmed bandit problem",
    Machine Learning 47, 2002): each null exploration halves how often the loop pays for the next. What ends the wait
    early is new evidence: a diagnosis since the last exploring stage that names a critical finding that stage's
    did not (its candidates answered the findings it saw, not this one), nor any other exploring stage of the streak.
    A person's revision or abort at any stage of the streak ends it too."""
    b = run.config.stage.explore_backoff
    if b == 0:
        return None
    nulls, since, explored = 0, 0, []
    for j in range(k - 1, 0, -1):
        d, t = run.result(j, Decided), run.result(j, Trained)
        if d is None or t is None:
            return None
        if t.exploits:
            if t.exploits != INCUMBENT or d.next_policy != t.checkpoint:  # a promotion's, or one that stopped paying
                break
            if (human := run.result(j, GateAnswer)) is not None and human.action in ("revise", "abort"):
                break  # a person asked for something else: the next stage's engineer acts on it
            since += nulls == 0
            continue
        if not found_nothing(run, j, d, t):
            break
        nulls, explored = nulls + 1, [*explored, j]
    allowed = 2 ** (nulls - b + 1) - 1 if nulls >= b else 0
    if since >= allowed or new_findings(run, explored, k):
        return None
    return nulls, since, allowed


def found_nothing(run: Run, j: int, d: Decided, t: Trained) -> bool:
    """Did exploring stage j find nothing while harness@main trained its lineage on (`backing_off`)?"""
    if t.exploits or d.winner or gained(run, j, d):
        return False
    if (human := run.result(j, GateAnswer)) is not None and human.action in ("revise", "abort"):
        return False
    probed, bt = run.result(j, Probed), run.result(j, Backtested)
    if probed is None or probed.regressed:
        return False
    return d.next_policy in {t.checkpoint, bt.control if bt is not None else None} - {None}


def new_findings(run: Run, explored: list[int], k: int) -> list[str]:
    """The critical findings of the diagnoses after the last of these exploring stages (up to stage k - 1) that none
    of them named critical: a code whose rate crosses its threshold in one stage and not the next (one exploring stage
    saw it, the other not) is not new evidence; one no exploring stage of the streak answered is."""
    if not explored:
        return []
    seen = {f.code for j in explored for f in run.store.findings(run.id, stage=j) if f.severity == "critical"}
    return sorted({f.code for j in range(max(explored) + 1, k) for f in run.store.findings(run.id, stage=j)
                   if f.severity == "critical" and f.code not in seen})


def known_causes(run: Run, stages: range) -> list[str]:
    """The critical root-cause findings (`harness.engineer.rule.ROOT_CAUSES`: the training lowered the policy, the
    reward pays invalid answers, the mix cannot teach or misses the target, ...) of these stages' diagnoses."""
    from harness.engineer.rule import ROOT_CAUSES

    return sorted({f.code for j in stages for f in run.store.findings(run.id, stage=j)
                   if f.severity == "critical" and f.code in ROOT_CAUSES})


def _exploit(run: Run, k: int) -> tuple[str | None, list[str]]:
    """`exploiting` and `exploit_held` in one walk back from stage k."""
    cap, gain_cap = run.config.stage.exploit_after_promotion, run.config.stage.exploit_after_gain
    for exploited, j in enumerate(range(k - 1, 0, -1)):  # `exploited`: exploit stages between j and k
        d, t = run.result(j, Decided), run.result(j, Trained)
        if d is None:
            return None, []
        if d.winner:
            return (d.winner if exploited < cap else None), []
        if t is not None and t.exploits and d.next_policy == t.checkpoint:  # exploiting paid: what did it exploit?
            if (human := run.result(j, GateAnswer)) is not None and human.action in ("revise", "abort"):
                return None, []  # a person asked for something else at an exploit stage: the engineer acts on it
            continue
        if t is not None and not t.exploits and exploited < gain_cap and gained(run, j, d):
            causes = known_causes(run, range(j, k))
            return (None, causes) if causes else (INCUMBENT, [])
        return None, []  # explored without a confirmed gain, or exploiting stopped paying
    return None, []


def gained(run: Run, j: int, d: Decided) -> bool:
    """Did exploring stage j, promoting nothing, confirm a gain of its own lineage (`exploiting`)? Its carry reading
    confirmed the checkpoint that continues, and that checkpoint is not a candidate's arm (`continues_from` may carry
    an arm confidently above the start without promoting its harness: the gain is then not the incumbent's). A stage a
    person revised or aborted at the gate starts no exploitation: the next stage's engineer must act on what they
    said."""
    c = d.carry_check
    if c is None or not c.confirmed or d.next_policy != c.chosen:
        return False
    if (human := run.result(j, GateAnswer)) is not None and human.action in ("revise", "abort"):
        return False
    bt = run.result(j, Backtested)
    return bt is None or all(a.checkpoint != c.chosen for a in bt.arms_vs_start)


def exploit_steps(run: Run, recipe_steps: int) -> int:
    """The GRPO steps of an exploit stage: the stage's own plus what its arms would have trained (a control arm and
    `stage.candidates` candidate arms of `backtest.arm_steps` each)."""
    cfg = run.config
    return recipe_steps + (cfg.stage.candidates + 1) * cfg.backtest.arm_steps


def _causes(run: Run, k: int, diagnosis: Any, idle: list[int]) -> set[str]:
    """The findings an escalation's re-test should answer: the root causes (`harness.engineer.rule.ROOT_CAUSES`: the
    training lowered the policy, the reward pays invalid answers, the mix cannot teach or misses the target) found
    now or in the stages that carried nothing (else the previous stage); when there is none, every critical finding
    of those stages. A fix for a symptom (dead groups, say) with a better interval comes after a fix for the cause."""
    from harness.engineer.rule import ROOT_CAUSES

    found = list(diagnosis.findings)
    for j in idle or [k - 1]:
        found += run.store.findings(run.id, stage=j)
    roots = {f.code for f in found if f.code in ROOT_CAUSES}
    return roots or {f.code for f in found if f.severity == "critical"}


def escalate(run: Run, k: int, diagnosis: Any, candidates: list[Any], slots: int) -> list[Any]:
    """The loop escalates instead of throwing a stage away again when a critical finding recurs (this stage's and
    the previous stage's diagnoses both carry it: the stage's training lowered the policy again) or when the last
    IDLE_STAGES stages in a row carried no trained checkpoint (`carried_nothing`, whatever the reason): the most
    promising inconclusive fix from this state is re-tested first, one proposed for a root cause found in these
    stages before any other (`_causes`, `most_promising_inconclusive`), its new pair pooled with its evidence; the
    engineer's own candidates fill the other slots (the next skill). Returns the candidates to commit."""
    from harness.engineer.proposal import change_key
    from harness.memory import candidate_from_row

    now = {f.code for f in diagnosis.findings if f.severity == "critical"}
    before = {f.code for f in run.store.findings(run.id, stage=k - 1)} if k > 1 else set()
    recurring = sorted(now & before & set(RECURRING))
    idle = carried_nothing(run, k)
    if recurring:
        why = f"{recurring[0]} again (stages {k - 1} and {k})"
    elif len(idle) >= IDLE_STAGES:
        why = f"stages {', '.join(map(str, sorted(idle)))} carried no trained checkpoint"
    else:
        return candidates
    row = most_promising_inconclusive(run, diagnosis.state, _causes(run, k, diagnosis, idle))
    if row is None:
        run.event(k, "propose", "escalation", f"{why}; no inconclusive fix from this state to re-test: the "
                  "engineer's next skill instead", key=f"{k}/escalation")
        return candidates
    old = candidate_from_row(row)
    key = change_key(diagnosis.state, old.change)
    rest = [c for c in candidates if change_key(diagnosis.state, c.change) != key and c.change.knob != old.change.knob]
    ev = row.get("evidence") or {}
    retest = old.model_copy(update={"rationale": (
        f"escalation: {why}; re-testing {row['id']} (inconclusive: effect {ev.get('effect', 0):+.3f} "
        f"[{ev.get('ci_low', 0):+.3f}, {ev.get('ci_high', 0):+.3f}], n={evidence_n(ev)}) with a new arm pair pooled with "
        f"its evidence. Was: {old.rationale}")[:2000]})
    run.event(k, "propose", "escalation", f"{why}: re-testing the most promising inconclusive fix {row['id']} "
              f"({old.change.knob} -> {old.change.value}) first", key=f"{k}/escalation")
    return [retest, *rest][:max(slots, 1)]


def runners_up(run: Run, k: int, diagnosis: Any, candidates: list[Any], slots: int) -> list[Any]:
    """One change a stage is promoted (`harness.backtest.choose_winner`): a change of stage k-1 that passed the gate
    and was beaten by that stage's winner is evidence that it works, from a harness state that no longer exists. So
    stage k re-tests it first from the new state (a new control: the winner's harness), best lower bound first, ahead
    of the engineer's own candidates (which fill the other slots, none on the same knob); escalation's re-test, when
    the stage escalates, still comes before it (`escalate` runs after). A change that no longer applies to the new
    harness is skipped with an event. Why: the too-hard run's whole-mixture change passed the gate at stage 2
    (+0.225 [+0.028, +0.377]) behind a learning-rate change, and nothing ever tested it again. Returns the candidates
    to commit."""
    from harness.memory import candidate_from_row, passed_gate
    from harness.vet import apply_change

    if k <= 1:
        return candidates
    rows = sorted((c for c in run.store.candidates(run.id, stage=k - 1) if passed_gate(c)),
                  key=lambda r: -(r.get("ci_low") if r.get("ci_low") is not None else -1.0))
    if not rows:
        return candidates
    main = run.workspace().files("main")
    front = []
    for row in rows:
        old = candidate_from_row(row)
        try:
            apply_change(main, old.change, run.task)
        except ValueError as exc:
            run.event(k, "propose", "runner_up_skipped", f"{row['id']} ({old.change.knob} -> {old.change.value}) "
                      f"passed the gate at stage {k - 1} but does not apply to the new harness: {cut(exc, 300)}",
                      key=f"{k}/runnerup/{row['id']}")
            continue
        ev = row.get("evidence") or {}
        why = (f"{row['id']} passed the gate at stage {k - 1} (effect {ev.get('effect', 0):+.3f} "
               f"[{ev.get('ci_low', 0):+.3f}, {ev.get('ci_high', 0):+.3f}], n={evidence_n(ev)}) and was "
               f"{row.get('reason') or 'beaten'}: re-tested from the new harness state")
        front.append(old.model_copy(update={"rationale": cut(f"runner-up: {why}. Was: {old.rationale}", 2000)}))
        run.event(k, "propose", "runner_up", why, key=f"{k}/runnerup/{row['id']}")
    knobs = {c.change.knob for c in front}
    rest = [c for c in candidates if c.change.knob not in knobs]
    return [*front, *rest][:max(slots, 1)]
