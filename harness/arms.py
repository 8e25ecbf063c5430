"""The stage's training runs: the warm start, the policy's GRPO stage and the backtest arms (on the configured
backend).

    out, n = warm_start(run)                                                   # checkpoints/warmstart (SFT, cached)
    trained = train_policy(run, k, "policy", start, files, steps, f"s{k}/train", out, seed)
    arms = run_arms(run, k, [("control", main_files), ("s1c1", cand_files)], start, steps)  # name -> ArmRecord | exc
    control = arm_eval(arms["control"], run.judge.per_instance)                               # per-instance outcomes
    start = judge_start(run, k, start_ckpt, control)                                          # did the control fall?

An arm is one `harness.scale.ArmJob` (`arm_job`): its harness, its train instances (the stage's shared arm pool under
its own env), the judge and this stage's backtest instances of the run's FIXED judge distribution (judge.json, never
the incumbent's env.yaml, which promotions rewrite). `harness.scale.execute_arm` runs it, in this process (scale.backend
local, one arm after another) or as a Ray task (`harness.scale.RayArms`); only this process records what came back
(`record_arm`: ledger, rollouts, eval row, the `arm:<name>` node result). Finished arms are not run again, so a resumed
stage runs only the missing ones.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.backtest import ArmEval, judge_arm, judge_greedy, regression, train_arm
from harness.faults import stop_on_machine_fault
from harness.records import RewardBatch, cut, read_rollouts, write_reward_batches, write_rollouts
from harness.results import ArmLook, ArmRecord, CarryBatch, StartJudged, Trained
from harness.round0 import harness_models
from harness.run import Run
from harness.threads import step_trial

TENSORBOARD_DIR = "tensorboard"  # event files per phase: tensorboard/s<k>/<sft|policy|control|candidate id>

log = logging.getLogger(__name__)


def progress_cb(run: Run, stage: int, node: str):
    def cb(what: str, step: int, total: int, logs: dict[str, Any]) -> None:
        run.progress("step", {"stage": stage, "node": node, "what": what, "step": step, "total": total,
                              "reward": logs.get("reward")})

    return cb


def warm_start(run: Run) -> tuple[Path, int]:
    """The run's starting policy (`checkpoints/warmstart`): the config's checkpoint or a fresh preset, SFT on
    `warm_start.sft_examples` expert demonstrations of the train split under `warm_start.env` (default: the round-0
    env; a `warm_start.teacher_noise` share of them from the task's imperfect teacher); a preset's is cached across
    runs by settings, that env and code version (`harness.warmstart`). Returns (its path, demonstrations used)."""
    from harness import warmstart
    from harness.tasks.drawn import built_in
    from harness.threads import sft_threads
    from policies.model import build_model
    from policies.train import latest_resume_checkpoint, resume_step

    cfg, task = run.config, run.task
    env, recipe, _ = harness_models(run.workspace().files("main"), task)
    if cfg.warm_start.env is not None:  # the demonstrations' distribution, when it is not the round-0 env
        env = task.spec.config_model.model_validate(cfg.warm_start.env)
    out = run.path("checkpoints", "warmstart")
    if cfg.policy.checkpoint:
        model, tok = run.load(cfg.policy.checkpoint)
    elif cfg.warm_start.sft_examples == 0:
        model, tok = build_model(cfg.policy.preset, task.spec.alphabet, words=list(task.spec.words), seed=cfg.seed)
    n = cfg.warm_start.sft_examples
    hit = key = None
    if n > 0:
        if cfg.warm_start.sft_steps is not None:
            recipe = recipe.model_copy(update={"sft_steps": cfg.warm_start.sft_steps})
        seeds = run.draw_seeds("train", n, key="warmstart")
        resume_at = latest_resume_checkpoint(run.path("checkpoints", warmstart.RESUME_DIR))
        if resume_at is not None:  # a kill interrupted the warm start: it continues from its last checkpoint
            step = resume_step(resume_at)
            run.event(0, "setup", "sft_resumed", f"the SFT warm start continues from its checkpoint at step {step} of "
                      f"{recipe.sft_steps}, not from zero", key=f"0/sft-resumed/{step}", step=step)
        sft_n, why = sft_threads(cfg, task)
        # a preset trained by us is cached (keyed by settings, threads + code version); a user's checkpoint is not ours
        model, tok, hit, key, m = warmstart.warm_start(
            task, cfg.policy.preset or "", run.style, env, seeds, recipe, seed=cfg.seed,
            progress=progress_cb(run, 0, "setup"), model_tok=(model, tok) if cfg.policy.checkpoint else None,
            tensorboard_dir=run.run_dir / TENSORBOARD_DIR / "s0" / "sft",
            resume_dir=run.path("checkpoints", warmstart.RESUME_DIR),
            threads=sft_n, teacher_noise=cfg.warm_start.teacher_noise,
            cacheable=built_in(task))  # a family of one's own: its code is in no key, so its warm starts are not kept
        if hit is not None:
            run.event(0, "setup", "cache", f"warm start loaded from the cache: {hit} (same settings and code version; "
                      "`evotrainer cache clear` or EVOTRAINER_WARMSTART_CACHE=0 retrains)", path=str(hit))
        if m is not None:
            shown = sft_n if sft_n is not None else "the run's own"
            run.event(0, "setup", "threads", f"torch threads for the SFT warm start: {shown} ({why})")
            run.charge(0, "policy", "sft", seconds=m.wall_s, steps=m.steps)
    run.save(model, tok, out)
    if key and hit is None:
        try:
            entry = warmstart.store(key, out, {"run": run.id, "sft_examples": n, "sft_steps": recipe.sft_steps,
                                               "teacher_noise": cfg.warm_start.teacher_noise})
        except warmstart.CacheWriteError as exc:  # the run has its warm start; only a later run's reuse is lost
            entry = None
            run.event(0, "setup", "warning", f"{exc}; the run goes on (a later run with these settings trains its "
                      "own)", key="0/warmstart-not-cached")
        if entry:
            run.event(0, "setup", "cache", f"warm start cached at {entry} (a later run with the same settings loads "
                      "it; clear with `evotrainer cache clear`)", path=str(entry))
    return out, n


def pool_seeds(run: Run, seed_key: str, recipe, steps: int) -> list[int]:
    """The prefix of the keyed train pool that `steps` GRPO steps of `recipe` consume (`Recipe.prompts_per_step`)."""
    seeds = run.draw_seeds("train", run.config.stage.train_instances, key=seed_key)
    return seeds[: steps * recipe.prompts_per_step]


def prefetch_stage(run: Run, k: int, env, recipe) -> None:
    """While stage k's policy trains: start making the probe, target-probe (when the target is not the training mix),
    backtest and control-arm instances of stage k."""
    cfg = run.config
    target = run.judge.config(run.task)
    run.prefetch(env, run.draw_seeds("probe", cfg.stage.probe_n, key=f"s{k}/probe"))
    if target != env:  # else the diagnosis reuses the probe's rollouts (`harness.evaluation.target_probe`)
        run.prefetch(target, run.draw_seeds("probe", cfg.stage.probe_n, key=f"s{k}/target"))
    run.prefetch(target, run.draw_seeds("backtest", cfg.backtest.n, key=f"s{k}/backtest"))
    run.prefetch(env, pool_seeds(run, f"s{k}/arms", recipe, cfg.backtest.arm_steps))


def prefetch_arms(run: Run, k: int, main_files: dict[str, str], candidates: list[dict[str, str]]) -> None:
    """While the control arm trains: the candidates' own arm pools (an env candidate draws other instances) and the
    next stage's train pool (under the current env; wasted only if a promotion changes the env)."""
    for files in candidates:
        env, recipe, _ = harness_models(files, run.task)
        run.prefetch(env, pool_seeds(run, f"s{k}/arms", recipe, run.config.backtest.arm_steps))
    if k < run.config.budget.stages:
        env, recipe, _ = harness_models(main_files, run.task)
        run.prefetch(env, pool_seeds(run, f"s{k + 1}/train", recipe, recipe.steps))


def train_policy(run: Run, stage: int, arm: str, start: str, files: dict[str, str], steps: int, seed_key: str,
                 out: Path, seed: int) -> Trained:
    """One GRPO run from `start` under the harness `files` (`harness.backtest.train_arm`, the function every arm
    runs); saves to `out`; charges the ledger; keeps the training rollouts' rewards per scoring call
    (`rollouts/s<stage>-<arm>-train-rewards.jsonl.gz`, `Trained.rewards`: what a curriculum over levels reads)."""
    env, recipe, _ = harness_models(files, run.task)
    # a fixed prompt pool per key: both arms of a decision train on the same instances, whatever their recipe; only
    # the prefix GRPO consumes (steps x prompts per step) is generated, so a recipe that needs more prompts trains on a
    # superset of the other arm's; past the end of the pool, TRL cycles over it
    seeds = pool_seeds(run, seed_key, recipe, steps)
    model, tok = run.load(start)
    batches: list[RewardBatch] = []
    t0 = time.perf_counter()  # training compute = the whole TRL call (trainer setup + steps), not just train()
    trial = step_trial(lambda msg: run.event(stage, "train", "threads", msg))  # None unless a probe's choice waits
    m = train_arm(model, tok, run.task, files, steps, seeds, seed, style=run.style,
                  instances=run.instances(env, seeds), progress=progress_cb(run, stage, arm),
                  tensorboard_dir=run.run_dir / TENSORBOARD_DIR / f"s{stage}" / arm, record=batches,
                  callbacks=[trial] if trial is not None else None)
    secs = time.perf_counter() - t0
    run.save(model, tok, out)
    rewards = write_reward_batches(run.path("rollouts", f"s{stage}-{arm}-train-rewards.jsonl.gz"), batches)
    run.charge(stage, arm, "grpo", seconds=secs, tokens=m.tokens_generated, steps=len(m.steps))
    return Trained(checkpoint=str(out), steps=[s.model_dump() for s in m.steps], seconds=m.wall_s,
                   tokens=m.tokens_generated, rewards=str(rewards))


# --- backtest arms -----------------------------------------------------------------------------------------------------


PAIR_SEED_STRIDE = 7919  # seed offset between a stage's arm pairs (a prime, so pairs never share a seed with stages)


def arm_name(name: str, pair: int = 1) -> str:
    """The arm `name` ("control" or a candidate id) of the stage's `pair`-th arm pair: the first keeps the bare name
    (its checkpoint `s<k>-<name>`), a second one is `<name>-p2`."""
    return name if pair == 1 else f"{name}-p{pair}"


def _pair_key(key: str, pair: int) -> str:
    return key if pair == 1 else f"{key}/p{pair}"


def arm_job(run: Run, k: int, name: str, files: dict[str, str], start: str, steps: int, pair: int = 1):
    """Everything one arm needs (`harness.scale.ArmJob`). `pair` > 1: an arm of the stage's `pair`-th arm pair (same
    start, its own train prompts, arm seed and backtest instances: an independent replicate of the first pair)."""
    from harness.scale import ArmJob

    cfg = run.config
    env, recipe, _ = harness_models(files, run.task)
    # both arms train on the same train seeds; arm randomness is shared too (paired design)
    train_seeds = pool_seeds(run, _pair_key(f"s{k}/arms", pair), recipe, steps)
    # the first look's instances; later looks judge the saved arm on the next ones (`judge_more`)
    eval_seeds = backtest_seeds(run, k, pair)[: cfg.gate.plan(cfg.backtest.n).min_n]
    judge = run.judge
    offset = PAIR_SEED_STRIDE * (pair - 1)
    return ArmJob(name=name, task=run.task.name, style=run.style, files=files, start=start, steps=steps,
                  train_seeds=train_seeds, train_instances=run.instances(env, train_seeds),
                  seed=cfg.seed + 1000 + k + offset, judge=judge,
                  eval_instances=run.instances(judge.config(run.task), eval_seeds), sampling_seed=cfg.seed + k + offset,
                  backend=cfg.policy.backend)


def backtest_seeds(run: Run, k: int, pair: int = 1) -> list[int]:
    """Stage k's backtest instances for its `pair`-th arm pair (fresh seeds of the backtest split, `backtest.n` of
    them: the most one arm pair may be judged on), in the order the looks consume them."""
    return run.draw_seeds("backtest", run.config.backtest.n, key=_pair_key(f"s{k}/backtest", pair))


def judge_more(run: Run, k: int, name: str, ckpt: str, seeds: list[int], look: int, pair: int = 1) -> ArmEval:
    """A later look's batch: the saved arm `name` judged on `seeds` (the judge's distribution; sampling seed shared
    by every arm of this look, so the pair stays paired). Recorded (rollouts, ledger, node `arm:<name>:look<j>`) and
    read back on a resume."""
    node = f"arm:{name}:look{look}"
    samples = run.judge.per_instance
    if (r := run.result(k, ArmLook, node=node)) is not None:
        return ArmEval.from_rollouts(read_rollouts(Path(r.rollouts)), r.greedy, samples)
    cfg, judge = run.config, run.judge
    model, tok = run.policy(ckpt)
    ev = judge_arm(model, tok, run.task, run.instances(judge.config(run.task), seeds), judge,
                   sampling_seed=cfg.seed + k + 100_003 * look + PAIR_SEED_STRIDE * (pair - 1), style=run.style,
                   backend=cfg.policy.backend)
    path = write_rollouts(run.path("rollouts", f"s{k}-{name}-backtest-look{look}.jsonl.gz"), ev.rollouts)
    run.charge(k, name, "eval", seconds=ev.seconds, tokens=ev.tokens, label=f"backtest look {look}")
    run.save_result(k, ArmLook(rollouts=str(path), greedy=ev.greedy, n=len(seeds)), node=node)
    return ArmEval.from_rollouts(ev.rollouts, ev.greedy, samples)


def judge_carry_batch(run: Run, k: int, name: str, ckpt: str, seeds: list[int], batch: int) -> list[float]:
    """One batch of stage k's carry confirmation (`harness.decisions.confirm_carry`): checkpoint `ckpt` (`name`: the
    chosen arm, or `start`) decoded greedily on `seeds` of the judge's distribution. Recorded (ledger, node
    `carry:<name>:b<batch>`) and read back on a resume."""
    node = f"carry:{name}:b{batch}"
    if (r := run.result(k, CarryBatch, node=node)) is not None:
        return r.greedy
    model, tok = run.policy(ckpt)
    t0 = time.perf_counter()
    greedy, tokens = judge_greedy(model, tok, run.task, run.instances(run.judge.config(run.task), seeds), run.judge,
                                  run.style, run.config.policy.backend)
    run.charge(k, name, "eval", seconds=time.perf_counter() - t0, tokens=tokens, label=f"carry confirmation {batch}")
    run.save_result(k, CarryBatch(checkpoint=ckpt, greedy=greedy), node=node)
    return greedy


def record_arm(run: Run, k: int, name: str, out) -> ArmRecord:
    """What the run process writes for a finished arm (from either backend): ledger, rollouts, eval, node result."""
    m, ev = out.metrics, out.eval
    run.charge(k, name, "grpo", seconds=out.train_s, tokens=m.tokens_generated, steps=len(m.steps))
    path = write_rollouts(run.path("rollouts", f"s{k}-{name}-backtest.jsonl.gz"), ev.rollouts)
    run.charge(k, name, "eval", seconds=ev.seconds, tokens=ev.tokens, label="backtest")
    run.record_eval(k, name, "backtest", n=len(ev.rollouts), valid=ev.valid,
                    optimal=float(np.mean([x.optimal for x in ev.rollouts])))
    steps = [s.model_dump() for s in m.steps]
    r = ArmRecord(checkpoint=str(run.path("checkpoints", f"s{k}-{name}")), seconds=m.wall_s,
                  tokens=m.tokens_generated, rollouts=str(path), valid=ev.valid, greedy=ev.greedy, steps=len(steps),
                  curve=steps)
    run.save_result(k, r, node=f"arm:{name}")
    return r


def run_arms(run: Run, k: int, arms: list[tuple[str, dict[str, str]]], start: str,
             steps: int, pair: int = 1) -> dict[str, ArmRecord | Exception]:
    """Train and judge every arm of stage k's `pair`-th arm pair (control first; names as `arm_name` makes them) on
    the configured backend. Returns name -> its record, or the exception of an arm that failed (one arm's failure is
    its decision's, not the run's)."""
    out: dict[str, ArmRecord | Exception] = {}
    todo = []
    for name, files in arms:
        if (r := run.result(k, ArmRecord, node=f"arm:{name}")) is not None:
            out[name] = r
        else:
            todo.append((name, files))
    if todo and run.config.scale.backend == "ray":
        out.update(_ray_arms(run, k, todo, start, steps, pair))
    elif todo:
        out.update(_local_arms(run, k, todo, start, steps, pair))
    return out


def _local_arms(run: Run, k: int, todo: list[tuple[str, dict[str, str]]], start: str,
                steps: int, pair: int = 1) -> dict[str, ArmRecord | Exception]:
    from harness.scale import execute_arm

    out: dict[str, ArmRecord | Exception] = {}
    for name, files in todo:
        try:
            job = arm_job(run, k, name, files, start, steps, pair)
            ckpt = run.path("checkpoints", f"s{k}-{name}")
            model, tok = run.load(start)
            res = execute_arm(job, model, tok, lambda m, t, ckpt=ckpt: run.save(m, t, ckpt),
                              lambda ckpt=ckpt: run.policy(str(ckpt)), progress=progress_cb(run, k, name),
                              tensorboard_dir=run.run_dir / TENSORBOARD_DIR / f"s{k}" / name)
            out[name] = record_arm(run, k, name, res)
        except Exception as exc:  # noqa: BLE001 - one arm's failure is its decision's, not the run's
            stop_on_machine_fault(exc, f"arm {name} of stage {k}", str(run.run_dir))  # ... unless the machine's
            log.warning("arm %s of stage %d failed: %s", name, k, exc)
            out[name] = exc
    return out


def _ray_arms(run: Run, k: int, todo: list[tuple[str, dict[str, str]]], start: str,
              steps: int, pair: int = 1) -> dict[str, ArmRecord | Exception]:
    out: dict[str, ArmRecord | Exception] = {}
    jobs = []
    for name, files in todo:
        try:
            jobs.append(arm_job(run, k, name, files, start, steps, pair))
        except Exception as exc:  # noqa: BLE001 - an arm whose instances cannot be made fails its decision
            stop_on_machine_fault(exc, f"arm {name} of stage {k}", str(run.run_dir))
            out[name] = exc
    run.event(k, "backtest", "scale", f"{len(jobs)} arm(s) submitted to Ray: {', '.join(j.name for j in jobs)}")
    for name, res in run.ray().run_into(jobs, lambda n: run.path("checkpoints", f"s{k}-{n}", "x").parent,
                                        lambda n: run.path(TENSORBOARD_DIR, f"s{k}", n, "x").parent):
        if isinstance(res, Exception):
            stop_on_machine_fault(res, f"arm {name} of stage {k} (on Ray)", str(run.run_dir))
            out[name] = res
            run.event(k, "backtest", "scale", f"arm {name} failed on Ray: {cut(str(res), 300)}")
            continue
        out[name] = record_arm(run, k, name, res)
        run.event(k, "backtest", "scale", f"arm {name} came back from Ray (valid {res.eval.valid:.3f})")
    return out


def arm_eval(record: ArmRecord, samples: int) -> ArmEval:
    """A recorded arm's per-instance outcomes, read back from its backtest rollouts (the same after a resume)."""
    return ArmEval.from_rollouts(read_rollouts(Path(record.rollouts)), record.greedy, samples)


def judge_start(run: Run, k: int, ckpt: str, control: ArmEval) -> StartJudged:
    """Judge the stage's START policy `ckpt` on the backtest instances (same judge, sampling seed and instances as the
    arms: the TARGET) and compare the control arm with it (`harness.backtest.regression`). The control arm is the
    incumbent harness after the stage's training and `arm_steps` more, so this is the whole stage measured where it
    matters: the probe before it watched only the training mix. A control arm whose estimate is below its start is
    not carried into the next stage (the start is: `harness.results.continues_from`); below it beyond noise, the next
    stage's diagnosis also gets `grpo.policy_regressed`. Catches a recipe that collapses the policy only after more
    steps than one stage trains, and a mix wrong for the target that lowers it a little every stage."""
    if (r := run.result(k, StartJudged)) is not None:
        return r
    cfg, judge = run.config, run.judge
    model, tok = run.policy(ckpt)
    ev = judge_arm(model, tok, run.task, run.instances(judge.config(run.task), control.seeds), judge,
                   sampling_seed=cfg.seed + k, style=run.style, backend=cfg.policy.backend)
    run.charge(k, "start", "eval", seconds=ev.seconds, tokens=ev.tokens, label="backtest")
    run.record_eval(k, "start", "backtest", n=len(ev.rollouts), valid=ev.valid,
                    optimal=float(np.mean([x.optimal for x in ev.rollouts])))
    reg = regression(ev.outcomes, control.outcomes, cfg.gate, np.random.default_rng([cfg.seed, k, 7]),
                     clusters=ev.problems or None)
    rule = cfg.backtest.carry_greedy and bool(ev.greedy) and len(control.greedy) == len(ev.greedy)
    r = StartJudged(checkpoint=ckpt, n=len(control.seeds), valid=reg.before, control_valid=reg.after,
                    change=reg.change, change_ci=[reg.ci_low, reg.ci_high], control_regressed=reg.regressed,
                    outcomes=ev.outcomes, greedy=list(ev.greedy), greedy_rule=rule,
                    control_greedy_change=float(np.mean(control.greedy) - np.mean(ev.greedy)) if rule else None)
    if reg.regressed:
        run.event(k, "backtest", "regression",
                  f"the stage's training and the control arm ({cfg.backtest.arm_steps} more steps under the incumbent "
                  f"harness) LOWERED backtest valid by more than noise: {r.valid:.3f} -> {r.control_valid:.3f} (effect "
                  f"{reg.change:+.3f}, {100 * cfg.gate.confidence:.0f}% upper bound {reg.ci_high:+.3f} < 0, "
                  f"n={r.n}); unless a candidate is promoted the next stage starts from {Path(ckpt).name}, not from "
                  "the control arm, and its engineer gets the finding grpo.policy_regressed", key=f"{k}/control-regression")
    elif r.control_below:
        what = (f"estimate on the target is below the stage's start ({r.valid:.3f} -> {r.control_valid:.3f}, effect "
                f"{reg.change:+.3f} [{reg.ci_low:+.3f}, {reg.ci_high:+.3f}], n={r.n}; within noise)") if r.change < 0 \
            else (f"greedy estimate on the target is below the stage's start ({np.mean(r.greedy):.3f} -> "
                  f"{np.mean(r.greedy) + r.control_greedy_change:.3f}, n={r.n}; sampled {r.valid:.3f} -> "
                  f"{r.control_valid:.3f}; backtest.carry_greedy)")
        if cfg.stage.keep_training:  # a dip within noise is left to the carry reading against the anchor
            run.event(k, "backtest", "control_below",
                      f"the control arm's {what}: not a collapse, so the carry reading against the run's anchor on "
                      "fresh instances decides whether the stage's arm continues (stage.keep_training)",
                      key=f"{k}/control-below-start")
        else:
            run.event(k, "backtest", "not_carried",
                      f"the control arm's {what}: unless a candidate is promoted the next stage starts from "
                      f"{Path(ckpt).name}, not from the control arm (a checkpoint is carried only when the target's "
                      "estimate did not fall)", key=f"{k}/control-below-start")
    run.save_result(k, r)
    return r
