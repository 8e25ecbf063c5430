"""The Skill record: a reusable intervention with its trigger, change, expected outcome, validation and evidence.

A skill file is Markdown with YAML front matter (the fields below except `description`, which is the body):

    ---
    name: raise-hole-ratio-on-hole-failures
    kind: env
    trigger: {findings: [mapf.hole], condition: "rate >= 0.2"}
    intervention: {knob: "env.sizes.{size}.hole_ratio", op: add, value: 0.1}
    expected: "hole failures on that size drop; valid rate rises"
    validation: valid
    domains: [mapf]
    ---
    Why this works, when it does not, what to watch.

Knob paths (shared by skills, engineers and the vet step):
- `env.sizes.<n>.<field>`   one per-size entry of the task's generator config, e.g. `env.sizes.5.hole_ratio`
  (`{size}` in a template is filled from the finding's slice); `env.<field>` for a global generator field.
- `recipe.<field>`          one training-recipe knob, e.g. `recipe.temperature`, `recipe.num_generations`.
- `reward.<field>`          one reward-shaping knob of the task, e.g. `reward.partial_credit`.
- `diagnostics/<name>.py`   one diagnostic file (kind: diagnostic; `intervention.code` holds its source).
- `env.mixture`             the whole training mix at once (a task with the `Mixture` capability), op `mix`, value
  the aim: `target` (toward the target's failing slices), `frontier` (toward the target's slices the policy can
  learn: the competence frontier, when the mix is too hard), `mastered` (away from slices the policy has mastered).
  The engineer computes the weights from the diagnosis' target view (`harness.engineer.rule.mixture_toward`).
- `@frontier`               family-neutral: the task's own knob for the training share of a difficulty level (its
  `frontier_knob`, e.g. `env.sizes.{size}.data_ratio` for MAPF, `env.levels.{digits}.data_ratio` for math), so one
  skill can carry across families; the engineer resolves it for the run's task.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SkillKind = Literal["env", "recipe", "reward", "diagnostic"]

MAX_NAME = 100  # characters of a skill's name (its exported file's name: 300 stopped `skills export` mid-library)
MAX_EXPECTED = 300  # characters of its expected outcome, one line (it goes into every LLM prompt that retrieves it)
SEVERITY_MAX = 3.0  # the largest factor `Intervention.scale_with_rate` grows a step by


class Trigger(BaseModel):
    model_config = ConfigDict(extra="forbid")
    findings: list[str] = Field(default_factory=list, description="finding codes that make the skill applicable")
    condition: str = Field("", description="a boolean expression over the finding's fields (rate, count, severity); "
                                           "typed and bounded, see skills.library.check_condition")


class Intervention(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a NaN step would poison the knob it moves
    knob: str = Field(..., description="knob path template (see module docstring) or diagnostics/<name>.py")
    op: Literal["set", "add", "mul", "code", "mix", "adopt"] = "add"
    value: float | int | str | None = None
    code: str | None = Field(None, description="source of a diagnostic file, for kind=diagnostic")
    scale_with_rate: float | None = Field(
        None, gt=0.0, le=1.0, description="an add or mul step that grows with the finding: at this finding rate the "
        "step is `value`'s, at a rate k times as high k times as large (at most SEVERITY_MAX times, never smaller; a mul "
        "factor v under 1 scales as the mirror of a growth, a division by 1 + (1 / v - 1) x k). "
        "A symptom that holds for every group calls for a larger move than one that holds for a third of them: from "
        "a temperature of 0.1 where 64 of 64 groups are identical, +0.2 leaves them identical (BENCHMARKS.md, the "
        "cold-temperature scenarios). None: the step is `value`'s whatever the rate")
    stop_at: float | None = Field(
        None, description="an add or mul step never moves the knob past this value (down to it for a step down, up to "
        "it for a step up), and a knob already there or beyond proposes nothing: the skill's own limit, such as a "
        "temperature cooled against malformed answers that must not come down into identical groups")


class Evidence(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tries: int = 0
    promotions: int = 0
    mean_effect: float = 0.0
    last_interval: tuple[float, float] | None = None
    families: list[str] = Field(default_factory=list, description="task families where it was promoted")


class Provenance(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: Literal["seed", "run", "import"] = "seed"
    run: str | None = None
    commit: str | None = None


KNOB_PREFIX: dict[str, tuple[str, ...]] = {"env": ("env.", "@frontier"), "recipe": ("recipe.",), "reward": ("reward.",),
                                           "diagnostic": ("diagnostics/",)}  # the part of the harness a kind moves
DIAGNOSTIC_PATH = r"^diagnostics/[A-Za-z0-9_]+\.py$"


class Skill(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9._-]*$")
    kind: SkillKind
    trigger: Trigger
    intervention: Intervention
    expected: str = Field(..., description="expected outcome, one line")
    validation: str = Field("valid", description="the metric that validates it")
    domains: list[str] = Field(default_factory=list, description="task families it applies to")
    evidence: Evidence = Field(default_factory=Evidence, description="earned in this library (backtested tries); "
                                                                     "the only evidence that ranks skills")
    imported: Evidence | None = Field(None, description="evidence an imported file claimed: shown, never ranked")
    provenance: Provenance = Field(default_factory=Provenance)
    description: str = ""


    @property
    def general(self) -> bool:
        """A skill becomes general after promotions in two or more task families."""
        return len(set(self.evidence.families)) >= 2
