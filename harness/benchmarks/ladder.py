"""The learning ladder: three checks, climbed in order, that GRPO on CPU learns. Each rung that fails points at a
different layer (plumbing, trainer wiring, task/recipe), so a learning failure is hunted, not tuned around.

    evotrainer bench ladder                   # all three rungs (about 15 minutes on 2 cores)
    evotrainer bench ladder --rungs 1,2       # plumbing and toy only (about 2 minutes)

1. **Plumbing** (`rung1`): the log-probability of every sampled completion token under the distribution the rollout
   engine sampled from equals the one the GRPO trainer computes for its loss (|diff| <= 1e-3) and the importance
   ratio at the first optimiser iteration is 1, for both rollout engines (`policies.train.check_logprobs`).
2. **A toy that must be learnt** (`rung2`): copy a 3-4 letter string. The warm start is SFT on noisy demonstrations
   (40% copies, 60% reversals), so it copies 30-50% of the time when sampled; GRPO with a 0/1 reward must reach >= 90%
   within 100 steps. A negative control (the same run with the reward flipped) must move the other way, so a pass
   cannot come from SFT momentum or evaluation noise.
3. **A task family** (`rung3`, `--task`): from a deliberately partial warm start, GRPO for a fixed CPU-time budget;
   held-out valid before and after, paired per instance, with a bootstrap confidence interval and per-slice figures.
   `mapf` (the rung's first form): 2-agent boards, 300 held out (100 each of sizes 3, 4, 5), passes at +15 points.
   `math`: two-term sums and differences, 600 held out (200 each of 1, 2 and 3 digits); `code`: Python pipelines of
   depth 1-3, 600 held out (300 each of depth 2 and 3). Both pass when the gain is above noise (its lower bound above
   zero): the other families' rungs, so that the harness-defects benchmark knows where GRPO learns besides MAPF.
   `RUNGS` holds each family's settings; every family is read in its default (first) prompt style.

Prints grep-able `key: value` lines and writes `ladder.json` to `--out`. A fast version of rungs 1 and 2 runs in
`make test` (tests/test_ladder.py).
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policies import cpu_threads

TOY_ALPHABET = "abcd"

# rung-3 settings from the measurements in BENCHMARKS.md ("The learning ladder"): binary reward, low temperature
RUNG3_RECIPE: dict[str, Any] = {"learning_rate": 1e-4, "temperature": 0.5, "beta": 0.0, "batch_size": 64,
                                "num_generations": 8, "warmup_ratio": 0.05, "max_completion_length": 96,
                                "scale_rewards": "group", "loss_type": "dapo", "drop_dead_groups": True,
                                "oversample": 3, "lr_schedule": "constant"}  # annealed by time (time_budget)
RUNG3_SHAPING: dict[str, float] = {"partial_credit": 0.0, "format_penalty": 0.0, "optimal_bonus": 0.0}
RUNG3_ENV = {"sizes": [{"size": s, "agents": 2, "hole_ratio": 0.2, "wait_ratio": 0.5} for s in (3, 4, 5)]}


@dataclass(frozen=True)
class Rung3Family:
    """What rung 3 needs from a task family: the distribution the warm start and GRPO train on (and the held-out set
    is drawn from, on test seeds), the GRPO recipe and reward shaping, how partial the warm start is, the slice the
    result is broken down by, and the gain that passes. Settings come from measurements (BENCHMARKS.md, "The learning
    ladder" and the families' sections); a family is one entry of `RUNGS`."""

    env: dict[str, Any]  # GRPO's training distribution (and the warm start's, unless `warm_env`)
    levels: tuple[dict[str, Any], ...]  # one held-out block per entry, each `per_level` instances from test seeds
    slice_key: str  # the task's slice the levels differ in (reported per value)
    per_level: int
    recipe: dict[str, Any]
    shaping: dict[str, float]
    sft_examples: int
    sft_steps: dict[str, int]  # per preset: SFT steps that leave the warm start partial
    max_new_tokens: int  # evaluation's completion budget
    gain: float  # the paired greedy effect that passes (its 95% lower bound must be above zero too)
    warm_env: dict[str, Any] | None = None  # the warm start's demonstrations, where they differ from `env`


# math: two-term sums and differences of 1-3 digit numbers (the math scenarios' target). The warm start (500 SFT steps,
# math scenarios' own) solves about 78% of 1-digit, 2% of 2-digit and none of 3-digit problems greedily. The recipe is
# the one BENCHMARKS.md's math section found to climb its objective without wrecking the policy: a small rate and 32
# prompts a step (lr 1e-4 at batch 64 wrecks it); dynamic sampling (oversample 2, dead groups dropped) gained less in
# the same seconds (+2.0 against +3.2 points, fewer steps).
MATH_RUNG_MIX = {"levels": [{"digits": d, "data_ratio": r, "terms": 2, "sub_ratio": 0.5}
                            for d, r in ((1, 0.34), (2, 0.33), (3, 0.33))]}
RUNGS: dict[str, Rung3Family] = {
    "mapf": Rung3Family(
        env=RUNG3_ENV, levels=tuple({"sizes": [{**e}]} for e in RUNG3_ENV["sizes"]), slice_key="size",
        per_level=100, recipe=RUNG3_RECIPE, shaping=RUNG3_SHAPING, sft_examples=3000,
        sft_steps={"tiny": 700, "small": 450}, max_new_tokens=128, gain=0.15),
    "math": Rung3Family(
        env=MATH_RUNG_MIX, levels=tuple({"levels": [{**e, "data_ratio": 1.0}]} for e in MATH_RUNG_MIX["levels"]),
        slice_key="digits", per_level=200,
        recipe={"learning_rate": 3e-5, "temperature": 1.0, "beta": 0.0, "batch_size": 256, "num_generations": 8,
                "warmup_ratio": 0.05, "max_completion_length": 16, "lr_schedule": "constant"},
        shaping={"valid_reward": 1.0, "partial_credit": 0.0, "format_penalty": -0.5}, sft_examples=3000,
        sft_steps={"tiny": 500}, max_new_tokens=16, gain=0.0),
    # code: BENCHMARKS.md's code section, "GRPO with dynamic sampling does raise greedy pass rates here": a warm start
    # on the family's default mix (depths 1-2), GRPO on depths 1-3 with dead groups dropped (+5.7 points on depth 2,
    # +3.0 on depth 3 after 300 steps). The warm start sees 400 demonstrations (800 SFT steps): from 4000 the rung
    # read -0.8 to +1.2 [+0.0, +2.5] in six 10-minute tries; from 400 it passed on three training seeds of three,
    # +3.8 [+1.8, +5.8], +5.0 [+3.0, +7.0], +6.2 [+3.7, +8.7] (BENCHMARKS.md, "Rung 3 on math and code")
    "code": Rung3Family(
        env={"levels": [{"depth": d, "data_ratio": r, "vocab": 6} for d, r in ((1, 0.3), (2, 0.4), (3, 0.3))]},
        warm_env={"levels": [{"depth": 1, "data_ratio": 0.6, "vocab": 6}, {"depth": 2, "data_ratio": 0.4, "vocab": 6}]},
        levels=tuple({"levels": [{"depth": d, "vocab": 6}]} for d in (2, 3)), slice_key="depth", per_level=300,
        recipe={"learning_rate": 1e-4, "temperature": 1.0, "beta": 0.0, "batch_size": 64, "num_generations": 8,
                "warmup_ratio": 0.05, "max_completion_length": 40, "lr_schedule": "constant",
                "drop_dead_groups": True, "oversample": 4},
        shaping={"valid_reward": 1.0, "partial_credit": 0.0, "format_penalty": -0.5}, sft_examples=400,
        sft_steps={"tiny": 800}, max_new_tokens=48, gain=0.0),
}


def cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of the children it waited for (code's sandboxed scorers run
    as bubblewrap jobs: `time.process_time` alone would leave their CPU out)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _say(key: str, value: Any) -> None:
    print(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}", flush=True)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of a rate k/n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / d
    return max(0.0, c - h), min(1.0, c + h)


# --- the toy task (rungs 1 and 2) -------------------------------------------------------------------------------------


def toy_strings(n: int, seed: int) -> list[str]:
    r = random.Random(seed)
    return ["".join(r.choice(TOY_ALPHABET) for _ in range(r.randint(3, 4))) for _ in range(n)]


def toy_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """1 for an exact copy of the prompt, else 0."""
    return [float(c == p) for p, c in zip(prompts, completions)]


def flipped_toy_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """The negative control: rewards everything but a copy."""
    return [1.0 - r for r in toy_reward(prompts, completions)]


def toy_warm_start(sft_steps: int = 600, copy_share: float = 0.4, seed: int = 0):
    """A tiny char model SFT'd on noisy demonstrations: `copy_share` copies, the rest reversals."""
    from policies.model import build_model
    from policies.train import Recipe, train_sft

    model, tok = build_model("tiny", TOY_ALPHABET, seed=seed)
    r = random.Random(seed + 1)
    demos = [{"prompt": p, "completion": p if r.random() < copy_share else p[::-1]}
             for p in toy_strings(5000, seed=seed + 2)]
    train_sft(model, tok, demos, Recipe(sft_steps=sft_steps))
    return model, tok


def toy_success(model, tok, held: list[str], temperature: float, n: int = 4) -> float:
    """Share of exact copies among `n` samples per held-out string (temperature 0: greedy, n = 1)."""
    from policies.rollout import SamplingParams, generate

    n = 1 if temperature == 0 else n
    res = generate(model, tok, held, SamplingParams(temperature=temperature, n=n, max_new_tokens=12, batch_size=512,
                                                    seed=1))
    return sum(c == held[i] for c, i in zip(res.completions, res.prompt_index)) / len(res.completions)


# the rungs count CPU time on one loop: `recipe.pipeline`'s auto would add a second core where one thread leaves it idle
# (`--recipe pipeline=true` asks for it)
ONE_LOOP = {"pipeline": False}


def toy_recipe(steps: int = 100, **kw: Any):
    from policies.train import Recipe

    return Recipe(**{"learning_rate": 1e-4, "temperature": 1.0, "beta": 0.0, "batch_size": 32, "num_generations": 8,
                     "max_completion_length": 12, "steps": steps, "warmup_ratio": 0.05, **ONE_LOOP, **kw})


def rung1(model=None, tok=None, prompts: list[str] | None = None) -> dict[str, Any]:
    """Sampler vs trainer log-probs, both engines, on the toy warm start (or the given model and prompts)."""
    from policies.train import check_logprobs, logprob_tolerance

    if model is None:
        model, tok = toy_warm_start(sft_steps=200)
    prompts = prompts or toy_strings(8, seed=99)
    out: dict[str, Any] = {}
    for engine in ("policies", "trl"):
        for temp in (1.0, 0.5):
            chk = check_logprobs(model, tok, prompts, toy_recipe(steps=1, temperature=temp, rollout_engine=engine))
            key = f"{engine}_T{temp}"
            out[key] = chk.model_dump()
            _say(f"rung1_{key}_max_abs_logp_diff", chk.max_abs_diff)
            _say(f"rung1_{key}_max_ratio_dev", chk.max_ratio_dev)
    tol = logprob_tolerance()  # 1e-3; 1/16 where the trainer runs bf16 autocast (a CUDA GPU)
    _say("rung1_tolerance", tol)
    out["passed"] = all(v["max_abs_diff"] <= tol and v["max_ratio_dev"] <= 1e-3 for v in out.values())
    _say("rung1_passed", out["passed"])
    return out


def rung2(sft_steps: int = 600, steps: int = 100, negative_control: bool = True, seed: int = 0,
          flipped_steps: int | None = None, recipe_kw: dict[str, Any] | None = None) -> dict[str, Any]:
    """Copy toy: warm start sampled success, then GRPO `steps` steps; and the flipped-reward control (`flipped_steps`
    steps, default `steps`: unlearning is faster than learning, so the test runs a shorter control). `recipe_kw`
    overrides the toy's recipe (e.g. `sampler="multinomial"`: the same rung on the reference sampler)."""
    import copy

    from policies.train import train_grpo

    t0 = time.perf_counter()
    model, tok = toy_warm_start(sft_steps=sft_steps, seed=seed)
    held = toy_strings(300, seed=10_000)
    train = [{"prompt": p} for p in toy_strings(4 * steps * 4, seed=20_000)]
    start = {"sampled": toy_success(model, tok, held, 1.0), "greedy": toy_success(model, tok, held, 0.0)}
    sft_s = time.perf_counter() - t0
    _say("rung2_warm_start_sampled", start["sampled"])
    _say("rung2_warm_start_greedy", start["greedy"])
    out: dict[str, Any] = {"start": start, "sft_seconds": sft_s, "steps": steps, "held_out": len(held)}
    runs = [("grpo", toy_reward)] + ([("flipped", flipped_toy_reward)] if negative_control else [])
    base = copy.deepcopy(model)
    for name, reward in runs:
        m = copy.deepcopy(base)
        t1 = time.perf_counter()
        n_steps = steps if name == "grpo" or flipped_steps is None else flipped_steps
        met = train_grpo(m, tok, train, reward, toy_recipe(steps=n_steps, seed=seed, **(recipe_kw or {})))
        res = {"sampled": toy_success(m, tok, held, 1.0), "greedy": toy_success(m, tok, held, 0.0),
               "seconds": time.perf_counter() - t1, "dead_group_share": met.dead_group_share}
        # over the held-out prompts, not their 4 samples each (samples of one prompt move together: counted as
        # independent the interval was up to 2x narrow; the prompts' n is the conservative bound, design effect <= 4)
        res["sampled_ci"] = wilson(round(res["sampled"] * len(held)), len(held))
        out[name] = res
        _say(f"rung2_{name}_sampled", res["sampled"])
        _say(f"rung2_{name}_greedy", res["greedy"])
        _say(f"rung2_{name}_seconds", res["seconds"])
    out["passed"] = (0.3 <= start["sampled"] <= 0.5 and out["grpo"]["sampled"] >= 0.9
                     and (not negative_control or out["flipped"]["sampled"] < start["sampled"]))
    _say("rung2_passed", out["passed"])
    return out


# --- rung 3: MAPF -----------------------------------------------------------------------------------------------------


# the noisy-teacher warm start of rung 3 (`--warm noisy`): 8000 demonstrations, 60% from the hole-blind planner (rung
# 2's 60/40 split), trained to convergence (2400 SFT steps): 27.3% greedy valid on the 300 boards, pass@16 at T 1 56%.
# `--blind-share 0.8` (25.3% greedy, pass@16 45%) leaves GRPO less to sharpen (BENCHMARKS.md, rung 3 fourth session)
NOISY_TEACHER = {"sft_examples": 8000, "sft_steps": 2400, "blind_share": 0.6}


def partial_warm_start(out: Path, family: str = "mapf", sft_examples: int | None = None,
                       sft_steps: int | None = None, preset: str = "tiny", blind_share: float = 0.0):
    """A family's deliberately partial warm start, cached in `out`: undertrained on expert demonstrations of its rung
    distribution (`blind_share` 0: MAPF about 28% greedy valid on the held-out boards at the defaults), or, for MAPF
    only, trained to convergence on a noisy teacher's plans (`blind_share` > 0: that share of demonstrations comes
    from the hole-blind planner). Defaults: the family's `RUNGS` entry."""
    from harness.policy_glue import sft_pairs
    from harness.seeds import seeds
    from harness.tasks import get_task
    from policies.model import build_model, load_policy, save_policy
    from policies.train import Recipe, train_sft

    fam = RUNGS[family]
    sft_examples = fam.sft_examples if sft_examples is None else sft_examples
    sft_steps = fam.sft_steps[preset] if sft_steps is None else sft_steps
    ck = out / ("warmstart-" + ("" if family == "mapf" else f"{family}-") + f"{sft_examples}-{sft_steps}"
                + ("" if preset == "tiny" else f"-{preset}") + (f"-blind{blind_share:g}" if blind_share else ""))
    if (ck / "config.json").exists():
        return load_policy(ck)
    task = get_task(family)
    cfg = task.spec.config_model.model_validate(fam.warm_env or fam.env)
    model, tok = build_model(preset, task.spec.alphabet, words=list(task.spec.words))
    seed_list = seeds("train", sft_examples)
    # blind_share > 0: the noisy teacher, MAPF's imperfect teacher (`harness.tasks.mapf.hole_blind`), as a run's
    # `warm_start.teacher_noise` draws it
    pairs = sft_pairs(task, cfg, seed_list, task.spec.styles[0], teacher_noise=blind_share)
    train_sft(model, tok, pairs, Recipe(sft_steps=sft_steps))
    save_policy(model, tok, ck)
    return load_policy(ck)


def held_out(task, family: str = "mapf") -> list:
    """The rung's held-out instances: `per_level` of each of the family's levels from test seeds no suite uses (MAPF:
    100 2-agent boards of each size 3, 4, 5, the boards every rung-3 figure in BENCHMARKS.md was measured on)."""
    from harness.seeds import seeds

    fam = RUNGS[family]
    out = []
    for i, level in enumerate(fam.levels):
        cfg = task.spec.config_model.model_validate(level)
        out += [task.generate(cfg, s) for s in seeds("test", fam.per_level, start=10_000 + 1_000 * i)]
    return out


SAMPLED_EVAL = (0.5, 4)  # temperature, samples per board: the backtest judge's way of reading a policy
HEADROOM = (1.0, 16)  # temperature, samples per board of the reach measurement (pass@16 at T 1)


def reach(model, tok, task, held, temperature: float = HEADROOM[0], n: int = HEADROOM[1], seed: int = 11,
          max_new_tokens: int = 96) -> np.ndarray:
    """Per board, the share of `n` samples at `temperature` that are valid. Boards at 0 are ones the policy never
    samples a valid plan for: GRPO gets no signal there (every group is dead), so sharpening alone can lift greedy
    valid at most to the share of boards above 0 (pass@n), the ceiling a short RL budget works under."""
    from harness.policy_glue import evaluate
    from policies.rollout import SamplingParams

    rep = evaluate(model, tok, task, held, task.spec.styles[0], params=SamplingParams(
        temperature=temperature, n=n, max_new_tokens=max_new_tokens, batch_size=256, seed=seed))
    p = np.zeros(len(held))
    for r in rep.rollouts:
        p[r.group] += r.valid / n
    return p


def rung_eval(model, tok, task, held, max_new_tokens: int = 128) -> dict[str, Any]:
    """Greedy valid/optimal per instance (the rung's target), and the sampled success rate per instance at the judge's
    temperature (4 samples at T 0.5, as backtests read a policy)."""
    from harness.policy_glue import evaluate
    from policies.rollout import SamplingParams

    rep = evaluate(model, tok, task, held, task.spec.styles[0], params=SamplingParams(
        temperature=0.0, max_new_tokens=max_new_tokens, batch_size=64))
    per = np.zeros(len(held))
    opt = np.zeros(len(held))
    for r in rep.rollouts:
        per[r.group] = r.valid
        opt[r.group] = r.optimal
    sampled = reach(model, tok, task, held, *SAMPLED_EVAL, seed=7, max_new_tokens=max_new_tokens)
    return {"valid": float(per.mean()), "optimal": float(opt.mean()), "per_board": per, "optimal_per_board": opt,
            "sampled": float(sampled.mean()), "sampled_per_board": sampled, "slices": [task.slices(i) for i in held]}


def curve_callback(tok, task, held, before: dict[str, Any], every_s: float, clock, max_new_tokens: int = 128):
    """A TrainerCallback for rung 3's learning curve: every `every_s` seconds of training it reads the model on the
    held-out boards the way the rung does before and after (`rung_eval`), prints a `rung3_curve:` line with the
    paired greedy effect so far, and keeps the point in `.points`. The clock (`clock`, the run's `time_budget`) is
    paused while it evaluates, so the budget and its annealing count training only; `.paused` holds the seconds spent.
    Evaluation samples from its own seeded generator, so the curve does not change what training draws. The curve
    says whether a budget ends on a plateau (more seconds would buy nothing) or mid-climb (the gain is rate-bound)."""
    from transformers import TrainerCallback

    from harness.backtest import paired_bootstrap

    class Curve(TrainerCallback):
        def __init__(self) -> None:
            self.points: list[dict[str, Any]] = []
            self.paused = 0.0
            self.last = 0.0

        def on_step_end(self, args, state, control, model=None, **kw):
            elapsed = time.perf_counter() - clock.t0
            if elapsed - self.last < every_s or model is None:
                return
            self.last = elapsed
            t = time.perf_counter()
            model.eval()
            try:
                now = rung_eval(model, tok, task, held, max_new_tokens)
            finally:
                model.train()
            eff, lo, hi = paired_bootstrap(before["per_board"], now["per_board"], 2000, 0.025,
                                           np.random.default_rng(0))
            self.points.append({"seconds": round(elapsed, 1), "step": state.global_step, "valid": now["valid"],
                                "effect": eff, "ci95": (lo, hi), "sampled": now["sampled"],
                                "optimal": now["optimal"]})
            _say("rung3_curve", f"t={elapsed:.0f}s step={state.global_step} greedy {now['valid']:.3f} "
                                f"{eff:+.3f} [{lo:+.3f}, {hi:+.3f}] sampled {now['sampled']:.3f}")
            spent = time.perf_counter() - t
            clock.t0 += spent
            self.paused += spent

    return Curve()


# expert demonstrations the supervised reference of rung 3 trains on (about 2 epochs of 10 minutes at batch 32)
SFT_REFERENCE_BOARDS = 10_000


def rung3(out: Path, budget_s: float = 600.0, max_steps: int = 1500, sft_examples: int | None = None,
          sft_steps: int | None = None, recipe_kw: dict[str, Any] | None = None, seed: int = 0,
          preset: str = "tiny", blind_share: float = 0.0, learner: str = "grpo",
          curve_every: float | None = None, family: str = "mapf", anneal: bool = True) -> dict[str, Any]:
    """`family`'s partial warm start (`RUNGS`), then GRPO until `budget_s` seconds of training (or `max_steps`, a
    cap); paired held-out figures. The learning rate anneals by elapsed time (`policies.train.time_budget`: cosine over
    the budget), so it reaches zero at the end of the budget whatever the seconds per step: a step schedule laid out
    past the budget kept the rate near its peak and the same 10 minutes ended at -1.0 points (BENCHMARKS.md).
    `anneal` False keeps the recipe's rate, after its warm-up, for the whole budget.

    `learner="sft"` is the rung's reference, not the rung: the same warm start, boards and budget, trained by supervised
    learning on the expert's plans for those boards (every token labelled, no sampling), at the warm start's own SFT
    rate annealed the same way. What 10 CPU-minutes of perfect labels buy bounds what a 0/1 reward can be expected to
    buy, and the ratio of the two says how far GRPO is from the most a learner could get out of this compute.

    `curve_every`: also read the held-out boards every that many seconds of training (`curve_callback`; the clock
    pauses while it evaluates), so the result says whether the budget ended on a plateau or mid-climb."""
    if learner not in ("grpo", "sft"):
        raise ValueError(f"learner {learner!r}: choose grpo (the rung) or sft (its supervised reference)")
    import torch

    from harness.backtest import paired_bootstrap
    from harness.policy_glue import grpo_rows, reward_fn, sft_pairs
    from harness.seeds import seeds
    from harness.tasks import get_task
    from policies.train import Recipe, time_budget, train_grpo, train_sft

    fam = RUNGS[family]
    task = get_task(family)
    out.mkdir(parents=True, exist_ok=True)
    sft_examples = fam.sft_examples if sft_examples is None else sft_examples
    sft_steps = fam.sft_steps[preset] if sft_steps is None else sft_steps
    model, tok = partial_warm_start(out, family, sft_examples, sft_steps, preset, blind_share)
    held = held_out(task, family)
    _say("rung3_task", family)
    before = rung_eval(model, tok, task, held, fam.max_new_tokens)
    _say("rung3_boards", len(held))
    _say("rung3_valid_before", before["valid"])
    reach_before = reach(model, tok, task, held)
    _say(f"rung3_pass@{HEADROOM[1]}_before", f"{(reach_before > 0).mean():.3f} (T {HEADROOM[0]}: the ceiling "
                                             "sharpening alone can lift greedy valid to)")
    cfg = task.spec.config_model.model_validate(fam.env)
    recipe = Recipe(**{**fam.recipe, **ONE_LOOP, **(recipe_kw or {}), "steps": max_steps, "seed": seed})
    prompts = max_steps * recipe.prompts_per_step
    if learner == "sft":  # the expert's plans for fresh training boards (made before the clock starts, like GRPO's rows)
        pairs = sft_pairs(task, cfg, seeds("train", SFT_REFERENCE_BOARDS, start=100_000), task.spec.styles[0])
    else:
        rows = grpo_rows(task, cfg, seeds("train", min(prompts, 30_000), start=100_000), task.spec.styles[0])
    t0, cpu0 = time.perf_counter(), cpu_seconds()

    def ticker(stage: str, step: int, total: int, logs: dict) -> None:
        if step % 25 == 0:
            what = f"reward={logs.get('reward', float('nan')):.3f}" if stage == "grpo" else \
                f"loss={logs.get('loss', float('nan')):.3f}"
            # the budget clock's seconds: training only (a curve reading pushes clock.t0 forward by its own time)
            print(f"  {stage} {step} {what} t={time.perf_counter() - clock.t0:.0f}s", flush=True)

    clock = time_budget(budget_s, anneal=anneal, start=t0)
    curve = curve_callback(tok, task, held, before, curve_every, clock, fam.max_new_tokens) if curve_every else None
    extra = [clock] + ([curve] if curve else [])
    if learner == "sft":
        # warm-up 40 of a nominal 4000 steps (more than 600 s holds at ~0.3 s/step); the clock stops and anneals it
        sm = train_sft(model, tok, pairs, Recipe(sft_steps=4000, warmup_ratio=0.01, seed=seed),
                       progress=ticker, callbacks=extra, schedule="constant")
        steps, dead = sm.steps, float("nan")
    else:
        m = train_grpo(model, tok, rows, reward_fn(task, task.spec.shaping_model.model_validate(fam.shaping)), recipe,
                       progress=ticker, callbacks=extra)
        steps, dead = len(m.steps), m.dead_group_share
    secs = time.perf_counter() - t0 - (curve.paused if curve else 0.0)  # training seconds, the curve's reads excluded
    cpu = cpu_seconds() - cpu0  # the curve's reads included
    after = rung_eval(model, tok, task, held, fam.max_new_tokens)
    reach_after = reach(model, tok, task, held)
    eff, lo, hi = paired_bootstrap(before["per_board"], after["per_board"], 4000, 0.025, np.random.default_rng(0))
    oeff, olo, ohi = paired_bootstrap(before["optimal_per_board"], after["optimal_per_board"], 4000, 0.025,
                                      np.random.default_rng(1))
    seff, slo, shi = paired_bootstrap(before["sampled_per_board"], after["sampled_per_board"], 4000, 0.025,
                                      np.random.default_rng(3))
    slices = {}
    for value in sorted({s[fam.slice_key] for s in before["slices"]}, key=lambda v: (len(v), v)):
        ix = np.array([i for i, s in enumerate(before["slices"]) if s[fam.slice_key] == value])
        se, sl, sh = paired_bootstrap(before["per_board"][ix], after["per_board"][ix], 4000, 0.025,
                                      np.random.default_rng(2))
        slices[value] = {"before": float(before["per_board"][ix].mean()),
                         "after": float(after["per_board"][ix].mean()), "effect": se, "ci95": (sl, sh),
                         "n": int(ix.size)}
        _say(f"rung3_{fam.slice_key}{value}", f"{slices[value]['before']:.3f} -> {slices[value]['after']:.3f} "
                                             f"[{sl:+.3f}, {sh:+.3f}]")
    res = {"task": family, "boards": len(held), "valid_before": before["valid"], "valid_after": after["valid"], "effect": eff,
           "ci95": (lo, hi), "optimal_before": before["optimal"], "optimal_after": after["optimal"],
           "optimal_effect": oeff, "optimal_ci95": (olo, ohi), "sampled_before": before["sampled"],
           "sampled_after": after["sampled"], "sampled_effect": seff, "sampled_ci95": (slo, shi), "slices": slices,
           "steps": steps, "learner": learner,
           f"pass@{HEADROOM[1]}_before": float((reach_before > 0).mean()),
           f"pass@{HEADROOM[1]}_after": float((reach_after > 0).mean()),
           "greedy_valid_where_never_sampled_before": float(after["per_board"][reach_before == 0].mean()
                                                           if (reach_before == 0).any() else float("nan")),
           "curve": curve.points if curve else [], "train_seconds": secs, "train_cpu_seconds": cpu,
           "threads": torch.get_num_threads(), "anneal": anneal,
           "dead_group_share": dead,
           "recipe": recipe.model_dump() if learner == "grpo" else {"sft_learning_rate": Recipe().sft_learning_rate,
                                                                   "boards": SFT_REFERENCE_BOARDS}, "shaping": fam.shaping,
           "warm_start": {"sft_examples": sft_examples, "sft_steps": sft_steps, "preset": preset,
                          "blind_share": blind_share}}
    _say("rung3_valid_after", after["valid"])
    _say("rung3_effect", f"{eff:+.4f} [{lo:+.4f}, {hi:+.4f}] (95% paired bootstrap)")
    _say("rung3_optimal", f"{before['optimal']:.3f} -> {after['optimal']:.3f} [{olo:+.4f}, {ohi:+.4f}]")
    _say("rung3_sampled", f"{before['sampled']:.3f} -> {after['sampled']:.3f} {seff:+.4f} [{slo:+.4f}, {shi:+.4f}] "
                          f"(T {SAMPLED_EVAL[0]}, {SAMPLED_EVAL[1]} samples per board)")
    _say(f"rung3_pass@{HEADROOM[1]}", f"{(reach_before > 0).mean():.3f} -> {(reach_after > 0).mean():.3f}")
    _say("rung3_gain_outside_reach", f"{res['greedy_valid_where_never_sampled_before']:.3f} greedy valid after, on "
                                     f"the {int((reach_before == 0).sum())} boards never sampled valid before")
    _say("rung3_steps", steps)
    _say("rung3_train_seconds", secs)
    _say("rung3_train_cpu_seconds", cpu)
    if learner == "sft":  # a reference, not the rung: it passes or fails nothing
        _say("rung3_reference", f"supervised learning on expert plans, {secs:.0f} s: {eff:+.3f}")
        return res
    res["passed"] = bool(eff >= fam.gain and lo > 0 and secs <= budget_s + 60
                         and all(s["ci95"][0] > -0.05 or s["effect"] >= 0 for s in slices.values()))
    _say("rung3_passed", res["passed"])
    return res


def run(out: str | Path = "runs/bench-ladder", rungs: tuple[int, ...] = (1, 2, 3), budget_s: float = 600.0,
        threads: int | str = 1, max_steps: int = 1500, preset: str = "tiny", warm: str = "undertrained",
        blind_share: float | None = None, learner: str = "grpo",
        recipe_kw: dict[str, Any] | None = None, curve_every: float | None = None, seed: int = 0,
        family: str = "mapf", sft_steps: int | None = None, anneal: bool = True,
        sft_examples: int | None = None) -> dict[str, Any]:
    if threads == "auto":  # the count a run of rung 3's model uses on this host (harness.threads)
        from harness.tasks import get_task
        from harness.threads import auto_for_model, step_shape
        from policies.model import build_model
        from policies.train import Recipe

        task, fam = get_task(family), RUNGS[family]
        model, tok = build_model(preset, task.spec.alphabet, words=list(task.spec.words))
        shape, note = step_shape(task, task.spec.config_model.model_validate(fam.env),
                                 Recipe(**{**fam.recipe, **(recipe_kw or {})}), tok, task.spec.styles[0])
        threads, why = auto_for_model(model, shape)
        why = f"{why}; {note}" if note else why
        _say("threads", f"{threads} ({why})")
    else:
        cpu_threads(int(threads))
        _say("threads", int(threads))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {}
    if 1 in rungs:
        res["rung1"] = rung1()
    if 2 in rungs:
        res["rung2"] = rung2(seed=seed, recipe_kw=recipe_kw)
    if 3 in rungs:
        # the noisy teacher's size unless --sft-examples / --sft-steps say otherwise (given, they win)
        warm_kw = {**(NOISY_TEACHER if warm == "noisy" else {}),
                   **({} if blind_share is None else {"blind_share": blind_share}),
                   **{k: v for k, v in (("sft_steps", sft_steps), ("sft_examples", sft_examples)) if v is not None}}
        res["rung3"] = rung3(out, budget_s=budget_s, max_steps=max_steps, preset=preset, learner=learner,
                             recipe_kw=recipe_kw, curve_every=curve_every, seed=seed, family=family, anneal=anneal,
                             **warm_kw)
    (out / "ladder.json").write_text(json.dumps(res, indent=1, default=float))
    return res
