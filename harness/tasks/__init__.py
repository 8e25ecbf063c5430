"""Task families. `get_task(name)` returns the task object; see `base.Task` for the protocol."""

from __future__ import annotations

import importlib

from harness.tasks.base import Instance, Outcome, SuiteEntry, Task

TASKS = {"mapf": "harness.tasks.mapf"}


class UnknownTaskError(ValueError):
    pass


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise UnknownTaskError(f"unknown task {name!r}; choose one of: {', '.join(sorted(TASKS))}")
    return importlib.import_module(TASKS[name]).TASK


__all__ = ["TASKS", "Instance", "Outcome", "SuiteEntry", "Task", "UnknownTaskError", "get_task"]
