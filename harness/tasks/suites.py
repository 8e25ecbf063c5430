"""Drawing a task's benchmark suite from held-out seeds (generic over tasks).

A suite is a list of `SuiteEntry` blocks defined in the task's code. Each block draws its `n` instances from its own
consecutive run of seeds of `split` (default `test`), so blocks never share a seed and the draw is reproducible.

    from harness.tasks import get_task
    from harness.tasks.suites import draw_suite
    for entry, inst in draw_suite(get_task("mapf"), "small"): ...
"""

from __future__ import annotations

from harness.seeds import seeds
from harness.tasks.base import Instance, Task
from harness.tasks.drawn import draw


def draw_env(task: Task, config: dict, n: int, split: str = "test") -> list[tuple[str, Instance]]:
    """[(block, instance)] for `n` instances of a generator config (a scenario's target used as a test set), seeds
    `0..n-1` of `split`. An instance's block is its slices (`size=3,agents=2`), so a per-block table still reads."""
    cfg = task.spec.config_model.model_validate(config)
    return [(",".join(f"{k}={v}" for k, v in sorted(task.slices(inst).items())) or "all", inst)
            for inst in draw(task, cfg, seeds(split, n))]


_DRAWN: dict[tuple[str, str], list[tuple[str, Instance]]] = {}  # draw_test's memo, per process
_DRAWN_MAX = 8


def draw_test(task: Task, eval_cfg) -> list[tuple[str, Instance]]:
    """The held-out test set of a run's `eval` section (`harness.config.EvalConfig`): its generator config's `n`
    instances, or its named suite; cut to `eval.limit`. Drawn once per process for a task and eval section (a
    generator is a function of its config and seed): an experiment's worker runs arm after arm on one test set, and
    drawing 1,000 MAPF boards with their optimal plans took ~5 s of each arm's setup."""
    key = (task.name, eval_cfg.model_dump_json())
    if key not in _DRAWN:
        out = draw_env(task, eval_cfg.env, eval_cfg.n) if eval_cfg.env is not None \
            else draw_suite(task, eval_cfg.suite)
        while len(_DRAWN) >= _DRAWN_MAX:
            _DRAWN.pop(next(iter(_DRAWN)))
        _DRAWN[key] = out[: eval_cfg.limit] if eval_cfg.limit else out
    return list(_DRAWN[key])


def draw_suite(task: Task, name: str, split: str = "test", start: int = 0,
               per_entry: int | None = None) -> list[tuple[str, Instance]]:
    """[(entry name, instance)] for every block of `task.suite(name)`, seeds from `split` starting at index `start`.
    per_entry: only the first that many instances of each block (the same seeds as in the full draw)."""
    out: list[tuple[str, Instance]] = []
    offset = start
    for entry in task.suite(name):
        want = seeds(split, min(entry.n, per_entry if per_entry is not None else entry.n), offset)
        out += [(entry.name, inst) for inst in draw(task, entry.config, want)]
        offset += entry.n
    return out
