"""The Task protocol: what every task family (MAPF-FrozenLake, math, code, reasoning) provides to the loop.

A task is a plain module-level object satisfying `Task`: a name, a `TaskSpec` (its models, slices, knobs and texts, as
data) and seven functions. The loop never looks inside an instance: it generates instances from a typed generator
config and a seed, renders prompts, scores completions into an `Outcome`, asks the expert for a demonstration (SFT warm
start), groups results by the instance's slices and draws benchmark suites. What only some families have is a declared
capability (`BatchScorer`, `EnvStats`, `VetConfigs`, `Mixture`, `ImperfectTeacher`, `CheckEnvironment`), checked
with `isinstance`, never found by `getattr`.

A family of your own: one module with its Task object (copy `harness/tasks/arith.py`'s layout), registered without
editing this package, either by an installed package's entry point (`[project.entry-points."evotrainer.tasks"]
sortd = "my_tasks.sortd:TASK"`) or by `EVOTRAINER_TASKS="sortd=my_tasks.sortd:TASK"` (`harness.tasks.registry`; the
object's `name` must be the registered name), plus seed skills of its own if it wants them (the family-neutral seeds
already apply: `domains: []`). What the loop assumes of it:
- `spec.alphabet` holds every character a prompt or an answer of any style can contain (the built-in presets' char
  tokenizer maps anything else to `<unk>`; a run on a preset checks the demonstrations against it at start);
- a weighted mixture (the level samplers, `env.mixture`, the mixture skills) is a list of entries keyed by
  `spec.entry_key`, each weighed by a field named `data_ratio` (`knobs.WEIGHT`);
- `suite("small")` is the default test set of a run (`eval.suite`); name yours so, or say `eval: {suite: ...}`;
- `all` is not a slice value (the loop's own word for "every instance");
- `generate` keeps an instance in its seed's split by content: wrap the draw in `harness.seeds.held_apart` (two
  seeds of different splits must never draw the same prompt, or a held-out instance is a training one).

    from harness.tasks import get_task
    task = get_task("mapf")
    inst = task.generate(task.default_config(), seed=4)
    print(task.prompt(inst, "compact")); print(task.score(inst, task.expert(inst, "compact")))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
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


def _never(metrics: dict[str, float]) -> bool:
    return False


@dataclass(frozen=True)
class TaskSpec:
    """What the loop knows about a family besides its functions, as data: its models, slices, knobs and texts.

    Diagnostics, the vet step, the engineers, the report and the tokenizer read these; none of them names a family."""

    config_model: type[BaseModel]  # the generator config (extra="forbid"): what env.yaml holds
    shaping_model: type[BaseModel]  # the reward shaping config (extra="forbid"): recipe.yaml's `reward:`
    instance_model: type[Instance]
    styles: tuple[str, ...]  # prompt styles, first is the default
    alphabet: str  # every character prompts and completions can contain (char tokenizer)
    # the round-0 env.yaml a new run's harness starts with, comments included (sandbox/template/ holds only what every
    # family shares: the recipe, the README and the example diagnostic)
    round0_env: str
    words: tuple[str, ...] = ()  # multi-character units a char tokenizer keeps as one token
    failure_types: tuple[str, ...] = ()  # the failure taxonomy of `Outcome.failure`
    # the failures whose answer could not be checked at all (empty, unparseable, not code): `grpo.malformed` counts them
    format_failures: tuple[str, ...] = ()
    # --- for diagnostics, vet and engineers ---
    entry_key: str | None = None  # knob paths index lists of config entries by this field (harness.tasks.knobs)
    slice_keys: tuple[str, ...] = ()  # the slices instances are grouped by (reports, vetoes, the gate's slice check)
    difficulty_slice: str = ""  # the slice that orders difficulty (the competence frontier is found along it)
    failure_knobs: dict[str, list[str]] = field(default_factory=dict)  # failure type -> knob templates ({<slice>})
    frontier_knob: str | None = None  # the knob template that moves the training mix along the difficulty slice
    gap_metric: str | None = None  # Outcome.metrics key: distance of a valid answer from optimal (None: no such notion)
    near_miss: Callable[[dict[str, float]], bool] = _never  # an invalid answer one step short of valid, from metrics
    near_miss_text: str = "one step short of a valid answer"  # what a near miss is, in one line (finding messages)
    suboptimal_text: str = "valid, but not optimal"  # what valid-but-not-optimal means, in one line


@runtime_checkable
class Task(Protocol):
    """A task family: a name, its spec, and the functions that make, show, solve, score and group its instances."""

    name: str
    spec: TaskSpec

    def default_config(self) -> BaseModel: ...
    def generate(self, config: BaseModel, seed: int) -> Instance: ...
    def prompt(self, instance: Instance, style: str = ...) -> str: ...
    def expert(self, instance: Instance, style: str = ...) -> str: ...  # the expert's completion (SFT warm start)
    def score(self, instance: Instance, completion: str, shaping: BaseModel | None = None) -> Outcome: ...
    def slices(self, instance: Instance) -> dict[str, str]: ...
    def suite(self, name: str) -> list[SuiteEntry]: ...  # a named benchmark suite; unknown names raise with the list


# --- optional capabilities: a family has one when it has the method (`isinstance(task, EnvStats)`) ----------------------


@runtime_checkable
class BatchScorer(Protocol):
    """Scores many (instance, completion) pairs at once (code: one sandbox job per distinct program, in parallel);
    `harness.tasks.score_all` uses it, else `score` one by one."""

    def score_many(self, pairs: list[tuple[Instance, str]], shaping: BaseModel | None = None) -> list[Outcome]: ...


@runtime_checkable
class EnvStats(Protocol):
    """Statistics of a generator config's distribution (the diagnosis shows them; `evotrainer env stats`)."""

    def env_stats(self, config: BaseModel, n: int, seed_start: int = 0) -> dict[str, Any]: ...


@runtime_checkable
class VetConfigs(Protocol):
    """The configs the vet step generates from to check a changed env (e.g. each entry the knob touches, alone);
    without it the vet generates from the whole config."""

    def vet_configs(self, config: BaseModel, knob: str) -> list[tuple[str, BaseModel]]: ...




@runtime_checkable
class ImperfectTeacher(Protocol):
    """A plausible teacher that is sometimes wrong in a way the task's reward can train out (MAPF: a plan that ignores
    the board's holes). A run's `warm_start.teacher_noise` draws that share of its SFT demonstrations from it
    (`harness.policy_glue.sft_pairs`), so the warm start samples the right behaviour often enough for GRPO to find it
    but does not yet prefer it: a partial policy with reach, where an undertrained expert SFT is partial without it
    (BENCHMARKS.md, rung 3 and the demo). `imperfect` returns the completion in `style`, like `expert`."""

    def imperfect(self, instance: Instance, style: str = ...) -> str: ...


@runtime_checkable
class CheckEnvironment(Protocol):
    """Optional: the task reads settings from the environment (a worker count, an isolation switch); a bad one raises
    ValueError naming the variable, called when a run starts, before anything trains."""

    def check_environment(self) -> None: ...


@runtime_checkable
class Mixture(Protocol):
    """The generator config is a weighted mixture along the task's difficulty slice (`TaskSpec.difficulty_slice`):
    one entry per slice value with its share of the instances. `mixture` reads the weights ({slice value: weight}, as
    written); `with_mixture` returns a validated config re-weighted as a whole (normalised; a value not named gets
    weight 0; a new value adds an entry at its defaults). The diagnosis compares the training mix with the judge's
    target through it, and the knob `env.mixture` (`harness.tasks.knobs.MIXTURE`) changes it as one factor."""

    def mixture(self, config: BaseModel) -> dict[str, float]: ...
    def with_mixture(self, config: BaseModel, weights: dict[str, float]) -> BaseModel: ...
