"""GRPO settings sweep from one SFT checkpoint: for each recipe override, GRPO from the same start on the same train
prompts, then greedy valid on 300 held-out 2-agent boards (100 per size 3, 4, 5; test seeds no suite uses).

    .venv/bin/python scripts/grpo_sweep.py CKPT '{"learning_rate": 2e-4}' '{"learning_rate": 1e-4, "temperature": 0.6}'

CKPT: an SFT checkpoint in the trace style (e.g. `<out>/sft` of `evotrainer bench policy`). Each override is a JSON
object of `policies.train.Recipe` fields (default: 30 steps, max 96 completion tokens). Prints one line per override.
"""

from __future__ import annotations

import json
import sys
import time

from policies import cpu_threads


def main(ckpt: str, specs: list[str]) -> None:
    cpu_threads(2)
    from harness.benchmarks.ladder import held_out
    from harness.policy_glue import evaluate, grpo_rows, reward_fn
    from harness.seeds import seeds
    from harness.tasks import get_task
    from policies.model import load_policy
    from policies.rollout import SamplingParams
    from policies.train import Recipe, train_grpo

    task = get_task("mapf")
    cfg = task.config_model.model_validate(
        {"sizes": [{"size": s, "agents": 2, "hole_ratio": 0.2, "wait_ratio": 0.5} for s in (3, 4, 5)]})
    held = held_out(task, "mapf")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=160, batch_size=64)

    def ev(model, tok) -> str:
        r = evaluate(model, tok, task, held, "trace", params=greedy)
        sizes = " ".join(f"{k}x{k}={v.valid:.3f}" for k, v in sorted(r.by_slice["size"].items()))
        return f"valid={r.valid:.3f} ({sizes})"

    model, tok = load_policy(ckpt)
    print(f"start: {ev(model, tok)}", flush=True)
    rows = grpo_rows(task, cfg, seeds("train", 400, start=100_000), "trace")
    for spec in specs:
        model, tok = load_policy(ckpt)
        recipe = Recipe(**{"steps": 30, "max_completion_length": 96, **json.loads(spec)})
        t0 = time.perf_counter()
        m = train_grpo(model, tok, rows, reward_fn(task), recipe)
        last = sum(s.reward_mean for s in m.steps[-5:]) / min(5, len(m.steps))
        print(f"{spec}: grpo {time.perf_counter() - t0:.1f} s, dead groups {m.dead_group_share:.2f}, "
              f"reward first {m.steps[0].reward_mean:.2f} last5 {last:.2f}, {ev(model, tok)}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
