"""Calibration of the backtest + gate on the live loop's own code path: A/A false promotions, power on a planted
change, and the CPU cost of one decision.

    evotrainer bench calibration --mode aa --decisions 40          # every promotion is a false promotion
    evotrainer bench calibration --mode power --decisions 10       # every rejection is a miss
    python -m harness.benchmarks.calibration

Each decision is judged by BOTH procedures on the same arms, side by side:
- **sequential** (the live loop's, `walk`): looks at `gate.plan(backtest.n).schedule()` prefixes of an arm pair,
  stopping when the decision is clear; a look that asks for a new pair trains one (new arm, training and backtest
  seeds) and pools the earlier pairs' evidence, as the loop's re-test of an inconclusive change does, up to
  `gate.max_pairs` pairs. Its cost: the pairs it trained plus the judging of the instances its looks used.
- **fixed**: the first pair, one look at all `backtest.n` instances (the gate before the sequential procedure: one
  arm pair, one test at the gate's confidence; what the issue's "95 CPU-seconds per decision" paid).
Every pair is two `harness.scale.ArmJob`s run by `harness.scale.execute_arm` (train, save, reload, judge), the job
and the function the live loop submits for its arms (`harness.arms`); every look is one call of
`harness.backtest.verdicts`, the loop's verdict function. The run config fixes the arm length, recipe, reward, judge
(backtest.env / samples / temperature, fixed as a run fixes it) and gate. The start checkpoint is the config's own SFT
warm start (the warm-start cache: the default config's is the demo's warm start until the forty-eighth session,
expert demonstrations only, on which every calibration figure in BENCHMARKS.md was measured).

- `aa`: control and candidate are the SAME harness (the config's round 0); only training randomness differs (arm
  seeds 2q and 2q+1 for the q-th pair of the benchmark), and both are judged on the same fresh backtest seeds.
  Every promotion is a false one. `--planted env` makes the candidate an env change that changes nothing (the same
  env.yaml, written again under a comment), so the walk treats it as an env change and the learning-signal route
  (`gate.learning_signal`) is on trial too: its false promotions count with the target's.
- `power`: a planted change with a known real benefit; the candidate is the config's round-0 harness, the control is
  a broken copy of it (paired design as in the loop: same arm seed). Every rejection is a miss. `--planted`:
  - `lr` (default): the control's learning rate is doubled (`PLANTED_LR_FACTOR`), the setting measured to collapse
    the tiny MAPF policy (BENCHMARKS.md): the kind of fix the demo's loop finds.
  - `env`: the control trains only on boards the evaluation does not contain (`PLANTED_ENV`: 7x7 boards, which the
    warm start almost never solves, so its groups give no gradient and it stays at the start).

Prints grep-able `key: value` lines, one `pair:` line per arm pair and one `decision:` line per decision; writes
`calibration-<mode>-<first>.json` in `--out`. `python -m harness.benchmarks.calibration merge A.json B.json` sums
runs split with `--first` (rates with Wilson intervals, seconds per decision of both procedures, their ratio, the
arm-training noise implied by the A/A pairs' full-n effects); `... replay --futility 0.05 A.json B.json` (also
`--learning-signal`, `--learning-signal-arm-sd`) judges the
recorded arm pairs again under another gate setting, with no training (`replay`); `... replay-runs --futility 0.05
RUN_DIR ...` judges the recorded decisions of live runs (their run.db and config.yaml) again under another
`gate.futility`: the tests it stops, the pooled re-tests it saves, the promotions it loses (`replay_runs`).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import yaml

from harness.backtest import finished_shares, judge_fingerprint, prior_pairs, read_harness, verdicts
from harness.decisions import finished_reading, signal_lift, signal_verdict
from harness.records import Verdict
from harness.round0 import round0_files
from harness.scale import ArmJob, ArmOutput, execute_arm, policy_loader
from harness.seeds import check_split, seeds

ROOT = Path(__file__).resolve().parents[2]
PLANTED_ENV = {"sizes": [{"size": 7, "agents": 2, "hole_ratio": 0.2, "wait_ratio": 0.5}]}
PLANTED_LR_FACTOR = 2.0
DEFAULT_CONFIG = ROOT / "examples" / "mapf_backtest.yaml"


def start_checkpoint(config, out: Path, files: dict[str, str]) -> tuple[Path, bool]:
    """The config's SFT warm start (cached under $EVOTRAINER_HOME/warmstart, shared with runs of the same config);
    saved to `out/start`; or the config's `policy.checkpoint` itself when it names one. Returns (path,
    loaded_from_cache)."""
    from harness import warmstart
    from harness.tasks import get_task
    from policies.model import save_policy

    if config.policy.checkpoint:  # a checkpoint of one's own (a scenario's warm start, a user's model): no SFT
        print(f"start: the config's policy.checkpoint {config.policy.checkpoint}", flush=True)
        return Path(config.policy.checkpoint), False
    task = get_task(config.task)
    env, recipe, _ = read_harness(files, task)
    if config.warm_start.sft_steps is not None:
        recipe = recipe.model_copy(update={"sft_steps": config.warm_start.sft_steps})

    def progress(stage: str, step: int, total: int, logs: dict) -> None:
        if step % 100 == 0 or step == total:
            print(f"start_sft_step: {step}/{total}  loss: {logs.get('loss', float('nan')):.3f}", flush=True)

    model, tok, hit, key, _ = warmstart.warm_start(task, config.policy.preset, config.style, env,
                                                   seeds("train", config.warm_start.sft_examples), recipe,
                                                   seed=config.seed, progress=progress,
                                                   teacher_noise=config.warm_start.teacher_noise)
    ckpt = out / "start"
    save_policy(model, tok, ckpt)
    if key and hit is None:
        try:
            warmstart.store(key, ckpt, {"bench": "calibration", "sft_steps": recipe.sft_steps})
        except warmstart.CacheWriteError as exc:  # the benchmark has its warm start: only its reuse is lost
            print(f"warning: {exc}", flush=True)
    return ckpt, hit is not None


class Decision(NamedTuple):
    verdict: Verdict
    arms: dict[str, ArmOutput]  # control, candidate
    checkpoints: dict[str, Path]
    compute: dict[str, float]  # both arms: seconds (load + train + save + judging), tokens, steps


class Pair(NamedTuple):
    arms: dict[str, ArmOutput]  # control, candidate
    checkpoints: dict[str, Path]
    train_seconds: float  # both arms: load + train + save
    judge_seconds: float  # both arms, on every eval instance
    tokens: float
    steps: float


def train_pair(start: Path, control_files: dict[str, str], candidate_files: dict[str, str], task: Any, style: str,
               steps: int, train_seeds: list[int], eval_seeds: list[int], judge, out: Path,
               arm_seeds: tuple[int, int] = (0, 0), backend: str = "transformers") -> Pair:
    """One arm pair as the loop trains it: a control and a candidate `ArmJob` from the same start checkpoint, the same
    training seeds and the same fresh backtest seeds (`eval_seeds`, drawn by the caller), each run by `execute_arm`
    in this process (train, save, reload, judge)."""
    from policies.model import load_policy, save_policy

    check_split(list(train_seeds), "train")  # before any compute is spent
    check_split(list(eval_seeds), "backtest")
    eval_instances = [task.generate(judge.config(task), s) for s in eval_seeds]
    arms: dict[str, ArmOutput] = {}
    ckpts: dict[str, Path] = {}
    train_s = judge_s = 0.0
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
        train_s += saved[0] - t0
        judge_s += arms[name].eval.seconds
    return Pair(arms, ckpts, train_s, judge_s,
                float(sum(a.metrics.tokens_generated + a.eval.tokens for a in arms.values())),
                float(sum(len(a.metrics.steps) for a in arms.values())))


def decision(start: Path, control_files: dict[str, str], candidate_files: dict[str, str], task: Any, style: str,
             steps: int, train_seeds: list[int], eval_seeds: list[int], gate, judge, out: Path, candidate_id: str,
             arm_seeds: tuple[int, int] = (0, 0), backend: str = "transformers") -> Decision:
    """One arm pair (`train_pair`) judged at one look on all of `eval_seeds` by `verdicts`, the loop's verdict
    function (the gate's plan at that n)."""
    pair = train_pair(start, control_files, candidate_files, task, style, steps, train_seeds, eval_seeds, judge, out,
                      arm_seeds, backend)
    evals = {name: a.eval for name, a in pair.arms.items()}
    [verdict] = verdicts(evals["control"], control_files, [(candidate_id, candidate_files, evals["candidate"])], gate,
                         rng=lambda i: np.random.default_rng(0), samples=judge.per_instance)
    compute = {"seconds": pair.train_seconds + pair.judge_seconds, "tokens": pair.tokens, "steps": pair.steps}
    return Decision(verdict, pair.arms, pair.checkpoints, compute)


class Walk(NamedTuple):
    verdict: Verdict  # the last look's
    pairs: int  # arm pairs trained
    instances: int  # instances judged, all pairs
    seconds: float  # CPU-seconds spent: the pairs' training + the judging of the instances the looks used


def _differ(control_files: dict[str, str], candidate_files: dict[str, str]) -> set[str]:
    return {p for p in {*control_files, *candidate_files} if control_files.get(p) != candidate_files.get(p)}


def recipe_changes(control_files: dict[str, str], candidate_files: dict[str, str]) -> dict[str, tuple[Any, Any]]:
    """{key: (control's value, candidate's)} of the recipe keys two harnesses differ in when recipe.yaml is all they
    differ in, else {}."""
    import yaml

    if _differ(control_files, candidate_files) != {"recipe.yaml"}:
        return {}
    a, b = (yaml.safe_load(f.get("recipe.yaml") or "") or {} for f in (control_files, candidate_files))
    return {k: (a.get(k), b.get(k)) for k in {*a, *b} if a.get(k) != b.get(k)}


def on_signal_route(control_files: dict[str, str], candidate_files: dict[str, str]) -> bool:
    """Do the two harnesses differ in a way the learning-signal route may decide (`harness.decisions.
    takes_signal_route`): env.yaml alone (an env change), or recipe.yaml alone in one of its route knobs (the sampling
    temperature, or a longer completion budget)?"""
    from harness.decisions import takes_signal_route

    if _differ(control_files, candidate_files) == {"env.yaml"}:
        return True
    keys = recipe_changes(control_files, candidate_files)
    return bool(keys) and all(takes_signal_route("recipe", f"recipe.{k}", *v) for k, v in keys.items())


def recipe_knob(control_files: dict[str, str], candidate_files: dict[str, str]) -> str:
    """`recipe.<key>` when the two harnesses differ in exactly one recipe key and nothing else, else "" (the knob a
    candidate row records, for `harness.decisions.finished_reading`)."""
    keys = list(recipe_changes(control_files, candidate_files))
    return f"recipe.{keys[0]}" if len(keys) == 1 else ""


def step_curve(arm: ArmOutput) -> list[dict]:
    """An arm's training curve, one dict per GRPO step; none for an arm replayed from a record (no training metrics:
    the route cannot decide it)."""
    metrics = getattr(arm, "metrics", None)
    if metrics is None:
        return []
    return [s if isinstance(s, dict) else s.model_dump() for s in metrics.steps]


def step_live(arm: ArmOutput) -> list[float]:
    """Per-step live-group shares of an arm's training (`harness.backtest.live_shares` of its step metrics); none for
    an arm replayed from a record."""
    from harness.backtest import live_shares

    return live_shares(curve) if (curve := step_curve(arm)) else []


def walk(pairs: list[Pair], more: Callable[[int], Pair], control_files: dict[str, str],
         candidate_files: dict[str, str], gate, plan, judge_fp: str, samples: int, candidate_id: str) -> Walk:
    """The loop's sequential decision over arm pairs judged on `plan.max_n` instances each: looks at the schedule's
    prefixes of each pair (`plan.min_n`, then every `plan.batch`), each through `verdicts` with the earlier pairs'
    evidence pooled (`prior_pairs`, as a re-test pools in the loop; the learning-signal route's ratio reading pools
    their live shares, `harness.decisions.earlier_live`'s); a look that says `new_pair` gets the next pair
    (`pairs[p]`, else `more(p)` trains it). Judging is charged per instance used (each pair was judged once on all
    `max_n`; its judge seconds pro rata), training per pair trained."""
    prior: list[Any] = []
    live: list[tuple[list[float], list[float]]] = []  # earlier pairs' live shares: the ratio reading pools them
    looks: list[dict[str, Any]] = []
    seconds = 0.0
    used = 0
    p = 0
    while True:
        pair = pairs[p] if p < len(pairs) else more(p)
        if p >= len(pairs):
            pairs.append(pair)
        seconds += pair.train_seconds
        control, candidate = pair.arms["control"].eval, pair.arms["candidate"].eval
        for m in plan.schedule():
            [v] = verdicts(control.prefix(m), control_files, [(candidate_id, candidate_files, candidate.prefix(m))],
                           gate, samples=samples, plan=plan, judge=judge_fp, prior={candidate_id: prior},
                           looks={candidate_id: looks}, comparisons=1)
            looks = v.evidence.looks if v.evidence is not None else looks
            step = v.evidence.next_step if v.evidence is not None else "stop"
            if v.decision != "inconclusive" or step != "more_instances":
                break
        used += m
        seconds += pair.judge_seconds * m / max(1, len(control.seeds))
        if v.decision == "inconclusive" and on_signal_route(control_files, candidate_files):  # the loop's second route
            here = (step_live(pair.arms["control"]), step_live(pair.arms["candidate"]))
            done = finished_reading(recipe_knob(control_files, candidate_files),  # a longer budget's third reading
                                    *(finished_shares(step_curve(pair.arms[a])) for a in ("control", "candidate")))
            v = (signal_verdict(v, *here, gate, 1, earlier=list(live), finished=done)  # a futility stop weighs the
                 or signal_lift(v, *here, gate, 1, earlier=list(live), finished=done) or v)  # route too
            step = v.evidence.next_step if v.evidence is not None else step
            live.append(here)
        if v.decision != "inconclusive" or step != "new_pair" or p + 1 >= plan.max_pairs:
            return Walk(v, p + 1, used, seconds)
        prior += prior_pairs([v.evidence], judge_fp)[0]
        p += 1


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
    control_files = candidate_files = files
    if mode == "aa" and planted == "env":  # a null env change: same boards, another text
        candidate_files = {**files, "env.yaml": "# A/A: the same boards, written again\n" + files["env.yaml"]}
    elif mode == "power" and planted == "env":
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
    from harness.sequential import Plan

    plan = cfg.gate.plan(cfg.backtest.n)
    fixed = Plan(**{**plan.model_dump(), "max_pairs": 1, "min_n": plan.max_n, "batch": plan.max_n})
    fp = judge_fingerprint(judge, cfg.gate, task.name)
    print(f"plan: looks at {plan.schedule()} instances of each of up to {plan.max_pairs} arm pairs; "
          f"fixed: one pair, one look at {fixed.max_n}", flush=True)
    rows: list[dict[str, Any]] = []
    for d in range(first, first + decisions):
        def pair(p: int, d: int = d) -> Pair:
            q = d * plan.max_pairs + p  # every pair of every decision: its own training, arm and backtest seeds
            res = train_pair(start, control_files, candidate_files, task, cfg.style, steps,
                             seeds("train", rows_per_arm, start=first_train + q * rows_per_arm),
                             seeds("backtest", plan.max_n, start=q * plan.max_n), judge,
                             out / "arms" / f"d{d:03d}p{p}", (2 * q, 2 * q + 1) if mode == "aa" else (q, q),
                             cfg.policy.backend)
            shutil.rmtree(out / "arms" / f"d{d:03d}p{p}")  # arm checkpoints are not needed after judging
            print(f"pair: {d}.{p}  control: {res.arms['control'].eval.valid:.3f}  candidate: "
                  f"{res.arms['candidate'].eval.valid:.3f}  train_s: {res.train_seconds:.1f}  judge_s: "
                  f"{res.judge_seconds:.1f}", flush=True)
            return res

        pairs = [pair(0)]
        cid = f"{mode}-{d:03d}"
        c0, k0 = pairs[0].arms["control"].eval, pairs[0].arms["candidate"].eval
        [fv] = verdicts(c0, control_files, [(cid, candidate_files, k0)], cfg.gate, samples=judge.per_instance, plan=fixed,
                        judge=fp, comparisons=1)
        w = walk(pairs, pair, control_files, candidate_files, cfg.gate, plan, fp, judge.per_instance, cid)
        sv, fe, se = w.verdict, fv.evidence, w.verdict.evidence
        row = {"decision": d,
               "fixed": {"decision": fv.decision, "effect": fe.effect, "ci_low": fe.ci_low, "mde": fe.mde,
                         "seconds": pairs[0].train_seconds + pairs[0].judge_seconds},
               "sequential": {"decision": sv.decision, "effect": se.effect if se else None,
                              "ci_low": se.ci_low if se else None, "ci_high": se.ci_high if se else None,
                              "pairs": w.pairs, "instances": w.instances, "seconds": w.seconds,
                              "looks": se.looks if se else [], "reason": sv.reason},
               "pairs": [{"control": x.arms["control"].eval.valid, "candidate": x.arms["candidate"].eval.valid,
                          "effect": x.arms["candidate"].eval.valid - x.arms["control"].eval.valid,
                          "greedy_control": float(np.mean(x.arms["control"].eval.greedy or [0.0])),
                          "greedy_candidate": float(np.mean(x.arms["candidate"].eval.greedy or [0.0])),
                          "diff_var": float(np.var(np.subtract(x.arms["candidate"].eval.outcomes,
                                                               x.arms["control"].eval.outcomes), ddof=1)),
                          "train_seconds": x.train_seconds, "judge_seconds": x.judge_seconds, "n": plan.max_n,
                          # per instance, so any procedure can be replayed on these arms (`replay`)
                          "outcomes": {name: [round(o, 4) for o in x.arms[name].eval.outcomes]
                                       for name in ("control", "candidate")},
                          "slices": x.arms["control"].eval.slices,
                          "live": {name: [round(o, 4) for o in step_live(x.arms[name])]
                                   for name in ("control", "candidate")}}
                         for x in pairs]}
        rows.append(row)
        (out / f"calibration-{mode}-{first}.json").write_text(json.dumps({  # after every decision: a stopped run counts
            "summary": {"mode": mode, "planted": recorded_change(mode, planted), "partial": True},
            "decisions": rows}, indent=1))
        print(f"decision: {d}  fixed: {fv.decision} {fe.effect:+.3f} (lo {fe.ci_low:+.3f}, "
              f"{row['fixed']['seconds']:.0f} s)  sequential: {sv.decision} "
              f"{se.effect if se else float('nan'):+.3f} (lo {se.ci_low if se else float('nan'):+.3f}) after "
              f"{w.pairs} pair(s), {w.instances} instances, {w.seconds:.0f} s", flush=True)
    summary = summarise(rows, mode, planted, plan)
    summary.update({"first": first, "config": str(config), "arm_steps": steps, "eval_n": plan.max_n,
                    "samples": judge.samples, "judge_temperature": judge.temperature,
                    "confidence": cfg.gate.confidence, "min_effect": cfg.gate.min_effect,
                    "arm_noise_sd": cfg.gate.arm_noise_sd, "seconds_total": time.perf_counter() - t0,
                    "threads": threads})
    (out / f"calibration-{mode}-{first}.json").write_text(json.dumps({"summary": summary, "decisions": rows}, indent=1))
    for key, val in summary.items():
        print(f"{key}: {val:.4f}" if isinstance(val, float) else f"{key}: {val}", flush=True)
    return summary


def recorded_change(mode: str, planted: str | None) -> str | None:
    """What a result file records as its change: power's defect, or `env` for an A/A whose candidate is a null env
    change (None for a plain A/A)."""
    return planted if mode == "power" or planted == "env" else None


def summarise(rows: list[dict[str, Any]], mode: str, planted: str, plan) -> dict[str, Any]:
    """Rates (Wilson 95% intervals) and costs of both procedures over the decisions in `rows` (one run's, or several
    runs' JSON `decisions` concatenated), and the arm-training noise implied by the pairs' full-n effects."""
    from harness.benchmarks.ladder import wilson

    k = len(rows)
    out: dict[str, Any] = {"mode": mode, "planted": recorded_change(mode, planted), "decisions": k}
    for proc in ("fixed", "sequential"):
        for verdict in ("promoted", "rejected", "inconclusive"):
            hits = sum(r[proc]["decision"] == verdict for r in rows)
            lo, hi = wilson(hits, k)
            out[f"{proc}_{verdict}"] = hits
            out[f"{proc}_{verdict}_rate_ci95"] = f"{hits / max(1, k):.3f} [{lo:.3f}, {hi:.3f}]"
        out[f"{proc}_seconds_per_decision"] = sum(r[proc]["seconds"] for r in rows) / max(1, k)
    seq = [r["sequential"] for r in rows]
    out["sequential_mean_pairs"] = sum(s["pairs"] for s in seq) / max(1, k)
    out["sequential_mean_instances"] = sum(s["instances"] for s in seq) / max(1, k)
    out["cost_ratio_fixed_over_sequential"] = out["fixed_seconds_per_decision"] / max(
        1e-9, out["sequential_seconds_per_decision"])
    pairs = [p for r in rows for p in r["pairs"]]
    train = sum(p["train_seconds"] for p in pairs)
    out["train_share_of_pair_seconds"] = train / max(1e-9, train + sum(p["judge_seconds"] for p in pairs))
    effects = np.array([p["effect"] for p in pairs])
    out["pair_effect_mean"] = float(effects.mean()) if len(effects) else float("nan")
    out["pair_effect_sd"] = float(effects.std(ddof=1)) if len(effects) > 1 else float("nan")
    if mode == "aa" and len(effects) > 1:  # var(pair effect) = arm noise^2 + instance variance / n
        inst = float(np.mean([p["diff_var"] / p["n"] for p in pairs]))
        out["arm_noise_sd_estimate"] = float(np.sqrt(max(0.0, out["pair_effect_sd"] ** 2 - inst)))
        out["instance_se_per_pair"] = float(np.sqrt(inst))
    return out


def merge(paths: list[str]) -> dict[str, Any]:
    """The summary over several runs' decisions (`--first` splits of one measurement), printed as `key: value`."""
    docs = [json.loads(Path(x).read_text()) for x in paths]
    modes = {(d["summary"]["mode"], d["summary"].get("planted")) for d in docs}  # partial files count too
    if len(modes) != 1:
        raise ValueError(f"cannot merge different measurements: {sorted(map(str, modes))}")
    (mode, planted), = modes
    firsts = [r["decision"] for d in docs for r in d["decisions"]]
    if len(set(firsts)) != len(firsts):
        raise ValueError("the files share decisions (same --first range): each decision may be counted once")
    rows = [r for d in docs for r in d["decisions"]]
    summary = summarise(rows, mode, planted or "lr", None)
    for key, val in summary.items():
        print(f"{key}: {val:.4f}" if isinstance(val, float) else f"{key}: {val}", flush=True)
    return summary


def replay(paths: list[str], config: str | Path = DEFAULT_CONFIG, **gate: Any) -> dict[str, Any]:
    """Judge the recorded arm pairs of earlier runs again under another gate (e.g. `futility=0.05`), with no training:
    each decision's pairs (their per-instance outcomes, written since this function exists) are walked by the loop's
    procedure (`walk`) with the config's gate updated by `gate`; a decision that would need a pair the run did not
    train is counted apart (a procedure that stops no later than the recorded one never needs one). Prints and
    returns the rates and costs as `summarise` does, for the replayable decisions."""
    from harness.backtest import ArmEval
    from harness.config import load_config
    from harness.round0 import make_judge
    from harness.tasks import get_task

    cfg = load_config(config)
    cfg = cfg.model_copy(update={"gate": cfg.gate.model_copy(update=gate)})
    task = get_task(cfg.task)
    judge = make_judge(cfg, round0_files(cfg))
    fp = judge_fingerprint(judge, cfg.gate, task.name)
    plan = cfg.gate.plan(cfg.backtest.n)
    docs = [json.loads(Path(x).read_text()) for x in paths]
    kinds = {(d["summary"]["mode"], d["summary"].get("planted")) for d in docs}
    if len(kinds) != 1:
        raise ValueError(f"cannot replay different measurements together: {sorted(map(str, kinds))}")
    (mode, planted), = kinds
    # an env change (planted env defect, or the A/A's null env change) walks with the learning-signal route live
    files = ({"env.yaml": "control"}, {"env.yaml": "candidate"}) if planted == "env" else ({}, {})
    rows, skipped, beyond = [], 0, 0
    for doc in docs:
        for r in doc["decisions"]:
            if not all("outcomes" in x for x in r["pairs"]):
                skipped += 1
                continue
            pairs = []
            for x in r["pairs"]:
                sd = list(range(len(x["outcomes"]["control"])))
                live = x.get("live") or {}  # per-step live shares, recorded since the learning-signal route
                ev = {name: ArmOutput(
                    metrics=SimpleNamespace(steps=[{"dead_group_share": 1.0 - v} for v in live.get(name, [])]),
                    train_s=0.0, eval=ArmEval(seeds=sd, outcomes=x["outcomes"][name], slices=x["slices"]))
                    for name in ("control", "candidate")}
                pairs.append(Pair(ev, {}, x["train_seconds"], x["judge_seconds"], 0.0, 0.0))

            def more(p: int) -> Pair:
                raise LookupError(p)

            try:
                w = walk(list(pairs), more, *files, cfg.gate, plan, fp, judge.per_instance, "replay")
            except LookupError:
                beyond += 1
                continue
            se = w.verdict.evidence
            rows.append({**r, "sequential": {"decision": w.verdict.decision, "pairs": w.pairs,
                                             "instances": w.instances, "seconds": w.seconds,
                                             "effect": se.effect if se else None}})
    summary = summarise(rows, mode, planted or "lr", plan)
    summary.update({"replayed_with": gate, "not_replayable": skipped, "needed_unrecorded_pairs": beyond})
    for key, val in summary.items():
        print(f"{key}: {val:.4f}" if isinstance(val, float) else f"{key}: {val}", flush=True)
    return summary


def replay_runs(run_dirs: list[str | Path], futility: float) -> dict[str, Any]:
    """Replay `gate.futility` on the recorded decisions of live runs, with no training. Every recorded test that
    continued to a new arm pair (inconclusive, re-testable later) is judged again by the loop's verdict function
    (`harness.backtest.verdicts`) on the pairs it had (`harness.backtest.prior_pairs` of the earlier tests it pooled
    and its own recorded evidence, same-stage pairs included; its own pair as outcomes max(0, -d) and max(0, d): the
    procedure sees only the differences),
    with the run's own gate (config.yaml) and `futility`, the stage's judged candidates as its comparisons. A test
    the rule stops would have ended there: its later pooled re-tests are saved, and any of them that was promoted is
    a promotion lost; a stop the loop lifts (`harness.decisions.signal_lift`: a change the learning-signal route
    reads, its recorded live shares showing the signal) is counted as lifted, not stopped. A replay on records cannot
    see what a run would have done instead (the stage's slot goes to
    another candidate); it counts what the rule removes. Prints and returns the counts, and one line per stop."""
    from harness.backtest import ArmEval
    from harness.config import load_config
    from harness.decisions import live_of, takes_signal_route
    from harness.records import Evidence
    from harness.store import RunStore

    tot: dict[str, Any] = {"runs": 0, "promotions": 0, "continued_tests": 0, "stopped": 0, "lifted": 0,
                           "saved_pairs": 0, "lost_promotions": 0, "not_replayable": 0, "stops": []}
    for d in map(Path, run_dirs):
        if not (d / "run.db").exists() or not (d / "config.yaml").exists():
            raise FileNotFoundError(f"{d}: not a run directory (needs run.db and config.yaml)")
        cfg = load_config(d / "config.yaml")
        gate = cfg.gate.model_copy(update={"futility": futility})
        plan = gate.plan(cfg.backtest.n)
        with RunStore.open(d / "run.db") as store:
            rows = [c for run in store.runs() for c in store.candidates(run)]
        ev = {c["id"]: c["evidence"] or {} for c in rows}
        status = {c["id"]: c["status"] for c in rows}
        judged: dict[int, int] = {}
        for c in rows:
            if ev[c["id"]].get("diffs"):
                judged[c["stage"]] = judged.get(c["stage"], 0) + 1
        tot["runs"] += 1
        tot["promotions"] += sum(s == "promoted" for s in status.values())
        for c in rows:
            e = ev[c["id"]]
            if e.get("next_step") != "new_pair" or not e.get("diffs"):
                continue
            rec = Evidence.model_validate(e)
            earlier = [Evidence.model_validate(ev[p]) for p in rec.pooled if ev.get(p, {}).get("diffs")]
            # every pair the test was judged on, as the loop pools them: the earlier tests' (with their same-stage
            # pairs), this test's same-stage pairs, then its own pair last
            pairs, _, refused = prior_pairs([*earlier, rec], rec.judge or "")
            if not rec.judge or refused:  # recorded before evidence named its judge, or across judges
                tot["not_replayable"] += 1
                continue
            *prior, own = pairs
            diffs, sl = own.diffs, own.slices or [{} for _ in own.diffs]
            arms = [ArmEval(seeds=list(range(len(diffs))), outcomes=[max(0.0, sign * x) for x in diffs], slices=sl)
                    for sign in (-1.0, 1.0)]  # control max(0, -d), candidate max(0, d): candidate - control = d
            v, = verdicts(arms[0], {}, [(c["id"], {}, arms[1])], gate, plan=plan, judge=rec.judge,
                          prior={c["id"]: prior}, comparisons=max(1, judged.get(c["stage"], 1)))
            tot["continued_tests"] += 1
            if not (v.evidence is not None and v.evidence.next_step == "stop" and "futility" in v.reason):
                continue
            if (rec.live.get("control") and rec.live.get("candidate") and takes_signal_route(
                    c["kind"], c.get("knob") or "", c.get("old_value"), (c.get("patch") or {}).get("value"))
                    and signal_lift(v, rec.live["control"], rec.live["candidate"], gate,
                                    max(1, judged.get(c["stage"], 1)),
                                    earlier=live_of([ev.get(x, {}) for x in rec.pooled], rec.stage_live),
                                    finished=finished_reading(c.get("knob") or "", rec.finished.get("control", []),
                                                              rec.finished.get("candidate", []))) is not None):
                tot["lifted"] += 1  # its learning signal is shown (or promising, level or ahead): the loop keeps its next pair
                continue
            later = [x for x, e2 in ev.items() if c["id"] in (e2.get("pooled") or [])]
            lost = [x for x in later if status[x] == "promoted"]
            tot["stopped"] += 1
            tot["saved_pairs"] += len(later)
            tot["lost_promotions"] += len(lost)
            tot["stops"].append({"run": str(d), "candidate": c["id"], "knob": c["knob"], "effect": rec.effect,
                                 "pairs": len(pairs), "later": later, "lost": lost})
            print(f"stop: {d} {c['id']} {c['knob']} effect {rec.effect:+.3f} after {len(pairs)} pair(s); "
                  f"later re-tests {later or 'none'}" + (f"; LOST promotion {lost}" if lost else ""), flush=True)
    for key in ("runs", "promotions", "continued_tests", "stopped", "lifted", "saved_pairs", "lost_promotions",
                "not_replayable"):
        print(f"{key}: {tot[key]}", flush=True)
    return tot


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["merge"]:
        merge(sys.argv[2:])
    elif sys.argv[1:2] == ["replay"]:  # replay [--futility 0.05] [--learning-signal 0.1|none] A.json B.json
        import argparse

        ap = argparse.ArgumentParser(prog="python -m harness.benchmarks.calibration replay",
                                     description="judge recorded arm pairs again under another gate setting")
        ap.add_argument("files", nargs="+", help="calibration-*.json files of one measurement")
        ap.add_argument("--futility", type=float, help="gate.futility (default: the config's)")
        ap.add_argument("--learning-signal", help="gate.learning_signal, a margin or 'none' (the route off)")
        ap.add_argument("--learning-signal-arm-sd", type=float, help="gate.learning_signal_arm_sd")
        ap.add_argument("--learning-signal-ratio", help="gate.learning_signal_ratio, a multiple or 'none' (off)")
        ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="the run config the pairs were measured on")
        a = ap.parse_args(sys.argv[2:])
        gate = {k: v for k, v in (("futility", a.futility), ("learning_signal_arm_sd", a.learning_signal_arm_sd))
                if v is not None}
        if a.learning_signal is not None:
            gate["learning_signal"] = None if a.learning_signal.lower() == "none" else float(a.learning_signal)
        if a.learning_signal_ratio is not None:
            gate["learning_signal_ratio"] = (None if a.learning_signal_ratio.lower() == "none"
                                             else float(a.learning_signal_ratio))
        replay(a.files, a.config, **gate)
    elif sys.argv[1:2] == ["replay-runs"]:  # replay-runs --futility 0.05 RUN_DIR ...
        import argparse

        ap = argparse.ArgumentParser(prog="python -m harness.benchmarks.calibration replay-runs",
                                     description="replay gate.futility on the recorded decisions of live runs")
        ap.add_argument("runs", nargs="+", help="run directories (each with run.db and config.yaml)")
        ap.add_argument("--futility", type=float, required=True, help="the gate.futility to replay")
        a = ap.parse_args(sys.argv[2:])
        replay_runs(a.runs, a.futility)
    else:
        run()
