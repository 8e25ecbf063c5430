"""The SFT warm start's seconds per step at each thread count, side by side in one process, and what `scale.threads:
auto` chooses for it and for the stages (issue 34: the GRPO probe's choice made the demo's SFT slower).

    python -m harness.benchmarks.sft_threads [CONFIG] [STEPS]      # default examples/mapf_quick.yaml, 100 steps

For each thread count (1, 2, ... up to the cores, then again in reverse order, the faster of the two kept): a fresh
model of the config's preset (same seed) trained `STEPS` SFT steps on the config's demonstrations (its round-0 env,
its SFT batch and learning rate), the steps timed apart from the trainer's setup; then the choices
`harness.threads` makes (the SFT's fixed count under auto, and the stages' probe, measured now, not read from a
cache). Prints `key: value` lines. Run it on an idle machine: the figures are ratios between thread counts.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(config: str | Path = ROOT / "examples" / "mapf_quick.yaml", steps: int = 100) -> dict[str, float]:
    import os
    import tempfile

    import torch

    from harness import threads
    from harness.backtest import read_harness
    from harness.config import load_config
    from harness.policy_glue import sft_pairs
    from harness.round0 import round0_files
    from harness.seeds import seeds
    from harness.tasks import get_task
    from policies.model import build_model
    from policies.train import train_sft

    cfg = load_config(config)
    task = get_task(cfg.task)
    env, recipe, _ = read_harness(round0_files(cfg), task)
    recipe = recipe.model_copy(update={"sft_steps": steps})
    pairs = sft_pairs(task, env, seeds("train", min(cfg.warm_start.sft_examples or 3000, 3000)), cfg.style)
    out: dict[str, float] = {}
    opts = threads.options(threads.cores())
    for n in [*opts, *reversed(opts)]:  # each count twice, in both orders: a first run's warm-up favours the second
        torch.set_num_threads(n)
        model, tok = build_model(cfg.policy.preset, task.spec.alphabet, words=list(task.spec.words), seed=cfg.seed)
        marks: list[tuple[int, float]] = []

        def progress(stage: str, step: int, total: int, logs: dict, marks=marks) -> None:
            marks.append((step, time.perf_counter()))

        t0 = time.perf_counter()
        train_sft(model, tok, pairs, recipe, progress=progress)
        total = time.perf_counter() - t0
        (s0, a), (s1, b) = marks[0], marks[-1]  # the steps alone: trainer setup and dataset preparation excluded
        for key, val in ((f"sft_seconds_per_step_{n}_threads", (b - a) / max(1, s1 - s0)),
                         (f"sft_seconds_with_setup_{n}_threads", total)):
            out[key] = min(out.get(key, val), val)
        print(f"threads {n}: {(b - a) / max(1, s1 - s0):.4f} s/step over steps {s0}-{s1}, {total:.1f} s with setup",
              flush=True)
    for n in opts:
        print(f"sft_seconds_per_step_{n}_threads: {out[f'sft_seconds_per_step_{n}_threads']:.4f}", flush=True)
    with tempfile.TemporaryDirectory() as home:  # the choices measured now, not read from the user's cache
        os.environ["EVOTRAINER_HOME"] = home
        os.environ.pop(threads.ENV, None)
        chosen, why = threads.sft_threads(cfg, task)
        out["auto_sft_threads"] = float(chosen or torch.get_num_threads())
        out["auto_stage_threads"] = float(threads.apply_threads(cfg, task)[0])
        print(f"auto_sft: {chosen} ({why})", flush=True)
    best = min((v, k) for k, v in out.items() if k.startswith("sft_seconds_per_step"))[1]
    print(f"auto_sft_threads: {out['auto_sft_threads']:.0f}\nauto_stage_threads: {out['auto_stage_threads']:.0f}\n"
          f"fastest_sft: {best}", flush=True)
    return out


if __name__ == "__main__":
    main(*(sys.argv[1:2] or [ROOT / "examples" / "mapf_quick.yaml"]), *(int(a) for a in sys.argv[2:3]))
