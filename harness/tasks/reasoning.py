"""Reasoning-gym: any of reasoning-gym's procedural datasets as a task family (task name `reasoning`).

reasoning-gym (`pip install 'evotrainer[math]'`, installed by `make venv`) generates its ~100 datasets offline
(`leg_counting`, `basic_arithmetic`, `countdown`, `sudoku`, `gsm_symbolic`, ...). This family mixes any of them: the
generator config is a list of datasets, each with its share of training (`data_ratio`, the knob, path
`env.datasets.<name>.data_ratio`) and the dataset's own parameters (`params`, passed to `reasoning_gym.create_dataset`
unchanged; they are the dataset's difficulty settings, not knobs the engineer moves). It is meant for real models
(a Hugging Face checkpoint or an endpoint); the tiny char presets can run it but score near zero.

Scoring. The final answer is the text after the last `Answer:` (any case), else the whole completion, stripped. It is
right when it equals the dataset's answer exactly (whitespace collapsed), or when the dataset's own verifier gives it
full marks (1.0: datasets whose puzzles have several right answers, such as `countdown`, verify instead of comparing).
Partial marks from reasoning-gym's scorer (its default pays for an answer that merely CONTAINS the right one) are never
used: the reward is binary. Failures: `no_answer`, `wrong`. Slices: `dataset`, `answer_len` (short <= 8 characters,
long otherwise).

    from harness.tasks import get_task
    task = get_task("reasoning")
    inst = task.generate(task.default_config(), seed=3)
    print(task.prompt(inst, "chat"), task.score(inst, "Answer: " + inst.answer).valid)
"""

from __future__ import annotations

import json
import re
import string
from functools import lru_cache
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.tasks import knobs
from harness.tasks.base import Instance, Outcome, SpecNames, SuiteEntry, TaskSpec

FAILURE_TYPES = ("no_answer", "wrong")
STYLES = ("plain", "chat")  # plain: the question, then `Answer: `; chat: the question and a format instruction
ENTRY_KEY = "name"


def _rg():
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError("the reasoning task needs reasoning-gym: pip install 'evotrainer[math]' (`make venv` "
                         "installs it)") from None
    return reasoning_gym


def dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


class DatasetEntry(BaseModel):
    """One reasoning-gym dataset of the training mix (knob paths `env.datasets.<name>.<field>`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(..., description="a reasoning-gym dataset name (the entry's key), e.g. leg_counting")
    data_ratio: float = Field(1.0, ge=0.0, le=1.0, description="share of training instances from this dataset "
                              "(normalised over datasets)")
    params: dict[str, Any] = Field(default_factory=dict, description="the dataset's own config (its difficulty), "
                                   "passed to reasoning_gym.create_dataset as keyword arguments")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        _rg()
        names = dataset_names()
        if v not in names:
            close = [n for n in names if v.split("_")[0] in n][:6] or names[:6]
            raise ValueError(f"unknown reasoning-gym dataset {v!r}; e.g. {', '.join(close)} "
                             f"({len(names)} in all: python -c 'import reasoning_gym.factory as f; "
                             "print(sorted(f.DATASETS))')")
        return v


class ReasoningConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    datasets: list[DatasetEntry] = Field(..., description="the datasets of the mixture; names unique")

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, v: list[DatasetEntry]) -> list[DatasetEntry]:
        return knobs.check_mixture(v, "datasets", "name", "names", "{name: leg_counting}")


class ReasoningShaping(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    valid_reward: float = Field(1.0, ge=0.0, le=2.0, description="reward of a right answer")
    format_penalty: float = Field(0.0, ge=-1.0, le=0.0, description="reward for no answer at all")


class ReasoningInstance(Instance):
    dataset: str
    params_json: str = "{}"  # the dataset's params (to rebuild its verifier)
    question: str
    answer: str
    entry_json: str  # reasoning-gym's whole entry (its verifier reads the metadata)


@lru_cache(maxsize=64)
def _dataset(name: str, params_json: str):
    """A reasoning-gym dataset object for `name` and its params: generates items, and its score_answer verifies."""
    return _rg().create_dataset(name, size=1, seed=0, **json.loads(params_json))


def generate(config: ReasoningConfig, seed: int) -> ReasoningInstance:
    rng = np.random.default_rng([seed, 0x46])
    ds = knobs.pick(config.datasets, rng)
    params = json.dumps(ds.params, sort_keys=True)
    try:
        entry = _rg().create_dataset(ds.name, size=1, seed=seed, **ds.params)[0]
    except Exception as exc:  # noqa: BLE001 -- a bad param, or a dataset needing what is not installed: name both
        raise ValueError(f"reasoning-gym dataset {ds.name!r} with params {ds.params} failed: "
                         f"{type(exc).__name__}: {exc}; fix env.datasets.{ds.name}.params") from None
    return ReasoningInstance(task="reasoning", seed=seed, dataset=ds.name, params_json=params,
                             question=str(entry["question"]), answer=str(entry["answer"]),
                             entry_json=json.dumps(entry, default=str))


def prompt(inst: ReasoningInstance, style: str = "plain") -> str:
    if style == "plain":
        return inst.question.rstrip() + "\nAnswer: "
    if style == "chat":
        return inst.question.rstrip() + "\n\nThink if you need to, then end with one line: `Answer: <final answer>`."
    raise ValueError(f"unknown style {style!r}; choose one of {', '.join(STYLES)}")


def expert(inst: ReasoningInstance, style: str = "plain") -> str:
    return inst.answer if style == "plain" else f"Answer: {inst.answer}"


_ANSWER = re.compile(r"answer\s*:", re.IGNORECASE)


def final_answer(completion: str) -> str:
    parts = _ANSWER.split(completion)
    text = parts[-1] if len(parts) > 1 else completion
    return text.strip().strip("`").strip()


def _norm(s: str) -> str:
    return " ".join(s.split())


def score(inst: ReasoningInstance, completion: str, shaping: ReasoningShaping | None = None) -> Outcome:
    sh = shaping or ReasoningShaping()
    got = final_answer(str(completion))
    metrics = {"answer_len": float(len(inst.answer))}
    if not got:
        return Outcome(failure="no_answer", reward=sh.format_penalty, detail="no answer", metrics=metrics)
    right = _norm(got) == _norm(inst.answer)
    if not right:
        try:  # the dataset's own verifier, full marks only (never its partial credit)
            right = float(_dataset(inst.dataset, inst.params_json).score_answer(got, json.loads(inst.entry_json))) >= 1.0
        except Exception:  # noqa: BLE001  # a verifier that cannot read this answer: it is not right
            right = False
    if right:
        return Outcome(valid=True, optimal=True, reward=sh.valid_reward, metrics=metrics)
    return Outcome(failure="wrong", reward=0.0, detail=f"{got[:60]!r} is not {inst.answer[:60]!r}",
                   where={"got": got[:200]}, metrics=metrics)


def slices(inst: ReasoningInstance) -> dict[str, str]:
    return {"dataset": inst.dataset, "answer_len": "short" if len(inst.answer) <= 8 else "long"}


def _cfg(*names: str) -> ReasoningConfig:
    return ReasoningConfig(datasets=[DatasetEntry(name=n) for n in names])


SMALL = ("leg_counting", "basic_arithmetic", "letter_counting")


def suite(name: str) -> list[SuiteEntry]:
    """Held-out suites (test seeds). small: 32 each of leg_counting, basic_arithmetic, letter_counting (96)."""
    if name == "small":
        return [SuiteEntry(name=n, config=_cfg(n), n=32) for n in SMALL]
    raise ValueError(f"unknown suite {name!r}; choose one of small")


def default_config() -> ReasoningConfig:
    return _cfg(*SMALL)


ROUND0_ENV = """\
# Environment generator config (reasoning: any of reasoning-gym's datasets). One entry per dataset: data_ratio =
# its share of training (the knob); params = the dataset's own config, passed to reasoning_gym.create_dataset.
datasets:
  - {name: leg_counting, data_ratio: 0.34, params: {}}
  - {name: basic_arithmetic, data_ratio: 0.33, params: {}}
  - {name: letter_counting, data_ratio: 0.33, params: {}}
"""


def env_stats(config: ReasoningConfig, n: int, seed_start: int = 0) -> dict[str, Any]:
    insts = [generate(config, s) for s in range(seed_start, seed_start + n)]
    by: dict[str, Any] = {}
    for name in sorted({i.dataset for i in insts}):
        xs = [i for i in insts if i.dataset == name]
        by[name] = {"share": round(len(xs) / len(insts), 3),
                    "mean_question_chars": round(float(np.mean([len(i.question) for i in xs])), 1),
                    "mean_answer_chars": round(float(np.mean([len(i.answer) for i in xs])), 1)}
    return {"n": len(insts), "by_dataset": by}


def near_miss(metrics: dict[str, float]) -> bool:
    """Not defined for reasoning-gym answers: never."""
    return False


SPEC = TaskSpec(
    config_model=ReasoningConfig, shaping_model=ReasoningShaping, instance_model=ReasoningInstance, styles=STYLES,
    alphabet="".join(sorted(set(string.printable) - set("\t\r\x0b\x0c"))), words=(), failure_types=FAILURE_TYPES,
    round0_env=ROUND0_ENV, entry_key=ENTRY_KEY, slice_keys=("dataset", "answer_len"),
    difficulty_slice="dataset",  # the datasets are the levels (unordered: the frontier is the datasets in between)
    failure_knobs={
        "no_answer": ["recipe.max_completion_length", "recipe.temperature"],
        "wrong": ["env.datasets.{dataset}.data_ratio"],
    },
    frontier_knob="env.datasets.{dataset}.data_ratio", gap_metric=None,
    near_miss=near_miss, near_miss_text="a near miss (not defined for reasoning-gym answers)",
    suboptimal_text="right, but not optimal (never for reasoning-gym)",
)


class ReasoningTask(SpecNames):
    """The `Task` protocol over reasoning-gym's datasets (harness/tasks/base.py), with the capabilities EnvStats,
    VetConfigs."""

    name = "reasoning"
    spec = SPEC

    def default_config(self) -> ReasoningConfig:
        return default_config()

    def generate(self, config: ReasoningConfig, seed: int) -> ReasoningInstance:
        return generate(config, seed)

    def prompt(self, instance: ReasoningInstance, style: str = "plain") -> str:
        return prompt(instance, style)

    def expert(self, instance: ReasoningInstance, style: str = "plain") -> str:
        return expert(instance, style)

    def score(self, instance: ReasoningInstance, completion: str, shaping: ReasoningShaping | None = None) -> Outcome:
        return score(instance, completion, shaping)

    def slices(self, instance: ReasoningInstance) -> dict[str, str]:
        return slices(instance)

    def suite(self, name: str) -> list[SuiteEntry]:
        return suite(name)

    def env_stats(self, config: ReasoningConfig, n: int, seed_start: int = 0) -> dict[str, Any]:
        return env_stats(config, n, seed_start)

    def vet_configs(self, config: ReasoningConfig, knob: str) -> list[tuple[str, ReasoningConfig]]:
        return knobs.entry_configs(config, "datasets", ENTRY_KEY, knob)


TASK = ReasoningTask()
