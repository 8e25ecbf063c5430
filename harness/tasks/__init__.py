"""Task families. `get_task(name)` returns the task object; see `base.Task` for the protocol, `base.TaskSpec` for
what a family declares as data, and `BatchScorer`, `EnvStats`, `VetConfigs`, `Mixture` for its optional capabilities."""

from __future__ import annotations

import importlib
import re

from harness.sources import READING_CODE, WARM_START_CODE, source_digest
from harness.tasks.base import BatchScorer, EnvStats, Instance, Mixture, Outcome, SuiteEntry, Task, TaskSpec, VetConfigs
from harness.tasks.drawn import code_version

code_version()  # the drawn-instance cache's key is the generators' code as this process imports it, not as edited later

source_digest(WARM_START_CODE)  # and so are the warm-start and held-out-reading caches' (`harness.sources`)
source_digest(READING_CODE)

DEFAULT_TASK = "mapf"  # a run config without `task:` runs this family
TASKS = {"mapf": "harness.tasks.mapf", "math": "harness.tasks.arith", "code": "harness.tasks.code",
         "reasoning": "harness.tasks.reasoning"}


class UnknownTaskError(ValueError):
    pass


ENTRY_POINTS = "evotrainer.tasks"  # a package's own family: `[project.entry-points."evotrainer.tasks"] name = "pkg.mod:TASK"`
ENV_TASKS = "EVOTRAINER_TASKS"  # or, without installing anything: EVOTRAINER_TASKS="sortd=my_tasks.sortd:TASK;..."


def registry() -> dict[str, str]:
    """Every family a run config may name -> where its Task object lives (`module:ATTRIBUTE`, or a module whose `TASK`
    it is): the built-in ones (`TASKS`), those installed packages declare under the `evotrainer.tasks` entry-point
    group, and those `$EVOTRAINER_TASKS` names (`name=module:ATTRIBUTE`, `;`-separated; child processes inherit it).
    A family of your own needs no edit in this package."""
    import os
    from importlib.metadata import entry_points

    out = dict(TASKS)
    for ep in entry_points(group=ENTRY_POINTS):
        out.setdefault(ep.name, ep.value)
    for item in filter(None, (x.strip() for x in os.environ.get(ENV_TASKS, "").split(";"))):
        name, eq, where = item.partition("=")
        if not eq or ":" not in where or not name.strip():
            raise UnknownTaskError(f"{ENV_TASKS}: {item!r} is not name=module:ATTRIBUTE (e.g. "
                                   "sortd=my_tasks.sortd:TASK)")
        out.setdefault(name.strip(), where.strip())
    return out


def known_task(name: str) -> bool:
    return name in registry()


def get_task(name: str) -> Task:
    """The Task object of family `name` (see `registry` for where families come from)."""
    reg = registry()
    if name not in reg:
        raise UnknownTaskError(f"unknown task {name!r}; choose one of {', '.join(sorted(reg))} (a family of your own: "
                               f"an installed package's `{ENTRY_POINTS}` entry point, or {ENV_TASKS}="
                               f"{name}=module:ATTRIBUTE)")
    module, _, attr = reg[name].partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr or "TASK")
    except (ImportError, AttributeError) as exc:
        raise UnknownTaskError(f"task {name!r}: cannot load {reg[name]!r}: {exc}") from None
    if not isinstance(obj, Task):
        raise UnknownTaskError(f"task {name!r}: {reg[name]} is a {type(obj).__name__}, not a Task "
                               "(harness/tasks/base.py)")
    if obj.name != name:  # workers and records find a family again by its name
        raise UnknownTaskError(f"task {name!r}: {reg[name]} is named {obj.name!r}; register it under that name")
    return obj


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_think(completion: str) -> tuple[str, int]:
    """`(answer, think_chars)`: a completion with the reasoning block a thinking chat model (Qwen3, DeepSeek-R1) writes
    before its answer, `<think>...</think>`, split off. The answer is what follows `</think>` (`_after_think`: leading
    blank lines dropped, the answer's own indentation kept); a block never closed (the model ran out of tokens thinking) leaves no answer. A completion that closes a
    block it never opened is one whose chat template opened it in the prompt (DeepSeek-R1 distills, QwQ: the
    generation prompt ends `<think>`): its thinking is everything before the first `</think>`. `think_chars` counts
    the block's characters, tags included (0 without a block)."""
    head = completion.lstrip()
    if not head.startswith(THINK_OPEN):
        end = completion.find(THINK_CLOSE)
        if end < 0:
            return completion, 0
        cut = end + len(THINK_CLOSE)
        return _after_think(completion[cut:]), cut
    end = head.find(THINK_CLOSE)
    if end < 0:
        return "", len(head)
    cut = end + len(THINK_CLOSE)
    return _after_think(head[cut:]), cut


def _after_think(rest: str) -> str:
    """The answer after `</think>`: on a later line, its blank lines dropped and its first line's indentation kept (a
    plain-style code body is indented: stripping it made every such answer a syntax error; an outside review,
    seventy-ninth session); on the same line, its leading spaces dropped."""
    if re.match(r"[ \t]*\r?\n", rest):
        return re.sub(r"\A(?:[ \t]*\r?\n)+", "", rest)
    return rest.lstrip()


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


def generate_many(task_name: str, config_json: str, seeds: list[int]) -> tuple[list[Instance], dict[int, str]]:
    """The task's instances for `seeds` under a config given as JSON, a seed the generator cannot draw replaced by one
    of the same split (`harness.tasks.drawn.draw_replacing`: the instances, and the generator's message by replaced
    seed): the body of the run's background prefetch worker (a spawned process that imports only this package, not
    torch)."""
    from harness.tasks.drawn import draw_replacing

    task = get_task(task_name)
    config = task.spec.config_model.model_validate_json(config_json)
    return draw_replacing(task, config, seeds)


__all__ = ["DEFAULT_TASK", "TASKS", "BatchScorer", "EnvStats", "Instance", "Mixture", "Outcome", "SuiteEntry", "Task", "TaskSpec",
           "UnknownTaskError", "VetConfigs", "generate_many", "get_task", "score_all", "split_think"]
