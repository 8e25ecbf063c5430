"""Greedy (and sampled) pass rates of code-family checkpoints on 300 held-out depth-2 and 300 depth-3 problems (vocab 6,
test seeds from index 5000), each paired against the first checkpoint (95% paired bootstrap). BENCHMARKS.md, "Code
family", the dynamic-sampling table.

    .venv/bin/python scripts/code_heldout.py /tmp/cx/sft1 /tmp/cx/gA /tmp/cx/gC
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from harness.backtest import paired_bootstrap
from harness.policy_glue import evaluate
from harness.seeds import seeds
from harness.tasks import get_task
from harness.tasks.code import CodeConfig, LevelEntry
from policies.model import load_policy
from policies.rollout import SamplingParams


def outcomes(path: str, n: int = 300) -> dict[str, np.ndarray]:
    task = get_task("code")
    model, tok = load_policy(path)
    out = {}
    for d in (2, 3):
        insts = [task.generate(CodeConfig(levels=[LevelEntry(depth=d, vocab=6)]), s) for s in seeds("test", n, 5000)]
        out[f"d{d}_greedy"] = np.array([r.valid for r in evaluate(model, tok, task, insts).rollouts], float)
        sampled = evaluate(model, tok, task, insts, params=SamplingParams(temperature=1.0, n=4, max_new_tokens=40,
                                                                          batch_size=64, seed=1))
        out[f"d{d}_sampled"] = np.array([r.valid for r in sampled.rollouts], float)
    return out


def main(paths: list[str]) -> None:
    torch.set_num_threads(2)
    base = None
    for path in paths:
        res = outcomes(path)
        line = []
        for key, v in res.items():
            text = f"{key}={100 * v.mean():.1f}%"
            if base is not None and key.endswith("greedy"):  # the gate's own paired bootstrap, 95% two-sided
                eff, lo, hi = paired_bootstrap(base[key], v, 10_000, 0.025, np.random.default_rng(0))
                d = v - base[key]
                text += (f" ({100 * eff:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}], "
                         f"flips +{int((d > 0).sum())}/-{int((d < 0).sum())})")
            line.append(text)
        print(f"{path}: " + "  ".join(line), flush=True)
        base = base or res


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: scripts/code_heldout.py BASE_CKPT [CKPT ...]")
    main(sys.argv[1:])
