"""How the stage rolls a policy out: on probe seeds (the diagnosis's rollouts) and on the held-out report suite.

    rollouts, seconds, tokens = rollouts(run, ckpt, seeds, env, samples=4, temperature=0.5, shaping=shaping)
    report_eval(run, k, ckpt)     # test split: valid / optimal per slice, reported, never used to decide

Backtest arms are judged elsewhere (`harness.backtest.judge_arm`, through the arm job).
"""

from __future__ import annotations

import json
import time

from harness.records import Rollout
from harness.round0 import harness_models
from harness.run import Run


def max_new_tokens(run: Run) -> int:
    """The completion budget of the incumbent recipe (harness@main)."""
    return int(harness_models(run.workspace().files("main"), run.task)[1].max_completion_length)


def rollouts(run: Run, ckpt: str, seeds: list[int], env, samples: int, temperature: float,
             shaping=None) -> tuple[list[Rollout], float, int]:
    """`samples` completions per instance of `env` at `seeds`; returns (rollouts, seconds, new tokens)."""
    from harness.policy_glue import evaluate
    from policies.rollout import SamplingParams

    instances = run.instances(env, seeds)
    model, tok = run.policy(ckpt)
    params = SamplingParams(temperature=temperature, n=samples, max_new_tokens=max_new_tokens(run),
                            seed=run.config.seed, backend=run.config.policy.backend)
    t0 = time.perf_counter()  # evaluation compute = generation + scoring
    rep = evaluate(model, tok, run.task, instances, run.style, params=params, shaping=shaping)
    return rep.rollouts, time.perf_counter() - t0, rep.new_tokens


def report_eval(run: Run, k: int, ckpt: str) -> None:
    """Held-out (test split) valid/optimal per slice of the stage's policy: reported, never used to decide."""
    if not run.config.eval.suite:
        return
    from harness.policy_glue import evaluate
    from policies.rollout import SamplingParams

    insts = run.suite()
    if run.config.eval.limit:
        insts = insts[: run.config.eval.limit]
    model, tok = run.policy(ckpt)
    t0 = time.perf_counter()
    rep = evaluate(model, tok, run.task, insts, run.style,
                   params=SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens(run), batch_size=64,
                                         backend=run.config.policy.backend))
    run.charge(k, "policy", "eval", seconds=time.perf_counter() - t0, tokens=rep.new_tokens, label="test")
    run.record_eval(k, "policy", "test", n=rep.n, valid=rep.valid, optimal=rep.optimal)
    per = [0.0] * len(insts)
    for r in rep.rollouts:
        per[r.group] = float(r.valid)
    # per-instance outcomes (same suite instances every stage): the report's paired stage-to-stage comparison
    out = run.path("stages", f"s{k}", "test.json")
    out.write_text(json.dumps({"checkpoint": ckpt, "seeds": [i.seed for i in insts], "valid": per}))
    for key, vals in rep.by_slice.items():
        for val, st in vals.items():
            run.record_eval(k, "policy", "test", n=st.n, valid=st.valid, optimal=st.optimal, slice_key=key,
                            slice_value=val)
