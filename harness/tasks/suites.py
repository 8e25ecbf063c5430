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


def draw_suite(task: Task, name: str, split: str = "test", start: int = 0,
               per_entry: int | None = None) -> list[tuple[str, Instance]]:
    """[(entry name, instance)] for every block of `task.suite(name)`, seeds from `split` starting at index `start`.
    per_entry: only the first that many instances of each block (the same seeds as in the full draw)."""
    out: list[tuple[str, Instance]] = []
    offset = start
    for entry in task.suite(name):
        for seed in seeds(split, min(entry.n, per_entry if per_entry is not None else entry.n), offset):
            out.append((entry.name, task.generate(entry.config, seed)))
        offset += entry.n
    return out
