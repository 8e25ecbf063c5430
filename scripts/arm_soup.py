"""Do a stage's arms, averaged, train the policy more than its control arm alone? (BENCHMARKS.md, sixty-ninth session)

A stage trains a control arm and candidate arms from one checkpoint and keeps one of them; the others' compute is
thrown away. Weight averaging of models fine-tuned from one start ("model soups": Wortsman et al., ICML 2022; for
RL-tuned policies, "WARP": Rame et al., 2024) would put that compute into the delivered policy. This measures it on
real GRPO arms: from each --start checkpoint, three control arms (the incumbent recipe, three seeds), two candidate
arms (temperature 1.5, groups of 4: what the rule engineer proposes on a dead-groups diagnosis) and one control arm
trained three times as long; then the uniform soups (of the three controls; of the control and both candidates; of
the control and one candidate), the sums of their task vectors (start + sum of deltas: Ilharco et al., "Editing models
with task arithmetic", ICLR 2023), and greedy valid on the same --n target instances for each.

    python scripts/arm_soup.py --task code --env target.yaml --start ckpt1 --start ckpt2 --out DIR [--recipe r.yaml]

The recipe (YAML, `policies.train.Recipe` fields) is the control's; the arms train `--steps` GRPO steps each.
Writes DIR/results.json (per start, per checkpoint: 0/1 per instance) and prints the means and paired differences.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np


def _combine(start: str, arms: list[str], weight: float, out: Path, around_start: bool) -> str:
    """start + weight * sum(arm - start) when `around_start`, else the uniform average of the arms."""
    from policies.model import load_policy, save_policy

    base = load_policy(start)[0].state_dict()
    sds = [load_policy(a)[0].state_dict() for a in arms]
    model, tok = load_policy(start)
    new = {}
    for k, v in base.items():
        if not v.is_floating_point():
            new[k] = v
        elif around_start:
            new[k] = (v.float() + weight * sum(sd[k].float() - v.float() for sd in sds)).to(v.dtype)
        else:
            new[k] = (sum(sd[k].float() for sd in sds) / len(sds)).to(v.dtype)
    model.load_state_dict(new)
    save_policy(model, tok, out)
    shutil.copy(Path(start) / "evotrainer.json", out / "evotrainer.json")
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="code")
    ap.add_argument("--env", required=True, help="the target generator config (YAML): training mix and test set")
    ap.add_argument("--start", action="append", required=True, help="a checkpoint the arms start from (repeat)")
    ap.add_argument("--recipe", help="the control's recipe YAML (default: groups of 2, temperature 1.0, lr 1e-4)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from policies import cpu_threads

    cpu_threads(2)
    from harness.policy_glue import checkpoint_style, train_policy
    from harness.tasks import get_task, score_all
    from harness.tasks.suites import draw_env
    from policies.model import load_policy
    from policies.rollout import SamplingParams, generate
    from policies.train import Recipe
    from sandbox.yamlload import load_yaml

    t = get_task(a.task)
    data = load_yaml(Path(a.env))
    env = t.spec.config_model.model_validate(data)
    insts = [i for _, i in draw_env(t, data, a.n)]
    control = {"batch_size": 64, "num_generations": 2, "temperature": 1.0, "learning_rate": 1e-4, "beta": 0.0,
                   "warmup_ratio": 0.05, "lr_schedule": "constant", "max_completion_length": 40}
    if a.recipe:
        control.update(load_yaml(Path(a.recipe)) or {})
    arms = {"ctl_a": {"seed": 11}, "ctl_b": {"seed": 12}, "ctl_c": {"seed": 13},
            "t15": {"temperature": 1.5, "seed": 12}, "ng4": {"num_generations": 4, "seed": 13}}

    def score(path: str) -> list[int]:
        model, tok = load_policy(path)
        style = checkpoint_style(t, path, tok)
        res = generate(model, tok, [t.prompt(i, style) for i in insts],
                       SamplingParams(temperature=0.0, max_new_tokens=control["max_completion_length"], batch_size=64))
        out = [0] * len(insts)
        for k, o in enumerate(score_all(t, [(insts[i], c) for i, c in zip(res.prompt_index, res.completions,
                                                                           strict=True)], None)):
            out[res.prompt_index[k]] = int(o.valid)
        return out

    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, list[int]]] = {}
    for s, start in enumerate(a.start):
        d = root / f"start{s}"
        ck = {"start": start}
        for name, kw in [*arms.items(), ("ctl_x3", {"seed": 11, "steps": 3 * a.steps})]:
            p = d / name
            steps = kw.pop("steps", a.steps)
            if not (p / "config.json").exists():
                train_policy(t, str(p), init=start, config=env, sft_examples=0, grpo_steps=steps,
                             recipe=Recipe(**{**control, **kw, "steps": steps}))
            ck[name] = str(p)
        for name, members, w, around in [("soup_controls", ["ctl_a", "ctl_b", "ctl_c"], 0, False),
                                         ("soup_arms", ["ctl_a", "t15", "ng4"], 0, False),
                                         ("soup_two", ["ctl_a", "t15"], 0, False),
                                         ("sum_controls", ["ctl_a", "ctl_b", "ctl_c"], 1.0, True),
                                         ("sum_arms", ["ctl_a", "t15", "ng4"], 1.0, True)]:
            ck[name] = _combine(start, [ck[m] for m in members], w, d / name, around)
        results[start] = {k: score(v) for k, v in ck.items()}
        print(start, {k: round(100 * float(np.mean(v)), 1) for k, v in results[start].items()}, flush=True)
        (root / "results.json").write_text(json.dumps(results))
    controls = ["ctl_a", "ctl_b", "ctl_c"]
    for k in ["soup_controls", "soup_arms", "soup_two", "sum_controls", "sum_arms", "ctl_x3"]:
        diffs = [100 * float(np.mean(np.array(v[k]) - np.mean([np.array(v[c]) for c in controls], axis=0)))
                 for v in results.values()]
        print(f"{k} minus the mean single control arm, per start: {[round(x, 1) for x in diffs]}; mean "
              f"{np.mean(diffs):+.2f} (sd {np.std(diffs, ddof=1) if len(diffs) > 1 else 0:.2f}, {len(diffs)} starts)")


if __name__ == "__main__":
    main()
