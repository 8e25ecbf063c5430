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


def draw_suite(task: Task, name: str, split: str = "test", start: int = 0) -> list[tuple[str, Instance]]:
    """[(entry name, instance)] for every block of `task.suite(name)`, seeds from `split` starting at index `start`."""
    out: list[tuple[str, Instance]] = []
    offset = start
    for entry in task.suite(name):
        for seed in seeds(split, entry.n, offset):
            out.append((entry.name, task.generate(entry.config, seed)))
        offset += entry.n
    return out
