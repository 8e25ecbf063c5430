"""How the stage rolls a policy out: on probe seeds (the diagnosis's rollouts), on the target, and on the held-out
report suite.

    rollouts, seconds, tokens = rollouts(run, ckpt, seeds, env, samples=4, temperature=0.5, shaping=shaping)
    target = target_probe(run, k, ckpt)   # the judge's distribution on fresh probe seeds, cached per stage
    report_eval(run, k, ckpt)     # test split: valid / optimal per slice, reported, never used to decide

Backtest arms are judged elsewhere (`harness.backtest.judge_arm`, through the arm job).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from harness.records import Rollout, problem_label, read_rollouts, write_rollouts
from harness.round0 import harness_models
from harness.run import Run


def max_new_tokens(run: Run) -> int:
    """The completion budget of the incumbent recipe (harness@main)."""
    return int(harness_models(run.workspace().files("main"), run.task)[1].max_completion_length)


def rollouts(run: Run, ckpt: str, seeds: list[int], env, samples: int, temperature: float,
             shaping=None, max_tokens: int | None = None) -> tuple[list[Rollout], float, int]:
    """`samples` completions per instance of `env` at `seeds` (`max_tokens` each, default the incumbent recipe's
    budget); returns (rollouts, seconds, new tokens)."""
    from harness.policy_glue import evaluate
    from policies.rollout import SamplingParams

    instances = run.instances(env, seeds)
    model, tok = run.policy(ckpt)
    params = SamplingParams(temperature=temperature, n=samples, max_new_tokens=max_tokens or max_new_tokens(run),
                            seed=run.config.seed, backend=run.config.policy.backend)
    t0 = time.perf_counter()  # evaluation compute = generation + scoring
    rep = evaluate(model, tok, run.task, instances, run.style, params=params, shaping=shaping)
    return rep.rollouts, time.perf_counter() - t0, rep.new_tokens


def target_path(run: Run, k: int):
    return run.path("rollouts", f"s{k}-target.jsonl.gz")


def target_probe(run: Run, k: int, ckpt: str, probe: tuple[str, Path] | None = None) -> list[Rollout]:
    """Stage k's start checkpoint `ckpt` on the TARGET (the judge's distribution, fixed at run start), on fresh probe
    seeds (`stage.probe_n` x `stage.probe_samples`, at the judge's temperature and completion budget, scored under
    the incumbent shaping): what the diagnosis compares with the training mix. When the probe (`probe`: its checkpoint
    and rollouts file) already rolled this checkpoint out on the same distribution with the same sampling (the
    default while env.yaml is the round-0 target), its rollouts are the target's and nothing is generated again.

    Cached in `rollouts/s<k>-target.jsonl.gz`, charged to the ledger (label `target-probe`) and recorded as evaluation
    rows (arm `target`, split `probe`, overall and per slice). Idempotent: the seed draw is keyed, the ledger and
    evaluation rows are upserts, and the rollouts file is written last (atomically), so once it exists a re-entered
    node reads it back."""
    path = target_path(run, k)
    if path.is_file():
        return read_rollouts(path)
    cfg, judge, task = run.config, run.judge, run.task
    env, recipe, shaping = harness_models(run.workspace().files("main"), task)
    target = judge.config(task)
    if (probe is not None and probe[0] == ckpt and target == env and judge.temperature == recipe.temperature
            and judge.max_new_tokens == recipe.max_completion_length):
        out = read_rollouts(probe[1])
    else:
        seeds = run.draw_seeds("probe", cfg.stage.probe_n, key=f"s{k}/target")
        out, secs, toks = rollouts(run, ckpt, seeds, target, cfg.stage.probe_samples, judge.temperature, shaping,
                                   max_tokens=judge.max_new_tokens)
        run.charge(k, "policy", "rollout", seconds=secs, tokens=toks, label="target-probe")
    from harness.diagnostics import slice_keys_of, slice_stats

    n = len(out)
    run.record_eval(k, "target", "probe", n=n, valid=sum(r.valid for r in out) / n,
                    optimal=sum(r.optimal for r in out) / n)
    for key in slice_keys_of(out):
        for name, st in slice_stats(out, key).items():
            run.record_eval(k, "target", "probe", n=int(st["n"]), valid=st["valid"], optimal=st["optimal"],
                            slice_key=key, slice_value=name.split("=", 1)[1])
    write_rollouts(path, out)
    return out


def previous_target(run: Run, k: int) -> list[Rollout] | None:
    """The previous stage's target rollouts when cached (None at stage 1, or when that stage's file is gone)."""
    path = run.run_dir / "rollouts" / f"s{k - 1}-target.jsonl.gz"
    return read_rollouts(path) if k > 1 and path.is_file() else None


def report_eval(run: Run, k: int, ckpt: str) -> None:
    """Held-out (test split) valid/optimal per slice of the stage's policy: reported, never used to decide. Scored with
    the judge's completion budget (fixed at run start), not the incumbent recipe's: a run that promotes a longer or
    shorter `max_completion_length` changes how it trains, not how its test set is scored."""
    if not run.config.eval.enabled:
        return
    from harness import evalcache
    from harness.policy_glue import evaluate
    from harness.tasks.drawn import built_in
    from policies.rollout import SamplingParams, resolve_backend

    insts = run.suite()
    ckey = evalcache.key_of(ckpt, task=run.config.task, style=run.style, suite=run.config.eval.name,
                           seeds=[i.seed for i in insts], max_new_tokens=run.judge.max_new_tokens,
                           backend=resolve_backend(run.config.policy.backend)
                           ) if built_in(run.task) else None  # a family of one's own: its scorer is in no key
    if (hit := evalcache.lookup(ckey)) is not None:  # these weights were read on this test set before: not again
        rep, per = hit
        run.event(k, "report", "cache", f"held-out reading of {Path(ckpt).name} reused: the same weights were "
                  f"scored on this test set before (valid {rep.valid:.3f}; `evotrainer cache clear` drops it)",
                  key=f"{k}/test-cache")
    else:
        model, tok = run.policy(ckpt)
        t0 = time.perf_counter()
        rep = evaluate(model, tok, run.task, insts, run.style,
                       params=SamplingParams(temperature=0.0, max_new_tokens=run.judge.max_new_tokens, batch_size=64,
                                             backend=run.config.policy.backend))
        run.charge(k, "policy", "eval", seconds=time.perf_counter() - t0, tokens=rep.new_tokens, label="test")
        per = [0.0] * len(insts)
        for r in rep.rollouts:
            per[r.group] = float(r.valid)
        evalcache.store(ckey, rep, per, {"run": run.id, "stage": k})
    run.record_eval(k, "policy", "test", n=rep.n, valid=rep.valid, optimal=rep.optimal)
    # per-instance outcomes (same suite instances every stage): the report's paired stage-to-stage comparison
    out = run.path("stages", f"s{k}", "test.json")
    # each instance's problem (`problem_label`, as the gate counts copies of one): the report's clusters
    out.write_text(json.dumps({"checkpoint": ckpt, "suite": run.config.eval.name, "seeds": [i.seed for i in insts],
                               "valid": per, "problems": [problem_label(run.task.prompt(i, run.style))
                                                          for i in insts]}))
    for key, vals in rep.by_slice.items():
        for val, st in vals.items():
            run.record_eval(k, "policy", "test", n=st.n, valid=st.valid, optimal=st.optimal, slice_key=key,
                            slice_value=val)
