"""The autonomous run: a LangGraph StateGraph that trains in stages and evolves the harness between them.

    setup -> train -> probe -> diagnose -> propose -> vet -> backtest -> gate -> decide -> remember -> (train | END)

This file is the stage: its nodes, top to bottom in the order they run, and the graph that wires them. Each node reads
the typed results of the nodes before it (`harness.results`, through `Run.result`) and writes its own. The rooms
around it: `harness.run` (the `Run` context the nodes share: config, store, workspace, instance and policy caches),
`harness.lifecycle` (create, drive, resume and answer a run), `harness.round0` (the round-0 harness files),
`harness.arms` (the policy's GRPO stage and the backtest arms on the local or Ray backend), `harness.backtest` (the
one judge: `verdicts`, `regression`), `harness.evaluation` (probe rollouts, the report suite), `harness.memory`
(history, feedback and skills across stages).

    from harness.lifecycle import start_run, resume_run
    run_dir = start_run(load_config("examples/mapf_quick.yaml"), runs_dir="runs")
    resume_run(run_dir)            # after a crash: re-enters the interrupted node

Every node is idempotent: it first asks the run store whether it already finished (then it returns the stored
result), and every write it makes is keyed (candidate ids, git branches and tags, seed draws, compute rows, skill
tries), so a node re-entered after SIGKILL never duplicates a commit, a row or a skill update. The LangGraph state
holds ids, paths and small summaries only; rollouts, checkpoints and evidence live on disk and in run.db.

Explore and exploit: a stage explores (the engineer proposes, arms are judged, one change may win); the stage after a
promotion exploits it (`stage.exploit_after_promotion`, `harness.decisions.exploiting`): its train node trains for the
compute its arms would have used, it proposes nothing, and its checkpoint is read on fresh backtest instances like
every stage's (`harness.decisions.confirm_carry`).

Keep training, keep the best (`stage.keep_training`): the run holds two checkpoints, the lineage (`State.policy`,
what the next stage trains from) and the anchor (`Decided.anchor`, its best confirmed checkpoint: what each stage's
report scores and what the run delivers). A stage's decided arm continues the lineage unless it reads below the anchor
by more than its noise on fresh instances, and replaces the anchor only when it reads above it by as much.

Held-out hygiene: training draws only `train` seeds, the diagnosis sees only `probe` rollouts, every decision draws
fresh `backtest` seeds (a forward-only cursor in run.db), and the `test` split is only used for per-stage reports.
"""

from __future__ import annotations

import hashlib
import os
import time
from itertools import pairwise
from pathlib import Path
from typing import Annotated, TypedDict

import numpy as np

from harness.arms import arm_name, judge_start, prefetch_arms, prefetch_stage, run_arms, train_policy, warm_start
from harness.backtest import ArmEval, choose_winner, regression
from harness.decisions import (
    INCUMBENT,
    anchor_at,
    arms_vs_start,
    backing_off,
    confirm_carry,
    escalate,
    exploit_held,
    exploit_steps,
    exploiting,
    fell_below_start,
    final_pick,
    judge_whole_plan,
    look_until_decided,
    on_learning_signal,
    runners_up,
    second_pairs,
    signal_pairs,
    signal_retest,
)
from harness.diagjudge import judge_diagnostics, split_verdicts
from harness.evaluation import previous_target, report_eval, rollouts, target_probe
from harness.faults import stop_on_machine_fault
from harness.memory import candidate_from_row, history, human_feedback, regression_findings, remember_skills
from harness.records import Verdict, cut, read_rollouts, write_rollouts
from harness.results import (
    ArmRecord,
    Asked,
    Backtested,
    Decided,
    Diagnosed,
    GateAnswer,
    NodeResult,
    Probed,
    Proposed,
    Remembered,
    SetUp,
    StopChecked,
    Trained,
    Vetted,
    continues_from,
)
from harness.retention import apply_retention
from harness.round0 import harness_models
from harness.run import Run, RunError
from harness.stagebook import stage_metrics, stop_reason

GATE_ACTIONS = ("approve", "revise", "abort")


LOG_LINES = 60  # every LangGraph checkpoint stores the whole state: an unbounded list made each one grow per stage


def recent(old: list[str], new: list[str]) -> list[str]:
    """The state's `log` reducer: append, keep the last LOG_LINES lines."""
    return [*(old or []), *(new or [])][-LOG_LINES:]


class State(TypedDict, total=False):
    run_id: str
    stage: int
    policy: str  # checkpoint the stage starts from (the next train node trains it)
    train_ckpt: str  # this stage's trained checkpoint; after the probe: the arms' start (`continues_from`)
    candidates: list[str]  # ids proposed this stage
    vetted: list[str]  # ids that passed vet
    winner: str | None
    next_policy: str
    consecutive_rejections: int
    fallbacks: int  # back to main since the last promotion: each shrinks the engineer's steps (`step_scale`)
    stages_without_promotion: int
    done: bool
    stop_reason: str
    human: str  # what the human gate said this stage: auto (no gate), approve, revise, abort
    log: Annotated[list[str], recent]  # the last LOG_LINES node lines (the full record: run.db's events)


def _finish(run: Run, stage: int, result: NodeResult, t0: float, message: str) -> None:
    """Record a node's result (with its timing) and say so: the node is done and will not run again."""
    now = time.time()
    timing = {"_wall_s": now - t0, "_started": t0, "_ended": now, "_pid": os.getpid()}
    run.save_result(stage, result, timing=timing)
    run.event(stage, result.NODE, "node", message, key=f"{stage}/{result.NODE}/done", wall_s=timing["_wall_s"])


# --- the nodes, in the order they run ------------------------------------------------------------------------------------


BIG_CHECKPOINT = 1 << 30  # a user's checkpoint past this many bytes of weights: say what keeping every promotion costs


def retention_warning(config) -> str | None:
    """With a user's checkpoint of a GiB or more and `retention.keep_promoted: all` (the default), each promotion keeps
    one more checkpoint that big for good (the rest of the disk use is bounded): said once, with the bound."""
    from harness.retention import weight_bytes

    ckpt = config.policy.checkpoint
    if not ckpt or config.retention.keep_promoted != "all":
        return None
    nbytes = weight_bytes(Path(ckpt))
    if nbytes < BIG_CHECKPOINT:
        return None
    return (f"retention.keep_promoted is 'all': each promotion keeps one more checkpoint of about {nbytes / 2**30:.1f} "
            "GiB (the weights of policy.checkpoint) for the rest of the run; set retention.keep_promoted: 2 to keep "
            "the newest two (the incumbent is always kept)")


def node_setup(run: Run, state: State) -> State:
    """Build (or load) the policy and run the SFT warm start on expert demonstrations from the train split."""
    first: State = {"stage": 1, "consecutive_rejections": 0, "stages_without_promotion": 0}
    if (r := run.result(0, SetUp)) is not None:
        return {"policy": r.policy, **first}
    t0 = time.time()
    noise = run.config.warm_start.teacher_noise
    run.event(0, "setup", "node_start", "building the policy and warm-starting it on expert demonstrations"
              + (f" ({noise:.0%} of them from the task's imperfect teacher)" if noise else ""))
    from harness.sequential import arm_noise_warning, max_evidence_warning

    if warn := max_evidence_warning(run.config.gate.plan(run.config.backtest.n),
                                    comparisons=max(1, run.config.stage.candidates)):
        # once, before the warm start's minutes, with the n it would need
        run.event(0, "setup", "warning", warn, key="max-evidence")
    if warn := retention_warning(run.config):
        run.event(0, "setup", "warning", warn, key="retention")
    if warn := arm_noise_warning(run.config.gate.plan(run.config.backtest.n)):
        run.event(0, "setup", "warning", warn, key="arm-noise")
    if unused := run.config.engineer.unused():  # `base_url` under kind: rule (the default): an endpoint never asked
        run.event(0, "setup", "warning", f"engineer.{', engineer.'.join(unused)} set, but engineer.kind is "
                  f"{run.config.engineer.kind!r}, which does not use {'it' if len(unused) == 1 else 'them'}"
                  + (": set engineer.kind: llm to have the endpoint propose changes" if run.config.engineer.kind ==
                     "rule" and set(unused) & {"base_url", "model", "model_path"} else ""), key="engineer-unused")
    out, n = warm_start(run)
    # per-run fixed costs paid once here, not by stage 1: the report suite (and the warm start's score on it, the
    # curve's starting point) and the round-0 env statistics
    if run.config.eval.enabled:
        run.suite()
        report_eval(run, 0, str(out))
    run.env_stats(harness_models(run.workspace().files("main"), run.task)[0])
    _finish(run, 0, SetUp(policy=str(out)), t0, f"warm start done: {out.name}")
    return {"policy": str(out), **first, "log": [f"setup: warm start on {n} expert demonstrations"]}


def node_train(run: Run, state: State) -> State:
    """GRPO on the stage's policy under harness@main; meanwhile the stage's probe, backtest and arm instances."""
    k = state["stage"]
    if (r := run.result(k, Trained)) is not None:
        return {"train_ckpt": r.checkpoint}
    t0 = time.time()
    run.store.start_stage(run.id, k)
    run.new_stage_instances()  # instances are cached within a stage (arms share them); the report suite outlives it
    cfg, files = run.config, run.workspace().files("main")
    env, recipe, _ = harness_models(files, run.task)
    prefetch_stage(run, k, env, recipe)
    steps, exploits = recipe.steps, exploiting(run, k)
    if not exploits and (held := exploit_held(run, k)):
        run.event(k, "train", "explore", f"stage {k} explores: the last exploring stage's own training confirmed a gain "
                  f"on the target, but a diagnosis since named a root cause a change can fix ({', '.join(held)}), so "
                  "the loop looks for that change instead of exploiting harness@main (stage.exploit_after_gain)",
                  key=f"{k}/explore")
    backoff = backing_off(run, k) if not exploits else None
    if backoff is not None:
        exploits = INCUMBENT
    if exploits:  # the stage after a promotion trains under it for its arms' compute too (`stage.exploit_after_...`)
        steps = exploit_steps(run, recipe.steps)
        why = (f"the last {backoff[0]} exploring stages in a row found nothing to promote while harness@main trained "
               f"the lineage on, so the loop explores less often (exploit stage {backoff[1] + 1} of "
               f"{backoff[2]} before it explores again); "
               "stage.explore_backoff" if backoff is not None else
               "the last exploring stage's own training under it confirmed a gain on the target and nothing was "
               "promoted; stage.exploit_after_gain" if exploits == INCUMBENT else
               f"promoted at stage {(run.store.candidate(exploits) or {}).get('stage', '?')}")
        run.event(k, "train", "exploit", f"stage {k} exploits {exploits} ({why}): "
                  f"{steps} GRPO steps under harness@main ({recipe.steps} of the stage's own and the {steps - recipe.steps} "
                  "its arms would have trained); it proposes nothing, and its checkpoint is read on fresh backtest "
                  "instances before it continues (stage.exploit_after_promotion)",
                  key=f"{k}/exploit")
    run.event(k, "train", "node_start", f"GRPO {steps} steps under harness@main")
    r = train_policy(run, k, "policy", state["policy"], files, steps, f"s{k}/train",
                     run.path("checkpoints", f"s{k}-train"), seed=cfg.seed + k)
    r = r.model_copy(update={"exploits": exploits, "backoff": list(backoff) if backoff is not None else None})
    _finish(run, k, r, t0, f"trained {steps} steps" + (f" (exploiting {exploits})" if exploits else ""))
    return {"train_ckpt": r.checkpoint, "log": [f"stage {k} train: {steps} GRPO steps"
                                                + (f", exploiting {exploits}" if exploits else "")]}


def node_probe(run: Run, state: State) -> State:
    """Roll the trained policy out on fresh probe seeds (several samples each) and cache the rollouts. The stage's
    START policy is rolled out on the same seeds too: if training lowered the probe valid rate by more than noise
    (`harness.backtest.regression`), that is a finding (`grpo.policy_regressed`) and the trained checkpoint is not
    carried forward: the arms (and the next stage) start from the stage's start policy instead."""
    k = state["stage"]
    if (r := run.result(k, Probed)) is not None:
        return {"train_ckpt": r.carried or state["train_ckpt"]}
    t0 = time.time()
    cfg = run.config
    env, recipe, shaping = harness_models(run.workspace().files("main"), run.task)
    seeds = run.draw_seeds("probe", cfg.stage.probe_n, key=f"s{k}/probe")
    after, secs, toks = rollouts(run, state["train_ckpt"], seeds, env, cfg.stage.probe_samples, recipe.temperature,
                                 shaping)
    path = write_rollouts(run.path("rollouts", f"s{k}-probe.jsonl.gz"), after)
    run.charge(k, "policy", "rollout", seconds=secs, tokens=toks, label="probe")
    valid = float(np.mean([r.valid for r in after]))
    run.record_eval(k, "policy", "probe", n=len(after), valid=valid, optimal=float(np.mean([r.optimal for r in after])))
    before, secs, toks = rollouts(run, state["policy"], seeds, env, cfg.stage.probe_samples, recipe.temperature,
                                  shaping)
    run.charge(k, "policy", "rollout", seconds=secs, tokens=toks, label="probe-start")
    start_path = write_rollouts(run.path("rollouts", f"s{k}-probe-start.jsonl.gz"), before)  # the diagnosis reads it
    start_eval = ArmEval.from_rollouts(before)
    reg = regression(start_eval.outcomes, ArmEval.from_rollouts(after).outcomes, cfg.gate,
                     np.random.default_rng([cfg.seed, k]), clusters=start_eval.problems or None)
    carried = continues_from(state["policy"], state["train_ckpt"], reg.regressed)
    msg = (f"probe valid {valid:.3f} (start of stage {reg.before:.3f}, change {reg.change:+.3f} [{reg.ci_low:+.3f}, "
           f"{reg.ci_high:+.3f}])")
    if reg.regressed:
        run.event(k, "probe", "regression",
                  f"stage {k} training LOWERED probe valid by more than noise: {reg.before:.3f} -> {valid:.3f} "
                  f"(effect {reg.change:+.3f}, {100 * cfg.gate.confidence:.0f}% upper bound {reg.ci_high:+.3f} < 0, "
                  f"n={len(seeds)} x {cfg.stage.probe_samples}); its checkpoint is NOT carried forward: the arms and "
                  f"the next stage start from {Path(carried).name}. A recipe that collapses the policy (e.g. a "
                  "learning rate too high) shows up here; the finding grpo.policy_regressed goes to the engineer",
                  key=f"{k}/regression")
    _finish(run, k, Probed(rollouts=str(path), valid=valid, start_valid=reg.before, change=reg.change,
                           change_ci=[reg.ci_low, reg.ci_high], regressed=reg.regressed, carried=carried,
                           start_rollouts=str(start_path)), t0, msg)
    return {"train_ckpt": carried, "log": [f"stage {k} probe: {msg}" + (" REGRESSED: not carried" if reg.regressed
                                                                         else "")]}


def node_diagnose(run: Run, state: State) -> State:
    """Built-in and evolved diagnostics on the probe rollouts, plus the regressions the loop itself saw; and the arms'
    start checkpoint on the TARGET (the judge's distribution, fresh probe seeds), so the diagnosis says where the
    target fails and whether the training mix covers it."""
    k = state["stage"]
    if run.result(k, Diagnosed) is not None:
        return {}
    t0 = time.time()
    from harness.diagnostics import build_diagnosis

    cfg, ws = run.config, run.workspace()
    files = ws.files("main")
    env, recipe, shaping = harness_models(files, run.task)
    probe, trained = run.result(k, Probed), run.result(k, Trained)
    start = state.get("train_ckpt") or probe.carried or (trained.checkpoint if trained else None)  # the arms' start
    target = target_probe(run, k, start, probe=(trained.checkpoint, Path(probe.rollouts))
                          if trained is not None and not probe.regressed else None)
    # the reward-hacking check compares training reward with the PROBE valid rate of past stages (never test)
    valid_hist = [e["valid"] for e in run.store.evaluations(run.id, arm="policy")
                  if e["split"] == "probe" and not e["slice_key"]]
    budget = cfg.budget
    wall_left = None if budget.wall_clock_s is None else max(0.0, budget.wall_clock_s - (time.time()
                                                                                         - run.store_started()))
    t_diag = time.perf_counter()
    diag = build_diagnosis(run.task, k, read_rollouts(Path(probe.rollouts)), env, recipe, history(run),
                           budget.stages - k, wall_left, train_metrics=trained.steps if trained else None,
                           valid_history=valid_hist, shaping=shaping, state=ws.head(), env_stats=run.env_stats(env),
                           diagnostics_files={p: s for p, s in files.items() if p.startswith("diagnostics/")},
                           rejections_before_fallback=cfg.stage.rejections_before_fallback,
                           step_shrink=cfg.stage.step_shrink, fallbacks=state.get("fallbacks", 0),
                           target=target, target_config=run.judge.config(run.task),
                           previous_target=previous_target(run, k),
                           start_rollouts=read_rollouts(Path(probe.start_rollouts)) if probe.start_rollouts
                           and Path(probe.start_rollouts).exists() else None)
    # the built-in and evolved diagnostics' work (an evolved one runs in the sandbox, up to its time limit): this
    # machine's compute, no tokens
    run.charge(k, "policy", "eval", seconds=time.perf_counter() - t_diag, label="diagnose")
    diag.findings[:0] = regression_findings(run, k, probe)  # the loop's own: training lowered the policy
    diag.feedback = human_feedback(run, k)  # a person's `revise` feedback reaches the engineer's prompt
    run.store.record_findings(run.id, k, diag.findings)
    path = run.path("stages", f"s{k}", "diagnosis.json")
    path.write_text(diag.model_dump_json(indent=1))
    top = ", ".join(f"{f.code}{'@' + ','.join(f'{a}={b}' for a, b in f.slice.items()) if f.slice else ''}"
                    for f in diag.findings[:3]) or "none"
    _finish(run, k, Diagnosed(diagnosis=str(path), findings=len(diag.findings)), t0,
            f"{len(diag.findings)} findings; top: {top}")
    return {"log": [f"stage {k} diagnose: {len(diag.findings)} findings (top: {top})"]}


def node_propose(run: Run, state: State) -> State:
    """Ask the engineer for candidates; commit each (one change) on its own branch cand/<id>."""
    k = state["stage"]
    if (r := run.result(k, Proposed)) is not None:
        return {"candidates": r.candidates}
    t0 = time.time()
    from harness.engineer import propose
    from harness.engineer.llm import Usage
    from harness.records import Diagnosis
    from harness.vet import apply_change

    cfg = run.config
    if (trained := run.result(k, Trained)) is not None and trained.exploits:
        msg = f"none: the stage exploits {trained.exploits} (stage.exploit_after_promotion)"
        _finish(run, k, Proposed(candidates=[], engineer="exploit"), t0, msg)
        return {"candidates": [], "log": [f"stage {k} propose: {msg}"]}
    if (asked := run.result(k, Asked)) is not None:
        # an earlier attempt at this node asked the engineer and recorded its answer, then was stopped before the
        # node finished: the same candidates again, not a fresh reply (an LLM's second answer differs, and its
        # candidates would collide with the first's commits under the same ids)
        cands = proposed_before(run, k, asked)
        run.event(k, "propose", "resumed", f"the engineer's {len(cands)} candidate(s) recorded before the run stopped "
                  "are committed as they were; the engineer is not asked again", key=f"{k}/propose-resumed")
    else:
        diag = Diagnosis.model_validate_json(Path(run.result(k, Diagnosed).diagnosis).read_text())
        skills = run.skills()
        spent = Usage()  # what the engineer's calls cost, charged even when a Ctrl-C stops the ask midway
        where = "endpoint" if cfg.engineer.base_url else "local"  # another machine's work, or this one's
        try:
            res = propose(cfg.engineer, diag, skills, cfg.stage.candidates, np.random.default_rng([cfg.seed, k]),
                          policy_ckpt=Path(state["train_ckpt"]), usage=spent)
        except BaseException:
            if spent.calls:  # the calls answered (or waited for) before the stop: paid, whatever the resume asks
                run.charge_again(k, "engineer", "engineer", f"{where} propose (stopped)", seconds=spent.seconds,
                                 tokens=spent.prompt_tokens + spent.completion_tokens)
            raise
        finally:
            skills.close()
        if res.usage.calls:  # the engineer's own calls (another model: kept apart from the policy's compute)
            u = res.usage
            # an ask before a kill is charged and kept: the resume asks again (nothing was recorded) and pays again
            run.charge_again(k, "engineer", "engineer", f"{where} propose", seconds=u.seconds,
                             tokens=u.prompt_tokens + u.completion_tokens)
            if u.unreported:
                run.event(k, "propose", "warning", f"{u.unreported} of {u.calls} engineer call(s) named no token usage "
                          "(the endpoint sent no `usage` field): their tokens are not in the ledger, their seconds are",
                          key=f"{k}/engineer-usage")
        for note in res.notes:
            # keyed by the whole note: two attempts' failures at one endpoint share their first 80 characters
            run.event(k, "propose", "engineer_note", note,
                      key=f"{k}/note/{hashlib.sha1(note.encode('utf-8', 'replace')).hexdigest()[:16]}")
        for bad in res.rejected_replies:  # the reply itself kept beside its reason (the morning review reads both)
            said = hashlib.sha1(bad.reply.encode("utf-8", "replace")).hexdigest()[:8]
            run.event(k, "propose", "reply_rejected", bad.reason, key=f"{k}/bad/{bad.attempt}/{said}", reply=bad.reply)
        # each call puts its own in front of what it is given: escalation's re-test, then a runner-up, then a
        # promising signal's re-test, then the engineer's
        cands = signal_retest(run, k, diag, res.candidates, cfg.stage.candidates)
        cands = runners_up(run, k, diag, cands, cfg.stage.candidates)
        cands = escalate(run, k, diag, cands, cfg.stage.candidates)
        cands = [c.model_copy(update={"id": f"s{k}c{i + 1}", "stage": k}) for i, c in enumerate(cands)]
        asked = Asked(candidates=[c.id for c in cands], engineer=res.engineer_used)
        run.store.record_proposal(run.id, k, cands, asked)  # before any commit: a resume finds all of it or none
        cands = proposed_before(run, k, asked)  # committed as run.db holds them, on this path and a resume's alike
    ws = run.workspace()
    main_files = ws.files("main")
    done_before = {c["id"] for c in run.store.candidates(run.id, stage=k, status="rejected_vet")}
    for cand in (c for c in cands if c.id not in done_before):  # an earlier attempt's vet rejection stands
        try:
            new_files = apply_change(main_files, cand.change, run.task)
        except ValueError as exc:  # a patch that does not apply is a vet rejection, recorded without a commit
            run.store.set_candidate_verdict(Verdict(candidate=cand.id, decision="rejected", stage_reached="vet",
                                                    reason=f"patch does not apply: {exc}"))
            continue
        changed = {p: s for p, s in new_files.items() if main_files.get(p) != s}
        try:
            sha = ws.propose(cand.id, changed, summary=cand.summary, rationale=cand.rationale,
                             factor=cand.change.knob, stage=k, skill=cand.skill, engineer=cand.engineer)
        except Exception as exc:  # noqa: BLE001 - one bad candidate costs itself, never the stage
            stop_on_machine_fault(exc, f"committing candidate {cand.id}", str(run.run_dir))  # not the candidate's
            run.store.set_candidate_verdict(Verdict(candidate=cand.id, decision="rejected", stage_reached="vet",
                                                    reason=cut(f"could not be committed: {type(exc).__name__}: "
                                                                f"{exc}")))
            continue
        run.store.upsert_candidate(run.id, cand, commit=sha)
    ids = [c.id for c in cands]
    msg = ", ".join(f"{c.id}: {c.change.knob}" for c in cands) or "no candidate"
    _finish(run, k, Proposed(candidates=ids, engineer=asked.engineer), t0, msg)
    return {"candidates": ids, "log": [f"stage {k} propose ({asked.engineer}): {msg}"]}


def proposed_before(run: Run, k: int, asked: Asked) -> list:
    """The candidates of stage `k`'s recorded answer, as run.db holds them, in the order proposed."""
    rows = {r["id"]: r for r in run.store.candidates(run.id, stage=k)}
    return [candidate_from_row(rows[cid]) for cid in asked.candidates]


def node_vet(run: Run, state: State) -> State:
    """Cheap checks before any training (schema, code, diagnostics in the sandbox, an offline backtest)."""
    k = state["stage"]
    if (r := run.result(k, Vetted)) is not None:
        return {"vetted": r.vetted}
    t0 = time.time()
    from harness.vet import VetResult, vet

    probe_rollouts = read_rollouts(Path(run.result(k, Probed).rollouts))
    ws = run.workspace()
    main_files = ws.files("main")
    vetted = []
    for cid in state.get("candidates", []):
        row = run.store.candidate(cid)
        if row["status"] in ("rejected_vet", "rejected", "promoted"):
            continue
        if (d := ws.decision(cid)) is not None:  # rejected in git, killed before run.db heard of it: git's stands
            # (vetted again, it could pass this time, a branch already deleted: every later resume failed)
            run.store.set_candidate_verdict(Verdict(candidate=cid, decision="rejected", reason=d.reason,
                                                    stage_reached="vet"), tag=d.tag)
            continue
        t_vet = time.perf_counter()
        try:
            res = vet(candidate_from_row(row), main_files, run.task, probe_rollouts)
        except Exception as exc:  # noqa: BLE001 - vet promises not to raise; if it does, the candidate pays
            stop_on_machine_fault(exc, f"the vet step of {cid}", str(run.run_dir))  # ... unless the machine failed
            res = VetResult(ok=False, stage="vet", reason=cut(f"the vet step failed on it: {type(exc).__name__}: "
                                                               f"{exc}"))
        run.charge(k, cid, "eval", seconds=time.perf_counter() - t_vet, label="vet")  # a diagnostic's sandbox runs
        if res.ok:
            run.store.set_candidate_status(cid, "vetted")
            vetted.append(cid)
        else:
            _reject(run, cid, Verdict(candidate=cid, decision="rejected", reason=f"{res.stage}: {res.reason}",
                                      stage_reached=res.stage))
    _finish(run, k, Vetted(vetted=vetted), t0, f"{len(vetted)} of {len(state.get('candidates', []))} vetted")
    return {"vetted": vetted}


def _reject(run: Run, cid: str, verdict: Verdict) -> None:
    """Tag rejected/<id> or inconclusive/<id> (idempotent: a re-entered node gets the same tag back) and record the
    verdict."""
    from sandbox.workspace import UnknownCandidate

    try:
        tag = run.workspace().reject(cid, verdict.reason, evidence=verdict.evidence,
                                     verdict="inconclusive" if verdict.decision == "inconclusive" else "rejected").tag
    except UnknownCandidate:  # never committed: its patch did not apply
        tag = None
    run.store.set_candidate_verdict(verdict, tag=tag)


def node_backtest(run: Run, state: State) -> State:
    """Control arm (incumbent harness) vs each vetted candidate arm, same start, budget and seeds; the verdicts.
    Diagnostic candidates train no arm: they are judged as diagnostics on held-out rollouts (`harness.diagjudge`)."""
    k = state["stage"]
    if run.result(k, Backtested) is not None:
        return {}
    t0 = time.time()
    cfg, ws = run.config, run.workspace()
    diag_vs, vetted = judge_diagnostics(run, k, state.get("vetted", []))
    if not vetted:
        trained = run.result(k, Trained)
        _finish(run, k, Backtested(verdicts=diag_vs), t0, f"{len(diag_vs)} diagnostic(s) judged; no arm to train"
                if diag_vs else f"no arm: the stage exploits {trained.exploits}" if trained is not None
                and trained.exploits else "nothing to backtest")
        return {}
    steps = cfg.backtest.arm_steps
    main_files = ws.files("main")
    cand_files = {cid: ws.files(f"cand/{cid}") for cid in vetted}
    prefetch_arms(run, k, main_files, list(cand_files.values()))
    arms = run_arms(run, k, [("control", main_files), *cand_files.items()], state["train_ckpt"], steps)
    vs, c_eval, evals = look_until_decided(run, k, arms, main_files, cand_files)  # batches of instances until decided
    comparisons = len(cand_files)
    second = {} if isinstance(c_eval, Exception) else second_pairs(run, k, vs)
    held = set(second)
    # an env change's second route, read on this pair (those getting a second pair already are read after it)
    vs = on_learning_signal(run, k, vs, arms, comparisons=comparisons, hold=held)
    if not isinstance(c_eval, Exception):
        second |= signal_pairs(run, k, vs, skip=held)
    if second:
        # a clear effect held back by a slice, a backed candidate, a promising learning signal: its second arm pair
        # now, pooled with the first
        for cid, why in second.items():
            run.event(k, "backtest", "second_pair", f"{cid}: {why}: a second arm pair in this stage",
                      key=f"{k}/second/{cid}")
        arms2 = run_arms(run, k, [(arm_name("control", 2), main_files),
                                  *((arm_name(cid, 2), cand_files[cid]) for cid in second)], state["train_ckpt"], steps,
                         pair=2)
        again, _, _ = look_until_decided(run, k, arms2, main_files, {cid: cand_files[cid] for cid in second}, pair=2,
                                         earlier={v.candidate: v for v in vs}, comparisons=comparisons)
        again = on_learning_signal(run, k, again, arms2, comparisons=comparisons, pair=2)  # pooled with pair 1's
        redone = {v.candidate: v for v in again if v.evidence is not None}  # judged; a failed arm keeps pair 1's
        for v in again:
            if v.candidate not in redone:
                run.event(k, "backtest", "second_pair", f"{v.candidate}: its second pair could not be judged "
                          f"({cut(v.reason, 200)}); the first pair's verdict stands", key=f"{k}/second-failed/{v.candidate}")
        vs = [redone.get(v.candidate, v) for v in vs]
        if lost := [v for v in vs if v.candidate in held and v.candidate not in redone]:  # its pair 2 failed:
            read = {v.candidate: v for v in on_learning_signal(run, k, lost, arms, comparisons=comparisons)}  # pair 1
            vs = [read.get(v.candidate, v) for v in vs]
    c_eval, evals = judge_whole_plan(run, k, arms, c_eval, evals)  # what continues reads every planned instance
    # the STAGE's start (not the arms'): the stage's training watched only the training mix, so the target's
    # comparison covers the whole stage (its training and the arms' steps); it is what continues if no arm is carried
    start = None if isinstance(c_eval, Exception) else judge_start(run, k, state["policy"], c_eval)
    control = arms["control"]
    fell = []
    for v in vs:
        if v.evidence is not None:  # judged (its arm and the control arm both came back)
            run.store.set_candidate_status(v.candidate, "backtested")
        # the reason often starts with the decision's word ("promoted: lower bound ..."): not said twice
        said = v.reason if v.reason.startswith(f"{v.decision}:") else f"{v.decision}: {v.reason}"
        run.event(k, "backtest", "verdict", f"{v.candidate}: {said}", key=f"{k}/verdict/{v.candidate}")
        if v.decision == "promoted" and fell_below_start(start, evals[v.candidate]):
            fell.append(arms[v.candidate].checkpoint)
            then = ("the carry reading against the anchor on fresh instances decides whether its checkpoint "
                    "continues (stage.keep_training)" if run.config.stage.keep_training else
                    f"its checkpoint is not carried (the next stage starts from {Path(start.checkpoint).name})")
            run.event(k, "backtest", "regression", f"{v.candidate}'s arm beat the control arm but its estimate on the "
                      "target (sampled, or greedy: backtest.carry_greedy) is below the stage's start: if it wins, its "
                      f"harness is promoted and {then}", key=f"{k}/winner-regression/{v.candidate}")
    above = [] if start is None else arms_vs_start(run, k, start, vs, arms, evals)
    _finish(run, k, Backtested(verdicts=[*vs, *diag_vs], control=None if start is None else control.checkpoint,
                               start=start, regressed_arms=fell, arms_vs_start=above), t0,
            f"{len(vs) + len(diag_vs)} decision(s)" + (": the control arm failed" if start is None else ""))
    return {}


def node_gate(run: Run, state: State) -> State:
    """The human gate (config `gate.human`): after the backtest, before anything is promoted, the run pauses (a
    LangGraph interrupt, persisted in graph.db, so the pause survives a restart or a kill) until a person answers
    `evotrainer approve|revise|abort RUN`. approve: the gate's own decision stands; revise: this stage promotes
    nothing and the feedback goes into the next diagnosis (the engineer's prompt) and run.db; abort: nothing is
    promoted and the run stops after this stage. Without a gate it passes straight through."""
    from langgraph.types import interrupt

    k = state["stage"]
    if (r := run.result(k, GateAnswer)) is not None:
        return {"human": r.action}
    t0 = time.time()
    # a stage that already waited takes its answer, whatever `gate.human` says now (a resume may edit it): switched
    # off during the pause, it recorded "auto" and dropped an abort or a revise the CLI had accepted
    waited = bool(run.store.events(run.id, stage=k, kind="gate_waiting"))
    if not waited and not run.config.gate.human_needed(state.get("stages_without_promotion", 0)):
        _finish(run, k, GateAnswer(action="auto"), t0, "no human gate")
        return {"human": "auto"}
    bt = run.result(k, Backtested) or Backtested()
    lines = [f"{v.candidate}: {v.decision}: {cut(v.reason, 200)}" for v in bt.verdicts] or \
        ["no candidate reached the backtest"]
    msg = (f"stage {k} waits at the human gate; the gate's verdicts: " + "; ".join(lines)
           + f". Answer with `evotrainer approve {run.run_dir}`, `evotrainer revise {run.run_dir} \"feedback\"` or "
           f"`evotrainer abort {run.run_dir}`")  # the folder, not the id: an id is found only under --runs-dir
    # the run's status becomes `paused` when the graph stops here (`lifecycle._drive_prepared`), not in this node:
    # it runs again to take the answer, and a kill then must leave the answer (kept in graph.db) to a plain resume
    run.event(k, "gate", "gate_waiting", msg, key=f"{k}/gate/waiting")
    answer = interrupt({"stage": k, "message": msg})  # returns the answer when the run is continued
    action = answer.get("action") if isinstance(answer, dict) else None
    if action not in GATE_ACTIONS:
        raise RunError(f"the human gate got {answer!r}; answer with one of {', '.join(GATE_ACTIONS)}")
    feedback = str(answer.get("feedback") or "").strip()
    run.store.set_run_status(run.id, "running")
    run.event(k, "gate", "gate_decision", f"{action}" + (f": {feedback}" if feedback else ""),
              key=f"{k}/gate/decision", action=action, feedback=feedback)
    _finish(run, k, GateAnswer(action=action, feedback=feedback), t0, f"human: {action}")
    return {"human": action, "log": [f"stage {k} gate: {action}"]}


def node_decide(run: Run, state: State) -> State:
    """Promote the best significant candidate (merge + tag) and every promoted diagnostic beside it; reject the rest;
    say which checkpoint continues."""
    k = state["stage"]
    if (r := run.result(k, Decided)) is not None:
        return _decide_state(run, state, r)
    t0 = time.time()
    bt = run.result(k, Backtested) or Backtested()
    vs = list(bt.verdicts)
    human = run.result(k, GateAnswer)
    if human is not None and human.action in ("revise", "abort"):  # a person overrode the gate: nothing is promoted
        said = {"revise": "revised", "abort": "aborted"}[human.action] + " by a human at the gate" + (
            f": {human.feedback}" if human.feedback else "")
        # what the gate would have promoted is rejected by the person; an inconclusive change keeps its verdict and
        # its evidence (a re-test pools with it), a refuted one stays refuted: a revision is not a refutation
        vs = [v.model_copy(update={"decision": "rejected", "reason": cut(f"{said} (the gate said: {v.reason})")})
              if v.decision == "promoted" else v.model_copy(update={"reason": cut(f"{v.reason} (the gate was "
                                                                                  f"answered: {said})")})
              for v in vs]
    diag, vs = split_verdicts(run, vs)  # diagnostics do not change training: merged beside the winner, not instead
    winner, others = choose_winner(vs)
    if winner is not None:
        d = run.workspace().promote(winner.candidate, evidence=winner.evidence, reason=winner.reason)
        run.store.set_candidate_verdict(winner, tag=d.tag)
    for v in others:
        if winner is None or v.candidate != winner.candidate:
            _reject(run, v.candidate, v)
    merged = _merge_diagnostics(run, diag)
    keep = run.config.stage.keep_training
    next_policy = continues_from(state["policy"], run.result(k, Trained).checkpoint, run.result(k, Probed).regressed,
                                 bt, run.result(k, ArmRecord, node=f"arm:{winner.candidate}") if winner else None,
                                 keep_training=keep)
    # fresh instances, not the ones it was chosen on; a stage that judged no arm confirms against its own start
    exploited = run.result(k, Trained).exploits  # a planned continuation: its own margin (`backtest.exploit_margin`)
    anchor = anchor_at(run, k) if keep else None  # keep training, keep the best (`stage.keep_training`)
    next_policy, check = confirm_carry(run, k, next_policy, bt, start=state["policy"],
                                       margin=run.config.backtest.exploit_margin if exploited else None, anchor=anchor)
    if anchor is not None and check is not None and check.confirmed:
        anchor = check.chosen
    if winner is None and (arm := next((a for a in bt.arms_vs_start if a.checkpoint == next_policy), None)):
        run.event(k, "decide", "carried_arm",
                  f"no candidate beat the control arm with confidence, but {arm.candidate}'s arm is confidently above "
                  f"the stage's start on the target ({arm.change:+.3f} [{arm.change_ci[0]:+.3f}, "
                  f"{arm.change_ci[1]:+.3f}]) and above the control arm ({bt.start.change:+.3f}): its checkpoint "
                  f"continues; its harness is NOT promoted (the next stage trains under harness@main)",
                  key=f"{k}/carried-arm")
    result = Decided(winner=winner.candidate if winner else None, next_policy=next_policy, anchor=anchor,
                     decided=len(vs) + len(diag), carry_check=check)
    msg = (f"promoted {winner.candidate}" if winner else "no promotion") + (
        f"; diagnostic(s) merged: {', '.join(merged)}" if merged else "")
    _finish(run, k, result, t0, msg)
    return {**_decide_state(run, state, result), "log": [f"stage {k} decide: {msg}"]}


def _merge_diagnostics(run: Run, verdicts: list[Verdict]) -> list[str]:
    """Merge every promoted diagnostic into main (after the winner: its branch touches only its diagnostics/ file, so
    the merges do not conflict) and reject the others; returns the merged ids. One that no longer merges (another
    diagnostic of this stage changed the same file first) is rejected with the reason."""
    from sandbox.workspace import AlreadyDecided, MergeConflict

    merged = []
    for v in verdicts:
        if v.decision == "promoted":
            try:
                d = run.workspace().promote(v.candidate, evidence=None, reason=v.reason)
            except MergeConflict as exc:
                v = v.model_copy(update={"decision": "rejected", "reason": cut(f"{exc} (it was: {v.reason})")})
            except AlreadyDecided:  # an earlier attempt at this node rejected it (its merge conflicted): it stays so
                if run.store.candidate(v.candidate)["status"] == "rejected":
                    continue  # recorded whole by that attempt
                earlier = run.workspace().decision(v.candidate)
                v = v.model_copy(update={"decision": "rejected", "reason": earlier.reason if earlier else v.reason})
            else:
                run.store.set_candidate_verdict(v, tag=d.tag)
                merged.append(v.candidate)
                continue
        _reject(run, v.candidate, v)
    return merged


def _decide_state(run: Run, state: State, r: Decided) -> State:
    k, cfg = state["stage"], run.config.stage
    tried = bool(state.get("candidates"))
    rej = 0 if r.winner else state.get("consecutive_rejections", 0) + (1 if tried else 0)
    fallbacks = 0 if r.winner else state.get("fallbacks", 0)
    if rej >= cfg.rejections_before_fallback:
        run.event(k, "decide", "fallback",
                  f"{rej} rejections in a row: back to the last promoted harness (main), smaller changes next",
                  key=f"{k}/fallback")
        rej, fallbacks = 0, fallbacks + 1
    trained = run.result(k, Trained)
    # an exploit stage tries nothing: it is no failure; but one that backs off exploring is there because nothing was
    # promoted, so it counts toward `budget.plateau` (a plateaued run stops after as many stages as without it)
    exploited = trained is not None and bool(trained.exploits) and not trained.backoff
    nwp = 0 if r.winner else state.get("stages_without_promotion", 0) + (0 if exploited else 1)
    return {"winner": r.winner, "next_policy": r.next_policy, "consecutive_rejections": rej, "fallbacks": fallbacks,
            "stages_without_promotion": nwp}


def node_remember(run: Run, state: State) -> State:
    """Skill evidence, a new skill for a promoted change that had none, the stage's held-out report, budget check."""
    k = state["stage"]
    if (said := run.result(k, StopChecked)) is None:  # decided once, before this node's own charges and draws: a
        # re-entered node (killed after `report_eval` charged the test reading, or after `_finish`) must not decide
        # otherwise, nor skip the final pick a stopping stage makes
        said = StopChecked(reason=stop_reason(run, k, state.get("stages_without_promotion", 0)))
        run.save_result(k, said)
    stop = said.reason
    if run.result(k, Remembered) is None:
        t0 = time.time()
        remember_skills(run, k)
        d = run.result(k, Decided)
        anchor = (d.anchor if d is not None else None) or state["next_policy"]  # what the run delivers so far
        if stop and run.config.stage.keep_training:  # the last stage: the lineage or the anchor, read once more
            anchor = final_pick(run, k, state["next_policy"], anchor)
        report_eval(run, k, anchor)
        run.release_engines(keep=[state["next_policy"], anchor])  # every other checkpoint of this stage is superseded
        apply_retention(run, k)  # the decision is recorded: delete what retention lets go
        run.store.end_stage(run.id, k, checkpoint=anchor, metrics=stage_metrics(run, k, time.time() - t0))
        _finish(run, k, Remembered(), t0, "stage recorded")
    out: State = {"policy": state["next_policy"], "stage": k + 1, "candidates": [], "vetted": [], "winner": None}
    if stop:
        run.store.set_run_status(run.id, "finished")
        run.event(k, "remember", "finished", stop, key=f"finished-{k}")  # a reopened run finishes again later
        out.update(done=True, stop_reason=stop)
    return out


# --- the graph -----------------------------------------------------------------------------------------------------------


def build_graph(run: Run, checkpointer):
    """The stage's wiring: the nodes in the order they run; after `remember`, the next stage or the end."""
    from langgraph.graph import END, START, StateGraph

    nodes = {"setup": node_setup, "train": node_train, "probe": node_probe, "diagnose": node_diagnose,
             "propose": node_propose, "vet": node_vet, "backtest": node_backtest, "gate": node_gate,
             "decide": node_decide, "remember": node_remember}
    g = StateGraph(State)
    for name, fn in nodes.items():
        g.add_node(name, _wrap(run, name, fn))
    g.add_edge(START, "setup")
    for a, b in pairwise(nodes):
        g.add_edge(a, b)
    g.add_conditional_edges("remember", lambda s: END if s.get("done") else "train", {END: END, "train": "train"})
    return g.compile(checkpointer=checkpointer)


def _wrap(run: Run, name: str, fn):
    def node(state: State) -> State:
        run.progress("node", {"stage": state.get("stage", 0), "node": name})
        return fn(run, state)

    node.__name__ = name
    return node
