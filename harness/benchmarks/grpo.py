"""Seconds per GRPO step on CPU, the fast path against today's reference in the same process (`evotrainer bench grpo`).

    evotrainer bench grpo                       # tiny preset, the demo's recipe, 3 interleaved repeats (~2-3 minutes)
    evotrainer bench grpo --preset small --steps 4
    evotrainer bench grpo --recipe rung3        # rung 3's recipe (oversample 3, dead groups dropped)

The policy is a partial MAPF warm start (SFT on expert trace plans, cached in `--out`; shorter than the demo's, so
completions are somewhat shorter). Both paths train a fresh copy of it with the same recipe, seed and prompts:

- reference: `compact_decode=False, shared_prompt_loss=False, sampler="multinomial", prune_dead_groups=False` (the
  model's own forward every decoded token, torch.multinomial for each draw, and TRL's loss forward and backward over
  every prompt + padded completion position of every group);
- fast: the recipe defaults (`policies.rollout.CompactLlama` decoding, inverse-CDF draws, `policies.train.
  shared_prompt_logps`, the loss on the live groups only: `prune_dead_groups`).

Runs alternate reference, fast, reference, fast, ... (`--repeats` pairs), so a machine shared with other work slows
both alike; a run's seconds per step is the median of its steps after the first (warm-up), and `speedup_vs_reference`
is the median over pairs of reference / fast. FLOP/s are useful work, not executed work: 2N FLOPs per position decoded
or prefilled and 6N per position of the batch trained (N = matmul parameters, the tied LM head included; attention
excluded; the whole batch is the work the reference's loss does, while the fast path's loss runs only the live
groups, `<path>_loss_group_share` of them, for the same gradient), the
positions being each step's distinct prompts plus its generated tokens; divided by the seconds of generation (our
engine's timer) and of the rest of the step (loss forward, backward, optimiser, reward, TRL bookkeeping). The roofline
is `torch.matmul` of (8192 x hidden) @ (hidden x mlp) in this process with the same threads, fp32, and bf16 where the
CPU has native bf16 matmuls (oneDNN reports AVX512-BF16 / AMX); elsewhere bf16 is reported unavailable.
Prints grep-able `key: value` lines and writes `grpo.json` to `--out`.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

from policies import cpu_threads

# the demo's recipe (examples/mapf_quick.yaml) and rung 3's (harness/benchmarks/ladder.py), steps set by --steps
DEMO_RECIPE: dict[str, Any] = {"batch_size": 64, "num_generations": 8, "learning_rate": 2e-4, "temperature": 0.5,
                               "beta": 0.0, "warmup_ratio": 0.1, "lr_schedule": "constant",
                               "max_completion_length": 96}
REFERENCE = {"compact_decode": False, "shared_prompt_loss": False, "sampler": "multinomial", "prune_dead_groups": False,
             "pipeline": False}


def _say(key: str, value: Any) -> None:
    print(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}", flush=True)


def matmul_roofline(hidden: int, mlp: int, dtype, seconds: float = 0.5) -> float:
    """FLOP/s of (8192 x hidden) @ (hidden x mlp) in `dtype`, best of repeated timings over about `seconds`."""
    import torch

    a, b = torch.randn(8192, hidden).to(dtype), torch.randn(hidden, mlp).to(dtype)
    for _ in range(3):
        a @ b
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * 8192 * hidden * mlp / best


def bf16_matmul_native() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (oneDNN: AVX512-BF16 or AMX); elsewhere bf16 is emulated
    and slower than fp32."""
    import torch

    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def matmul_params(model) -> int:
    """Parameters that take part in matrix multiplications per position: every Linear plus the LM head."""
    import torch

    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    head = model.get_output_embeddings()
    return n + (head.weight.numel() if not isinstance(head, torch.nn.Linear) else 0)


# the fast path is one loop (the pipeline off whatever `auto` would pick on this host), the pipelined path two
PATHS: dict[str, dict[str, Any]] = {"reference": REFERENCE, "fast": {"pipeline": False}, "pipelined": {"pipeline": True}}


def _one(model, tok, rows, reward, recipe, path: str) -> dict[str, Any]:
    from policies.train import Recipe, train_grpo

    r = Recipe(**{**recipe, **PATHS[path]})
    m = train_grpo(copy.deepcopy(model), tok, rows, reward, r)
    groups = r.prompts_per_step // r.oversample
    steps = m.steps[1:] or m.steps  # the first step pays one-off costs
    return {"s_per_step": statistics.median(s.seconds for s in steps),
            "gen_s": statistics.median(s.generation_seconds or 0.0 for s in steps),
            "tokens": statistics.median(s.tokens_generated for s in steps),
            "reward": [s.reward_mean for s in m.steps], "wall_s": m.wall_s,
            "pipelined": statistics.mean(s.pipelined or 0.0 for s in steps),
            "live_share": statistics.median(  # of the groups a step's loss holds (the sampled ones, oversampling aside)
                (s.live_groups if s.live_groups is not None else groups) / groups for s in steps)}


def run(out: Path = Path("runs/bench-grpo"), preset: str = "tiny", recipe: str = "demo", steps: int = 8,
        repeats: int = 3, threads: int = 1, sft_steps: int = 300, sft_examples: int = 1500,
        reference: bool = True, checkpoint: Path | None = None, config: Path | None = None,
        pipeline: bool = False) -> dict[str, Any]:
    """`checkpoint`: a saved policy (ours, or a Hugging Face Llama-style causal LM) instead of the bench's partial
    MAPF warm start; `config`: a run config whose task, round-0 env (the boards or problems) and prompt style the
    steps train on, instead of MAPF's rung-3 boards in the trace style. Its recipe is not used: `recipe` picks it."""
    import torch

    from harness.benchmarks.ladder import RUNG3_ENV, RUNG3_RECIPE, partial_warm_start
    from harness.policy_glue import grpo_rows, reward_fn
    from harness.seeds import seeds
    from harness.tasks import get_task
    from policies.model import format_prompt, load_policy

    cpu_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if config is not None:
        from harness.config import load_config
        from harness.round0 import harness_models, round0_files

        run_cfg = load_config(config)
        task = get_task(run_cfg.task)
        cfg = harness_models(round0_files(run_cfg), task)[0]
        style = run_cfg.style
    else:
        task, style = get_task("mapf"), "trace"
        cfg = task.spec.config_model.model_validate(RUNG3_ENV)
    if checkpoint is not None:
        model, tok = load_policy(checkpoint)
        model.to("cpu").train(False)
    else:
        model, tok = partial_warm_start(out, "mapf", sft_examples=sft_examples, sft_steps=sft_steps, preset=preset)
    _say("warm_start_s", time.perf_counter() - t0)
    base = {**(DEMO_RECIPE if recipe == "demo" else RUNG3_RECIPE), "steps": steps + 1}
    per_step = base["batch_size"] // base["num_generations"] * base.get("oversample", 1)
    rows = grpo_rows(task, cfg, seeds("train", per_step * (steps + 1)), style)
    reward = reward_fn(task)
    prompt_len = statistics.mean(len(tok(format_prompt(tok, r["prompt"]))["input_ids"]) for r in rows)
    hidden, mlp = model.config.hidden_size, getattr(model.config, "intermediate_size", 4 * model.config.hidden_size)
    n_mm = matmul_params(model)
    res: dict[str, Any] = {"preset": preset if checkpoint is None else None, "recipe": recipe, "steps": steps,
                           "repeats": repeats, "threads": threads, "matmul_params": n_mm, "prompt_tokens": prompt_len,
                           "cpu": torch.backends.cpu.get_cpu_capability(),
                           "checkpoint": str(checkpoint) if checkpoint else None,
                           "config": str(config) if config else None, "task": task.name}
    res["roofline_fp32_flops"] = matmul_roofline(hidden, mlp, torch.float32)
    res["bf16_native"] = bf16_matmul_native()
    if res["bf16_native"]:
        res["roofline_bf16_flops"] = matmul_roofline(hidden, mlp, torch.bfloat16)
    _say("preset", preset if checkpoint is None else f"checkpoint {checkpoint}")
    _say("task", f"{task.name} ({config or 'the rung-3 boards'}, style {style})")
    _say("recipe", recipe)
    _say("cpu_capability", res["cpu"])
    _say("roofline_fp32_gflops", res["roofline_fp32_flops"] / 1e9)
    _say("roofline_bf16_gflops", res["roofline_bf16_flops"] / 1e9 if res["bf16_native"] else "n/a (no native bf16)")
    order = [p for p in PATHS if (p != "reference" or reference) and (p != "pipelined" or pipeline)]
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in order}
    for i in range(repeats):
        for path in order:
            r = _one(model, tok, rows, reward, base, path)
            runs[path].append(r)
            _say(f"repeat{i}_{path}_s_per_step", r["s_per_step"])
    res["runs"] = runs

    def summary(path: str) -> dict[str, float]:
        rs = runs[path]
        s = statistics.median(r["s_per_step"] for r in rs)
        gen = statistics.median(r["gen_s"] for r in rs)
        toks = statistics.median(r["tokens"] for r in rs)
        positions = per_step * prompt_len + toks
        train_s = max(s - gen, 1e-9)
        return {"s_per_step": s, "generation_s": gen, "train_s": train_s, "tokens_per_step": toks,
                "generated_tokens_per_s": toks / max(gen, 1e-9),
                "generation_flops": 2 * n_mm * positions / max(gen, 1e-9),
                "train_flops": 6 * n_mm * positions / train_s}

    for path, done in runs.items():
        if not done:
            continue
        sm = res[path] = summary(path)
        _say(f"{path}_s_per_step", sm["s_per_step"])
        _say(f"{path}_generation_s", sm["generation_s"])
        _say(f"{path}_train_s", sm["train_s"])
        _say(f"{path}_generated_tokens_per_s", sm["generated_tokens_per_s"])
        _say(f"{path}_loss_group_share", statistics.median(r.get("live_share", 1.0) for r in done))
        # the pipelined path's generation runs beside its training: its seconds are the step's wait (about 0), so
        # FLOP/s over them would be nonsense; the training line is over the whole step
        for part in ("train",) if path == "pipelined" else ("generation", "train"):
            _say(f"{path}_{part}_gflops", sm[f"{part}_flops"] / 1e9)
            _say(f"{path}_{part}_fraction_of_fp32_roofline", sm[f"{part}_flops"] / res["roofline_fp32_flops"])
    if reference:
        ratios = [a["s_per_step"] / b["s_per_step"] for a, b in zip(runs["reference"], runs["fast"])]
        res["speedup_pairs"] = ratios
        res["speedup_vs_reference"] = statistics.median(ratios)
        _say("speedup_pairs", " ".join(f"{x:.2f}" for x in ratios))
        _say("speedup_vs_reference", res["speedup_vs_reference"])
    if pipeline:
        _say("pipelined_step_share", statistics.median(r["pipelined"] for r in runs["pipelined"]))
        ratios = [a["s_per_step"] / b["s_per_step"] for a, b in zip(runs["fast"], runs["pipelined"])]
        res["pipelined_vs_fast"] = statistics.median(ratios)
        _say("pipelined_vs_fast_pairs", " ".join(f"{x:.2f}" for x in ratios))
        _say("pipelined_vs_fast", res["pipelined_vs_fast"])
        if reference:
            ratios = [a["s_per_step"] / b["s_per_step"] for a, b in zip(runs["reference"], runs["pipelined"])]
            res["pipelined_speedup_vs_reference"] = statistics.median(ratios)
            _say("pipelined_speedup_pairs", " ".join(f"{x:.2f}" for x in ratios))
            _say("pipelined_speedup_vs_reference", res["pipelined_speedup_vs_reference"])
    (out / "grpo.json").write_text(json.dumps(res, indent=1))
    return res
