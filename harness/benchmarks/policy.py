"""Policy-layer benchmark on CPU: SFT warm start then GRPO on MAPF-FrozenLake, held-out valid / optimal per slice after
each stage with wall times, rollout throughput of our engine vs plain `model.generate`, and GRPO seconds per step for
each preset. Prints grep-able `key: value` lines and writes `summary.json` to the output folder.

    evotrainer bench policy                       # full run (about 13 minutes on the 2-core machine)
    evotrainer bench policy --sft-steps 100 --grpo-steps 4 --skip-small    # quick smoke run
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console

from policies import cpu_threads

console = Console()

def _ticker(t0: float):
    """Progress hook: one line every 100 SFT steps / 5 GRPO steps, with elapsed seconds."""

    def hook(stage: str, step: int, total: int, logs: dict) -> None:
        if step % (100 if stage == "sft" else 5) == 0 or step == total:
            key = "reward" if stage == "grpo" else "loss"
            console.print(f"  {stage} {step}/{total} {key}={logs.get(key, float('nan')):.3f} "
                          f"t={time.perf_counter() - t0:.0f}s", highlight=False)

    return hook


# --- pieces -----------------------------------------------------------------------------------------------------------


def rollout_throughput(model, tok, prompts: list[str], n: int, max_new_tokens: int, repeats: int = 2) -> dict:
    """New tokens/s of `policies.rollout.generate` vs one `model.generate` call on the same batch (best of repeats)."""
    from policies.rollout import SamplingParams, generate, plain_generate

    p = SamplingParams(temperature=1.0, n=n, max_new_tokens=max_new_tokens, seed=0, batch_size=len(prompts) * n)
    ours = max((generate(model, tok, prompts, p) for _ in range(repeats)), key=lambda r: r.tokens_per_s)
    ref = max((plain_generate(model, tok, prompts, p) for _ in range(repeats)), key=lambda r: r.tokens_per_s)
    return {"rows": len(prompts) * n, "ours_tok_s": ours.tokens_per_s, "generate_tok_s": ref.tokens_per_s,
            "ours_new_tokens": ours.new_tokens, "generate_new_tokens": ref.new_tokens,
            "speedup": ours.tokens_per_s / max(ref.tokens_per_s, 1e-9)}


def grpo_seconds_per_step(task, config, preset: str, sft_steps: int, steps: int, recipe_kw: dict,
                          style: str = "trace") -> dict:
    """Short SFT (so completions end at <eos> as in real use) then `steps` GRPO steps; returns seconds per step."""
    from harness.policy_glue import grpo_rows, reward_fn, sft_pairs
    from harness.seeds import seeds
    from policies.model import build_model, count_parameters
    from policies.train import Recipe, train_grpo, train_sft

    recipe = Recipe(**{**recipe_kw, "sft_steps": sft_steps, "steps": steps})
    model, tok = build_model(preset, task.spec.alphabet, words=list(task.spec.words))
    if sft_steps:
        train_sft(model, tok, sft_pairs(task, config, seeds("train", 500), style), recipe)
    rows = grpo_rows(task, config, seeds("train", steps * recipe.prompts_per_step, start=500), style)
    m = train_grpo(model, tok, rows, reward_fn(task), recipe)
    per = [s.seconds for s in m.steps[1:]] or [m.steps[0].seconds]  # first step pays one-off setup
    return {"preset": preset, "params": count_parameters(model), "steps": steps, "batch": recipe.batch_size,
            "s_per_step": sum(per) / len(per), "completion_length": sum(s.completion_length for s in m.steps) / steps}


def _wide(report) -> dict:
    return {"valid": report.valid, "optimal": report.optimal, "n": report.n,
            "by_size": {k: {"valid": v.valid, "optimal": v.optimal, "n": v.n}
                        for k, v in report.by_slice["size"].items()}}


def _rates(report) -> dict:
    return {"valid": report.valid, "optimal": report.optimal, "n": report.n, "eval_s": report.seconds,
            "by_slice": {k: {v: s.model_dump() for v, s in vals.items()} for k, vals in report.by_slice.items()},
            "failures": report.failures}


def _print_wide(report, label: str) -> None:
    sizes = "  ".join(f"{k}x{k} {v.valid:.1%} valid / {v.optimal:.1%} optimal"
                      for k, v in sorted(report.by_slice["size"].items()))
    console.print(f" {label}, 2-agent held-out ({report.n // len(report.by_slice['size'])} per size): {sizes}",
                  highlight=False)


# --- the benchmark ----------------------------------------------------------------------------------------------------


def run(out: Path, preset: str = "tiny", sft_examples: int = 8000, sft_steps: int = 2400, grpo_steps: int = 30,
        suite: str = "small", threads: int = 2, skip_small: bool = False, config_path: Path | None = None,
        max_new_tokens: int = 160, grpo_max_tokens: int = 96, small_sft_steps: int = 100, style: str = "trace",
        grpo_learning_rate: float = 1e-4, grpo_temperature: float = 0.6) -> dict:
    from harness.benchmarks.ladder import held_out as rung_held_out
    from harness.policy_glue import evaluate, grpo_rows, print_eval, reward_fn, sft_pairs, suite_blocks, suite_instances
    from harness.seeds import seeds
    from harness.tasks import get_task
    from policies.model import build_model, count_parameters, save_policy
    from policies.rollout import SamplingParams
    from policies.train import Recipe, train_grpo, train_sft

    cpu_threads(threads)
    task = get_task("mapf")
    if style not in task.spec.styles:
        raise ValueError(f"unknown style {style!r}; choose one of: {', '.join(task.spec.styles)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if config_path:
        import yaml

        config = task.spec.config_model.model_validate(yaml.safe_load(Path(config_path).read_text()))
    else:  # the brief's setting: 2-agent boards of sizes 3-5, the suite's holes and wait ratio
        config = task.spec.config_model.model_validate(
            {"sizes": [{"size": s, "agents": 2, "hole_ratio": 0.2, "wait_ratio": 0.5} for s in (3, 4, 5)]})
    recipe = Recipe(sft_steps=sft_steps, steps=grpo_steps, max_completion_length=grpo_max_tokens,
                    learning_rate=grpo_learning_rate, temperature=grpo_temperature)
    held_out, blocks = suite_instances(task, suite), suite_blocks(task, suite)
    wide = rung_held_out(task, "mapf")  # 100 2-agent boards per size 3, 4, 5 (the suite has 16 per block)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, batch_size=64)
    summary: dict = {"preset": preset, "suite": suite, "threads": threads, "recipe": recipe.model_dump(),
                     "config": json.loads(config.model_dump_json())}

    t0 = time.perf_counter()
    model, tok = build_model(preset, task.spec.alphabet, words=list(task.spec.words), seed=recipe.seed)
    summary["params"] = count_parameters(model)
    summary["style"] = style
    pairs = sft_pairs(task, config, seeds("train", sft_examples), style)
    summary["prompt_chars"] = sum(len(p["prompt"]) for p in pairs) / len(pairs)
    summary["completion_chars"] = sum(len(p["completion"]) for p in pairs) / len(pairs)
    def checkpoint(name: str, title: str) -> tuple[dict, float]:
        """Save the policy as out/<name>, evaluate it on the suite and the wide 2-agent set, print both."""
        save_policy(model, tok, out / name)
        rep = evaluate(model, tok, task, held_out, style, params=greedy, blocks=blocks)
        t = time.perf_counter() - t0
        print_eval(rep, title, console)
        wide_rep = evaluate(model, tok, task, wide, style, params=greedy)
        _print_wide(wide_rep, f"after {name.upper()}")
        wide_reps[name] = wide_rep
        return {"wide": _wide(wide_rep), **_rates(rep)}, t

    wide_reps: dict = {}
    sft = train_sft(model, tok, pairs, recipe, progress=_ticker(t0))
    rates, t_sft = checkpoint("sft", f"after SFT ({sft_steps} steps, {sft_examples} demos)")
    summary["sft"] = {"wall_s": sft.wall_s, "loss_first": sft.loss[0], "loss_last": sft.loss[-1],
                      "total_s_incl_eval": t_sft, **rates}

    rows = grpo_rows(task, config, seeds("train", grpo_steps * recipe.prompts_per_step, start=sft_examples), style)
    grpo = train_grpo(model, tok, rows, reward_fn(task), recipe, progress=_ticker(t0))
    rates, t_all = checkpoint("grpo", f"after GRPO ({grpo_steps} steps)")
    summary["grpo"] = {"wall_s": grpo.wall_s, "s_per_step": grpo.seconds_per_step,
                       "dead_group_share": grpo.dead_group_share, "tokens_generated": grpo.tokens_generated,
                       "reward_first": grpo.steps[0].reward_mean, "reward_last": grpo.steps[-1].reward_mean,
                       "total_s_incl_evals": t_all, **rates}

    prompts = [task.prompt(i, style) for i in held_out[:32]]
    summary["rollout"] = rollout_throughput(model, tok, prompts, n=8, max_new_tokens=max_new_tokens)
    speeds = [{"preset": preset, "params": summary["params"], "s_per_step": grpo.seconds_per_step,
               "batch": recipe.batch_size, "completion_length": sum(s.completion_length for s in grpo.steps)
               / len(grpo.steps)}]
    if not skip_small and preset != "small":
        speeds.append(grpo_seconds_per_step(task, config, "small", sft_steps=small_sft_steps, steps=4,
                                            recipe_kw={"max_completion_length": grpo_max_tokens}, style=style))
    summary["grpo_speed"] = speeds
    (out / "summary.json").write_text(json.dumps(summary, indent=2))

    r = summary["rollout"]
    for stage, rep in wide_reps.items():
        for k, v in sorted(rep.by_slice["size"].items()):
            console.print(f"{stage}_valid_2agent_{k}x{k}: {v.valid:.4f}", highlight=False)
    console.print(f"sft_s: {sft.wall_s:.1f}\nsft_valid: {summary['sft']['valid']:.4f}\n"
                  f"sft_optimal: {summary['sft']['optimal']:.4f}\ngrpo_s: {grpo.wall_s:.1f}\n"
                  f"grpo_valid: {summary['grpo']['valid']:.4f}\ngrpo_optimal: {summary['grpo']['optimal']:.4f}\n"
                  f"total_s: {t_all:.1f}\nrollout_tok_s: {r['ours_tok_s']:.0f}\ngenerate_tok_s: {r['generate_tok_s']:.0f}"
                  f"\nrollout_speedup: {r['speedup']:.2f}", highlight=False)
    for s in speeds:
        console.print(f"grpo_s_per_step_{s['preset']}: {s['s_per_step']:.2f}", highlight=False)
    return summary
