"""The Task protocol: what every task family (MAPF-FrozenLake, math, code) provides to the loop.

A task is a plain module-level object satisfying `Task`. The loop never looks inside an instance: it generates
instances from a typed generator config and a seed, renders prompts, scores completions into an `Outcome`, asks the
expert for a demonstration (SFT warm start), and groups results by the instance's slices.

    from harness.tasks import get_task
    task = get_task("mapf")
    inst = task.generate(task.default_config(), seed=4)
    print(task.prompt(inst, "compact")); print(task.score(inst, task.expert(inst, "compact")))
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


class Instance(BaseModel):
    """One task instance. Subclasses add their fields; every instance knows its task and seed and is JSON-serialisable."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    task: str
    seed: int


class Outcome(BaseModel):
    """The score of one completion on one instance. Never raised: a parse failure is an Outcome too."""

    model_config = ConfigDict(extra="forbid")
    valid: bool = Field(False, description="the main metric: the task is solved legally (MAPF: valid plan; math: correct)")
    optimal: bool = Field(False, description="the stricter metric (MAPF: valid and optimal makespan; math/code: = valid)")
    reward: float = Field(0.0, description="the shaped training reward under the given shaping config")
    failure: str | None = Field(None, description="failure code from the task's taxonomy; None when valid")
    where: dict[str, Any] = Field(default_factory=dict, description="where the first violation happened (agent, step, cell)")
    detail: str = Field("", description="one human-readable line about the failure")
    metrics: dict[str, float] = Field(default_factory=dict, description="numbers for diagnostics (makespan, gap, ...)")


class SuiteEntry(BaseModel):
    """One block of a benchmark suite: `n` instances drawn from `config`. Suites are defined in code, never by a run."""

    model_config = ConfigDict(frozen=True)
    name: str
    config: Any  # the task's generator config model
    n: int


@runtime_checkable
class Task(Protocol):
    name: str
    config_model: type[BaseModel]  # generator config (extra="forbid")
    shaping_model: type[BaseModel]  # reward shaping config (extra="forbid")
    instance_model: type[Instance]
    failure_types: tuple[str, ...]
    styles: tuple[str, ...]  # prompt styles, first is the default
    # --- what the loop needs to know about the family, so that it names none (diagnostics, vet, engineers) ---
    entry_key: str | None  # knob paths index lists of config entries by this field (harness.tasks.knobs)
    slice_keys: tuple[str, ...]  # the slices instances are grouped by (reports, vetoes, the gate's slice check)
    difficulty_slice: str  # the slice that orders difficulty (the competence frontier is found along it)
    failure_knobs: dict[str, list[str]]  # failure type -> knob templates ({<slice>} filled from a finding's slice)
    frontier_knob: str | None  # the knob template that moves the training mix along the difficulty slice
    gap_metric: str | None  # Outcome.metrics key: distance of a valid answer from optimal (None: no such notion)
    near_miss_text: str  # what a near miss is, in one line (finding messages)
    suboptimal_text: str  # what valid-but-not-optimal means, in one line

    def default_config(self) -> BaseModel: ...
    def generate(self, config: BaseModel, seed: int) -> Instance: ...
    def prompt(self, instance: Instance, style: str = ...) -> str: ...
    def expert(self, instance: Instance, style: str = ...) -> str: ...
    def score(self, instance: Instance, completion: str, shaping: BaseModel | None = None) -> Outcome: ...
    # optional: `score_many(pairs, shaping) -> list[Outcome]`, a batch scorer (harness.tasks.score_all uses it)
    def slices(self, instance: Instance) -> dict[str, str]: ...
    def suite(self, name: str) -> list[SuiteEntry]: ...
    def alphabet(self) -> str: ...  # every character prompts and completions can contain (char tokenizer)
    def words(self) -> list[str]: ...  # multi-character units a char tokenizer keeps as one token ([] for none)
    def near_miss(self, metrics: dict[str, float]) -> bool: ...  # an invalid answer one step short of valid
    def env_stats(self, config: BaseModel, n: int, seed_start: int = 0) -> dict[str, Any]: ...
    def vet_configs(self, config: BaseModel, knob: str) -> list[tuple[str, BaseModel]]: ...  # what the vet generates
    def round0_env(self) -> str | None: ...  # the family's round-0 env.yaml text (None: sandbox/template/env.yaml)
