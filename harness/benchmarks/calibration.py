"""A/A calibration of the online backtest and the promotion gate: how often does the gate promote a candidate that is
IDENTICAL to the control?

    evotrainer bench calibration                         # or: .venv/bin/python -m harness.benchmarks.calibration
    evotrainer bench calibration --decisions 40 --steps 2 --eval-n 64

Each decision is a full online backtest (`harness.backtest.backtest`): from one start checkpoint (a tiny policy after
an expert SFT warm start, built once and cached in `--out`), a control arm and a candidate arm train a few GRPO steps
under the SAME harness (the sandbox template: sizes 3-5, 2 agents) on the same training seeds, but with different arm seeds (different
data order and sampling: training randomness is the only difference); both are evaluated on the same fresh backtest
seeds (new ones for every decision, drawn from the template's env config) and judged by the default `GateConfig`. Every promotion is a false promotion.
Prints grep-able `key: value` lines (`false_promotion_rate:`), one `decision:` line per decision, and writes
`calibration.json` in `--out`.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from harness.backtest import ArmBudget, GateConfig, backtest
from harness.seeds import seeds

TEMPLATE = Path(__file__).resolve().parents[2] / "sandbox" / "template"


def template_files() -> dict[str, str]:
    """The starting harness as {path: text} (what `Workspace.files('main')` returns for a fresh run)."""
    return {str(p.relative_to(TEMPLATE)): p.read_text(encoding="utf-8") for p in sorted(TEMPLATE.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def start_checkpoint(task: Any, out: Path, config: Any, sft_examples: int, sft_steps: int) -> Path:
    """A tiny policy after an expert SFT warm start on `config` (cached: reused when `out/start` exists)."""
    from harness.policy_glue import train_policy
    from policies.train import Recipe

    ckpt = out / "start"
    if (ckpt / "config.json").exists():
        return ckpt
    def progress(stage: str, step: int, total: int, logs: dict) -> None:
        if step % 25 == 0 or step == total:
            print(f"start_sft_step: {step}/{total}  loss: {logs.get('loss', float('nan')):.3f}", flush=True)

    train_policy(task, str(ckpt), preset="tiny", config=config, sft_examples=sft_examples, grpo_steps=0,
                 recipe=Recipe(sft_steps=sft_steps), progress=progress)
    return ckpt


def run(decisions: int = 40, steps: int = 2, eval_n: int = 64, out: str | Path = "runs/bench-calibration",
        sft_examples: int = 1000, sft_steps: int = 200, task_name: str = "mapf", threads: int = 2,
        gate: GateConfig | None = None) -> dict[str, Any]:
    import torch

    from harness.tasks import get_task
    from policies.train import Recipe

    torch.set_num_threads(threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    task = get_task(task_name)
    gate = gate or GateConfig()
    files = template_files()
    t0 = time.perf_counter()
    import yaml

    env = task.config_model.model_validate(yaml.safe_load(files["env.yaml"]))  # the run's starting distribution
    start = start_checkpoint(task, out, env, sft_examples, sft_steps)
    setup_s = time.perf_counter() - t0
    print(f"start_checkpoint: {start}  setup_seconds: {setup_s:.1f}", flush=True)

    rec = {k: v for k, v in (yaml.safe_load(files["recipe.yaml"]) or {}).items() if k != "reward"}
    recipe = Recipe.model_validate(rec)
    rows_per_arm = steps * recipe.batch_size // recipe.num_generations
    rows: list[dict[str, Any]] = []
    promoted = 0
    for d in range(decisions):
        train_seeds = seeds("train", rows_per_arm, start=sft_examples + d * rows_per_arm)
        eval_seeds = seeds("backtest", eval_n, start=d * eval_n)  # fresh held-out seeds for every decision
        res = backtest(start, files, files, task, ArmBudget(steps=steps), train_seeds, eval_seeds, gate,
                       out / "arms" / f"d{d:03d}", candidate_id=f"aa-{d:03d}", eval_config=env,
                       arm_seeds=(2 * d, 2 * d + 1))
        shutil.rmtree(out / "arms" / f"d{d:03d}")  # arm checkpoints are not needed after the verdict
        v = res.verdict
        ev = v.evidence
        promoted += v.decision == "promoted"
        row = {"decision": d, "promoted": v.decision == "promoted", "control": ev.control, "candidate": ev.candidate,
               "effect": ev.effect, "ci_low": ev.ci_low, "ci_high": ev.ci_high, "n": ev.n,
               "seconds": res.compute["seconds"], "tokens": res.compute["tokens"], "reason": v.reason}
        rows.append(row)
        print(f"decision: {d}  promoted: {row['promoted']}  control: {ev.control:.3f}  candidate: {ev.candidate:.3f}  "
              f"effect: {ev.effect:+.3f}  ci_low: {ev.ci_low:+.3f}  seconds: {row['seconds']:.1f}", flush=True)
    total = time.perf_counter() - t0
    summary = {"decisions": decisions, "false_promotions": promoted,
               "false_promotion_rate": promoted / max(1, decisions), "steps_per_arm": steps, "eval_n": eval_n,
               "confidence": gate.confidence, "min_effect": gate.min_effect, "slice_tolerance": gate.slice_tolerance,
               "mean_valid": sum(r["control"] for r in rows) / max(1, len(rows)),
               "mean_abs_effect": sum(abs(r["effect"]) for r in rows) / max(1, len(rows)),
               "seconds_per_decision": sum(r["seconds"] for r in rows) / max(1, len(rows)), "seconds_total": total}
    (out / "calibration.json").write_text(json.dumps({"summary": summary, "decisions": rows}, indent=1))
    for k, v in summary.items():
        print(f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}")
    return summary


if __name__ == "__main__":
    run()
