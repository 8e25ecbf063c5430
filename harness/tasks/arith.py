"""Math: procedurally generated integer arithmetic, the second task family (task name `math`).

An instance is an expression of `terms` integers of `digits` digits joined by +, - or * (`37+85-12`), and its value.
The generator's knobs, per difficulty level (one entry per digit count, knob paths `env.levels.<digits>.<field>`):
`data_ratio` (the level's share of training), `terms` (2..4), `sub_ratio` and `mul_ratio` (the chance that an operator
is - or *; the rest are +). Scoring is EXACT match of the final answer, the integer after the last `=` or, without
one, the whole completion stripped (ASCII digits; a sign or leading zeros are read as the integer they write): an
answer that merely contains the right number is wrong.

Failure taxonomy (what the diagnostics act on): `no_answer` (empty), `parse_error` (not an integer; the name MAPF
uses too, so skills about format errors carry across families), `wrong_length`
(an integer with the wrong number of digits or sign: usually a lost carry or term), `wrong` (right length, wrong
digits). Slices: `digits` (the difficulty), `terms`, `op` (add, sub, mul, mixed), `carries` (0, 1, 2+ carries in the
column sums of an addition-only expression; `-` otherwise).

    from harness.tasks import get_task
    task = get_task("math")
    inst = task.generate(task.default_config(), seed=3)
    print(task.prompt(inst), task.expert(inst), task.score(inst, task.expert(inst)).valid)
"""

from __future__ import annotations

import re
import string
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.seeds import held_apart
from harness.tasks import knobs
from harness.tasks.base import Instance, Outcome, SuiteEntry, TaskSpec
from harness.tasks.drawn import draw

FAILURE_TYPES = ("no_answer", "parse_error", "wrong_length", "wrong")
# trace: the completion first writes the answer's digits least significant first (the order a carry flows, so each
# digit depends only on digits already written), then `=` and the answer: `16-78=` -> `26-=-62`. A scratchpad the
# scorer ignores, like MAPF's trace style. plain: the answer alone. chat: English, for chat LLMs.
STYLES = ("trace", "plain", "chat")
ENTRY_KEY = "digits"
OPS = ("+", "-", "*")


class LevelEntry(BaseModel):
    """One difficulty level of the training mix (knob paths `env.levels.<digits>.<field>`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
    digits: int = Field(..., ge=1, le=6, description="digits per operand, 1..6 (the level's key and its difficulty)")
    data_ratio: float = Field(1.0, ge=0.0, le=1.0, description="share of training instances at this level "
                              "(normalised over levels)")
    terms: int = Field(2, ge=2, le=4, description="operands per expression, 2..4")
    sub_ratio: float = Field(0.0, ge=0.0, le=1.0, description="chance that an operator is '-'")
    mul_ratio: float = Field(0.0, ge=0.0, le=1.0, description="chance that an operator is '*' (its right operand has "
                             "one digit, so products stay learnable)")
    source: Literal["builtin", "chain_sum", "basic_arithmetic"] = Field(
        "builtin", description="who writes the expressions: this module (builtin), or reasoning-gym's chain_sum / "
        "basic_arithmetic generator with this level's digits and terms (needs `pip install 'evotrainer[math]'`; "
        "its operators: + and - for chain_sum; for basic_arithmetic +, and - / * where sub_ratio / mul_ratio > 0)")

    @model_validator(mode="after")
    def _ops(self) -> LevelEntry:
        if self.sub_ratio + self.mul_ratio > 1.0 + 1e-9:
            raise ValueError(f"digits {self.digits}: sub_ratio + mul_ratio must be <= 1 (the rest is '+'), got "
                             f"{self.sub_ratio} + {self.mul_ratio}; lower env.levels.{self.digits}.sub_ratio or "
                             f"env.levels.{self.digits}.mul_ratio")
        return self


class MathConfig(BaseModel):
    """The generator config: a mixture of difficulty levels."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
    levels: list[LevelEntry] = Field(..., description="per-digit-count entries of the mixture; digits unique")

    @field_validator("levels")
    @classmethod
    def _levels(cls, v: list[LevelEntry]) -> list[LevelEntry]:
        return knobs.check_mixture(v, "levels", "digits", "digits", "{digits: 1, data_ratio: 1.0}")


class MathShaping(BaseModel):
    """Reward shaping for math. The task's own scorer (exact match) always decides `valid`; shaping only sets reward."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)
    valid_reward: float = Field(1.0, ge=0.0, le=2.0, description="reward of an exactly right answer")
    partial_credit: float = Field(0.0, ge=0.0, le=1.0, description="for a wrong integer of the right length: this "
                                  "times the share of right digits (0: binary reward)")
    format_penalty: float = Field(-0.5, ge=-1.0, le=0.0, description="reward for no_answer and parse_error")


class MathInstance(Instance):
    digits: int
    terms: int
    expr: str
    answer: int
    op: str  # add | sub | mul | mixed
    carries: int  # column carries of an addition-only expression, else -1
    question: str | None = None  # the source's own wording (reasoning-gym), used by the chat style


DRAWS = 50  # reasoning-gym items drawn at most for one instance whose operands all have the level's digits


def _reasoning_gym(lv: LevelEntry, seed: int) -> tuple[str, int, str]:
    """(expression without spaces, answer, question) of one reasoning-gym item with this level's digits and terms."""
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError(f"env.levels.{lv.digits}.source is {lv.source!r}, but reasoning-gym is not installed: pip "
                         "install 'evotrainer[math]' (`make venv` installs it), or set source: builtin") from None
    kw: dict[str, Any] = {"min_terms": lv.terms, "max_terms": lv.terms, "min_digits": lv.digits,
                          "max_digits": lv.digits, "allow_negation": False}
    if lv.source == "basic_arithmetic":
        kw.update(allow_parentheses=False, whitespace="single",
                  operators=["+"] + (["-"] if lv.sub_ratio > 0 else []) + (["*"] if lv.mul_ratio > 0 else []))
    item = reasoning_gym.create_dataset(lv.source, size=1, seed=seed, **kw)[0]
    expr = str(item["metadata"]["expression"]).replace(" ", "")
    return expr, int(item["answer"]), str(item["question"])


def _carries(nums: list[int]) -> int:
    """Column carries when adding `nums` (all non-negative), as a person would count them."""
    out, carry, col = 0, 0, 0
    width = max(len(str(n)) for n in nums)
    while col < width:
        s = carry + sum((n // 10**col) % 10 for n in nums)
        carry = s // 10
        out += carry > 0
        col += 1
    return out


def value(nums: list[int], ops: list[str]) -> int:
    """The expression's value, * before + and - (left to right otherwise)."""
    total, term, sign = 0, nums[0], 1
    for op, n in zip(ops, nums[1:], strict=True):
        if op == "*":
            term *= n
            continue
        total += sign * term
        term, sign = n, (1 if op == "+" else -1)
    return total + sign * term


def generate(config: MathConfig, seed: int) -> MathInstance:
    """The instance for (config, seed), kept in its seed's split by content (`harness.seeds.held_apart`)."""
    one = knobs.one_entry(config, "levels", np.random.default_rng([seed, 0x3A7]))  # the level, picked once
    return held_apart(lambda s: _generate(one, s), prompt, seed)


def _generate(config: MathConfig, seed: int) -> MathInstance:
    rng = np.random.default_rng([seed, 0x3A7])
    lv = knobs.pick(config.levels, rng)
    if lv.source != "builtin":
        # reasoning-gym draws an operand from 0..10**digits inclusive (100 at two digits) and, without parentheses,
        # computes basic_arithmetic strictly left to right while the question reads as ordinary notation (89 + 40 *
        # 40 "is" 5160): a draw with an operand of another length is drawn again, and the answer is the expression's
        # value as it reads (`value`: * first), as the prompt and the demonstrations say (an outside review,
        # seventy-ninth session: about one instance in four wrong or mislabelled)
        for j in range(DRAWS):
            expr, _, question = _reasoning_gym(lv, seed + j * 1_000_003)
            nums = [int(x) for x in re.split(r"(?<=\d)[-+*]", expr)]
            ops = re.findall(r"(?<=\d)[-+*]", expr)
            if all(len(str(n)) == lv.digits for n in nums):
                break
        else:
            raise ValueError(f"env.levels.{lv.digits}: {lv.source} gave no expression of {lv.digits}-"
                             f"digit operands in {DRAWS} draws; set source: builtin")
        answer = value(nums, ops)
        kinds = set(ops)
        op = "mixed" if len(kinds) > 1 else {"+": "add", "-": "sub", "*": "mul"}.get(next(iter(kinds), "+"), "add")
        return MathInstance(task="math", seed=seed, digits=lv.digits, terms=lv.terms, expr=expr, answer=answer,
                            op=op, carries=_carries(nums) if kinds <= {"+"} else -1, question=question)
    lo, hi = (0 if lv.digits == 1 else 10 ** (lv.digits - 1)), 10**lv.digits - 1
    nums = [int(rng.integers(lo, hi + 1))]
    ops: list[str] = []
    for _ in range(lv.terms - 1):
        u = rng.random()
        op = "-" if u < lv.sub_ratio else "*" if u < lv.sub_ratio + lv.mul_ratio else "+"
        ops.append(op)
        nums.append(int(rng.integers(2, 10)) if op == "*" else int(rng.integers(lo, hi + 1)))
    expr = str(nums[0]) + "".join(o + str(n) for o, n in zip(ops, nums[1:], strict=True))
    answer = value(nums, ops)
    kinds = set(ops)
    op = "mixed" if len(kinds) > 1 else {"+": "add", "-": "sub", "*": "mul"}[ops[0]]
    return MathInstance(task="math", seed=seed, digits=lv.digits, terms=lv.terms, expr=expr, answer=answer, op=op,
                        carries=_carries(nums) if kinds == {"+"} else -1)


def prompt(inst: MathInstance, style: str = "trace") -> str:
    if style in ("plain", "trace"):
        return f"{inst.expr}="
    if style == "chat":
        return (inst.question or f"What is {inst.expr}?") + " Reply with the final answer only, as `= <integer>`."
    raise ValueError(f"unknown style {style!r}; choose one of {', '.join(STYLES)}")


def expert(inst: MathInstance, style: str = "trace") -> str:
    if style == "trace":
        return f"{str(inst.answer)[::-1]}={inst.answer}"
    return str(inst.answer) if style == "plain" else f"= {inst.answer}"


_INT = re.compile(r"^[+-]?[0-9]+$")  # ASCII digits only: `\d` also matches other scripts' digits, which int() reads


def canonical_int(text: str) -> str:
    """An integer's text as `str(int(text))` writes it (sign, no leading zeros), without int(): Python refuses to
    convert more than 4300 digits, and one degenerate rollout of that length crashed a run's scoring."""
    neg = text.startswith("-")
    digits = text.lstrip("+-").lstrip("0") or "0"
    return ("-" if neg and digits != "0" else "") + digits


def final_answer(completion: str) -> str:
    """The text of the final answer: after the last `=` if there is one, else the whole completion; stripped, with
    the code or bold marks a chat model puts around it (`` `= -5` ``, `**= -5**`: the chat prompt shows the format in
    backticks) and a typographic minus (U+2212) read as `-`."""
    text = completion.strip().replace("\u2212", "-")
    if "=" in text:
        text = text.rsplit("=", 1)[1]
    return text.strip(" \t\r\n`*.")


def score(inst: MathInstance, completion: str, shaping: MathShaping | None = None) -> Outcome:
    sh = shaping or MathShaping()
    got = final_answer(completion)
    want = str(inst.answer)
    metrics: dict[str, float] = {"answer_len": float(len(want))}
    if not got:
        return Outcome(failure="no_answer", reward=sh.format_penalty, detail="no answer", metrics=metrics)
    if not _INT.match(got):
        return Outcome(failure="parse_error", reward=sh.format_penalty, detail=f"not an integer: {got[:40]!r}",
                       metrics=metrics)
    g = canonical_int(got)
    if g == want:
        return Outcome(valid=True, optimal=True, reward=sh.valid_reward, metrics={**metrics, "digits_right": 1.0})
    if g.startswith("-") != want.startswith("-"):  # the sign is no digit: -8 for 18 is no near miss
        return Outcome(failure="wrong_length", reward=0.0, detail=f"{g} has the other sign than the answer",
                       where={"got": g}, metrics={**metrics, "digits_right": 0.0})
    gd, wd = g.lstrip("-"), want.lstrip("-")
    if len(gd) != len(wd):
        return Outcome(failure="wrong_length", reward=0.0, detail=f"{g} has {len(gd)} digits, the answer "
                       f"{len(wd)}", where={"got": g}, metrics={**metrics, "digits_right": 0.0})
    right = sum(a == b for a, b in zip(gd, wd, strict=True))
    share = right / len(wd)
    first = next(i for i, (a, b) in enumerate(zip(gd, wd, strict=True)) if a != b)
    return Outcome(failure="wrong", reward=sh.partial_credit * share, detail=f"{g}: {right}/{len(wd)} digits right",
                   where={"got": g, "first_wrong_digit": first},
                   metrics={**metrics, "digits_right": share, "wrong_digits": float(len(wd) - right)})


def slices(inst: MathInstance) -> dict[str, str]:
    c = "-" if inst.carries < 0 else str(min(inst.carries, 2)) + ("+" if inst.carries >= 2 else "")
    return {"digits": str(inst.digits), "terms": str(inst.terms), "op": inst.op, "carries": c}


def _cfg(*levels: dict[str, Any]) -> MathConfig:
    return MathConfig(levels=[LevelEntry(**e) for e in levels])


def suite(name: str) -> list[SuiteEntry]:
    """Held-out suites (test seeds). small: digits 1..3, two terms, + and -, 32 per level (96): CPU scale. easy: 1-digit
    two-term sums and differences (100). medium: 2-digit, two terms, + and - (100)."""
    mixed = {"terms": 2, "sub_ratio": 0.5}
    if name == "small":
        return [SuiteEntry(name=f"d{d}", config=_cfg({"digits": d, **mixed}), n=32) for d in (1, 2, 3)]
    if name == "easy":
        return [SuiteEntry(name="d1", config=_cfg({"digits": 1, **mixed}), n=100)]
    if name == "medium":
        return [SuiteEntry(name="d2", config=_cfg({"digits": 2, **mixed}), n=100)]
    raise ValueError(f"unknown suite {name!r}; choose one of small, easy, medium")


def default_config() -> MathConfig:
    return _cfg({"digits": 1, "data_ratio": 0.5, "sub_ratio": 0.5}, {"digits": 2, "data_ratio": 0.5, "sub_ratio": 0.5})


ROUND0_ENV = """\
# Environment generator config (math: integer arithmetic). Round 0: one- and two-digit sums and differences.
# One entry per difficulty level (digits per operand): data_ratio = share of training instances at this level;
# terms = operands per expression; sub_ratio / mul_ratio = chance that an operator is '-' / '*' (the rest are '+').
levels:
  - {digits: 1, data_ratio: 0.5, terms: 2, sub_ratio: 0.5, mul_ratio: 0.0}
  - {digits: 2, data_ratio: 0.5, terms: 2, sub_ratio: 0.5, mul_ratio: 0.0}
"""


def alphabet() -> str:
    return "".join(sorted(set(string.digits + "+-*= ?.`,:'" + string.ascii_letters)))


def env_stats(config: MathConfig, n: int, seed_start: int = 0) -> dict[str, Any]:
    insts = draw(TASK, config, list(range(seed_start, seed_start + n)))  # read back where drawn before (drawn.py)
    by: dict[str, Any] = {}
    for d in sorted({i.digits for i in insts}):
        xs = [i for i in insts if i.digits == d]
        by[str(d)] = {"share": round(len(xs) / len(insts), 3),
                      "mean_answer_len": round(float(np.mean([len(str(i.answer)) for i in xs])), 2),
                      "ops": {o: sum(i.op == o for i in xs) for o in ("add", "sub", "mul", "mixed")}}
    return {"n": len(insts), "by_digits": by}


def near_miss(metrics: dict[str, float]) -> bool:
    """A wrong answer with one digit wrong."""
    return metrics.get("wrong_digits") == 1.0


SPEC = TaskSpec(
    config_model=MathConfig, shaping_model=MathShaping, instance_model=MathInstance, styles=STYLES,
    alphabet=alphabet(), words=(), failure_types=FAILURE_TYPES,
    format_failures=("no_answer", "parse_error"), round0_env=ROUND0_ENV,
    entry_key=ENTRY_KEY, slice_keys=("digits", "terms", "op", "carries"), difficulty_slice="digits",
    failure_knobs={
        "no_answer": ["recipe.max_completion_length", "recipe.temperature"],
        "parse_error": ["recipe.temperature"],
        "wrong_length": ["env.levels.{digits}.data_ratio", "env.levels.{digits}.terms"],
        "wrong": ["env.levels.{digits}.data_ratio"],
    },
    frontier_knob="env.levels.{digits}.data_ratio", gap_metric=None,  # an exact answer is optimal
    near_miss=near_miss, near_miss_text="one digit wrong",
    suboptimal_text="right, but not optimal (never for math)",
)


class MathTask:
    """The `Task` protocol for integer arithmetic (harness/tasks/base.py), with the capabilities EnvStats,
    VetConfigs and Mixture."""

    name = "math"
    spec = SPEC

    def default_config(self) -> MathConfig:
        return default_config()

    def generate(self, config: MathConfig, seed: int) -> MathInstance:
        return generate(config, seed)

    def prompt(self, instance: MathInstance, style: str = "trace") -> str:
        return prompt(instance, style)

    def expert(self, instance: MathInstance, style: str = "trace") -> str:
        return expert(instance, style)

    def score(self, instance: MathInstance, completion: str, shaping: MathShaping | None = None) -> Outcome:
        return score(instance, completion, shaping)

    def slices(self, instance: MathInstance) -> dict[str, str]:
        return slices(instance)

    def suite(self, name: str) -> list[SuiteEntry]:
        return suite(name)

    def env_stats(self, config: MathConfig, n: int, seed_start: int = 0) -> dict[str, Any]:
        return env_stats(config, n, seed_start)

    def mixture(self, config: MathConfig) -> dict[str, float]:
        return knobs.mixture_of(config, "levels", ENTRY_KEY)

    def with_mixture(self, config: MathConfig, weights: dict[str, float]) -> MathConfig:
        return knobs.with_mixture(config, "levels", ENTRY_KEY, weights)

    def vet_configs(self, config: MathConfig, knob: str) -> list[tuple[str, MathConfig]]:
        return knobs.entry_configs(config, "levels", ENTRY_KEY, knob)


def get_knob(config: MathConfig, path: str) -> Any:
    return knobs.read(config, path, ENTRY_KEY)


TASK = MathTask()
