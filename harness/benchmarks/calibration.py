"""Calibration of the backtest + gate on the live loop's own code path: A/A false promotions, power on a planted
change, and the CPU cost of one decision.

    evotrainer bench calibration --mode aa --decisions 40          # every promotion is a false promotion
    evotrainer bench calibration --mode power --decisions 10       # every rejection is a miss
    python -m harness.benchmarks.calibration

Each decision is one `decision()`: two `harness.scale.ArmJob`s run by `harness.scale.execute_arm` (train, save,
reload, judge), the job and the function the live loop submits for its arms (`harness.arms`), and one call of
`harness.backtest.verdicts`, the loop's verdict function. The run config fixes the arm length, recipe, reward, judge
(backtest.env / samples / temperature, fixed as a run fixes it) and gate. The start checkpoint is the config's own SFT
warm start (the warm-start cache: the same checkpoint `make demo` trains or loads).

- `aa`: control and candidate are the SAME harness (the config's round 0); only training randomness differs (arm
  seeds 2d and 2d+1), and both are judged on the same fresh backtest seeds. Every promotion is a false one.
- `power`: a planted change with a known real benefit; the candidate is the config's round-0 harness, the control is
  a broken copy of it (paired design as in the loop: same arm seed). Every rejection is a miss. `--planted`:
  - `lr` (default): the control's learning rate is doubled (`PLANTED_LR_FACTOR`), the setting measured to collapse
    the tiny MAPF policy (BENCHMARKS.md): the fix the demo's loop finds.
  - `env`: the control trains only on boards the evaluation does not contain (`PLANTED_ENV`: 7x7 boards, which the
    warm start almost never solves, so its groups give no gradient and it stays at the start).

Prints grep-able `key: value` lines and one `decision:` line per decision; writes `calibration-<mode>.json` in `--out`.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import yaml

from harness.backtest import read_harness, verdicts
from harness.records import Verdict
from harness.scale import ArmJob, ArmOutput, execute_arm, policy_loader
from harness.seeds import check_split, seeds

TEMPLATE = Path(__file__).resolve().parents[2] / "sandbox" / "template"
ROOT = Path(__file__).resolve().parents[2]
PLANTED_ENV = {"sizes": [{"size": 7, "agents": 2, "hole_ratio": 0.2, "wait_ratio": 0.5}]}
PLANTED_LR_FACTOR = 2.0
DEFAULT_CONFIG = ROOT / "examples" / "mapf_backtest.yaml"


def template_files() -> dict[str, str]:
    """The starting harness as {path: text} (what `Workspace.files('main')` returns for a fresh run)."""
    return {str(p.relative_to(TEMPLATE)): p.read_text(encoding="utf-8") for p in sorted(TEMPLATE.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def round0_files(config) -> dict[str, str]:
    from harness.round0 import initial_files

    return {**template_files(), **initial_files(config)}


def start_checkpoint(config, out: Path, files: dict[str, str]) -> tuple[Path, bool]:
    """The config's SFT warm start (cached under $EVOTRAINER_HOME/warmstart, shared with runs of the same config);
    saved to `out/start`. Returns (path, loaded_from_cache)."""
    from harness import warmstart
    from harness.tasks import get_task
    from policies.model import save_policy

    task = get_task(config.task)
    env, recipe, _ = read_harness(files, task)
    if config.warm_start.sft_steps is not None:
        recipe = recipe.model_copy(update={"sft_steps": config.warm_start.sft_steps})

    def progress(stage: str, step: int, total: int, logs: dict) -> None:
        if step % 100 == 0 or step == total:
            print(f"start_sft_step: {step}/{total}  loss: {logs.get('loss', float('nan')):.3f}", flush=True)

    model, tok, hit, key, _ = warmstart.warm_start(task, config.policy.preset, config.style, env,
                                                   seeds("train", config.warm_start.sft_examples), recipe,
                                                   seed=config.seed, progress=progress)
    ckpt = out / "start"
    save_policy(model, tok, ckpt)
    if key and hit is None:
        warmstart.store(key, ckpt, {"bench": "calibration", "sft_steps": recipe.sft_steps})
    return ckpt, hit is not None


class Decision(NamedTuple):
    verdict: Verdict
    arms: dict[str, ArmOutput]  # control, candidate
    checkpoints: dict[str, Path]
    compute: dict[str, float]  # both arms: seconds (load + train + save + judging), tokens, steps


def decision(start: Path, control_files: dict[str, str], candidate_files: dict[str, str], task: Any, style: str,
             steps: int, train_seeds: list[int], eval_seeds: list[int], gate, judge, out: Path, candidate_id: str,
             arm_seeds: tuple[int, int] = (0, 0), backend: str = "transformers") -> Decision:
    """One decision as the loop makes it: a control and a candidate `ArmJob` from the same start checkpoint, the same
    training seeds and the same fresh backtest seeds (`eval_seeds`, drawn by the caller per decision), each run by
    `execute_arm` in this process, then `verdicts`."""
    from policies.model import load_policy, save_policy

    check_split(list(train_seeds), "train")  # before any compute is spent
    check_split(list(eval_seeds), "backtest")
    eval_instances = [task.generate(judge.config(task), s) for s in eval_seeds]
    arms: dict[str, ArmOutput] = {}
    ckpts: dict[str, Path] = {}
    evals, seconds = {}, 0.0
    for name, files, seed in (("control", control_files, arm_seeds[0]), ("candidate", candidate_files, arm_seeds[1])):
        env, recipe, _ = read_harness(files, task)
        used = list(train_seeds)[: steps * recipe.prompts_per_step]
        job = ArmJob(name=name, task=task.name, style=style, files=files, start=str(start), steps=steps,
                     train_seeds=used, train_instances=[task.generate(env, s) for s in used], seed=seed, judge=judge,
                     eval_instances=eval_instances, sampling_seed=int(eval_seeds[0]), backend=backend)
        ckpts[name] = Path(out) / name
        t0, saved = time.perf_counter(), [0.0]

        def save(m, t, path=ckpts[name], saved=saved) -> None:
            save_policy(m, t, path)
            saved[0] = time.perf_counter()

        model, tok = load_policy(start)
        arms[name] = execute_arm(job, model, tok, save, policy_loader(ckpts[name], backend))
        evals[name] = arms[name].eval
        seconds += saved[0] - t0 + arms[name].eval.seconds
    [verdict] = verdicts(evals["control"], control_files, [(candidate_id, candidate_files, evals["candidate"])], gate,
                         rng=lambda i: np.random.default_rng(0), samples=judge.samples)
    compute = {"seconds": seconds,
               "tokens": float(sum(a.metrics.tokens_generated + a.eval.tokens for a in arms.values())),
               "steps": float(sum(len(a.metrics.steps) for a in arms.values()))}
    return Decision(verdict, arms, ckpts, compute)


def run(config: str | Path = DEFAULT_CONFIG, decisions: int = 40, mode: str = "aa",
        out: str | Path = "runs/bench-calibration", threads: int = 2, arm_steps: int | None = None,
        n: int | None = None, first: int = 0, planted: str = "lr") -> dict[str, Any]:
    from harness.config import load_config
    from harness.round0 import make_judge
    from harness.tasks import get_task
    from policies import cpu_threads

    if mode not in ("aa", "power"):
        raise ValueError(f"mode {mode!r}: choose aa or power")
    if planted not in ("lr", "env"):
        raise ValueError(f"planted {planted!r}: choose lr or env")
    cpu_threads(threads)
    cfg = load_config(config)
    if arm_steps or n:
        cfg = cfg.model_copy(update={"backtest": cfg.backtest.model_copy(update={
            **({"arm_steps": arm_steps} if arm_steps else {}), **({"n": n} if n else {})})})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    task = get_task(cfg.task)
    files = round0_files(cfg)
    judge = make_judge(cfg, files)
    t0 = time.perf_counter()
    start, cached = start_checkpoint(cfg, out, files)
    print(f"start_checkpoint: {start}  from_cache: {cached}  setup_seconds: {time.perf_counter() - t0:.1f}",
          flush=True)
    control_files = files
    if mode == "power" and planted == "env":
        control_files = {**files, "env.yaml": "# planted: boards the evaluation does not contain\n"
                                              + yaml.safe_dump(PLANTED_ENV, sort_keys=False)}
    elif mode == "power":
        rec = yaml.safe_load(files["recipe.yaml"]) or {}
        rec["learning_rate"] = float(rec.get("learning_rate", 1e-4)) * PLANTED_LR_FACTOR
        control_files = {**files, "recipe.yaml": "# planted: a learning rate that collapses the policy\n"
                                                 + yaml.safe_dump(rec, sort_keys=False)}
    _, recipe, _ = read_harness(files, task)
    steps = cfg.backtest.arm_steps
    rows_per_arm = steps * recipe.prompts_per_step
    first_train = cfg.warm_start.sft_examples + 100_000  # beyond any warm-start demonstration
    rows: list[dict[str, Any]] = []
    hits = 0
    for d in range(first, first + decisions):
        train_seeds = seeds("train", rows_per_arm, start=first_train + d * rows_per_arm)
        eval_seeds = seeds("backtest", cfg.backtest.n, start=d * cfg.backtest.n)  # fresh held-out seeds per decision
        arm_seeds = (2 * d, 2 * d + 1) if mode == "aa" else (d, d)
        res = decision(start, control_files, files, task, cfg.style, steps, train_seeds, eval_seeds, cfg.gate, judge,
                       out / "arms" / f"d{d:03d}", candidate_id=f"{mode}-{d:03d}", arm_seeds=arm_seeds,
                       backend=cfg.policy.backend)
        shutil.rmtree(out / "arms" / f"d{d:03d}")  # arm checkpoints are not needed after the verdict
        v, ev = res.verdict, res.verdict.evidence
        hits += v.decision == "promoted"
        row = {"decision": d, "promoted": v.decision == "promoted", "control": ev.control, "candidate": ev.candidate,
               "greedy_control": ev.greedy_control, "greedy_candidate": ev.greedy_candidate, "effect": ev.effect,
               "ci_low": ev.ci_low, "ci_high": ev.ci_high, "mde": ev.mde, "n": ev.n,
               "seconds": res.compute["seconds"], "tokens": res.compute["tokens"], "reason": v.reason}
        rows.append(row)
        print(f"decision: {d}  promoted: {row['promoted']}  control: {ev.control:.3f}  candidate: {ev.candidate:.3f}  "
              f"effect: {ev.effect:+.3f}  ci_low: {ev.ci_low:+.3f}  mde: {ev.mde:+.3f}  "
              f"greedy: {ev.greedy_control:.3f}->{ev.greedy_candidate:.3f}  seconds: {row['seconds']:.1f}", flush=True)
    from harness.benchmarks.ladder import wilson

    lo, hi = wilson(hits, decisions)
    k = len(rows) or 1
    summary = {"mode": mode, "planted": planted if mode == "power" else None, "first": first, "config": str(config), "decisions": decisions, "promotions": hits,
               "promotion_rate": hits / max(1, decisions), "promotion_rate_ci95": f"[{lo:.3f}, {hi:.3f}]",
               "arm_steps": steps, "eval_n": cfg.backtest.n, "samples": judge.samples,
               "judge_temperature": judge.temperature, "confidence": cfg.gate.confidence,
               "min_effect": cfg.gate.min_effect, "slice_tolerance": cfg.gate.slice_tolerance,
               "mean_control": sum(r["control"] for r in rows) / k,
               "mean_effect": sum(r["effect"] for r in rows) / k,
               "mean_abs_effect": sum(abs(r["effect"]) for r in rows) / k,
               "mean_mde": sum(r["mde"] for r in rows) / k,
               "seconds_per_decision": sum(r["seconds"] for r in rows) / k,
               "seconds_total": time.perf_counter() - t0, "threads": threads}
    (out / f"calibration-{mode}-{first}.json").write_text(json.dumps({"summary": summary, "decisions": rows}, indent=1))
    for key, val in summary.items():
        print(f"{key}: {val:.4f}" if isinstance(val, float) else f"{key}: {val}", flush=True)
    return summary


if __name__ == "__main__":
    run()
