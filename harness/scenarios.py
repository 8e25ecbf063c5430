"""Harness defects as data: a scenario is one YAML file, a training harness that is wrong in one documented way, and
the benchmark runs every arm on it at equal compute.

    evotrainer bench scenarios examples/scenarios --quick          # every scenario, 4 arms, one seed
    evotrainer bench scenarios examples/scenarios --scenarios mapf-lr-collapse --arms oracle,plr --seeds 3

A scenario file (`examples/scenarios/*.yaml`; the defect is a comment at its top, never a field, so no arm can read it):

    scenario: mapf-lr-collapse      # its name (the bench's row; never shown to an arm: every arm's run is "scenario")
    run: base/mapf.yaml             # the run config every arm shares (policy, warm start, recipe sizing, stages,
                                    # backtest, gate, engineer): inline, or a path relative to this file
    target: {...}                   # a generator config: the judge's distribution (backtest.env) AND the test set
    test_n: 1000                    # test instances drawn from the target (test split, greedy)
    round0: {env: {...}, recipe: {...}, reward: {...}}    # the harness the run starts from (the broken one)
    oracle: {env: {...}, recipe: {...}, reward: {...}}    # the known-good harness a careful person would write
    control: false                  # true only for the healthy control, whose round0 IS the oracle
    quick: {...}                    # run-config overrides for --quick (deep-merged)

`round0.recipe` / `oracle.recipe` are merged over `run.recipe` (so sizing is shared and a harness names only the knobs
it sets); `reward` likewise over `run.reward`; `env` is a whole generator config.

A scenario becomes a `harness.experiment.ExperimentConfig` (`experiment_config`): its run config is `run` with the
round-0 harness written in, the target as `backtest.env` and `eval.env`; the `oracle` arm is a baseline whose provider
gives the oracle harness every stage (`harness.baselines.OracleHarness`). Everything else (the warm start shared by every arm, the evolved
arm's measured compute as every other arm's budget, resume) is the experiment's. Refused before anything trains
(`check`): a file with an unknown field (one line naming it), an oracle identical to round 0 (unless `control`), a
target the generator cannot draw from, a warm-start checkpoint that does not exist.

The bench's table (`summarize`): per scenario and arm, final test valid (mean over seeds); the **gap** (oracle minus
fixed-template) and each arm's difference from fixed-template, paired over seeds x test instances (the pigeonhole
bootstrap, Owen 2007: seeds and test instances resampled independently, since every seed is judged on the same
instances; until the thirty-ninth session every (seed, instance) cell was resampled as an independent pair, which
understated the intervals), and each arm's **recovery** of the gap ((arm - fixed) / gap, when the gap's interval
excludes 0) with its 95% interval (Fieller's, over the same resampling: `harness.backtest.ratio_bootstrap`).
"""

from __future__ import annotations

import difflib
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

QUICK_ARMS = ("fixed-template", "oracle", "evolved-rule", "plr")
SCENARIO_RUN_NAME = "scenario"  # every arm's run id prefix: the scenario's name is not shown to any arm


class ScenarioError(ValueError):
    """A scenario that cannot run: one line naming the file, the field and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HarnessSpec(_Strict):
    env: dict[str, Any] = Field(..., description="the whole generator config (the task's env.yaml)")
    recipe: dict[str, Any] = Field(default_factory=dict, description="recipe knobs, merged over run.recipe")
    reward: dict[str, Any] = Field(default_factory=dict, description="reward shaping, merged over run.reward")


RESERVED_NAMES = {"scenarios.json", "scenarios.md", "scenarios.png", "scenarios.html", "lock"}  # the bench's own files


class Scenario(_Strict):
    scenario: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=60, description="the name")

    @field_validator("scenario")
    @classmethod
    def _not_the_benchs_own(cls, v: str) -> str:
        if v.lower() in RESERVED_NAMES:
            raise ValueError(f"{v!r} is the name of a file the bench writes into --out (<out>/<name> holds a "
                             "scenario's results); choose another name")
        return v

    run: dict[str, Any] = Field(..., description="the run config every arm shares (inline, or a relative path)")
    target: dict[str, Any] = Field(..., description="generator config: the judge's distribution and the test set")
    # 1000: at 200 a greedy rate's standard error is ~3.3 points, as large as the differences the table compares, and
    # an arm that keeps the shared warm start keeps that draw's luck (BENCHMARKS.md, "Fortieth session")
    test_n: int = Field(1000, ge=8, description="test instances drawn from the target (test split)")
    round0: HarnessSpec = Field(..., description="the harness the run starts from")
    oracle: HarnessSpec = Field(..., description="the known-good harness (the oracle arm's)")
    control: bool = Field(False, description="the healthy control: round0 is the oracle")
    quick: dict[str, Any] = Field(default_factory=dict, description="run-config overrides for --quick")
    baselines: dict[str, Any] = Field(default_factory=dict, description="the baseline arms' settings (plr:, "
                                      "random:, ...: `harness.experiment.ExperimentConfig`'s fields); default theirs")

    @property
    def task(self) -> str:
        from harness.tasks import DEFAULT_TASK

        return str(self.run.get("task", DEFAULT_TASK))


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _one_line(path: Path, exc: ValidationError, prefix: str = "") -> ScenarioError:
    errs = exc.errors()
    # an unknown key first: `oracel:` beside a missing `oracle:` is one typo, and "oracle: Field required" hid it
    e = next((x for x in errs if x["type"] == "extra_forbidden"), errs[0])
    where = ".".join([p for p in [prefix] if p] + [str(p) for p in e["loc"]]) or "(top level)"
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        missing = [str(x["loc"][-1]) for x in errs if x["type"] == "missing" and x["loc"][:-1] == e["loc"][:-1]]
        close = difflib.get_close_matches(str(e["loc"][-1]), missing, n=1)
        msg = f"unknown key (did you mean {close[0]}?)" if close else "unknown key (typo?)"
    section = {"target": "target.", "round0.env": "round0.env.", "oracle.env": "oracle.env."}.get(prefix)
    if section:  # a generator config's own fix names its fields as a run config's `env.`: name the scenario's
        msg = re.sub(r"(?<![\w.])env\.", section, msg)  # not inside `backtest.env.`
    return ScenarioError(f"{path}: {where}: {msg}")


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; every error is one line naming the field."""
    path = Path(path)
    if not path.is_file():
        raise ScenarioError(f"scenario {path} not found; see examples/scenarios/")
    from sandbox.yamlload import YamlError, load_yaml

    try:
        data = load_yaml(path) or {}
    except YamlError as exc:
        raise ScenarioError(str(exc).splitlines()[0]) from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: a scenario is a YAML mapping (scenario:, run:, target:, round0:, oracle:), got "
                            f"a {type(data).__name__}")
    run_file = data.get("run") if isinstance(data.get("run"), str) else None
    if run_file is not None:
        rp = (path.parent / data["run"]).resolve()
        if not rp.is_file():
            raise ScenarioError(f"{path}: run: {data['run']} not found (paths are relative to the scenario file)")
        try:
            data["run"] = load_yaml(rp) or {}
        except YamlError as exc:
            raise ScenarioError(str(exc).splitlines()[0]) from None
    try:
        sc = Scenario.model_validate(data)
        _check_sections(sc, path)
    except ValidationError as exc:
        raise _one_line(path, exc) from None
    except ScenarioError as exc:  # a setting of a shared run config is fixed in that file, not in the scenario
        if run_file and re.search(rf"{re.escape(str(path))}: run[.:]", str(exc)):
            raise ScenarioError(f"{exc} (in {run_file}, the run config this scenario shares)") from None
        raise
    return sc


def _check_sections(sc: Scenario, path: Path) -> None:
    """Each section validated by the model that reads it, so an error names the scenario's own field."""
    from harness.config import RunConfig
    from harness.tasks import UnknownTaskError, get_task
    from policies.train import Recipe

    try:
        task = get_task(sc.task)
    except UnknownTaskError as exc:
        raise ScenarioError(f"{path}: run.task: {exc}") from None
    sections = [("target", task.spec.config_model, sc.target)]
    for name in ("round0", "oracle"):
        h: HarnessSpec = getattr(sc, name)
        sections += [(f"{name}.env", task.spec.config_model, h.env),
                     (f"{name}.recipe", Recipe, _merge(sc.run.get("recipe") or {}, h.recipe)),
                     (f"{name}.reward", task.spec.shaping_model, _merge(sc.run.get("reward") or {}, h.reward))]
    for prefix, model, value in sections:
        try:
            model.model_validate(value)
        except ValidationError as exc:
            raise _one_line(path, exc, prefix) from None
    from harness.experiment import ExperimentConfig

    bad = sorted(set(sc.baselines) - set(ExperimentConfig.model_fields) | set(sc.baselines) & {"run", "arms", "seeds",
                                                                                           "oracle", "quick"})
    if bad:
        raise ScenarioError(f"{path}: baselines.{bad[0]}: not a baseline's settings (plr, random, ...)")
    if "budget_steps" in sc.baselines:  # the bench always runs an evolved arm, whose compute is every budget
        raise ScenarioError(f"{path}: baselines.budget_steps: every arm's budget is the evolved arm's measured "
                            "compute (equal compute); remove it")
    try:
        ExperimentConfig.model_validate({**sc.baselines, "run": {}})
    except ValidationError as exc:
        raise _one_line(path, exc, "baselines") from None
    for where, data in (("run", sc.run), ("quick", sc.quick)):  # quick: a part of run's, silently overwritten there
        for key in ("env", "backtest.env", "eval"):  # the scenario sets these; a run: that sets them is ambiguous
            head, _, tail = key.partition(".")
            if head in data and (not tail or tail in (data.get(head) or {})):
                raise ScenarioError(f"{path}: {where}.{key}: set by the scenario (round0.env, target, test_n); remove "
                                    f"it from {where}:")
    try:
        RunConfig.model_validate(run_dict(sc))
    except ValidationError as exc:
        raise _one_line(path, exc, "run") from None
    if sc.quick:  # --quick's sizing is checked now, under its own name, not first seen as "oracle: ..." mid-call
        try:
            RunConfig.model_validate(run_dict(sc, quick=True))  # what --quick runs, its own overrides included
        except ValidationError as exc:
            raise _one_line(path, exc, "quick") from None


def harness_of(sc: Scenario, which: str, quick: bool = False) -> dict[str, Any]:
    """The run-config sections (env, recipe, reward) of the scenario's `round0` or `oracle` harness: its own knobs over
    the shared run's (with --quick's sizing)."""
    h: HarnessSpec = getattr(sc, which)
    run = _merge(sc.run, quick_overrides(sc) if quick else {})
    return {"env": h.env, "recipe": _merge(run.get("recipe") or {}, h.recipe),
            "reward": _merge(run.get("reward") or {}, h.reward)}


def run_dict(sc: Scenario, quick: bool = False) -> dict[str, Any]:
    """The run config every arm shares: `run`, the round-0 harness, the target as judge and test set."""
    data = _merge(sc.run, quick_overrides(sc) if quick else {})
    data = _merge(data, harness_of(sc, "round0", quick))
    data["name"] = SCENARIO_RUN_NAME
    data["backtest"] = {**(data.get("backtest") or {}), "env": sc.target}
    data["eval"] = {"env": sc.target, "n": min(sc.test_n, QUICK_TEST_N) if quick else sc.test_n}
    return data


# --quick is a smoke and a first reading, sized so the whole set runs in 30 minutes on 2 cores: under it a carried
# checkpoint is confirmed on QUICK_CONFIRM fresh instances (up to three times that while unclear), not the full
# size's 288. At 288 the confirmations and the last stage's pick read ~12,000 tokens a stage against its ~29,000 of
# GRPO (the 45th session's quick set: 33.4 minutes, every baseline's budget following the evolved arm's compute; 31.4
# with this, the rest being each arm's fixed cost: BENCHMARKS.md, "Forty-fifth session"). A
# scenario's own `quick:` block may set `backtest.carry_confirm` itself; a run config sized smaller keeps its own.
QUICK_CONFIRM = 64
# ... and its arms are tested on the first QUICK_TEST_N of the target's test instances (the full size's `test_n`, 1,000,
# cut to 500): every arm reads the test set after each of its stages, and at 1,000 those passes were ~12 of a quick MAPF
# arm's ~55 seconds (the 46th session's quick set: 34.8 minutes on a host a third slower than the 45th's). A paired
# difference over 500 instances is still read to about +-3 to 4 points (95%; +-2.5 to 3 at 1,000).
QUICK_TEST_N = 500


def quick_overrides(sc: Scenario) -> dict[str, Any]:
    ran = (sc.run.get("backtest") or {}).get("carry_confirm")  # a run sized smaller still keeps its own
    return _merge({"backtest": {"carry_confirm": min(ran, QUICK_CONFIRM) if ran else QUICK_CONFIRM}}, sc.quick)


# --- checks made before anything trains ------------------------------------------------------------------------------


# recipe fields that set how many completions one GRPO step samples: a scenario's harnesses may not change them, since
# an arm's compute is counted in steps (`harness.stagebook.step_equivalents`); the loop may not either (`harness.vet.
# RECIPE_KNOBS` leaves them out), nor an experiment's per-arm overrides (`harness.experiment.COMPUTE_KNOBS`)
SAMPLING_KNOBS = ("batch_size", "oversample")


def _mix_normalised(env: dict[str, Any]) -> dict[str, Any]:
    """An env with each mixture's `data_ratio`s divided by their sum: the generator draws a mixture's entries in
    proportion, so 0.34 / 0.33 / 0.33 and 0.68 / 0.66 / 0.66 are one training mix (an outside review: an oracle that
    only doubled the ratios passed as a defect fixed)."""
    out = dict(env)
    for key, entries in env.items():
        if isinstance(entries, list) and entries and all(isinstance(e, dict) and "data_ratio" in e for e in entries):
            total = sum(float(e["data_ratio"]) for e in entries)
            if total > 0:
                out[key] = [{**e, "data_ratio": round(float(e["data_ratio"]) / total, 9)} for e in entries]
    return out


def _trained_as(sc: Scenario, which: str) -> dict[str, Any]:
    """A harness as the arms train under it: each section through the model that reads it, so `4e-4` written as text
    and `4.0e-4`, or a field set to its default and one left out, are the same harness."""
    from harness.tasks import get_task
    from policies.train import Recipe

    spec = get_task(sc.task).spec
    h = harness_of(sc, which)
    return {"env": _mix_normalised(spec.config_model.model_validate(h["env"]).model_dump(mode="json")),
            "recipe": Recipe.model_validate(h["recipe"]).model_dump(mode="json"),
            "reward": spec.shaping_model.model_validate(h["reward"]).model_dump(mode="json")}


def check(sc: Scenario, path: str | Path) -> None:
    """The refusals a scenario gets before any arm trains, each naming the fix."""
    from harness.config import parse_config
    from harness.tasks import get_task
    from harness.tasks.suites import draw_env

    same = _trained_as(sc, "round0") == _trained_as(sc, "oracle")
    if not sc.control and same:
        raise ScenarioError(f"{path}: oracle: identical to round0, so the scenario has no defect to fix; change the "
                            "round-0 harness (or set control: true for the healthy control)")
    if sc.control and not same:
        raise ScenarioError(f"{path}: control: true, but oracle differs from round0; the healthy control's round-0 "
                            "harness is its oracle (copy oracle: into round0:, or drop control)")
    from policies.train import Recipe

    for which in ("round0", "oracle"):  # compute is counted in GRPO steps: a step must sample what the run's does
        own = getattr(sc, which).recipe or {}
        for knob in (k for k in SAMPLING_KNOBS if k in own):
            base = (sc.run.get("recipe") or {}).get(knob, Recipe.model_fields[knob].default)
            if own[knob] != base:
                raise ScenarioError(
                    f"{path}: {which}.recipe.{knob}: {own[knob]} changes how many completions one GRPO step samples "
                    f"(the run's recipe: {base}); compute is counted in steps, so the arms would not have equal "
                    f"compute. Set recipe.{knob} in the run config for every arm, or drop it here")
    task = get_task(sc.task)
    # the target, and the env each arm trains on (round0's: the evolved and template arms; the oracle's): a generator
    # that cannot draw from one failed after the shared warm start and a whole arm had trained
    warm = [(f"{w}.warm_start.env", e, "train") for w, e in (("run", (sc.run.get("warm_start") or {}).get("env")),
                                                              ("quick", (sc.quick.get("warm_start") or {}).get("env")))
            if e is not None]  # the shared warm start's demonstrations: drawn before any arm, failing after none
    for field, data, split in (("target", sc.target, "test"), ("round0.env", harness_of(sc, "round0")["env"], "train"),
                               ("oracle.env", harness_of(sc, "oracle")["env"], "train"), *warm):
        try:
            draw_env(task, data, 8, split)
        except Exception as exc:  # noqa: BLE001 - any refusal of the generator is the scenario's error
            # the generator's own field names, as the scenario spells them; the fix it names is kept whole
            said = re.sub(r"(?<![\w.])env\.", f"{field}.", str(exc).splitlines()[0])
            raise ScenarioError(f"{path}: {field}: the {sc.task} generator cannot draw instances from it: "
                                f"{said}; fix the {field.rsplit('.', 1)[0]} config") from None
    for where, data in (("run", run_dict(sc)), ("quick", run_dict(sc, quick=True) if sc.quick else None)):
        if data is None:
            continue
        ck = parse_config(data, str(path)).policy.checkpoint  # --quick's own checkpoint too, before anything trains
        if ck and not (Path(ck) / "config.json").is_file():
            raise ScenarioError(f"{path}: {where}.policy.checkpoint: {ck} is not a checkpoint (no config.json there); "
                                "train it first or point at an existing one, or use a preset with warm_start")


# --- the oracle arm ---------------------------------------------------------------------------------------------------


def experiment_config(sc: Scenario, arms: list[str], seeds: int, quick: bool = False, skills: str | None = None):
    """The experiment that runs the scenario (the oracle arm gets the oracle harness); `skills` (isolated, shared)
    overrides the scenario's or the default skill-library mode of its evolved runs."""
    from harness.experiment import ExperimentConfig

    return ExperimentConfig.model_validate({**sc.baselines, "run": run_dict(sc, quick), "arms": arms, "seeds": seeds,
                                            "oracle": oracle_files(sc, quick), **({"skills": skills} if skills else {})})


def oracle_files(sc: Scenario, quick: bool = False) -> dict[str, str]:
    """The oracle's harness files: the template with the oracle's env, recipe and reward written in (as a run's
    round 0 is made), so the oracle arm trains under exactly what a run started from the oracle would."""
    from harness.config import parse_config
    from harness.round0 import initial_files
    from sandbox.workspace import TEMPLATE_DIR

    made = initial_files(parse_config(_merge(run_dict(sc, quick), harness_of(sc, "oracle", quick)), "oracle"))
    made.setdefault("recipe.yaml", (TEMPLATE_DIR / "recipe.yaml").read_text())  # no overrides: the template's
    return made


# --- the bench ---------------------------------------------------------------------------------------------------------


def scenario_files(where: list[str | Path], only: list[str] | None = None) -> list[Path]:
    """Scenario files from files and folders (a folder's `*.yaml` and `*.yml`, not its subfolders, less the run
    configs a scenario there names as its `run:`, which are no scenarios); each file once however it is given; `only`
    keeps those names."""
    files: list[Path] = []
    for w in where:
        p = Path(w)
        if p.is_dir():
            found = sorted([*p.glob("*.yaml"), *p.glob("*.yml")])
            shared = {r for f in found if (r := _run_path(f)) is not None}
            files += [f for f in found if f.resolve() not in shared]
        elif p.is_file():
            files.append(p)
        else:
            raise ScenarioError(f"{p}: no such scenario file or folder")
    seen: set[Path] = set()
    files = [f for f in files if not (f.resolve() in seen or seen.add(f.resolve()))]  # each file once, as first given
    if only:
        names = {f: _name(f) for f in files}
        missing = sorted(set(only) - set(names.values()))
        if missing:
            raise ScenarioError(f"--scenarios: unknown scenario {missing[0]!r}; known: {', '.join(names.values())}")
        files = [f for f in files if names[f] in only]
    if not files:
        raise ScenarioError("no scenario files found (*.yaml or *.yml); see examples/scenarios/")
    return files


def _peek(path: Path) -> dict[str, Any]:
    """A scenario file's mapping without validating it ({} where it does not read as one): selecting files by name
    or telling a shared run config apart must not fail on another broken file (it is named when it is loaded)."""
    from sandbox.yamlload import YamlError, load_yaml

    try:
        data = load_yaml(path)  # bounded (no alias bombs)
    except (YamlError, OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _run_path(path: Path) -> Path | None:
    """The run config a scenario file names as its `run:` (resolved); None if none."""
    run = _peek(path).get("run")
    return (path.parent / run).resolve() if isinstance(run, str) else None


def _name(path: Path) -> str:
    """A scenario file's name (its `scenario:`, else its file name)."""
    name = _peek(path).get("scenario", path.stem)
    return name if isinstance(name, str) else path.stem


AUTOMATIC = ("plr", "learnability", "bandit", "pbt")  # what a person would use instead of the loop: curricula, PBT
# (harness.experiment's BASELINES less the fixed harnesses and the oracle, and its POPULATIONS)


def paired(a: list[list[float]], b: list[list[float]], rng_seed: int = 0,
           clusters: list[Any] | None = None) -> tuple[float, float, float] | None:
    """Mean of a - b with a 95% interval over seeds x test instances: the pigeonhole bootstrap (seeds and instances
    resampled independently, `harness.backtest.two_way_bootstrap`), since every seed is judged on the same test
    instances. Seeds judged on test sets of different sizes (each seed's two arms on one) fall back to the paired
    bootstrap over every (seed, instance) pair; None where one seed's two arms were not judged on as many instances
    (nothing pairs: concatenated, lengths 3 + 2 against 2 + 3 were paired out of step). `clusters` (one label per test
    instance; `harness.experiment.suite_clusters`) makes the instance side resample test PROBLEMS, the copies of one
    drawn together."""
    from harness.backtest import paired_bootstrap, two_way_bootstrap

    rng = np.random.default_rng(rng_seed)
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b, strict=False)):
        return None
    if len(lens := {len(x) for x in (*a, *b)}) == 1:
        return two_way_bootstrap(b, a, 2000, 0.025, rng,
                                 clusters=clusters if clusters is not None and len(clusters) in lens else None)
    return paired_bootstrap(np.concatenate(b), np.concatenate(a), 2000, 0.025, rng)


def _vs(per: dict[str, dict[int, list[float]]], arm: str, other: str,
        clusters: list[Any] | None = None) -> tuple[float, float, float] | None:
    """`arm` - `other`, paired over their common seeds (`per[arm][seed]` = its final per-instance outcomes)."""
    common = sorted(set(per[arm]) & set(per[other]))
    return paired([per[arm][s] for s in common], [per[other][s] for s in common],
                  clusters=clusters) if common else None


def _recovery_ci(per: dict[str, dict[int, list[float]]], arm: str,
                 clusters: list[Any] | None = None) -> tuple[float, list[float | None]] | None:
    """`arm`'s recovery of the gap, (arm - fixed-template) / (oracle - fixed-template), and its 95% interval, both
    over the seeds all three share (`harness.backtest.ratio_bootstrap`: Fieller's interval over the pigeonhole
    bootstrap, the same resampling as every other interval of the table); an end past 100 times the gap is unbounded,
    recorded as None (scenarios.json stays strict JSON). None when the seeds' test sets differ in length (the table
    then gives the ratio of the paired means without an interval). Why it is reported:
    the ratio's denominator is itself an estimate, so a point estimate of the ratio moves by tens of points where the
    broken harness collapses in some runs and not others (code's cold temperature read 75% and 46% on the same seeds'
    baselines a few dozen steps of budget apart, BENCHMARKS.md, seventy-fifth session)."""
    from harness.backtest import ratio_bootstrap

    common = sorted(set(per[arm]) & set(per["fixed-template"]) & set(per["oracle"]))
    if not common:
        return None
    if len({len(per[a][s]) for a in ("fixed-template", "oracle", arm) for s in common}) != 1:
        return None  # ragged test sets (a seed judged on another test_n) make no seeds x instances table
    f, o, x = (np.asarray([per[a][s] for s in common], dtype=float) for a in ("fixed-template", "oracle", arm))
    theta, lo, hi = ratio_bootstrap(x - f, o - f, 2000, 0.025, np.random.default_rng(0),
                                    clusters=clusters if clusters is not None and len(clusters) == f.shape[1] else None)
    if not np.isfinite(theta):
        return None
    return theta, [end if np.isfinite(end) else None for end in (lo, hi)]


WARM = "warm start"  # the shared start, as a row of `per` in `summarize`


def off_budget(results: list[dict[str, Any]], budgets: dict[int, float]) -> list[list[float]]:
    """[seed, compute, budget] of each of an arm's runs whose measured compute (step-equivalents) is further than
    `harness.experiment.EQUAL_COMPUTE` of the budget its seed's baselines were given (the first evolved arm's compute, or
    `budget_steps`): a second evolved arm (the baselines follow the first one only), a baseline whose probes overran
    its last stage, a budget set by hand. Empty when every run is at equal compute."""
    from harness.experiment import EQUAL_COMPUTE

    return [[r["seed"], round(float(r["compute"]), 1), b] for r in results if (b := budgets.get(r["seed"]))
            and abs(float(r["compute"]) - b) > EQUAL_COMPUTE * b]


def summarize(rows: dict[str, dict[str, Any]], warm: dict[str, list[float]] | None = None,
              clusters: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    """Per scenario: each arm's final valid (mean over seeds) and its paired difference from fixed-template; the gap
    (oracle - fixed-template) and each arm's recovery of it; each evolved arm paired against the scenario's best
    automatic arm (`AUTOMATIC`). `rows[scenario][arm]` = [result.json of each seed].

    With `warm[scenario]` (the shared warm start's per-instance test outcomes, the same for every seed) each arm also
    gets its difference from the warm start (`vs_warm`), and the scenario says whether its oracle trained above it
    (`oracle_learns`: the interval's lower bound above 0). An oracle that does not learn makes the gap the harm the
    defect does, not learning a good harness adds: an arm that keeps its warm start then "recovers" the whole gap
    (issue 33: "measure that each oracle is good before it anchors anything").

    With `clusters[scenario]` (its test set's problem label per instance, `harness.experiment.suite_clusters`) every
    interval resamples problems rather than copies of one (`paired`)."""
    from harness.experiment import EVOLVED, lineage_share, pipelined_share

    out: dict[str, Any] = {}
    for name, arms in rows.items():
        per = {arm: {r["seed"]: r["final_per_instance"] for r in results} for arm, results in arms.items()}
        budgets = {r["seed"]: float(r["budget"]) for arm, results in arms.items() if arm not in EVOLVED
                   for r in results if r.get("budget")}  # what each seed's baselines were given
        sc: dict[str, Any] = {"arms": {}}
        w, cl = (warm or {}).get(name), (clusters or {}).get(name)
        if w is not None:
            seeds = sorted({s for p in per.values() for s in p if len(p[s]) == len(w)})
            per[WARM] = {s: list(w) for s in seeds}
            sc["warm"] = float(np.mean(w))
        for arm, results in arms.items():
            a: dict[str, Any] = {"seeds": len(per[arm]),
                                 "valid": float(np.mean([np.mean(v) for v in per[arm].values()])),
                                 "compute": float(np.mean([r["compute"] for r in results])),
                                 "wall_s": float(sum(r.get("wall_s", 0.0) for r in results)),
                                 "cpu_s": float(sum(r.get("cpu_s", 0.0) for r in results))}
            if arm != "fixed-template" and "fixed-template" in per and (m := _vs(per, arm, "fixed-template", cl)):
                a["vs_fixed"] = m
            if WARM in per and (m := _vs(per, arm, WARM, cl)):
                a["vs_warm"] = m
            if (share := lineage_share(results)) is not None:
                a["lineage"] = share[0]
            if (piped := pipelined_share(results)) is not None:
                a["pipelined"] = piped
            if off := off_budget(results, budgets):
                a["off_budget"] = off
            eng = [(r.get("ledger") or {}).get("engineer_tokens", 0) for r in results]
            if any(eng):  # an LLM engineer's own tokens: another model's, beside the step-equivalents
                a["engineer_tokens"] = float(np.mean(eng))
            sc["arms"][arm] = a
        gap = sc["arms"].get("oracle", {}).get("vs_fixed")
        sc["gap"] = gap
        if "vs_warm" in sc["arms"].get("oracle", {}):
            sc["oracle_learns"] = bool(sc["arms"]["oracle"]["vs_warm"][1] > 0)
        if auto := [arm for arm in AUTOMATIC if arm in arms]:  # the loop's bar: the best curriculum or PBT arm
            best = sc["best_automatic"] = max(auto, key=lambda arm: sc["arms"][arm]["valid"])
            for arm in EVOLVED:
                if arm in arms and (m := _vs(per, arm, best, cl)):
                    sc["arms"][arm]["vs_best_automatic"] = m
        if gap is not None and (gap[1] > 0 or gap[2] < 0):
            for arm, a in sc["arms"].items():
                if "vs_fixed" in a and arm != "oracle":
                    a["recovery"] = a["vs_fixed"][0] / gap[0]
                    if (rec := _recovery_ci(per, arm, cl)) is not None:  # the point and its interval on one set of
                        a["recovery"], a["recovery_ci"] = rec  # seeds (the line above's may pair different ones)
        out[name] = sc
    return out


def defect_knobs(sc: Scenario) -> set[str]:
    """Where the round-0 harness differs from the oracle's: "env" when the generator config differs (a mix defect:
    every env knob is a way to fix it), "recipe.<knob>" / "reward.<knob>" for each differing recipe or reward knob.
    What a promoted change must touch to count as a fix of the defect (`is_fix`). Empty for the healthy control."""
    r0, orc = _trained_as(sc, "round0"), _trained_as(sc, "oracle")  # as trained: a default spelt out is no defect
    out = {"env"} if r0["env"] != orc["env"] else set()
    for part in ("recipe", "reward"):
        out |= {f"{part}.{k}" for k in set(r0[part]) | set(orc[part]) if r0[part].get(k) != orc[part].get(k)}
    return out


def is_fix(knob: str, defects: set[str]) -> bool:
    """Does a change of `knob` touch the defect (`defect_knobs`)?"""
    return (knob.startswith("env.") and "env" in defects) or ".".join(knob.split(".")[:2]) in defects


def promotions(sc: Scenario, result: dict[str, Any]) -> dict[str, Any]:
    """An evolved arm's promoted changes (stage, candidate, knob, whether it touches the defect) read from its run.db,
    and the stage of its first promoted fix (None: never). What the skill-carry-over comparison counts."""
    from harness.store import RunStore

    run_dir = Path(result.get("run_dir") or "")
    db, marker = run_dir / "run.db", run_dir / ".evotrainer-run"
    if not (db.is_file() and marker.is_file()):
        return {"promoted": [], "first_fix": None}
    defects = defect_knobs(sc)
    store = RunStore.open(db)
    try:
        rows = store.candidates(marker.read_text().strip(), status="promoted")
    finally:
        store.close()
    got = [{"stage": r["stage"], "candidate": r["id"], "knob": r["knob"], "fix": is_fix(r["knob"] or "", defects)}
           for r in sorted(rows, key=lambda r: (r["stage"], r["id"]))]
    return {"promoted": got, "first_fix": next((g["stage"] for g in got if g["fix"]), None)}


def promotions_table(summary: dict[str, Any]) -> str:
    """Scenario x evolved arm x seed: what was promoted, at which stage, and the stage of the first fix."""
    lines = ["| scenario | arm | seed | promoted (stage: knob; * touches the defect) | first fix at stage |",
             "|---|---|---|---|---|"]
    for name, sc in summary.items():
        for arm, a in sc["arms"].items():
            for seed, p in sorted((a.get("promotions") or {}).items()):
                said = "; ".join(f"{g['stage']}: {g['knob']}{'*' if g['fix'] else ''}" for g in p["promoted"])
                lines.append(f"| {name} | {arm} | {seed} | {said or 'none'} | "
                             f"{p['first_fix'] if p['first_fix'] is not None else 'never'} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def summary_md(summary: dict[str, Any], arms: list[str]) -> str:
    """The bench's markdown: the scenario x arm table, the evolved arms against the best automatic arm, the share of
    their compute that trained what they delivered, then what they promoted (scenarios.md and the page)."""
    from harness.experiment import EVOLVED, mixed_trainers

    md = table(summary, arms)
    if mixed := [f"{name}: {m}" for name, sc in summary.items() if (m := mixed_trainers(sc["arms"]))]:
        md += "\n**Warning**: " + "\n**Warning**: ".join(mixed) + ".\n"
    vs = [(name, arm, sc["best_automatic"], a["vs_best_automatic"]) for name, sc in summary.items()
          for arm, a in sc["arms"].items() if "vs_best_automatic" in a]
    if vs:
        md += ("\nThe evolved arms against the best automatic arm (curriculum or PBT) of each scenario, points, paired "
               "over seeds x test instances:\n\n| scenario | evolved arm | best automatic arm | evolved - best [95% CI] |\n"
               "|---|---|---|---|\n" + "".join(f"| {n} | {a} | {b} | {_pts(m)} |\n" for n, a, b, m in vs))
    shares = [(name, arm, a["lineage"]) for name, sc in summary.items() for arm, a in sc["arms"].items()
              if "lineage" in a and arm in EVOLVED]
    if shares:  # the price of judging: a fixed harness trains what it delivers with all of its compute
        md += ("\nThe share of each evolved arm's compute that trained the policy it delivered (mean over seeds; the "
               "rest trained arms and stages that did not continue, or judged; `evotrainer status RUN` says where):"
               "\n\n| scenario | evolved arm | trained the delivered policy |\n|---|---|---|\n"
               + "".join(f"| {n} | {a} | {100 * x:.0f}% |\n" for n, a, x in shares))
    if fixes := promotions_table(summary):
        md += "\nWhat the evolved arms promoted (from each run's run.db):\n\n" + fixes
    if eng := [f"{name} {arm} {a['engineer_tokens']:,.0f}" for name, sc in summary.items()
               for arm, a in sc["arms"].items() if a.get("engineer_tokens")]:
        md += ("\nThe LLM engineer's own tokens (prompt and completion, mean per seed; another model's, so not in the "
               "step-equivalents every arm is matched on): " + "; ".join(eng) + ".\n")
    from harness.experiment import EQUAL_COMPUTE

    if off := [f"{name} {arm} (" + ", ".join(f"seed {s}: {c:g} against {b:g}" for s, c, b in a["off_budget"]) + ")"
               for name, sc in summary.items() for arm, a in sc["arms"].items() if a.get("off_budget")]:
        md += (f"\n**Not at equal compute** (step-equivalents more than {100 * EQUAL_COMPUTE:g}% from the budget "
               "the seed's baselines were given, the first evolved arm's compute; its comparisons are not at equal "
               "compute): " + "; ".join(off) + ".\n")
    return md


def _pts(m) -> str:
    return f"{100 * m[0]:+.1f} [{100 * m[1]:+.1f}, {100 * m[2]:+.1f}]"


def _share(a: dict[str, Any]) -> str:
    """An arm's recovery of the gap in words: its estimate and, when known, its 95% interval."""
    def pct(x: float | None, end: str) -> str:
        return f"{100 * x:.0f}%" if x is not None else end
    ci = a.get("recovery_ci")
    return pct(a["recovery"], "") + (f" [{pct(ci[0], '-inf')}, {pct(ci[1], '+inf')}]" if ci else "")


def table(summary: dict[str, Any], arms: list[str]) -> str:
    """Scenario x arm: final test valid %, then each arm's paired difference from fixed-template and its recovery (the
    oracle's cell: its difference from the warm start); the warm start's column when it is known; under the table,
    each scenario whose oracle did not train above its warm start."""
    lines = ["| scenario | gap (oracle - fixed), points | warm start | " + " | ".join(arms) + " |",
             "|---|---|---|" + "---|" * len(arms)]
    for name, sc in summary.items():
        cells = []
        for arm in arms:
            a = sc["arms"].get(arm)
            if a is None:
                cells.append("")
                continue
            cell = f"{100 * a['valid']:.1f}"
            if "vs_fixed" in a and arm != "oracle":
                cell += f" ({_pts(a['vs_fixed'])}"
                cell += f"; {_share(a)} of gap)" if "recovery" in a else ")"
            elif arm == "oracle" and "vs_warm" in a:
                cell += f" ({_pts(a['vs_warm'])} vs warm start)"
            cells.append(cell)
        gap = _pts(sc["gap"]) if sc["gap"] is not None else "(no oracle or fixed-template)"
        ws = f"{100 * sc['warm']:.1f}" if "warm" in sc else ""
        lines.append(f"| {name} | {gap} | {ws} | " + " | ".join(cells) + " |")
    if idle := [name for name, sc in summary.items() if sc.get("oracle_learns") is False]:
        lines += ["", "Oracle not above its warm start beyond noise (the gap is harm the defect does, not learning a "
                  "good harness adds; keeping the warm start recovers all of it): " + ", ".join(idle) + "."]
    return "\n".join(lines) + "\n"


def measures_budget(scenarios: list[Scenario], arms: list[str]) -> bool:
    """Does one of `arms` measure the budget every other arm trains at (an evolved arm that will run)? An evolved-llm
    arm of a scenario whose run config names no engineer to ask is skipped (`harness.experiment.plan`), so it
    measures nothing (before: `--arms evolved-llm,oracle` was refused naming `budget_steps`, which scenarios refuse)."""
    from harness.experiment import EVOLVED

    def asks(sc: Scenario) -> bool:
        eng = sc.run.get("engineer") or {}
        return bool(eng.get("base_url") or eng.get("model_path"))

    return any(a in EVOLVED and (a != "evolved-llm" or all(asks(sc) for sc in scenarios)) for a in arms)


def run_scenarios(files: list[Path], out: str | Path, arms: list[str], seeds: int, quick: bool,
                  say: Callable[[str], None] = print, progress=None, jobs: int = 1,
                  skills: str | None = None) -> dict[str, Any]:
    """Every scenario's experiment (resumed where it stopped), then scenarios.json / .md / .png / .html in `out`.
    The scenarios' arms are one schedule (`harness.experiment.run_experiments`): `jobs` > 1 runs that many arms side
    by side, across scenarios."""

    out = Path(out)
    loaded = []
    for f in files:  # every refusal before anything trains
        sc = load_scenario(f)
        check(sc, f)
        if same := next((g for g, other in loaded if other.scenario == sc.scenario), None):
            raise ScenarioError(f"{f}: scenario {sc.scenario!r} is also the name of {same}: each scenario's results go "
                                f"to <out>/<name>, so two files of one name would pool; rename one")
        loaded.append((f, sc))
    run_arms = list(arms)
    added = not measures_budget([sc for _, sc in loaded], run_arms)
    if added:  # the evolved arm's compute is every arm's budget
        run_arms.insert(0, "evolved-rule")
    # a seed count out of range or an arm listed twice is refused here, before anything is printed or made
    configs = [experiment_config(sc, run_arms, seeds, quick, skills) for _, sc in loaded]
    if added:
        say("arms: evolved-rule added (its measured compute is every other arm's budget; a finished one is reused)")
    from harness.experiment import lock_out

    out.mkdir(parents=True, exist_ok=True)  # after every refusal above: a refused call leaves no empty --out behind
    lock = lock_out(out, "bench", ScenarioError)  # one call per --out: two would train the same baselines into it
    try:
        return _run_scenarios(loaded, configs, out, run_arms, seeds, quick, say, progress, jobs)
    finally:
        lock.release()


def _run_scenarios(loaded: list, configs: list, out: Path, run_arms: list[str], seeds: int, quick: bool, say,
                   progress, jobs: int) -> dict[str, Any]:
    from harness.experiment import EVOLVED, run_experiments

    t0 = time.time()
    for f, sc in loaded:
        say(f"scenario {sc.scenario} ({f}): arms {', '.join(run_arms)}, {seeds} seed(s){', quick' if quick else ''}")
    done = run_experiments([(cfg, out / sc.scenario) for cfg, (_, sc) in zip(configs, loaded, strict=True)], say,
                           progress, jobs, labels=[sc.scenario for _, sc in loaded])
    rows: dict[str, dict[str, Any]] = {}
    for (_, sc), exp in zip(loaded, done, strict=True):  # this call's arms and earlier parts' (`_with_earlier_parts`)
        res: dict[str, list[dict[str, Any]]] = {}
        for arm in exp.get("arms_reported", run_arms):
            res[arm] = [json.loads(p.read_text()) for s in range(seeds)
                        if (p := out / sc.scenario / arm / f"seed{s}" / "result.json").exists()]
        rows[sc.scenario] = {a: r for a, r in res.items() if r}
    dirs, names = [out / sc.scenario for _, sc in loaded], [sc.scenario for _, sc in loaded]
    summary = summarize(rows, warm_outcomes(dirs, names), warm_outcomes(dirs, names, "test_clusters"))
    for _, sc in loaded:  # the evolved arms' promotions: what they changed, and when the defect was first fixed
        for arm, results in rows.get(sc.scenario, {}).items():
            if arm in EVOLVED:
                summary[sc.scenario]["arms"][arm]["promotions"] = {r["seed"]: promotions(sc, r) for r in results}
    from harness.experiment import ARMS

    # scenarios an earlier call into this --out measured and this one did not (a `--scenarios` subset): kept in the
    # table as that call summarised them, and said (before, a subset call rewrote the table with its own only)
    carried = _earlier_scenarios(out, set(summary))
    if carried:
        say(f"the table keeps {len(carried)} scenario(s) an earlier call into {out} measured, as it read them: "
            f"{', '.join(carried)}")
        summary = dict(sorted({**summary, **carried}.items()))
    shown = [a for a in ARMS if any(a in sc["arms"] for sc in summary.values())]
    arm_h = sum(a["wall_s"] for sc in summary.values() for a in sc["arms"].values()) / 3600
    cpu_h = sum(a["cpu_s"] for sc in summary.values() for a in sc["arms"].values()) / 3600
    doc = {"scenarios": summary, "arms": shown, "seeds": seeds, "quick": quick, "wall_s": time.time() - t0,
           "arm_hours": arm_h, "cpu_hours": cpu_h, "jobs": jobs}
    (out / "scenarios.json").write_text(json.dumps(doc, indent=1, default=float))
    skipped = {a: why for exp in done for a, why in (exp.get("skipped") or {}).items()}
    doc["skipped"] = skipped  # asked for and not run (an LLM arm without an endpoint): said, never a silent gap
    (out / "scenarios.md").write_text(summary_md(summary, shown) + "".join(
        f"\nSkipped: {a}: {why}\n" for a, why in skipped.items()) + f"\nArm hours (each arm's own wall time, summed over arms and seeds, "
                                      f"{jobs} side by side): {arm_h:.2f}; CPU hours (the arms' processes, every "
                                      f"thread; not the warm starts' SFT): {cpu_h:.2f}; this call's wall: "
                                      f"{doc['wall_s'] / 60:.1f} min\n")
    write_plot(summary, shown, out)
    return doc


def _earlier_scenarios(out: Path, now: set[str]) -> dict[str, Any]:
    """The summaries of scenarios the last `scenarios.json` under `out` holds and this call did not run, each with
    its folder still there (a folder deleted by hand is a scenario dropped)."""
    try:
        doc = json.loads((out / "scenarios.json").read_text())
        earlier = doc["scenarios"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {n: v for n, v in earlier.items() if n not in now and isinstance(v, dict) and (out / n).is_dir()}


def warm_outcomes(dirs: list[Path], names: list[str], key: str = "warm_per_instance") -> dict[str, list[Any]]:
    """Each scenario's shared warm start, per test instance, from its experiment's results.json (written there since
    the fortieth session; absent before, so older outputs have no warm-start column); with `key="test_clusters"` its
    test set's problem labels (since the sixty-fourth session; absent before: intervals over instances)."""
    got = {}
    for d, name in zip(dirs, names, strict=True):
        p = d / "results.json"
        if p.is_file() and (w := json.loads(p.read_text()).get(key)) is not None:
            got[name] = [float(v) if key == "warm_per_instance" else v for v in w]
    return got


def write_plot(summary: dict[str, Any], arms: list[str], out: Path) -> None:
    """scenarios.png: final test valid per scenario and arm (grouped bars); scenarios.html: the plot and the table."""
    from harness.report_page import _plt, plot_page

    plt = _plt()
    names = list(summary)
    fig, ax = plt.subplots(figsize=(max(6.4, 1.2 * len(names) + 2), 3.6))
    width = 0.8 / max(1, len(arms))
    for i, arm in enumerate(arms):
        ys = [100 * summary[n]["arms"].get(arm, {}).get("valid", float("nan")) for n in names]
        xs = [j + i * width for j in range(len(names))]
        bars = ax.bar(xs, ys, width, label=arm)
        for x, y in zip(xs, ys, strict=True):  # a measured 0.0 is a bar of no height: labelled, it is not a gap
            if y == 0:
                ax.annotate("0", (x, 0), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                            fontsize=7, color=bars.patches[0].get_facecolor())
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("test valid % (target, greedy)")
    ax.legend(fontsize=7, frameon=False, loc="lower center", bbox_to_anchor=(0.5, 1.0),  # above the bars, never on
              ncol=min(len(arms), 5))  # them, nor past the page's right edge where a wide chart is scaled
    page = plot_page(fig, out / "scenarios.png", "Broken harnesses: every arm at equal compute",
                     "Final test valid % on each scenario's target; in brackets the paired difference from "
                     "fixed-template (points, 95% paired bootstrap over seeds x test instances) and the share of the "
                     "oracle's gap recovered, with its 95% interval (Fieller's, over the same resampling; "
                     "inf where the gap is too close to noise to bound it).", summary_md(summary, arms))
    (out / "scenarios.html").write_text(page)
