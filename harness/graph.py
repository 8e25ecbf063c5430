"""The autonomous run: a LangGraph StateGraph that trains in stages and evolves the harness between them.

    setup -> train -> probe -> diagnose -> propose -> vet -> backtest -> decide -> remember -> (train | END)

This file is the stage: its nodes, top to bottom in the order they run, and the graph that wires them. The rooms
around it: `harness.run` (the `Run` context the nodes share: config, store, workspace, instance and policy caches),
`harness.lifecycle` (create, drive, resume and answer a run: `start_run`, `resume_run`, `answer_gate`).

    from harness.lifecycle import start_run, resume_run
    run_dir = start_run(load_config("examples/mapf_quick.yaml"), runs_dir="runs")
    resume_run(run_dir)            # after a crash: re-enters the interrupted node

Every node is idempotent: it first asks the run store whether it already finished (then it returns the stored
result), and every write it makes is keyed (candidate ids, git branches and tags, seed draws, compute rows, skill
tries), so a node re-entered after SIGKILL never duplicates a commit, a row or a skill update. The LangGraph state
holds ids, paths and small summaries only; rollouts, checkpoints and evidence live on disk and in run.db.

Held-out hygiene: training draws only `train` seeds, the diagnosis sees only `probe` rollouts, every decision draws
fresh `backtest` seeds (a forward-only cursor in run.db), and the `test` split is only used for per-stage reports.
"""

from __future__ import annotations

import json
import logging
import operator
import os
import time
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, TypedDict

import numpy as np
import yaml

from harness.config import RunConfig
from harness.engineer.proposal import cut
from harness.records import Candidate, Finding, HistoryItem, Rollout, Verdict, read_rollouts, write_rollouts
from harness.run import Run, RunError
from harness.tasks import get_task

TENSORBOARD_DIR = "tensorboard"  # event files per phase: tensorboard/s<k>/<sft|policy|control|candidate id>
NODES = ("setup", "train", "probe", "diagnose", "propose", "vet", "backtest", "gate", "decide", "remember")


# --- state -------------------------------------------------------------------------------------------------------------


class State(TypedDict, total=False):
    run_id: str
    stage: int
    policy: str  # checkpoint the next train node starts from
    train_ckpt: str  # this stage's trained checkpoint (start of both arms)
    candidates: list[str]  # ids proposed this stage
    vetted: list[str]  # ids that passed vet
    winner: str | None
    next_policy: str
    consecutive_rejections: int
    stages_without_promotion: int
    done: bool
    stop_reason: str
    human: str  # what the human gate said this stage: auto (no gate), approve, revise, abort
    log: Annotated[list[str], operator.add]  # one line per node, for the summary


log = logging.getLogger(__name__)

# --- harness files: env config, recipe, reward shaping -------------------------------------------------------------------


def harness_models(files: dict[str, str], task) -> tuple[Any, Any, Any]:
    """(env config, Recipe, shaping) from the harness repo's env.yaml and recipe.yaml (its `reward:` section)."""
    from harness.backtest import read_harness

    return read_harness(files, task)


def make_judge(config: RunConfig, files: dict[str, str]):
    """The backtest judge of a run from its config and its round-0 harness `files`: backtest.env (default the round-0
    env), backtest.samples, backtest.temperature (default the round-0 recipe's)."""
    from harness.backtest import Judge

    env, recipe, _ = harness_models(files, get_task(config.task))
    return Judge(env=config.backtest.env or env.model_dump(mode="json"), samples=config.backtest.samples,
                 temperature=config.backtest.temperature or recipe.temperature,
                 max_new_tokens=recipe.max_completion_length)


def initial_files(config: RunConfig) -> dict[str, str]:
    """The round-0 harness: the template, with the run config's env / recipe / reward overrides written in."""
    from sandbox.workspace import TEMPLATE_DIR

    files: dict[str, str] = {}
    tmpl_recipe = yaml.safe_load((TEMPLATE_DIR / "recipe.yaml").read_text()) or {}
    if config.env is not None:
        files["env.yaml"] = "# Round-0 generator config (from the run config).\n" + yaml.safe_dump(
            config.env, sort_keys=False)
    elif (own := get_task(config.task).round0_env()) is not None:  # the family's own round-0 env.yaml
        files["env.yaml"] = own
    if config.recipe or config.reward:  # edited into the template in place: its comments stay next to each knob
        from harness.yamledit import set_leaf_text

        rec = {**tmpl_recipe, **config.recipe, "reward": {**(tmpl_recipe.get("reward") or {}), **config.reward}}
        text = (TEMPLATE_DIR / "recipe.yaml").read_text()
        try:
            for key, value in config.recipe.items():
                text = set_leaf_text(text, [key], value)
            for key, value in config.reward.items():
                text = set_leaf_text(text, ["reward", key], value)
        except (KeyError, ValueError):
            text = ""
        if yaml.safe_load(text or "{}") != rec:  # a template the round-trip edit cannot express: write it whole
            text = "# Round-0 training recipe (template + run config overrides).\n" + yaml.safe_dump(rec, sort_keys=False)
        files["recipe.yaml"] = text
    return files


# --- nodes ---------------------------------------------------------------------------------------------------------------


def _done(run: Run, stage: int, node: str) -> dict[str, Any] | None:
    return run.store.node_result(run.id, stage, node)


def _finish(run: Run, stage: int, node: str, result: dict[str, Any], t0: float, message: str) -> dict[str, Any]:
    now = time.time()
    result = {**result, "_wall_s": now - t0, "_started": t0, "_ended": now, "_pid": os.getpid()}
    run.store.mark_node_done(run.id, stage, node, result)
    run.event(stage, node, "node", message, key=f"{stage}/{node}/done", wall_s=result["_wall_s"])
    return result


def node_setup(run: Run, state: State) -> State:
    """Build (or load) the policy and run the SFT warm start on expert demonstrations from the train split."""
    if (r := _done(run, 0, "setup")) is not None:
        return {"policy": r["policy"], "stage": 1, "consecutive_rejections": 0, "stages_without_promotion": 0}
    t0 = time.time()
    from policies.model import build_model

    cfg, task = run.config, run.task
    run.event(0, "setup", "node_start", "building the policy and warm-starting it on expert demonstrations")
    env, recipe, _ = harness_models(run.workspace().files("main"), task)
    out = run.path("checkpoints", "warmstart")
    if cfg.policy.checkpoint:
        model, tok = run.load(cfg.policy.checkpoint)
    elif cfg.warm_start.sft_examples == 0:
        model, tok = build_model(cfg.policy.preset, task.alphabet(), words=task.words(), seed=cfg.seed)
    n = cfg.warm_start.sft_examples
    hit = key = None
    if n > 0:
        from harness import warmstart

        if cfg.warm_start.sft_steps is not None:
            recipe = recipe.model_copy(update={"sft_steps": cfg.warm_start.sft_steps})
        seeds = run.store.draw_seeds(run.id, "train", n, key="warmstart")
        # a preset trained by us is cached (keyed by settings + code version); a user's checkpoint is not ours to key
        model, tok, hit, key, m = warmstart.warm_start(
            task, cfg.policy.preset or "", run.style, env, seeds, recipe, seed=cfg.seed,
            progress=_progress_cb(run, 0, "setup"), model_tok=(model, tok) if cfg.policy.checkpoint else None,
            tensorboard_dir=run.run_dir / TENSORBOARD_DIR / "s0" / "sft",
            resume_dir=run.path("checkpoints", warmstart.RESUME_DIR))
        if hit is not None:
            run.event(0, "setup", "cache", f"warm start loaded from the cache: {hit} (same settings and code version; "
                      "`evotrainer cache clear` or EVOTRAINER_WARMSTART_CACHE=0 retrains)", path=str(hit))
        if m is not None:
            run.store.charge(run.id, 0, "policy", "sft", seconds=m.wall_s, steps=m.steps)
    run.save(model, tok, out)
    if key and hit is None:
        entry = warmstart.store(key, out, {"run": run.id, "sft_examples": n, "sft_steps": recipe.sft_steps})
        if entry:
            run.event(0, "setup", "cache", f"warm start cached at {entry} (a later run with the same settings loads "
                      "it; clear with `evotrainer cache clear`)", path=str(entry))
    # per-run fixed costs paid once here, not by stage 1: the report suite (and the warm start's score on it, the
    # curve's starting point) and the round-0 env statistics
    if cfg.eval.suite:
        run.suite()
        _report_eval(run, 0, str(out))
    run.env_stats(env)
    _finish(run, 0, "setup", {"policy": str(out)}, t0, f"warm start done: {out.name}")
    return {"policy": str(out), "stage": 1, "consecutive_rejections": 0, "stages_without_promotion": 0,
            "log": [f"setup: warm start on {n} expert demonstrations"]}


def _progress_cb(run: Run, stage: int, node: str):
    def cb(what: str, step: int, total: int, logs: dict[str, Any]) -> None:
        run.progress("step", {"stage": stage, "node": node, "what": what, "step": step, "total": total,
                              "reward": logs.get("reward")})

    return cb


def _pool_seeds(run: Run, seed_key: str, recipe, steps: int) -> list[int]:
    """The prefix of the keyed train pool that `steps` GRPO steps of `recipe` consume (prompts = batch / group)."""
    from harness.backtest import arm_prompts

    seeds = run.store.draw_seeds(run.id, "train", run.config.stage.train_instances, key=seed_key)
    return seeds[: arm_prompts(recipe, steps)]


def _prefetch_stage(run: Run, k: int) -> None:
    """While stage k's policy trains: start the probe, backtest and control-arm instances of stage k."""
    cfg = run.config
    env, recipe, _ = harness_models(run.workspace().files("main"), run.task)
    run.prefetch(env, run.store.draw_seeds(run.id, "probe", cfg.stage.probe_n, key=f"s{k}/probe"))
    run.prefetch(run.judge.config(run.task), run.store.draw_seeds(run.id, "backtest", cfg.backtest.n,
                                                                  key=f"s{k}/backtest"))
    run.prefetch(env, _pool_seeds(run, f"s{k}/arms", recipe, cfg.backtest.arm_steps))


def _grpo(run: Run, stage: int, arm: str, start: str, files: dict[str, str], steps: int, seed_key: str,
          out: Path, seed: int) -> dict[str, Any]:
    """One GRPO run from `start` under the harness `files` (`harness.backtest.train_arm`, the same function the
    calibration benchmark's arms run); saves to `out`; charges the ledger."""
    from harness.backtest import train_arm

    env, recipe, _ = harness_models(files, run.task)
    # a fixed prompt pool per key: both arms of a decision train on the same instances, whatever their recipe; only
    # the prefix GRPO consumes (steps x prompts per step) is generated, so a recipe that needs more prompts trains on a
    # superset of the other arm's; past the end of the pool, TRL cycles over it
    seeds = _pool_seeds(run, seed_key, recipe, steps)
    model, tok = run.load(start)
    t0 = time.perf_counter()  # training compute = the whole TRL call (trainer setup + steps), not just train()
    m = train_arm(model, tok, run.task, files, steps, seeds, seed, style=run.style,
                  instances=run.instances(env, seeds), progress=_progress_cb(run, stage, arm),
                  tensorboard_dir=run.run_dir / TENSORBOARD_DIR / f"s{stage}" / arm)
    secs = time.perf_counter() - t0
    run.save(model, tok, out)
    run.store.charge(run.id, stage, arm, "grpo", seconds=secs, tokens=m.tokens_generated, steps=len(m.steps))
    steps_out = [s.model_dump() for s in m.steps]
    return {"checkpoint": str(out), "steps": steps_out, "seconds": m.wall_s, "tokens": m.tokens_generated}


def node_train(run: Run, state: State) -> State:
    k = state["stage"]
    if (r := _done(run, k, "train")) is not None:
        return {"train_ckpt": r["checkpoint"]}
    t0 = time.time()
    run.store.start_stage(run.id, k)
    # instances are cached within a stage (arms share them); only the report suite outlives the stage
    run.new_stage_instances()
    files = run.workspace().files("main")
    steps = harness_models(files, run.task)[1].steps
    _prefetch_stage(run, k)
    run.event(k, "train", "node_start", f"GRPO {steps} steps under harness@main")
    r = _grpo(run, k, "policy", state["policy"], files, steps, f"s{k}/train", run.path("checkpoints", f"s{k}-train"),
              seed=run.config.seed + k)
    _finish(run, k, "train", r, t0, f"trained {steps} steps")
    return {"train_ckpt": r["checkpoint"], "log": [f"stage {k} train: {steps} GRPO steps"]}


def _rollouts(run: Run, ckpt: str, seeds: list[int], env, samples: int, temperature: float,
              shaping=None) -> tuple[list[Rollout], float, int]:
    from harness.policy_glue import evaluate
    from policies.rollout import SamplingParams

    task = run.task
    instances = run.instances(env, seeds)
    model, tok = run.policy(ckpt)
    params = SamplingParams(temperature=temperature, n=samples, max_new_tokens=_max_new(run), seed=run.config.seed,
                            backend=run.config.policy.backend)
    t0 = time.perf_counter()  # evaluation compute = generation + scoring
    rep = evaluate(model, tok, task, instances, run.style, params=params, shaping=shaping)
    return rep.rollouts, time.perf_counter() - t0, rep.new_tokens


def _max_new(run: Run) -> int:
    return int(harness_models(run.workspace().files("main"), run.task)[1].max_completion_length)


def node_probe(run: Run, state: State) -> State:
    """Roll the trained policy out on fresh probe seeds (several samples each) and cache the rollouts. The stage's
    START policy is rolled out on the same seeds too: if training lowered the probe valid rate by more than noise
    (paired bootstrap, the gate's confidence), that is a finding (`grpo.policy_regressed`) and the trained checkpoint
    is not carried forward: the arms (and the next stage) start from the stage's start policy instead."""
    k = state["stage"]
    if (r := _done(run, k, "probe")) is not None:
        return {"train_ckpt": r.get("carried", state["train_ckpt"])}
    t0 = time.time()
    from harness.backtest import paired_bootstrap

    cfg = run.config
    env, recipe, shaping = harness_models(run.workspace().files("main"), run.task)
    seeds = run.store.draw_seeds(run.id, "probe", cfg.stage.probe_n, key=f"s{k}/probe")
    rollouts, secs, toks = _rollouts(run, state["train_ckpt"], seeds, env, cfg.stage.probe_samples,
                                     recipe.temperature, shaping)
    path = write_rollouts(run.path("rollouts", f"s{k}-probe.jsonl.gz"), rollouts)
    run.store.charge(run.id, k, "policy", "rollout", seconds=secs, tokens=toks, label="probe")
    valid = float(np.mean([r.valid for r in rollouts]))
    run.store.record_eval(run.id, k, "policy", "probe", n=len(rollouts), valid=valid,
                          optimal=float(np.mean([r.optimal for r in rollouts])))
    before, secs, toks = _rollouts(run, state["policy"], seeds, env, cfg.stage.probe_samples, recipe.temperature,
                                   shaping)
    run.store.charge(run.id, k, "policy", "rollout", seconds=secs, tokens=toks, label="probe-start")
    _, b_out, _ = _per_instance(before)
    _, a_out, _ = _per_instance(rollouts)
    eff, lo, hi = paired_bootstrap(b_out, a_out, cfg.gate.n_boot, cfg.gate.alpha, np.random.default_rng([cfg.seed, k]))
    carried, regressed = state["train_ckpt"], hi < 0
    result = {"rollouts": str(path), "valid": valid, "start_valid": float(np.mean(b_out)), "change": eff,
              "change_ci": [lo, hi], "regressed": regressed}
    msg = f"probe valid {valid:.3f} (start of stage {np.mean(b_out):.3f}, change {eff:+.3f} [{lo:+.3f}, {hi:+.3f}])"
    if regressed:
        carried = state["policy"]
        run.event(k, "probe", "regression",
                  f"stage {k} training LOWERED probe valid by more than noise: {np.mean(b_out):.3f} -> {valid:.3f} "
                  f"(effect {eff:+.3f}, {100 * cfg.gate.confidence:.0f}% upper bound {hi:+.3f} < 0, n={len(seeds)} x "
                  f"{cfg.stage.probe_samples}); its checkpoint is NOT carried forward: the arms and the next stage "
                  f"start from {Path(state['policy']).name}. A recipe that collapses the policy (e.g. a learning rate "
                  "too high) shows up here; the finding grpo.policy_regressed goes to the engineer",
                  key=f"{k}/regression")
    result["carried"] = carried
    _finish(run, k, "probe", result, t0, msg)
    return {"train_ckpt": carried, "log": [f"stage {k} probe: {msg}" + (" REGRESSED: not carried" if regressed
                                                                         else "")]}


def _history(run: Run) -> list[HistoryItem]:
    from harness.engineer.proposal import change_key
    from harness.records import Change

    parents = {r.id: r.parent for r in run.workspace().history()}  # the harness state each candidate started from
    out = []
    for c in run.store.candidates(run.id):
        if c["status"] not in ("promoted", "rejected", "rejected_vet"):
            continue
        lo, hi = c.get("ci_low"), c.get("ci_high")
        key = change_key(parents[c["id"]], Change.model_validate(c["patch"])) if c["id"] in parents else ""
        out.append(HistoryItem(stage=c["stage"], candidate=c["id"], knob=c["knob"],
                               change=f"{c['knob']} -> {(c['patch'] or {}).get('value')}",
                               verdict="promoted" if c["status"] == "promoted" else "rejected",
                               effect=c.get("effect"), ci=(lo, hi) if lo is not None and hi is not None else None,
                               reason=c.get("reason") or "", key=key))
    return out


def _budget_left(run: Run, stage: int) -> tuple[int, float | None]:
    b = run.config.budget
    wall = b.wall_clock_s
    left = None if wall is None else max(0.0, wall - (time.time() - run.store_started()))
    return b.stages - stage, left


def node_diagnose(run: Run, state: State) -> State:
    k = state["stage"]
    if _done(run, k, "diagnose") is not None:
        return {}
    t0 = time.time()
    from harness.diagnostics import build_diagnosis

    ws = run.workspace()
    files = ws.files("main")
    env, recipe, shaping = harness_models(files, run.task)
    rollouts = read_rollouts(Path(run.store.node_result(run.id, k, "probe")["rollouts"]))
    train = run.store.node_result(run.id, k, "train") or {}
    # the reward-hacking check compares training reward with the PROBE valid rate of past stages (never test)
    valid_hist = [e["valid"] for e in run.store.evaluations(run.id, arm="policy")
                  if e["split"] == "probe" and not e["slice_key"]]
    stages_left, budget_left = _budget_left(run, k)
    diag = build_diagnosis(run.task, k, rollouts, env, recipe, _history(run), stages_left, budget_left,
                           train_metrics=train.get("steps"), valid_history=valid_hist, shaping=shaping,
                           state=ws.head(), env_stats=run.env_stats(env),
                           diagnostics_files={p: s for p, s in files.items() if p.startswith("diagnostics/")},
                           rejections_before_fallback=run.config.stage.rejections_before_fallback,
                           step_shrink=run.config.stage.step_shrink)
    probe = run.store.node_result(run.id, k, "probe") or {}
    if k > 1 and not probe.get("regressed"):
        found = carried_regression(k, run.store.node_result(run.id, k - 1, "backtest"),
                                   run.store.node_result(run.id, k - 1, "decide"), run.config.backtest.arm_steps)
        if found:
            diag.findings.insert(0, found)
    if probe.get("regressed"):
        diag.findings.insert(0, Finding(
            code="grpo.policy_regressed", severity="critical", count=run.config.stage.probe_n,
            rate=round(-probe["change"], 4), knobs=["recipe.learning_rate"],
            message=(f"this stage's GRPO lowered probe valid {probe['start_valid']:.3f} -> {probe['valid']:.3f} "
                     f"(upper bound {probe['change_ci'][1]:+.3f}); the trained checkpoint was discarded")))
    diag.feedback = human_feedback(run, k)  # a person's `revise` feedback reaches the engineer's prompt
    run.store.record_findings(run.id, k, diag.findings)
    path = run.path("stages", f"s{k}", "diagnosis.json")
    path.write_text(diag.model_dump_json(indent=1))
    top = ", ".join(f"{f.code}{'@' + ','.join(f'{a}={b}' for a, b in f.slice.items()) if f.slice else ''}"
                    for f in diag.findings[:3]) or "none"
    _finish(run, k, "diagnose", {"diagnosis": str(path), "findings": len(diag.findings)}, t0,
            f"{len(diag.findings)} findings; top: {top}")
    return {"log": [f"stage {k} diagnose: {len(diag.findings)} findings (top: {top})"]}


def carried_regression(k: int, prev_backtest: dict[str, Any] | None, prev_decide: dict[str, Any] | None,
                       arm_steps: int) -> Finding | None:
    """`grpo.policy_regressed` for stage k when stage k-1's control arm fell below its start on the backtest
    (`_judge_start`) and nothing was promoted there, so the harness that lowered the policy is still the incumbent."""
    start = (prev_backtest or {}).get("start") or {}
    if not start.get("control_regressed") or (prev_decide or {}).get("winner"):
        return None
    return Finding(
        code="grpo.policy_regressed", severity="critical", count=int(start["n"]), rate=round(-start["change"], 4),
        knobs=["recipe.learning_rate"],
        message=(f"stage {k - 1}'s control arm ({arm_steps} more GRPO steps under this harness) lowered backtest "
                 f"valid {start['valid']:.3f} -> {start['control_valid']:.3f} (upper bound "
                 f"{start['change_ci'][1]:+.3f}); it was not carried forward"))


def node_propose(run: Run, state: State) -> State:
    """Ask the engineer for candidates; commit each (one change) on its own branch cand/<id>."""
    k = state["stage"]
    if (r := _done(run, k, "propose")) is not None:
        return {"candidates": r["candidates"]}
    t0 = time.time()
    from harness.engineer import propose
    from harness.records import Diagnosis
    from harness.vet import apply_change

    cfg = run.config
    diag = Diagnosis.model_validate_json(Path(run.store.node_result(run.id, k, "diagnose")["diagnosis"]).read_text())
    rng = np.random.default_rng([cfg.seed, k])
    skills = run.skills()
    try:
        res = propose(cfg.engineer, diag, skills, cfg.stage.candidates, rng, policy_ckpt=Path(state["train_ckpt"]))
    finally:
        skills.close()
    for note in res.notes:
        run.event(k, "propose", "engineer_note", note, key=f"{k}/note/{note[:80]}")
    for bad in res.rejected_replies:
        run.event(k, "propose", "reply_rejected", bad.reason, key=f"{k}/bad/{bad.attempt}")
    ws = run.workspace()
    main_files = ws.files("main")
    ids = []
    for i, cand in enumerate(res.candidates):
        cand = cand.model_copy(update={"id": f"s{k}c{i + 1}", "stage": k})
        ids.append(cand.id)
        run.store.upsert_candidate(run.id, cand)
        try:
            new_files = apply_change(main_files, cand.change, run.task)
        except ValueError as exc:  # a patch that does not apply is a vet rejection, recorded without a commit
            run.store.set_candidate_verdict(Verdict(candidate=cand.id, decision="rejected", stage_reached="vet",
                                                    reason=f"patch does not apply: {exc}"))
            continue
        changed = {p: s for p, s in new_files.items() if main_files.get(p) != s}
        try:
            sha = ws.propose(cand.id, changed, summary=_summary(cand), rationale=cand.rationale,
                             factor=cand.change.knob, stage=k, skill=cand.skill, engineer=cand.engineer)
        except Exception as exc:  # noqa: BLE001 - one bad candidate costs itself, never the stage
            run.store.set_candidate_verdict(Verdict(candidate=cand.id, decision="rejected", stage_reached="vet",
                                                    reason=cut(f"could not be committed: {type(exc).__name__}: "
                                                                f"{exc}")))
            continue
        run.store.upsert_candidate(run.id, cand, commit=sha)
    msg = ", ".join(f"{i}: {c.change.knob}" for i, c in zip(ids, res.candidates)) or "no candidate"
    _finish(run, k, "propose", {"candidates": ids, "engineer": res.engineer_used}, t0, msg)
    return {"candidates": ids, "log": [f"stage {k} propose ({res.engineer_used}): {msg}"]}


def _summary(c: Candidate) -> str:
    if c.change.kind == "diagnostic":
        return f"{c.change.knob}: add/revise diagnostic"
    return f"{c.change.knob}: {c.old_value} -> {c.change.value}"


def node_vet(run: Run, state: State) -> State:
    k = state["stage"]
    if (r := _done(run, k, "vet")) is not None:
        return {"vetted": r["vetted"]}
    t0 = time.time()
    from harness.vet import vet

    ws = run.workspace()
    rollouts = read_rollouts(Path(run.store.node_result(run.id, k, "probe")["rollouts"]))
    main_files = ws.files("main")
    vetted = []
    for cid in state.get("candidates", []):
        row = run.store.candidate(cid)
        if row["status"] in ("rejected_vet", "rejected", "promoted"):
            continue
        cand = _candidate(row)
        try:
            res = vet(cand, main_files, run.task, rollouts)
        except Exception as exc:  # noqa: BLE001 - vet promises not to raise; if it does, the candidate pays
            from harness.vet import VetResult

            res = VetResult(ok=False, stage="vet", reason=cut(f"the vet step failed on it: {type(exc).__name__}: "
                                                               f"{exc}"))
        if res.ok:
            run.store.set_candidate_status(cid, "vetted")
            vetted.append(cid)
        else:
            _reject(run, cid, Verdict(candidate=cid, decision="rejected", reason=f"{res.stage}: {res.reason}",
                                      stage_reached=res.stage))
    _finish(run, k, "vet", {"vetted": vetted}, t0, f"{len(vetted)} of {len(state.get('candidates', []))} vetted")
    return {"vetted": vetted}


def _candidate(row: dict[str, Any]) -> Candidate:
    from harness.records import Change

    return Candidate(id=row["id"], stage=row["stage"], change=Change.model_validate(row["patch"]),
                     old_value=row["old_value"], rationale=row["rationale"] or "", expected=row["expected"] or "",
                     skill=row["skill"], engineer=row["engineer"] or "rule")


def _reject(run: Run, cid: str, verdict: Verdict) -> None:
    """Tag rejected/<id> (idempotent: a re-entered node gets the same tag back) and record the verdict."""
    from sandbox.workspace import UnknownCandidate

    ws = run.workspace()
    try:
        tag = ws.reject(cid, verdict.reason, evidence=verdict.evidence).tag
    except UnknownCandidate:  # never committed: its patch did not apply
        tag = None
    run.store.set_candidate_verdict(verdict, tag=tag)


def _arm_job(run: Run, k: int, name: str, files: dict[str, str], start: str, steps: int):
    """Everything one arm needs (`harness.scale.ArmJob`): its harness, its train instances (the stage's shared arm pool
    under its own env), the judge and this stage's backtest instances of the run's FIXED judge distribution
    (judge.json, never the incumbent's env.yaml, which promotions rewrite)."""
    from harness.scale import ArmJob

    cfg = run.config
    env, recipe, _ = harness_models(files, run.task)
    # both arms train on the same train seeds; arm randomness is shared too (paired design)
    train_seeds = _pool_seeds(run, f"s{k}/arms", recipe, steps)
    eval_seeds = run.store.draw_seeds(run.id, "backtest", cfg.backtest.n, key=f"s{k}/backtest")
    judge = run.judge
    return ArmJob(name=name, task=run.task.name, style=run.style, files=files, start=start, steps=steps,
                  train_seeds=train_seeds, train_instances=run.instances(env, train_seeds), seed=cfg.seed + 1000 + k,
                  judge=judge, eval_instances=run.instances(judge.config(run.task), eval_seeds),
                  sampling_seed=cfg.seed + k, backend=cfg.policy.backend)


def _record_arm(run: Run, k: int, name: str, out) -> dict[str, Any]:
    """What the run process writes for a finished arm (from either backend): ledger, rollouts, eval, node result."""
    m, ev = out.metrics, out.eval
    run.store.charge(run.id, k, name, "grpo", seconds=out.train_s, tokens=m.tokens_generated, steps=len(m.steps))
    path = write_rollouts(run.path("rollouts", f"s{k}-{name}-backtest.jsonl.gz"), ev.rollouts)
    run.store.charge(run.id, k, name, "eval", seconds=ev.seconds, tokens=ev.tokens, label="backtest")
    run.store.record_eval(run.id, k, name, "backtest", n=len(ev.rollouts), valid=ev.valid,
                          optimal=float(np.mean([x.optimal for x in ev.rollouts])))
    steps_out = [s.model_dump() for s in m.steps]
    r = {"checkpoint": str(run.path("checkpoints", f"s{k}-{name}")), "seconds": m.wall_s,
         "tokens": m.tokens_generated, "rollouts": str(path), "valid": ev.valid, "greedy": ev.greedy,
         "steps": len(steps_out), "curve": steps_out}  # per-step training metrics (the report draws them)
    run.store.mark_node_done(run.id, k, f"arm:{name}", r)
    return r


def _arms(run: Run, k: int, arms: list[tuple[str, dict[str, str]]], start: str, steps: int) -> dict[str, Any]:
    """Train and judge every arm of stage k (control first), each with `harness.scale.execute_arm`: one after another
    in this process (scale.backend local), or side by side as Ray tasks (ray). Finished arms are not run again (a
    resumed stage runs only the missing ones). Returns name -> node result, or the exception of an arm that failed."""
    from harness.scale import execute_arm, write_tree

    out: dict[str, Any] = {}
    todo = []
    for name, files in arms:
        if (r := run.store.node_result(run.id, k, f"arm:{name}")) is not None:
            out[name] = r
        else:
            todo.append((name, files))
    if not todo:
        return out
    if run.config.scale.backend == "ray":
        jobs = []
        for name, files in todo:
            try:
                jobs.append(_arm_job(run, k, name, files, start, steps))
            except Exception as exc:  # noqa: BLE001 - an arm whose instances cannot be made fails its decision
                out[name] = exc
        run.event(k, "backtest", "scale", f"{len(jobs)} arm(s) submitted to Ray: {', '.join(j.name for j in jobs)}")
        for name, res, ckpt, tb in run.ray().run(jobs):
            if isinstance(res, Exception):
                out[name] = res
                run.event(k, "backtest", "scale", f"arm {name} failed on Ray: {cut(str(res), 300)}")
                continue
            write_tree(ckpt, run.path("checkpoints", f"s{k}-{name}", "x").parent)
            write_tree(tb, run.path(TENSORBOARD_DIR, f"s{k}", name, "x").parent)
            out[name] = _record_arm(run, k, name, res)
            run.event(k, "backtest", "scale", f"arm {name} came back from Ray (valid {res.eval.valid:.3f})")
        run.ray().forget_starts()
        return out
    for name, files in todo:
        try:
            job = _arm_job(run, k, name, files, start, steps)
            ckpt = run.path("checkpoints", f"s{k}-{name}")
            model, tok = run.load(start)
            res = execute_arm(job, model, tok, lambda m, t, ckpt=ckpt: run.save(m, t, ckpt),
                              lambda ckpt=ckpt: run.policy(str(ckpt)), progress=_progress_cb(run, k, name),
                              tensorboard_dir=run.run_dir / TENSORBOARD_DIR / f"s{k}" / name)
            out[name] = _record_arm(run, k, name, res)
        except Exception as exc:  # noqa: BLE001 - one arm's failure is its decision's, not the run's
            log.warning("arm %s of stage %d failed: %s", name, k, exc)
            out[name] = exc
    return out


def _per_instance(rollouts: list[Rollout]) -> tuple[list[int], list[float], list[dict[str, str]]]:
    by: dict[int, list[Rollout]] = {}
    for x in rollouts:
        by.setdefault(x.seed, []).append(x)
    seeds = sorted(by)
    return seeds, [float(np.mean([x.valid for x in by[s]])) for s in seeds], [by[s][0].slices for s in seeds]


def node_backtest(run: Run, state: State) -> State:
    """Control arm (incumbent harness) vs each vetted candidate arm, same start, budget and seeds; the gate."""
    k = state["stage"]
    if _done(run, k, "backtest") is not None:
        return {}
    t0 = time.time()
    from harness.backtest import decide, detectability_warning
    from harness.diagnostics import arm_metrics, run_vetoes

    cfg, ws = run.config, run.workspace()
    vetted = state.get("vetted", [])
    if not vetted:
        _finish(run, k, "backtest", {"verdicts": []}, t0, "nothing to backtest")
        return {}
    steps = cfg.backtest.arm_steps
    main_files = ws.files("main")
    # while the control arm trains: the candidates' own arm pools (an env candidate draws other instances) and the
    # next stage's train pool (under the current env; wasted only if a promotion changes the env)
    for cid in vetted:
        c_env, c_rec, _ = harness_models(ws.files(f"cand/{cid}"), run.task)
        run.prefetch(c_env, _pool_seeds(run, f"s{k}/arms", c_rec, steps))
    if k < cfg.budget.stages:
        env, rec, _ = harness_models(main_files, run.task)
        run.prefetch(env, _pool_seeds(run, f"s{k + 1}/train", rec, rec.steps))
    results = _arms(run, k, [("control", main_files)] + [(cid, ws.files(f"cand/{cid}")) for cid in vetted],
                    state["train_ckpt"], steps)
    control = results["control"]
    if isinstance(control, Exception):  # without a control there is no decision: every candidate fails with the reason
        verdicts = [Verdict(candidate=cid, decision="rejected", stage_reached="backtest",
                            reason=cut(f"the control arm failed, so nothing could be compared: "
                                       f"{type(control).__name__}: {control}")) for cid in vetted]
        for v in verdicts:
            run.event(k, "backtest", "verdict", f"{v.candidate}: rejected: {v.reason}", key=f"{k}/verdict/{v.candidate}")
        _finish(run, k, "backtest", {"verdicts": [json.loads(v.model_dump_json()) for v in verdicts]}, t0,
                f"{len(verdicts)} decision(s): the control arm failed")
        return {}
    c_roll = read_rollouts(Path(control["rollouts"]))
    c_seeds, c_out, c_slices = _per_instance(c_roll)
    start = _judge_start(run, k, state["train_ckpt"], c_seeds, c_out)
    verdicts = []
    for cid in vetted:
        files = ws.files(f"cand/{cid}")
        arm = results[cid]
        if isinstance(arm, Exception):  # a candidate whose arm cannot train or be judged is rejected
            v = Verdict(candidate=cid, decision="rejected", stage_reached="backtest",
                        reason=cut(f"its backtest arm failed: {type(arm).__name__}: {arm}"))
            verdicts.append(v)
            run.event(k, "backtest", "verdict", f"{cid}: rejected: {v.reason}", key=f"{k}/verdict/{cid}")
            continue
        x_roll = read_rollouts(Path(arm["rollouts"]))
        x_seeds, x_out, _ = _per_instance(x_roll)
        assert x_seeds == c_seeds, "arms must be evaluated on the same backtest instances"
        # vetoes from BOTH trees: a candidate cannot escape a veto by deleting or rewriting its file
        # (each distinct file once: the incumbent's, plus the candidate's where it differs)
        diag = [{p: s for p, s in main_files.items() if p.startswith("diagnostics/")},
                {p: s for p, s in files.items() if p.startswith("diagnostics/") and main_files.get(p) != s}]
        vetoes: list[str] = []
        for tree in diag:
            for v in run_vetoes(tree, c_roll, x_roll, arm_metrics(c_roll), arm_metrics(x_roll)):
                if v not in vetoes:
                    vetoes.append(v)
        v = decide(c_out, x_out, c_slices, cfg.gate, vetoes, candidate_id=cid, comparisons=len(vetted),
                   rng=np.random.default_rng([cfg.seed, k, len(verdicts)]), seeds=c_seeds,
                   greedy=(control.get("greedy") or [], arm.get("greedy") or []), samples=run.judge.samples)
        verdicts.append(v)
        warn = detectability_warning(v.evidence.mde, v.evidence.n, run.judge.samples, cfg.gate) if v.evidence else None
        if warn:  # said once per run (keyed event), with the fix
            run.event(k, "backtest", "warning", warn, key="detectability")
        run.store.set_candidate_status(cid, "backtested")
        run.event(k, "backtest", "verdict", f"{cid}: {v.decision}: {v.reason}", key=f"{k}/verdict/{cid}")
    _finish(run, k, "backtest", {"verdicts": [json.loads(v.model_dump_json()) for v in verdicts],
                                 "control": control["checkpoint"], "start": start}, t0, f"{len(verdicts)} decision(s)")
    return {}


def _judge_start(run: Run, k: int, ckpt: str, seeds: list[int], control_out: list[float]) -> dict[str, Any]:
    """Judge the arms' START policy on the backtest instances (same judge, sampling seed and instances as the arms)
    and compare the control arm with it: the control arm is the incumbent harness trained `arm_steps` further, so a
    control arm below its start by more than noise (paired bootstrap, the gate's confidence) means the incumbent
    recipe lowers the policy over that horizon. Then the control arm is not carried into the next stage (the start
    is) and the next stage's diagnosis gets `grpo.policy_regressed`. Catches what the probe misses when a recipe
    collapses the policy only after more steps than one stage trains."""
    from harness.backtest import judge_arm, paired_bootstrap

    if (r := run.store.node_result(run.id, k, "judge:start")) is not None:
        return r
    cfg = run.config
    judge = run.judge
    model, tok = run.policy(ckpt)
    ev = judge_arm(model, tok, run.task, run.instances(judge.config(run.task), seeds), judge,
                   sampling_seed=cfg.seed + k, style=run.style, backend=cfg.policy.backend)
    run.store.charge(run.id, k, "start", "eval", seconds=ev.seconds, tokens=ev.tokens, label="backtest")
    run.store.record_eval(run.id, k, "start", "backtest", n=len(ev.rollouts), valid=ev.valid,
                          optimal=float(np.mean([x.optimal for x in ev.rollouts])))
    eff, lo, hi = paired_bootstrap(ev.outcomes, control_out, cfg.gate.n_boot, cfg.gate.alpha,
                                   np.random.default_rng([cfg.seed, k, 7]))
    r = {"checkpoint": ckpt, "n": len(seeds), "valid": float(np.mean(ev.outcomes)),
         "control_valid": float(np.mean(control_out)), "change": eff, "change_ci": [lo, hi], "control_regressed": hi < 0}
    if hi < 0:
        run.event(k, "backtest", "regression",
                  f"the control arm ({cfg.backtest.arm_steps} more steps under the incumbent harness) LOWERED "
                  f"backtest valid by more than noise: {r['valid']:.3f} -> {r['control_valid']:.3f} (effect "
                  f"{eff:+.3f}, {100 * cfg.gate.confidence:.0f}% upper bound {hi:+.3f} < 0, n={len(seeds)}); unless a "
                  f"candidate is promoted the next stage starts from {Path(ckpt).name}, not from the control arm, "
                  "and its engineer gets the finding grpo.policy_regressed", key=f"{k}/control-regression")
    run.store.mark_node_done(run.id, k, "judge:start", r)
    return r


GATE_ACTIONS = ("approve", "revise", "abort")


def node_gate(run: Run, state: State) -> State:
    """The human gate (config `gate.human`): after the backtest, before anything is promoted, the run pauses (a
    LangGraph interrupt, persisted in graph.db, so the pause survives a restart or a kill) until a person answers
    `evotrainer approve|revise|abort RUN`. approve: the gate's own decision stands; revise: this stage promotes
    nothing and the feedback goes into the next diagnosis (the engineer's prompt) and run.db; abort: nothing is
    promoted and the run stops after this stage. Without a gate it passes straight through."""
    from langgraph.types import interrupt

    k = state["stage"]
    if (r := _done(run, k, "gate")) is not None:
        return {"human": r["action"]}
    t0 = time.time()
    if not run.config.gate.human_needed(state.get("stages_without_promotion", 0)):
        _finish(run, k, "gate", {"action": "auto"}, t0, "no human gate")
        return {"human": "auto"}
    bt = run.store.node_result(run.id, k, "backtest") or {"verdicts": []}
    lines = [f"{v['candidate']}: {v['decision']}: {cut(v['reason'], 200)}" for v in bt["verdicts"]] or \
        ["no candidate reached the backtest"]
    msg = (f"stage {k} waits at the human gate; the gate's verdicts: " + "; ".join(lines)
           + f". Answer with `evotrainer approve {run.id}`, `evotrainer revise {run.id} \"feedback\"` or "
           f"`evotrainer abort {run.id}`")
    run.store.set_run_status(run.id, "paused")
    run.event(k, "gate", "gate_waiting", msg, key=f"{k}/gate/waiting")
    answer = interrupt({"stage": k, "message": msg})  # returns the answer when the run is continued
    action = answer.get("action") if isinstance(answer, dict) else None
    if action not in GATE_ACTIONS:
        raise RunError(f"the human gate got {answer!r}; answer with one of {', '.join(GATE_ACTIONS)}")
    feedback = str(answer.get("feedback") or "").strip()
    run.store.set_run_status(run.id, "running")
    run.event(k, "gate", "gate_decision", f"{action}" + (f": {feedback}" if feedback else ""),
              key=f"{k}/gate/decision", action=action, feedback=feedback)
    _finish(run, k, "gate", {"action": action, "feedback": feedback}, t0, f"human: {action}")
    return {"human": action, "log": [f"stage {k} gate: {action}"]}


def human_feedback(run: Run, before: int) -> list[str]:
    """Feedback a person gave at the gate (`revise`) in stages before `before`, oldest first."""
    out = []
    for j in range(1, before):
        r = run.store.node_result(run.id, j, "gate") or {}
        if r.get("action") == "revise" and r.get("feedback"):
            out.append(f"stage {j}: {r['feedback']}")
    return out


def node_decide(run: Run, state: State) -> State:
    """Promote the best significant candidate (merge + tag; its arm's checkpoint continues); reject the rest."""
    k = state["stage"]
    if (r := _done(run, k, "decide")) is not None:
        return _decide_state(run, state, r)
    t0 = time.time()
    from harness.backtest import choose_winner

    ws = run.workspace()
    bt = run.store.node_result(run.id, k, "backtest") or {"verdicts": []}
    verdicts = [Verdict.model_validate(v) for v in bt["verdicts"]]
    human = run.store.node_result(run.id, k, "gate") or {}
    if human.get("action") in ("revise", "abort"):  # a person overrode the gate: nothing is promoted this stage
        said = {"revise": "revised", "abort": "aborted"}[human["action"]] + " by a human at the gate" + (
            f": {human['feedback']}" if human.get("feedback") else "")
        verdicts = [v.model_copy(update={"decision": "rejected", "reason": cut(f"{said} (the gate said: {v.reason})")})
                    for v in verdicts]
    winner, others = choose_winner(verdicts)
    next_policy = bt.get("control") or state["train_ckpt"]
    if (run.store.node_result(run.id, k, "probe") or {}).get("regressed") or \
            (bt.get("start") or {}).get("control_regressed"):
        # the stage's recipe lowered the probe, or the control arm fell below its start on the backtest: the control
        # arm (trained under that same recipe) is not carried
        next_policy = state["train_ckpt"]  # = the arms' start (after a probe regression: the stage's start policy)
    if winner is not None:
        d = ws.promote(winner.candidate, evidence=winner.evidence, reason=winner.reason)
        run.store.set_candidate_verdict(winner, tag=d.tag)
        next_policy = run.store.node_result(run.id, k, f"arm:{winner.candidate}")["checkpoint"]
    for v in others:
        if winner is None or v.candidate != winner.candidate:
            _reject(run, v.candidate, v)
    result = {"winner": winner.candidate if winner else None, "next_policy": next_policy,
              "decided": len(verdicts)}
    msg = f"promoted {winner.candidate}" if winner else "no promotion"
    _finish(run, k, "decide", result, t0, msg)
    return {**_decide_state(run, state, result), "log": [f"stage {k} decide: {msg}"]}


def _decide_state(run: Run, state: State, r: dict[str, Any]) -> State:
    k = state["stage"]
    cfg = run.config.stage
    tried = bool(state.get("candidates"))
    rej = 0 if r["winner"] else state.get("consecutive_rejections", 0) + (1 if tried else 0)
    if rej >= cfg.rejections_before_fallback:
        run.event(k, "decide", "fallback",
                  f"{rej} rejections in a row: back to the last promoted harness (main), smaller changes next",
                  key=f"{k}/fallback")
        rej = 0
    nwp = 0 if r["winner"] else state.get("stages_without_promotion", 0) + 1
    return {"winner": r["winner"], "next_policy": r["next_policy"], "consecutive_rejections": rej,
            "stages_without_promotion": nwp}


def node_remember(run: Run, state: State) -> State:
    """Skill evidence, a new skill for a promoted change that had none, the stage's held-out report, budget check."""
    k = state["stage"]
    if _done(run, k, "remember") is None:
        t0 = time.time()
        _remember_skills(run, k)
        policy = state["next_policy"]
        _report_eval(run, k, policy)
        run.release_engines(keep=[policy])  # every other checkpoint of this stage is superseded
        from harness.retention import apply_retention  # the decision is recorded: delete what retention lets go
        apply_retention(run, k)
        run.store.end_stage(run.id, k, checkpoint=policy, metrics=_stage_metrics(run, k, time.time() - t0))
        _finish(run, k, "remember", {}, t0, "stage recorded")
    stop = _stop_reason(run, state)
    out: State = {"policy": state["next_policy"], "stage": k + 1, "candidates": [], "vetted": [], "winner": None}
    if stop:
        run.store.set_run_status(run.id, "finished")
        run.event(k, "remember", "finished", stop, key="finished")
        out.update(done=True, stop_reason=stop)
    return out


def _remember_skills(run: Run, k: int) -> None:
    from skills.model import Evidence as SkillEvidence
    from skills.model import Intervention, Provenance, Skill, Trigger

    lib = run.skills()
    try:
        for c in run.store.candidates(run.id, stage=k):
            if c["status"] not in ("promoted", "rejected"):
                continue
            cand = _candidate(c)
            promoted = c["status"] == "promoted"
            interval = (c["ci_low"], c["ci_high"]) if c.get("ci_low") is not None else None
            if cand.skill:
                lib.record_try(cand.skill, promoted=promoted, effect=c.get("effect") or 0.0, interval=interval,
                               family=run.config.task, run=run.id, candidate=cand.id, commit=c.get("commit_sha"))
            elif promoted:  # an engineer-invented change that worked becomes a skill
                codes = [f.code for f in run.store.findings(run.id, stage=k)][:3]
                name = f"{run.config.task}-{cand.change.knob.replace('/', '-').replace('_', '-')}-{run.id}-{cand.id}"
                name = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in name.lower())
                lib.add(Skill(
                    name=name, kind=cand.change.kind, trigger=Trigger(findings=codes),
                    intervention=Intervention(knob=cand.change.knob, op="code" if cand.change.code else "set",
                                              value=cand.change.value, code=cand.change.code),
                    expected=cand.expected or f"raises {cand.target_metric}", validation=cand.target_metric,
                    domains=[run.config.task],
                    evidence=SkillEvidence(tries=1, promotions=1, mean_effect=c.get("effect") or 0.0,
                                           last_interval=interval, families=[run.config.task]),
                    provenance=Provenance(source="run", run=run.id, commit=c.get("commit_sha")),
                    description=cand.rationale), replace=True)
    finally:
        lib.close()


def _report_eval(run: Run, k: int, ckpt: str) -> None:
    """Held-out (test split) valid/optimal per slice of the stage's policy: reported, never used to decide."""
    if not run.config.eval.suite:
        return
    from harness.policy_glue import evaluate
    from policies.rollout import SamplingParams

    task = run.task
    insts = run.suite()
    if run.config.eval.limit:
        insts = insts[: run.config.eval.limit]
    model, tok = run.policy(ckpt)
    t0 = time.perf_counter()
    rep = evaluate(model, tok, task, insts, run.style,
                   params=SamplingParams(temperature=0.0, max_new_tokens=_max_new(run), batch_size=64,
                                         backend=run.config.policy.backend))
    run.store.charge(run.id, k, "policy", "eval", seconds=time.perf_counter() - t0, tokens=rep.new_tokens,
                     label="test")
    run.store.record_eval(run.id, k, "policy", "test", n=rep.n, valid=rep.valid, optimal=rep.optimal)
    per = [0.0] * len(insts)
    for r in rep.rollouts:
        per[r.group] = float(r.valid)
    # per-instance outcomes (same suite instances every stage): the report's paired stage-to-stage comparison
    out = run.path("stages", f"s{k}", "test.json")
    out.write_text(json.dumps({"checkpoint": ckpt, "seeds": [i.seed for i in insts], "valid": per}))
    for key, vals in rep.by_slice.items():
        for val, st in vals.items():
            run.store.record_eval(run.id, k, "policy", "test", n=st.n, valid=st.valid, optimal=st.optimal,
                                  slice_key=key, slice_value=val)


def _stage_wall(run: Run, k: int, remember_s: float) -> float:
    """Wall seconds of stage k: from the end of the previous stage (or of setup) to now, everything included (nodes,
    LangGraph checkpoints, routing). A stage that a crash interrupted (its nodes ran in different processes) reports
    the sum of its node times instead, so the downtime is not counted."""
    nodes = [run.store.node_result(run.id, k, n) or {} for n in NODES[1:-1]]
    prev = run.store.node_result(run.id, k - 1, "remember") if k > 1 else run.store.node_result(run.id, 0, "setup")
    summed = remember_s + sum(r.get("_wall_s", 0.0) for r in nodes)
    pids = {r.get("_pid") for r in [*nodes, prev or {}]}
    if prev and "_ended" in prev and pids == {os.getpid()}:
        return time.time() - prev["_ended"]
    return summed


def _stage_metrics(run: Run, k: int, remember_s: float) -> dict[str, Any]:
    """Held-out metrics plus the framework overhead: stage wall time not spent in training/eval compute."""
    wall = _stage_wall(run, k, remember_s)
    compute = float(run.store.db.execute("SELECT COALESCE(SUM(seconds), 0) FROM compute WHERE run = ? AND stage = ?",
                                         [run.id, k]).fetchone()[0])
    test = [e for e in run.store.evaluations(run.id, stage=k, arm="policy") if e["split"] == "test"
            and not e["slice_key"]]
    out = {"wall_s": wall, "compute_s": compute, "overhead_share": max(0.0, wall - compute) / wall if wall else 0.0}
    if test:
        out.update(valid=test[0]["valid"], optimal=test[0]["optimal"])
    return out


def _stop_reason(run: Run, state: State) -> str | None:
    b, k = run.config.budget, state["stage"]
    if (run.store.node_result(run.id, k, "gate") or {}).get("action") == "abort":
        return f"aborted by a human at the gate (stage {k})"
    if k >= b.stages:
        return f"stage budget reached ({b.stages} stages)"
    wall = b.wall_clock_s
    if wall is not None and time.time() - run.store_started() >= wall:
        return f"wall-clock budget reached ({b.wall_clock})"
    if b.compute_s is not None and run.store.seconds_spent(run.id) >= b.compute_s:
        return f"compute budget reached ({b.compute_s:.0f} s)"
    if b.plateau and state.get("stages_without_promotion", 0) >= b.plateau:
        return f"plateau: {b.plateau} stages without a promotion"
    return None


# --- the graph -----------------------------------------------------------------------------------------------------------


def build_graph(run: Run, checkpointer):
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(State)
    for name in NODES:
        fn = globals()[f"node_{name}"]
        g.add_node(name, _wrap(run, name, fn))
    g.add_edge(START, "setup")
    g.add_edge("setup", "train")
    for a, b in pairwise(NODES[1:]):
        g.add_edge(a, b)
    g.add_conditional_edges("remember", lambda s: END if s.get("done") else "train", {END: END, "train": "train"})
    return g.compile(checkpointer=checkpointer)


def _wrap(run: Run, name: str, fn):
    def node(state: State) -> State:
        run.progress("node", {"stage": state.get("stage", 0), "node": name})
        return fn(run, state)

    node.__name__ = name
    return node
