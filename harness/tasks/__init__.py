"""Task families. `get_task(name)` returns the task object; see `base.Task` for the protocol, `base.TaskSpec` for
what a family declares as data, and `BatchScorer`, `EnvStats`, `VetConfigs`, `Mixture` for its optional capabilities."""

from __future__ import annotations

import importlib

from harness.tasks.base import BatchScorer, EnvStats, Instance, Mixture, Outcome, SuiteEntry, Task, TaskSpec, VetConfigs

DEFAULT_TASK = "mapf"  # a run config without `task:` runs this family
TASKS = {"mapf": "harness.tasks.mapf", "math": "harness.tasks.arith", "code": "harness.tasks.code",
         "reasoning": "harness.tasks.reasoning"}


class UnknownTaskError(ValueError):
    pass


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise UnknownTaskError(f"unknown task {name!r}; choose one of: {', '.join(sorted(TASKS))}")
    return importlib.import_module(TASKS[name]).TASK


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_think(completion: str) -> tuple[str, int]:
    """`(answer, think_chars)`: a completion with the reasoning block a thinking chat model (Qwen3, DeepSeek-R1) writes
    before its answer, `<think>...</think>`, split off. The answer is what follows `</think>` (leading whitespace
    dropped); a block never closed (the model ran out of tokens thinking) leaves no answer. `think_chars` counts the
    block's characters, tags included (0 without a block)."""
    head = completion.lstrip()
    if not head.startswith(THINK_OPEN):
        return completion, 0
    end = head.find(THINK_CLOSE)
    if end < 0:
        return "", len(head)
    cut = end + len(THINK_CLOSE)
    return head[cut:].lstrip(), cut


def score_all(task: Task, pairs: list[tuple[Instance, str]], shaping=None) -> list[Outcome]:
    """Score (instance, completion) pairs: the task's batch scorer where it has one (code runs a batch of programs in
    parallel sandboxes), else its `score` one by one. A leading `<think>...</think>` block is stripped before scoring
    (`split_think`); its length is reported as the outcome's `think_chars` metric."""
    split = [split_think(c) for _, c in pairs]
    pairs = [(inst, answer) for (inst, _), (answer, _) in zip(pairs, split, strict=True)]
    outs = task.score_many(pairs, shaping) if isinstance(task, BatchScorer) else [task.score(inst, comp, shaping)
                                                                                  for inst, comp in pairs]
    return [o.model_copy(update={"metrics": {**o.metrics, "think_chars": float(chars)}}) if chars else o
            for o, (_, chars) in zip(outs, split, strict=True)]


def generate_many(task_name: str, config_json: str, seeds: list[int]) -> list[Instance]:
    """The task's instances for `seeds` under a config given as JSON: the body of the run's background prefetch
    worker (a spawned process that imports only this package, not torch)."""
    task = get_task(task_name)
    config = task.spec.config_model.model_validate_json(config_json)
    return [task.generate(config, s) for s in seeds]


__all__ = ["DEFAULT_TASK", "TASKS", "BatchScorer", "EnvStats", "Instance", "Mixture", "Outcome", "SuiteEntry", "Task", "TaskSpec",
           "UnknownTaskError", "VetConfigs", "generate_many", "get_task", "score_all", "split_think"]
