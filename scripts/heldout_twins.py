"""How many held-out instances have a training twin (the same prompt) under a run config's env: the check behind
`harness.seeds.held_apart` (BENCHMARKS.md, fifty-fourth session). Draws `ntrain` train seeds (a run's warm start and
stages draw a few thousand) and `nheld` backtest and test seeds, and counts held-out prompts that a train seed drew.

    .venv/bin/python scripts/heldout_twins.py examples/math_quick.yaml 3512 500
"""

from __future__ import annotations

import sys
import time

import yaml

from harness.seeds import seeds
from harness.tasks import get_task


def main(cfgfile: str, ntrain: int, nheld: int) -> None:
    with open(cfgfile) as fh:
        c = yaml.safe_load(fh)
    task = get_task(c["task"])
    env = task.spec.config_model.model_validate(c["env"])
    t = time.time()
    train: dict[str, int] = {}
    for s in seeds("train", ntrain):
        train.setdefault(task.prompt(task.generate(env, s)), s)
    print(f"distinct train prompts {len(train)} of {ntrain} ({time.time() - t:.1f} s)")
    for split in ("backtest", "test"):
        insts = [task.generate(env, s) for s in seeds(split, nheld)]
        twins = [i for i in insts if task.prompt(i) in train]
        by: dict[str, int] = {}
        for i in twins:
            k = ",".join(f"{a}={b}" for a, b in sorted(task.slices(i).items()))
            by[k] = by.get(k, 0) + 1
        print(f"{split}: {len(twins)}/{nheld} held-out instances have a training twin", by)
        if twins:
            i = twins[0]
            print(f"  e.g. {split} seed {i.seed} == train seed {train[task.prompt(i)]}: {task.prompt(i)[:100]!r}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
